//! A node's membership in a user's group (docs/collectives.md): the task that joins the
//! fabric when the server says `join`, then runs the user's group commands
//! one at a time, in the order the server relays them (collectives must run
//! in the same order on every member, as in MPI), against the member's
//! resident [`Buffers`]. Each command gets one [`GroupReply`].
//!
//! A collective that fails (a member lost, stalled, or inconsistent; or this
//! member's own arguments wrong) fails the group for good: every later
//! collective is answered with the first failure at once, so no member waits
//! on a group that can no longer complete one. The server tears such a group
//! down; dropping the [`GroupHandle`] frees the buffers.
//!
//! A collective's priority class travels in its group command (the command
//! byte's high nibble, feature `group-priority`) to every member, which
//! writes it into each of its chunks' collective header, in a byte that was
//! reserved: older nodes ignore it, and their own chunks read as the default
//! class. The server only clears the class for a member that did not offer
//! the feature; it does not reorder commands by class, since a group's
//! members must run collectives in one order.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use corefarm_smp::group::{Cmd, GroupCmd, GroupCtl, GroupMember, GroupReply, NO_CULPRIT};
use corefarm_smp::{Algo, DType, ErrorCode, ErrorMsg, OutFrame, ReduceOp, DATA_ID_LEN};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::buffers::{BufError, Buffers};
use crate::collective::{CollError, CollOptions, Group};
use crate::configure::{self, Configured};
use crate::direct;
use crate::guard::MemoryGuard;
use crate::handlers::{Job, Outgoing};
use crate::peer::link;
use crate::peer::{Fabric, FabricError, GroupSpec, Member, PeerListener, Topology, TopologyError};
use crate::NodeOptions;

/// Size of the reply header: a `get` must fit the link with it.
const REPLY_OVERHEAD: usize = corefarm_smp::group::REPLY_HEADER_LEN;

/// Parses a topology as group control names it: `mesh`, `ring`, `tree`, `torus:<cols>`.
pub fn parse_topology(s: &str) -> Result<Topology, TopologyError> {
    match s {
        "mesh" | "" => Ok(Topology::FullMesh),
        "ring" => Ok(Topology::Ring),
        "tree" => Ok(Topology::BinomialTree),
        t => match t.strip_prefix("torus:").map(str::parse::<u32>) {
            Some(Ok(cols)) if cols > 0 => Ok(Topology::Torus { cols }),
            _ => Err(TopologyError::Unknown(t.to_string())),
        },
    }
}

