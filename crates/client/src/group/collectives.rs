//! Collectives among a group's nodes, and their priority: each
//! call has a class, 0 (most urgent) to 7, that its data takes on the
//! links between the members, where each link serves the classes by
//! strict priority with an anti-starvation guard. An urgent collective's
//! data so passes a bulk one's still queued on the same links. The
//! calls take a [`Plan`]: an [`Algorithm`] alone is class 4,
//! `Algorithm::class` names another.
//!
//! The class reaches the nodes only through a server that agreed
//! `features::GROUP_PRIORITY` ([`Group::priorities`]); through an older
//! one every call is class 4, as a direct call's class is to a member
//! that predates chunks.

use bytes::Bytes;
use corefarm_smp::group::{Cmd, GroupCmd, ALL_RANKS};
use corefarm_smp::stream::{CLASSES, DEFAULT_CLASS};
use corefarm_smp::{Algo, DType, ReduceOp};

use super::{auto, Algorithm, Call, Group, GroupError, Result};

/// A class over 7 is the caller's mistake, as for `Direct::map_with`.
fn check_class(class: u8) -> Result<()> {
    if class >= CLASSES {
        return Err(GroupError::Usage(format!(
            "priority class {class}: 0 (most urgent) to {} exist",
            CLASSES - 1
        )));
    }
    Ok(())
}

/// How a collective runs: the tree it takes and the priority class of its
/// data on the links. An [`Algorithm`] alone is a plan in the default
/// class 4; [`Algorithm::class`] names another:
/// `g.allreduce("x", "s", i32, sum, Algorithm::Auto.class(0))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub algo: Algorithm,
    /// 0 (most urgent) to 7.
    pub class: u8,
}

impl From<Algorithm> for Plan {
    fn from(algo: Algorithm) -> Plan {
        Plan {
            algo,
            class: DEFAULT_CLASS,
        }
    }
}

impl Algorithm {
    /// This tree, its data in priority class `class` (0 most urgent to 7;
    /// a bad class is the call's usage error, and nothing is sent).
    pub fn class(self, class: u8) -> Plan {
        Plan { algo: self, class }
    }
}

impl Group {
    /// Whether the server relays a call's class to the nodes (it agreed
    /// `features::GROUP_PRIORITY`); if not, every call is class 4.
    pub fn priorities(&self) -> bool {
        self.classes
    }

    /// Gives every member `data` as buffer `name`: one copy to rank 0, then a
    /// broadcast among the nodes (the server carries the data once; the
    /// copy to rank 0 passes it in order with every command, whatever the
    /// plan's class).
    pub fn bcast_from_user(
        &mut self,
        name: &str,
        dtype: DType,
        data: Bytes,
        plan: impl Into<Plan>,
    ) -> Result<()> {
        let plan = plan.into();
        check_class(plan.class)?;
        self.put(0, name, dtype, data)?;
        self.bcast(0, name, name, dtype, plan)
    }

    /// Buffer `src` of `root` into buffer `dst` of every member.
    pub fn bcast(
        &mut self,
        root: u32,
        src: &str,
        dst: &str,
        dtype: DType,
        plan: impl Into<Plan>,
    ) -> Result<()> {
        let size = self.size_of(src, root);
        let mut c = self.coll(Cmd::Bcast, plan.into(), size, src, dst)?;
        (c.root, c.dtype) = (root, dtype);
        self.call(c)?;
        self.set_size(dst, None, size);
        // The root keeps its buffer's type; the others take the command's.
        let at_root = self.dtypes.get(src).and_then(|v| v[root as usize]);
        self.set_dtype(dst, None, Some(dtype));
        self.set_dtype(dst, Some(root), at_root.or(Some(dtype)));
        Ok(())
    }

    /// Element-wise reduction of every member's `src` into `dst` of `root`.
    pub fn reduce(
        &mut self,
        root: u32,
        src: &str,
        dst: &str,
        dtype: DType,
        op: ReduceOp,
        plan: impl Into<Plan>,
    ) -> Result<()> {
        let size = self.size_of(src, root);
        self.check_reduction(Cmd::Reduce, src, dtype)?;
        let mut c = self.coll(Cmd::Reduce, plan.into(), size, src, dst)?;
        (c.root, c.dtype, c.reduce) = (root, dtype, op);
        self.call(c)?;
        self.set_size(dst, Some(root), size);
        self.set_dtype(dst, Some(root), Some(dtype));
        Ok(())
    }

