//! Collectives among a group's nodes, and their priority (issue 11): each
//! call has a class, 0 (most urgent) to 7, that its data takes on the
//! links between the members, where each link serves the classes by
//! strict priority with an anti-starvation guard. An urgent collective's
//! data so passes a bulk one's still queued on the same links. The plain
//! calls use the default class 4; the `_with_priority` ones take a class.
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

/// A class over 7 is the caller's mistake, as for `Direct::map_with_priority`.
fn check_class(class: u8) -> Result<()> {
    if class >= CLASSES {
        return Err(GroupError::Usage(format!(
            "priority class {class}: 0 (most urgent) to {} exist",
            CLASSES - 1
        )));
    }
    Ok(())
}

impl Group {
    /// Whether the server relays a call's class to the nodes (it agreed
    /// `features::GROUP_PRIORITY`); if not, every call is class 4.
    pub fn priorities(&self) -> bool {
        self.classes
    }

    /// Gives every member `data` as buffer `name`: one copy to rank 0, then a
    /// broadcast among the nodes (the server carries the data once).
    pub fn bcast_from_user(
        &mut self,
        name: &str,
        dtype: DType,
        data: Bytes,
        algo: Algorithm,
    ) -> Result<()> {
        self.bcast_from_user_with_priority(name, dtype, data, algo, DEFAULT_CLASS)
    }

    /// [`Group::bcast_from_user`] whose broadcast is in priority class
    /// `class`, 0 (most urgent) to 7 (the copy to rank 0 passes the server
    /// in order with every command); a bad class sends nothing.
    pub fn bcast_from_user_with_priority(
        &mut self,
        name: &str,
        dtype: DType,
        data: Bytes,
        algo: Algorithm,
        class: u8,
    ) -> Result<()> {
        check_class(class)?;
        self.put(0, name, dtype, data)?;
        self.bcast_with_priority(0, name, name, dtype, algo, class)
    }

    /// Buffer `src` of `root` into buffer `dst` of every member.
    pub fn bcast(
        &mut self,
        root: u32,
        src: &str,
        dst: &str,
        dtype: DType,
        algo: Algorithm,
    ) -> Result<()> {
        self.bcast_with_priority(root, src, dst, dtype, algo, DEFAULT_CLASS)
    }

    /// [`Group::bcast`] in priority class `class`, 0 (most urgent) to 7.
    pub fn bcast_with_priority(
        &mut self,
        root: u32,
        src: &str,
        dst: &str,
        dtype: DType,
        algo: Algorithm,
        class: u8,
    ) -> Result<()> {
        let size = self.size_of(src, root);
        let mut c = self.coll(Cmd::Bcast, algo, size, src, dst, class)?;
        (c.root, c.dtype) = (root, dtype);
        self.call(c)?;
        self.set_size(dst, None, size);
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
        algo: Algorithm,
    ) -> Result<()> {
        self.reduce_with_priority(root, src, dst, dtype, op, algo, DEFAULT_CLASS)
    }

    /// [`Group::reduce`] in priority class `class`, 0 (most urgent) to 7.
    #[allow(clippy::too_many_arguments)]
    pub fn reduce_with_priority(
        &mut self,
        root: u32,
        src: &str,
        dst: &str,
        dtype: DType,
        op: ReduceOp,
        algo: Algorithm,
        class: u8,
    ) -> Result<()> {
        let size = self.size_of(src, root);
        let mut c = self.coll(Cmd::Reduce, algo, size, src, dst, class)?;
        (c.root, c.dtype, c.reduce) = (root, dtype, op);
        self.call(c)?;
        self.set_size(dst, Some(root), size);
        Ok(())
    }

    /// Element-wise reduction of every member's `src` into `dst` of every member.
    pub fn allreduce(
        &mut self,
        src: &str,
        dst: &str,
        dtype: DType,
        op: ReduceOp,
        algo: Algorithm,
    ) -> Result<()> {
        self.allreduce_with_priority(src, dst, dtype, op, algo, DEFAULT_CLASS)
    }

    /// [`Group::allreduce`] in priority class `class`, 0 (most urgent) to 7.
    pub fn allreduce_with_priority(
        &mut self,
        src: &str,
        dst: &str,
        dtype: DType,
        op: ReduceOp,
        algo: Algorithm,
        class: u8,
    ) -> Result<()> {
        let call = self.begin_allreduce_with_priority(src, dst, dtype, op, algo, class)?;
        self.wait(call).map(drop)
    }

    /// Every member's `src`, in rank order, into `dst` of every member.
    pub fn allgather(&mut self, src: &str, dst: &str, algo: Algorithm) -> Result<()> {
        self.allgather_with_priority(src, dst, algo, DEFAULT_CLASS)
    }

    /// [`Group::allgather`] in priority class `class`, 0 (most urgent) to 7.
    pub fn allgather_with_priority(
        &mut self,
        src: &str,
        dst: &str,
        algo: Algorithm,
        class: u8,
    ) -> Result<()> {
        let total = self
            .sizes
            .get(src)
            .and_then(|v| v.iter().copied().sum::<Option<u64>>());
        let c = self.coll(Cmd::Allgather, algo, total, src, dst, class)?;
        self.call(c)?;
        self.set_size(dst, None, total);
        Ok(())
    }

    /// Returns once every member has entered the barrier.
    pub fn barrier(&mut self, algo: Algorithm) -> Result<()> {
        self.barrier_with_priority(algo, DEFAULT_CLASS)
    }

    /// [`Group::barrier`] with priority class `class`. A barrier moves no
    /// data, and its empty chunks ride above every class on the links
    /// anyway; the class is checked and carried like any other call's.
    pub fn barrier_with_priority(&mut self, algo: Algorithm, class: u8) -> Result<()> {
        let c = self.coll(Cmd::Barrier, algo, Some(0), "", "", class)?;
        self.call(c).map(drop)
    }

    /// Starts [`Group::allreduce`] without waiting for it.
    pub fn begin_allreduce(
        &mut self,
        src: &str,
        dst: &str,
        dtype: DType,
        op: ReduceOp,
        algo: Algorithm,
    ) -> Result<Call> {
        self.begin_allreduce_with_priority(src, dst, dtype, op, algo, DEFAULT_CLASS)
    }

    /// Starts [`Group::allreduce_with_priority`] without waiting for it:
    /// a bulk allreduce begun first and an urgent one after it share the
    /// links, where the urgent one's chunks go first.
    pub fn begin_allreduce_with_priority(
        &mut self,
        src: &str,
        dst: &str,
        dtype: DType,
        op: ReduceOp,
        algo: Algorithm,
        class: u8,
    ) -> Result<Call> {
        let size = self.size_of(src, 0);
        let mut c = self.coll(Cmd::Allreduce, algo, size, src, dst, class)?;
        (c.dtype, c.reduce) = (dtype, op);
        self.set_size(dst, None, size);
        self.begin(c)
    }

    /// A collective command for every rank: `auto` resolved, the class
    /// checked and kept only where the server relays it.
    pub(super) fn coll(
        &mut self,
        cmd: Cmd,
        algo: Algorithm,
        bytes: Option<u64>,
        a: &str,
        b: &str,
        class: u8,
    ) -> Result<GroupCmd> {
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
        g.allreduce_with_priority("x", "s", i32, sum, algo, 0)
            .unwrap();
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