/// Why a member could not join its group; the text is the `joined`
/// error the server (and the group's user) reads.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error(transparent)]
    Topology(#[from] TopologyError),
    #[error("rank {rank} ({name}): peer address {peer:?}: {error}")]
    PeerAddress {
        rank: u32,
        name: String,
        peer: String,
        error: std::net::AddrParseError,
    },
    #[error(transparent)]
    Fabric(#[from] FabricError),
}

/// What a member needs besides the join message.
#[derive(Clone)]
pub struct MemberEnv {
    pub opts: NodeOptions,
    pub guard: MemoryGuard,
    /// Largest payload on the server link.
    pub limit: u32,
    pub listener: Arc<PeerListener>,
    /// Replies go out through the session's sending task.
    pub out: mpsc::UnboundedSender<Outgoing>,
}

/// The longest a member waits on another for one chunk, whatever a command
/// asks (10 minutes): a member that died is named within it, and the
/// server's commands pending for a user end.
pub const MAX_WAIT_MS: u32 = 600_000;

/// The running member task; dropping it leaves the group (links closed,
/// buffers freed, cores stopped).
pub struct GroupHandle {
    pub group: u32,
    tx: mpsc::UnboundedSender<GroupCmd>,
    task: JoinHandle<()>,
}

impl Drop for GroupHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl GroupHandle {
    /// Joins the group described by a `join` message in the background;
    /// `joined` (with an error if linking failed) goes to the server.
    pub fn start(
        group: u32,
        rank: u32,
        members: Vec<GroupMember>,
        topology: &str,
        token: u64,
        env: MemberEnv,
    ) -> GroupHandle {
        let (tx, rx) = mpsc::unbounded_channel();
        let topology = parse_topology(topology);
        let task = tokio::spawn(async move {
            let joined = match topology {
                Ok(t) => join(group, rank, members, t, token, &env).await,
                Err(e) => Err(JoinError::Topology(e)),
            };
            let fab = match joined {
                Ok(f) => f,
                Err(e) => {
                    tracing::warn!(node = %env.opts.name, group, "cannot join: {e}");
                    let ctl = GroupCtl::Joined {
                        group,
                        error: Some(e.to_string()),
                    };
                    let _ = env.out.send(Outgoing::Frame(ctl.to_frame()));
                    return;
                }
            };
            tracing::info!(node = %env.opts.name, group, rank, "joined group");
            let ctl = GroupCtl::Joined { group, error: None };
            let _ = env.out.send(Outgoing::Frame(ctl.to_frame()));
            Resident::new(fab, env).serve(rx, group, rank, token).await;
        });
        GroupHandle { group, tx, task }
    }

    /// Queues a command; `false` if the member task has ended.
    pub fn submit(&self, cmd: GroupCmd) -> bool {
        self.tx.send(cmd).is_ok()
    }
}

async fn join(
    group: u32,
    rank: u32,
    members: Vec<GroupMember>,
    topology: Topology,
    token: u64,
    env: &MemberEnv,
) -> Result<Fabric, JoinError> {
    let members = members
        .into_iter()
        .map(|m| match m.peer.parse::<SocketAddr>() {
            Ok(addr) => Ok(Member { name: m.name, addr }),
            Err(error) => Err(JoinError::PeerAddress {
                rank: m.rank,
                name: m.name,
                peer: m.peer,
                error,
            }),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let spec = GroupSpec::new(group, rank, members, topology)
        .with_token(token)
        .with_chunk_size(env.opts.chunk_size);
    Ok(Fabric::join(&env.listener, spec).await?)
}

/// Why a command failed: code, reason, and the member to blame if another.
struct Fail {
    code: ErrorCode,
    culprit: u32,
    reason: String,
}

impl From<BufError> for Fail {
    fn from(e: BufError) -> Self {
        let code = match e {
            BufError::Full { .. } => ErrorCode::TooLarge,
            BufError::Mismatch { .. } => ErrorCode::BadDataSize,
            _ => ErrorCode::Malformed,
        };
        Fail {
            code,
            culprit: NO_CULPRIT,
            reason: e.to_string(),
        }
    }
}

impl From<CollError> for Fail {
    fn from(e: CollError) -> Self {
        Fail {
            code: ErrorCode::Timeout,
            culprit: e.rank().unwrap_or(NO_CULPRIT),
            reason: e.to_string(),
        }
    }
}

fn local(code: ErrorCode, reason: impl Into<String>) -> Fail {
    Fail {
        code,
        culprit: NO_CULPRIT,
        reason: reason.into(),
    }
}

struct Resident {
    coll: Group,
    bufs: Buffers,
    env: MemberEnv,
    cores: Option<(Configured, mpsc::UnboundedReceiver<Outgoing>)>,
    /// The first failed collective: the group cannot run another.
    failed: Option<Fail>,
}

impl Resident {
    fn new(fab: Fabric, env: MemberEnv) -> Self {
        Resident {
            coll: Group::new(fab, CollOptions::default()),
            bufs: Buffers::new(env.guard.clone()),
            env,
            cores: None,
            failed: None,
        }
    }

    async fn serve(
        mut self,
        mut rx: mpsc::UnboundedReceiver<GroupCmd>,
        group: u32,
        rank: u32,
        token: u64,
    ) {
        // Direct users reach this member through its peer port for as long
        // as it is in the group (the fabric's own registration ended with the join).
        let mut users = match self.env.listener.register(group) {
            Ok((rx, guard)) => Some((rx, guard)),
            Err(e) => {
                tracing::warn!(group, "no direct path: {e}");
                None
            }
        };
        let (jobs_tx, mut jobs) = direct::queue::queue();
        let max_frame = self.env.listener.max_frame();
        let member = direct::Member {
            group,
            rank,
            token,
            offer: link::offer(self.env.opts.chunk_size, max_frame),
            max_frame,
            jobs: jobs_tx,
            stats: (self.env.opts.telemetry.as_ref()).map(|t| t.node(&self.env.opts.name)),
            port: self.env.listener.stats().clone(),
        };
        // Dropped with this task: the direct connections end with the membership.
        let mut conns = tokio::task::JoinSet::new();
        loop {
            while conns.try_join_next().is_some() {}
            let incoming = async {
                match users.as_mut() {
                    Some((rx, _)) => rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            let cmd = tokio::select! {
                c = rx.recv() => match c {
                    Some(c) => c,
                    None => break,
                },
                Some(inc) = incoming => {
                    conns.spawn(direct::accept(inc, member.clone()));
                    continue;
                }
                Some(job) = jobs.next() => {
                    let frame = match self.compute(job.data, &format!("direct data id {}", job.id)).await {
                        Ok(out) => OutFrame::data(job.id, out)
                            .unwrap_or_else(|e| ErrorMsg::new(job.id, e.code(), e.to_string()).to_frame()),
                        Err(f) => ErrorMsg::new(job.id, f.code, f.reason).to_frame(),
                    };
                    let _ = job.reply.send((frame, Some(job.slot)));
                    continue;
                }
            };
            let (seq, rank) = (cmd.seq, self.coll.rank());
            let reply = match self.exec(cmd).await {
                Ok(data) => GroupReply::ok(seq, rank, data),
                Err(f) => GroupReply::failed(seq, rank, f.code, f.culprit, &f.reason),
            };
            match reply.to_frame() {
                Ok(f) => {
                    if self.env.out.send(Outgoing::Frame(f)).is_err() {
                        break;
                    }
                }
                Err(e) => tracing::warn!("group reply not encodable: {e}"),
            }
        }
        if let Some((c, _)) = self.cores.take() {
            let _ = tokio::task::spawn_blocking(move || drop(c.workers.stop())).await;
        }
    }

    async fn exec(&mut self, c: GroupCmd) -> Result<Bytes, Fail> {
        if c.cmd.is_collective() {
            if let Some(f) = &self.failed {
                return Err(Fail {
                    code: f.code,
                    culprit: f.culprit,
                    reason: format!("{}: the group failed earlier: {}", c.label(), f.reason),
                });
            }
            self.coll.set_timeout(Duration::from_millis(
                c.timeout_ms.clamp(1, MAX_WAIT_MS) as u64
            ));
            self.coll.set_class(c.class);
            let r = self.collective(&c).await;
            if let Err(f) = &r {
                if f.culprit == NO_CULPRIT {
                    // This member's own arguments were wrong: the others
                    // wait on it, so tell them who to blame and why.
                    let me = self.coll.rank();
                    let why = format!("{}: {}", c.label(), f.reason);
                    self.coll.fabric().abort(me, u32::MAX, &why);
                }
                self.failed = Some(Fail {
                    code: f.code,
                    culprit: if f.culprit == NO_CULPRIT {
                        self.coll.rank()
                    } else {
                        f.culprit
                    },
                    reason: f.reason.clone(),
                });
            }
            return r;
        }
        match c.cmd {
            Cmd::Put => {
                self.bufs.put(&c.a, c.dtype, c.data)?;
                Ok(Bytes::new())
            }
            Cmd::Get => {
                let data = self.bufs.get(&c.a)?.data.clone();
                let limit = self.env.limit as usize;
                if data.len() + REPLY_OVERHEAD > limit {
                    return Err(local(
                        ErrorCode::TooLarge,
                        format!(
                            "buffer {:?} of {} bytes does not fit one message of at most {limit} bytes",
                            c.a,
                            data.len()
                        ),
                    ));
                }
                Ok(data)
            }
            Cmd::Free => {
                self.bufs.free(&c.a)?;
                Ok(Bytes::new())
            }
            Cmd::Configure => self.configure(c.data).await.map(|_| Bytes::new()),
            Cmd::Run => self.run(&c).await.map(|_| Bytes::new()),
            _ => unreachable!("collectives handled above"),
        }
    }

    async fn collective(&mut self, c: &GroupCmd) -> Result<Bytes, Fail> {
        let algo = c.algo.unwrap_or(Algo::Binomial);
        let (me, n) = (self.coll.rank(), self.coll.size());
        if c.root >= n {
            return Err(local(
                ErrorCode::Malformed,
                format!("{}: root {} in a group of {n}", c.label(), c.root),
            ));
        }
        let reduce_args = || -> Result<(), Fail> {
            if c.reduce == ReduceOp::None || c.dtype == DType::Bytes {
                return Err(local(
                    ErrorCode::Malformed,
                    format!(
                        "{}: a reduction needs an element type and an operator",
                        c.label()
                    ),
                ));
            }
            Ok(())
        };
        match c.cmd {
            Cmd::Barrier => {
                self.coll.barrier(algo).await?;
            }
            Cmd::Bcast => {
                let data = if me == c.root {
                    let d = self.bufs.get(&c.a)?;
                    (d.data.clone(), d.dtype)
                } else {
                    (Bytes::new(), c.dtype)
                };
                if !(me == c.root && c.a == c.b) {
                    self.bufs.check_new(&c.b)?;
                }
                let out = self.coll.bcast(algo, c.root, data.0).await?;
                if !(me == c.root && c.a == c.b) {
                    // Non-roots learn the element type from the command.
                    let dtype = if me == c.root { data.1 } else { c.dtype };
                    self.bufs.put(&c.b, dtype, out)?;
                }
            }
            Cmd::Reduce => {
                reduce_args()?;
                let data = self.bufs.typed(&c.a, c.dtype)?;
                if me == c.root {
                    self.bufs.check_new(&c.b)?;
                }
                let out = self
                    .coll
                    .reduce(algo, c.root, c.dtype, c.reduce, data)
                    .await?;
                if let Some(out) = out {
                    self.bufs.put(&c.b, c.dtype, out)?;
                }
            }
            Cmd::Allreduce => {
                reduce_args()?;
                let data = self.bufs.typed(&c.a, c.dtype)?;
                self.bufs.check_new(&c.b)?;
                let out = self.coll.allreduce(algo, c.dtype, c.reduce, data).await?;
                self.bufs.put(&c.b, c.dtype, out)?;
            }
            Cmd::Allgather => {
                let d = self.bufs.get(&c.a)?;
                let (data, dtype) = (d.data.clone(), d.dtype);
                self.bufs.check_new(&c.b)?;
                let parts = self.coll.allgather(algo, data).await?;
                let mut all = BytesMut::with_capacity(parts.iter().map(Bytes::len).sum());
                parts.iter().for_each(|p| all.extend_from_slice(p));
                self.bufs.put(&c.b, dtype, all.freeze())?;
            }
            _ => unreachable!("not a collective"),
        }
        Ok(Bytes::new())
    }

    async fn configure(&mut self, payload: Bytes) -> Result<(), Fail> {
        if let Some((old, _)) = self.cores.take() {
            let _ = tokio::task::spawn_blocking(move || drop(old.workers.stop())).await;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let (c, _) =
            configure::configure(payload, &self.env.opts, self.env.limit, false, &tx, None)
                .await
                .map_err(|e| local(e.code(), e.to_string()))?;
        tracing::info!(node = %self.env.opts.name, "group cores: {}", configure::describe(&c.cfg));
        self.cores = Some((c, rx));
        Ok(())
    }

    /// Every input of buffer `a` through the configured cores (split across
    /// them), the outputs in input order into buffer `b`. A command whose
    /// data names an operand buffer appends that buffer to every input (a
    /// matrix row and the broadcast vector, say).
    async fn run(&mut self, c: &GroupCmd) -> Result<(), Fail> {
        let input = self.bufs.get(&c.a)?.data.clone();
        let operand = match c.data.is_empty() {
            true => None,
            false => {
                let name = std::str::from_utf8(&c.data)
                    .map_err(|_| local(ErrorCode::Malformed, "operand name is not UTF-8"))?;
                Some(self.bufs.get(name)?.data.clone())
            }
        };
        self.bufs.check_new(&c.b)?;
        let Some((cores, _)) = self.cores.as_ref() else {
            return Err(local(
                ErrorCode::NotConfigured,
                format!("{}: no configuration: configure the group first", c.label()),
            ));
        };
        let isz = cores.cfg.input_size as usize;
        // Each core input is one element of `a`, followed by the operand if any.
        let op_len = operand.as_ref().map_or(0, Bytes::len);
        let elem = isz.checked_sub(op_len).filter(|&e| e > 0).ok_or_else(|| {
            local(
                ErrorCode::BadDataSize,
                format!(
                    "{}: an operand of {op_len} bytes leaves nothing of a {isz}-byte input",
                    c.label()
                ),
            )
        })?;
        if input.is_empty() || !input.len().is_multiple_of(elem) {
            return Err(BufError::Mismatch {
                name: c.a.clone(),
                reason: format!(
                    "{} bytes is not a whole number of {elem}-byte inputs",
                    input.len()
                ),
            }
            .into());
        }
        let count = input.len() / elem;
        let input = match &operand {
            None => input,
            Some(op) => {
                let mut v = BytesMut::with_capacity(count * isz);
                for e in input.chunks_exact(elem) {
                    v.extend_from_slice(e);
                    v.extend_from_slice(op);
                }
                v.freeze()
            }
        };
        let out = self.compute(input, &c.label()).await?;
        self.bufs.put(&c.b, DType::Bytes, out)?;
        Ok(())
    }

    /// Whole inputs of the configured size through the cores (split across
    /// them); the outputs in input order.
    pub(crate) async fn compute(&mut self, input: Bytes, label: &str) -> Result<Bytes, Fail> {
        let Some((cores, results)) = self.cores.as_mut() else {
            return Err(local(
                ErrorCode::NotConfigured,
                format!("{label}: no configuration: configure the group first"),
            ));
        };
        let (isz, osz) = (
            cores.cfg.input_size as usize,
            cores.cfg.output_size as usize,
        );
        if input.is_empty() || !input.len().is_multiple_of(isz) {
            return Err(local(
                ErrorCode::BadDataSize,
                format!(
                    "{label}: {} bytes is not a whole number of {isz}-byte inputs",
                    input.len()
                ),
            ));
        }
        let count = input.len() / isz;
        let out_len = count * osz;
        if out_len + DATA_ID_LEN > self.env.limit as usize {
            return Err(local(
                ErrorCode::TooLarge,
                format!("{count} outputs of {osz} bytes exceed the message limit"),
            ));
        }
        let jobs = cores.cfg.cores.len().clamp(1, count);
        let per = count.div_ceil(jobs);
        let mut parts: Vec<Option<Bytes>> = Vec::new();
        let mut failure = None;
        for (id, start) in (0..count).step_by(per).enumerate() {
            let n = per.min(count - start);
            let Some(mem) = self.env.guard.try_reserve(n * (isz + osz)) else {
                failure = Some(local(
                    ErrorCode::TooLarge,
                    "the node's memory guard is full",
                ));
                break;
            };
            let job = Job {
                id: id as u32,
                class: corefarm_smp::stream::DEFAULT_CLASS,
                data: input.slice(start * isz..(start + n) * isz),
                count: n,
                reservation: mem,
                queued: std::time::Instant::now(),
            };
            if !cores.workers.submit(job).await {
                return Err(local(ErrorCode::CoreFailure, "the core handlers stopped"));
            }
            parts.push(None);
        }
        // Every part submitted is answered before this returns, failed or
        // not: the channel is shared by the calls that follow, and a part
        // left in it would be taken as one of theirs.
        let mut left = parts.len();
        while left > 0 {
            match results.recv().await {
                Some(Outgoing::Result { id, data, .. }) => {
                    if let Some(p) = parts.get_mut(id as usize) {
                        *p = Some(data);
                    }
                    left -= 1;
                }
                Some(Outgoing::Failed { reason, .. }) => {
                    failure.get_or_insert_with(|| {
                        local(ErrorCode::CoreFailure, format!("{label}: {reason}"))
                    });
                    left -= 1;
                }
                // A group command has no user link to notify.
                Some(Outgoing::Frame(_) | Outgoing::Notes { .. }) => {}
                None => return Err(local(ErrorCode::CoreFailure, "the core handlers stopped")),
            }
        }
        if let Some(f) = failure {
            return Err(f);
        }
        let mut out = BytesMut::with_capacity(out_len);
        parts
            .iter()
            .flatten()
            .for_each(|p| out.extend_from_slice(p));
        Ok(out.freeze())
    }
}