    /// Element-wise reduction of every member's `src` into `dst` of every member.
    pub fn allreduce(
        &mut self,
        src: &str,
        dst: &str,
        dtype: DType,
        op: ReduceOp,
        plan: impl Into<Plan>,
    ) -> Result<()> {
        let call = self.begin_allreduce(src, dst, dtype, op, plan)?;
        self.wait(call).map(drop)
    }

    /// Every member's `src`, in rank order, into `dst` of every member.
    pub fn allgather(&mut self, src: &str, dst: &str, plan: impl Into<Plan>) -> Result<()> {
        let total = self
            .sizes
            .get(src)
            .and_then(|v| v.iter().copied().sum::<Option<u64>>());
        let c = self.coll(Cmd::Allgather, plan.into(), total, src, dst)?;
        self.call(c)?;
        self.set_size(dst, None, total);
        let dtype = self.dtype_of(src);
        self.set_dtype(dst, None, dtype);
        Ok(())
    }

    /// Returns once every member has entered the barrier. A barrier moves
    /// no data, and its empty chunks ride above every class on the links
    /// anyway; a plan's class is checked and carried like any other call's.
    pub fn barrier(&mut self, plan: impl Into<Plan>) -> Result<()> {
        let c = self.coll(Cmd::Barrier, plan.into(), Some(0), "", "")?;
        self.call(c).map(drop)
    }

    /// Starts [`Group::allreduce`] without waiting for it: a bulk allreduce
    /// begun first and an urgent one after it share the links, where the
    /// urgent one's chunks go first.
    pub fn begin_allreduce(
        &mut self,
        src: &str,
        dst: &str,
        dtype: DType,
        op: ReduceOp,
        plan: impl Into<Plan>,
    ) -> Result<Call> {
        let size = self.size_of(src, 0);
        self.check_reduction(Cmd::Allreduce, src, dtype)?;
        let mut c = self.coll(Cmd::Allreduce, plan.into(), size, src, dst)?;
        (c.dtype, c.reduce) = (dtype, op);
        self.set_size(dst, None, size);
        self.set_dtype(dst, None, Some(dtype));
        self.begin(c)
    }

    /// A collective command for every rank: `auto` resolved, the class
    /// checked and kept only where the server relays it.
    pub(super) fn coll(
        &mut self,
        cmd: Cmd,
        plan: Plan,
        bytes: Option<u64>,
        a: &str,
        b: &str,
    ) -> Result<GroupCmd> {
        let Plan { algo, class } = plan;
        check_class(class)?;
        let algo = match algo {
            Algorithm::Auto => auto(self.model.as_deref(), cmd, bytes, self.size()),
            Algorithm::Linear => Algo::Linear,
            Algorithm::Binomial => Algo::Binomial,
            Algorithm::Star => Algo::Star,
        };
        let mut c = self.cmd(ALL_RANKS, cmd);
        (c.algo, c.a, c.b) = (Some(algo), a.into(), b.into());
        // An older server would refuse the command byte with a class.
        c.class = if self.classes { class } else { DEFAULT_CLASS };
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::tests::{server, NO_PEER};
    use crate::group::GroupOptions;

    fn urgent_allreduce(addr: &str) -> bool {
        let mut opts = GroupOptions::new(2);
        opts.model = None;
        let mut g = Group::open(addr, opts).unwrap();
        let agreed = g.priorities();
        let (i32, sum, algo) = (DType::I32, ReduceOp::Sum, Algorithm::Binomial);
        g.allreduce("x", "s", i32, sum, algo.class(0)).unwrap();
        g.allreduce("x", "t", i32, sum, algo).unwrap();
        agreed
    }

    #[test]
    fn a_class_goes_only_to_a_server_that_agreed_it() {
        let allreduce = Cmd::Allreduce as u8;
        let (addr, t) = server(true, &[NO_PEER; 2]);
        assert!(urgent_allreduce(&addr));
        assert_eq!(t.join().unwrap(), [0x80 | allreduce, allreduce]);
        // An older server would refuse the byte: class 4 for everything.
        let (addr, t) = server(false, &[NO_PEER; 2]);
        assert!(!urgent_allreduce(&addr));
        assert_eq!(t.join().unwrap(), [allreduce, allreduce]);
    }

    #[test]
    fn classes_over_7_are_a_usage_error() {
        assert!(check_class(0).is_ok() && check_class(7).is_ok());
        let e = check_class(8).unwrap_err().to_string();
        assert_eq!(
            e,
            "invalid use of the group: priority class 8: 0 (most urgent) to 7 exist"
        );
    }
}
