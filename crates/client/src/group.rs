//! Groups of nodes driven from the client (seed 003): a group of N
//! gang-allocated nodes with ranks 0..N-1, named buffers resident on them,
//! and MPI-style collectives among them.
//!
//! ```no_run
//! use corefarm_client::group::{Algorithm, Group, GroupOptions};
//! use corefarm_smp::{DType, ReduceOp};
//! let mut g = Group::open("127.0.0.1:9999", GroupOptions::new(4))?;
//! g.scatter_rows("x", DType::I32, &vec![0u8; 4 * 64], 4)?; // 64 rows of one i32
//! g.allreduce("x", "sum", DType::I32, ReduceOp::Sum, Algorithm::Auto)?;
//! let sums = g.gather("sum")?; // one block per rank, in rank order
//! # Ok::<(), corefarm_client::group::GroupError>(())
//! ```
//!
//! Data between the user and the group (`put`, `scatter_rows`, `get`,
//! `gather`, `bcast_from_user`) passes through the server; collectives
//! among the nodes (`bcast`, `reduce`, `allreduce`, `allgather`, `barrier`)
//! and `run` move no data through the user or the server.
//!
//! Every command has a sequence number and a timeout: a member that dies or
//! stalls makes the call fail with [`GroupError::Failed`] naming the member
//! and the operation (or [`GroupError::Timeout`] naming the ranks that did
//! not answer), never a hang; after a member failure the server has torn
//! the group down and every later call fails with [`GroupError::Closed`].

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
/// The latency model `auto` uses (`corefarm model calibrate`).
pub use corefarm_model::collectives::Calibration;
use corefarm_model::collectives::{Algo as ModelAlgo, Op as ModelOp};
use corefarm_smp::auth::{AuthChallenge, AuthResponse, SECRET_ENV, SECRET_FILE_ENV};
use corefarm_smp::blocking::{write_frame, FrameReader};
use corefarm_smp::group::{Cmd, GroupCmd, GroupCtl, GroupMember, GroupReply, ALL_RANKS};
use corefarm_smp::hello::features;
use corefarm_smp::{Algo, Configuration, DType, Hello, MsgType};

use crate::tls::{RecvHalf, SendHalf};
use crate::{ClientError, ClientOptions};

mod calls;
mod collectives;
pub use calls::Call;
use calls::{read_until, unexpected};
pub use collectives::Plan;

/// Which tree a collective runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// Chosen per call: the lowest latency the calibrated model predicts
    /// ([`choose_calibrated`]), else seed 003's stage count ([`choose`]).
    Auto,
    Linear,
    Binomial,
    Star,
}

/// A name that is not an [`Algorithm`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown algorithm {0:?} (auto, linear, binomial, star)")]
pub struct UnknownAlgorithm(pub String);

impl std::str::FromStr for Algorithm {
    type Err = UnknownAlgorithm;
    fn from_str(s: &str) -> Result<Self, UnknownAlgorithm> {
        Ok(match s {
            "auto" => Algorithm::Auto,
            "linear" => Algorithm::Linear,
            "binomial" => Algorithm::Binomial,
            "star" => Algorithm::Star,
            _ => return Err(UnknownAlgorithm(s.to_string())),
        })
    }
}

/// Bytes per chunk the nodes pipeline (the fabric's default).
pub const CHUNK: u64 = 64 * 1024;

/// The algorithm `auto` picks for `bytes` over `n` members: the fewest
/// chunk-stages on the critical path, after seed 003's models (§5.4.2).
/// With c chunks, the pipelined chain takes c + n − 2 stages, the binomial
/// tree ⌈log2 n⌉·c (its root sends each chunk to ⌈log2 n⌉ children), the
/// star (n − 1)·c. Binomial wins for short messages, the chain for long ones.
pub fn choose(bytes: u64, n: u32) -> Algo {
    if n <= 2 {
        return Algo::Binomial;
    }
    let c = bytes.div_ceil(CHUNK).max(1) as f64;
    let n = f64::from(n);
    let linear = c + n - 2.0;
    let binomial = n.log2().ceil() * c;
    if linear < binomial {
        Algo::Linear
    } else {
        Algo::Binomial
    }
}

/// The tree with the lowest latency `model` predicts for `op` over `n`
/// members with `bytes` per rank (`corefarm model calibrate`).
pub fn choose_calibrated(model: &Calibration, op: ModelOp, bytes: u64, n: u32) -> Algo {
    match model.best(op, n, bytes) {
        ModelAlgo::Linear => Algo::Linear,
        ModelAlgo::Binomial => Algo::Binomial,
        ModelAlgo::Star => Algo::Star,
    }
}

/// What `auto` runs `cmd` over: `bytes` is the source buffer (for an
/// allgather, the total of all ranks), `None` when the client cannot know
/// it (then binomial, the safe choice for short messages).
pub fn auto(model: Option<&Calibration>, cmd: Cmd, bytes: Option<u64>, n: u32) -> Algo {
    let op = match cmd {
        Cmd::Bcast => ModelOp::Bcast,
        Cmd::Reduce => ModelOp::Reduce,
        Cmd::Allreduce => ModelOp::Allreduce,
        Cmd::Barrier => ModelOp::Barrier,
        _ => ModelOp::Allgather,
    };
    match (model, bytes) {
        (Some(m), Some(b)) => {
            let per_rank = if op == ModelOp::Allgather {
                b / u64::from(n.max(1))
            } else {
                b
            };
            choose_calibrated(m, op, per_rank, n)
        }
        (None, Some(b)) => choose(b, n),
        (_, None) => Algo::Binomial,
    }
}

/// How a group is opened.
#[derive(Debug, Clone)]
pub struct GroupOptions {
    pub nodes: u32,
    /// `mesh`, `ring`, `tree` or `torus:<cols>`.
    pub topology: String,
    /// Bound of every command (the nodes' wait on each other).
    pub timeout: Duration,
    /// Bound on connecting and on the group being formed.
    pub connect_timeout: Duration,
    pub name: Option<String>,
    pub max_message: u32,
    /// Latency model for `auto`; [`GroupOptions::new`] loads the default
    /// file of `corefarm model calibrate` if there is a valid one. `None`:
    /// seed 003's stage count ([`choose`]).
    pub model: Option<Arc<Calibration>>,
    /// The user secret, for a server with an auth file (as
    /// [`crate::ClientOptions::secret`]).
    pub secret: Option<corefarm_smp::auth::Secret>,
    /// The user named in the server's auth file whose secret `secret` is,
    /// as [`crate::ClientOptions::user`]: its node limit bounds the group,
    /// and the group's node time goes to its account. `None`: the
    /// anonymous tenant (the shared user secret).
    pub user: Option<String>,
    /// TLS to the server's user port, as [`crate::ClientOptions::tls`]
    /// (the CA to trust and, optionally, the name its certificate
    /// carries); `None`: plain TCP. The group's commands, and the data
    /// between the user and the group, then travel encrypted; the direct
    /// data path does not exist for such a group ([`GroupError::DirectOverTls`]).
    pub tls: Option<corefarm_smp::tls::ClientTls>,
}

impl GroupOptions {
    pub fn new(nodes: u32) -> Self {
        GroupOptions {
            nodes,
            topology: "mesh".into(),
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(30),
            name: None,
            max_message: corefarm_smp::DEFAULT_MAX_MESSAGE,
            model: Calibration::load_default().map(Arc::new),
            secret: None,
            user: None,
            tls: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    /// A command failed; `rank`/`node` name the member held responsible.
    #[error("{op}: {reason}")]
    Failed {
        op: String,
        rank: Option<u32>,
        node: Option<String>,
        reason: String,
    },
    #[error("{op}: no answer within {after:?} from rank(s) {waiting:?} ({nodes})")]
    Timeout {
        op: String,
        after: Duration,
        waiting: Vec<u32>,
        nodes: String,
    },
    /// The group ended (a member failed, or it was closed).
    #[error("the group is closed: {0}")]
    Closed(String),
    #[error("invalid use of the group: {0}")]
    Usage(String),
    /// The direct data path was asked of a group opened over TLS: the
    /// members' peer ports speak plain TCP only, so its data (and the
    /// group's token) would leave the encryption the user asked for.
    #[error(
        "the direct data path is not available on a group opened over TLS: the members' peer \
         ports speak plain TCP only, so the data would travel unencrypted. Send the data \
         through the server instead (put or scatter_rows, run, gather: TLS covers them), or \
         open the group without TLS on a plain user port (--tls-ports nodes) if the network \
         to the nodes is private"
    )]
    DirectOverTls,
    #[error(transparent)]
    Client(#[from] ClientError),
}

impl GroupError {
    /// The rank held responsible, if the error names one.
    pub fn rank(&self) -> Option<u32> {
        match self {
            GroupError::Failed { rank, .. } => *rank,
            GroupError::Timeout { waiting, .. } => waiting.first().copied(),
            _ => None,
        }
    }
}

pub type Result<T, E = GroupError> = std::result::Result<T, E>;

/// A group of nodes held for this connection's lifetime.
#[derive(Debug)]
pub struct Group {
    writer: SendHalf,
    reader: FrameReader<RecvHalf>,
    /// The link to the server is TLS (so the plain direct path is refused).
    pub(crate) tls: bool,
    id: u32,
    members: Vec<GroupMember>,
    seq: u32,
    pub(crate) timeout: Duration,
    closed: Option<String>,
    /// Bytes of each buffer on each rank, as far as the client can tell
    /// (for `auto`); unknown sizes fall back to the binomial tree.
    sizes: HashMap<String, Vec<Option<u64>>>,
    /// Element type of each buffer on each rank, as far as the client can
    /// tell: a collective that the nodes would refuse for its type (which
    /// ends the group) is refused here first, and the group goes on.
    dtypes: HashMap<String, Vec<Option<DType>>>,
    /// Input and output size of the configured cores.
    io: Option<(u64, u64)>,
    /// Replies to calls in flight other than the one being waited for.
    early: Vec<GroupReply>,
    /// Admits direct connections to the members ([`crate::direct`]).
    pub(crate) token: u64,
    model: Option<Arc<Calibration>>,
    /// The server agreed `features::GROUP_PRIORITY`: commands may carry a class.
    classes: bool,
}

impl Drop for Group {
    fn drop(&mut self) {
        // The server ends the group when the connection closes anyway.
        if self.closed.is_none() {
            let _ = write_frame(&mut self.writer, GroupCtl::Close.to_frame());
        }
    }
}

fn io_err(during: &'static str) -> impl Fn(io::Error) -> GroupError {
    move |source| GroupError::Client(ClientError::Io { during, source })
}

impl Group {
    /// Connects, asks for a group of `opts.nodes` nodes and waits until every
    /// member is linked.
    pub fn open(addr: &str, opts: GroupOptions) -> Result<Group> {
        // The ordinary client's connection, TLS included: a server that
        // stops reading fails a command's write within the command's bound
        // instead of holding the caller.
        let link = ClientOptions {
            connect_timeout: Some(opts.connect_timeout),
            io_timeout: Some(opts.timeout + Duration::from_secs(5)),
            max_message: opts.max_message,
            tls: opts.tls.clone(),
            ..ClientOptions::default()
        };
        let (mut writer, mut reader) = crate::connect::open_link(addr, &link)?;
        let mut hello = Hello::new("user");
        hello.name = opts.name.clone();
        hello.user = opts.user.clone();
        hello.features = [features::ERROR, features::GROUP, features::GROUP_PRIORITY]
            .map(String::from)
            .to_vec();
        hello.nodes = Some(0);
        if opts.secret.is_some() {
            hello.features.push(features::AUTH.into());
        }
        // Kept as sent: an answer to a challenge covers these exact bytes.
        let hello_bytes = hello.encode();
        write_frame(&mut writer, hello.to_frame()).map_err(io_err("sending the hello"))?;
        let open = GroupCtl::Open {
            nodes: opts.nodes,
            topology: Some(opts.topology.clone()),
        };
        let deadline = Instant::now() + opts.connect_timeout;
        let mut h = read_until(&mut reader, deadline, "waiting for the hello reply")?;
        if h.ty == MsgType::AuthChallenge {
            let challenge = AuthChallenge::parse(&h.payload).map_err(ClientError::Protocol)?;
            let Some(secret) = &opts.secret else {
                return Err(ClientError::Handshake {
                    addr: addr.to_string(),
                    detail: format!(
                        "the server requires authentication: give the user secret \
                         ({SECRET_ENV}, {SECRET_FILE_ENV} or --secret-file)"
                    ),
                }
                .into());
            };
            let answer = AuthResponse::answer(secret, &challenge, "user", &hello_bytes);
            write_frame(&mut writer, answer.to_frame())
                .map_err(io_err("sending the authentication answer"))?;
            h = read_until(&mut reader, deadline, "waiting for the hello reply")?;
        }
        let classes = match h.ty {
            MsgType::Hello => {
                let h = Hello::decode(&h.payload).map_err(ClientError::Protocol)?;
                if !h.has(features::GROUP) {
                    return Err(ClientError::Unsupported("groups").into());
                }
                h.has(features::GROUP_PRIORITY)
            }
            _ => return Err(unexpected(&h, "the hello reply")),
        };
        write_frame(&mut writer, open.to_frame()).map_err(io_err("asking for a group"))?;
        let f = read_until(&mut reader, deadline, "waiting for the group to open")?;
        let (id, members, token) = match (f.ty, GroupCtl::decode(&f.payload)) {
            (
                MsgType::GroupCtl,
                Ok(GroupCtl::Opened {
                    group,
                    members,
                    token,
                }),
            ) => (group, members, token),
            _ => return Err(unexpected(&f, "the group to open")),
        };
        Ok(Group {
            writer,
            reader,
            tls: opts.tls.is_some(),
            id,
            members,
            token,
            seq: 0,
            timeout: opts.timeout,
            closed: None,
            sizes: HashMap::new(),
            dtypes: HashMap::new(),
            io: None,
            early: Vec::new(),
            model: opts.model,
            classes,
        })
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn size(&self) -> u32 {
        self.members.len() as u32
    }

    pub fn members(&self) -> &[GroupMember] {
        &self.members
    }

    /// `name@peer` of a rank, as errors name members.
    pub fn label(&self, rank: u32) -> String {
        self.members
            .get(rank as usize)
            .map_or(format!("rank {rank}"), |m| format!("{}@{}", m.name, m.peer))
    }

    pub fn set_timeout(&mut self, t: Duration) {
        self.timeout = t;
    }

    /// Loads a configuration on every member, for [`Group::run`].
    pub fn configure(&mut self, cfg: &Configuration) -> Result<()> {
        let mut c = self.cmd(ALL_RANKS, Cmd::Configure);
        c.data = Bytes::from(cfg.encode_payload());
        self.call(c)?;
        self.io = Some((cfg.input_size as u64, cfg.output_size as u64));
        Ok(())
    }

    /// Creates buffer `name` on `rank`.
    pub fn put(&mut self, rank: u32, name: &str, dtype: DType, data: Bytes) -> Result<()> {
        let len = data.len() as u64;
        let mut c = self.cmd(rank, Cmd::Put);
        (c.a, c.dtype, c.data) = (name.into(), dtype, data);
        self.call(c)?;
        self.set_size(name, Some(rank), Some(len));
        self.set_dtype(name, Some(rank), Some(dtype));
        Ok(())
    }

    /// Buffer `name` of `rank`.
    pub fn get(&mut self, rank: u32, name: &str) -> Result<Bytes> {
        let mut c = self.cmd(rank, Cmd::Get);
        c.a = name.into();
        let mut r = self.call(c)?;
        Ok(r.pop().map(|r| r.data).unwrap_or_default())
    }

    /// Frees buffer `name` on every member.
    pub fn free(&mut self, name: &str) -> Result<()> {
        let mut c = self.cmd(ALL_RANKS, Cmd::Free);
        c.a = name.into();
        self.call(c)?;
        self.sizes.remove(name);
        self.dtypes.remove(name);
        Ok(())
    }

    /// Splits `data` into rows of `row_bytes` and gives each rank a
    /// contiguous block of rows as buffer `name` (the first `rows % n` ranks
    /// get one more). Returns the number of rows of each rank.
    pub fn scatter_rows(
        &mut self,
        name: &str,
        dtype: DType,
        data: &[u8],
        row_bytes: usize,
    ) -> Result<Vec<usize>> {
        if row_bytes == 0 || !data.len().is_multiple_of(row_bytes) {
            return Err(GroupError::Usage(format!(
                "{} bytes is not a whole number of {row_bytes}-byte rows",
                data.len()
            )));
        }
        let (rows, n) = (data.len() / row_bytes, self.size() as usize);
        let counts: Vec<usize> = (0..n)
            .map(|r| rows / n + usize::from(r < rows % n))
            .collect();
        let mut at = 0;
        for (r, &k) in counts.iter().enumerate() {
            let block = Bytes::copy_from_slice(&data[at..at + k * row_bytes]);
            self.put(r as u32, name, dtype, block)?;
            at += k * row_bytes;
        }
        Ok(counts)
    }

    /// Every member's buffer `name`, in rank order.
    pub fn gather(&mut self, name: &str) -> Result<Vec<Bytes>> {
        (0..self.size()).map(|r| self.get(r, name)).collect()
    }

    /// Every member runs its configured cores over each input of its buffer
    /// `input`; the outputs stay resident as buffer `output`.
    pub fn run(&mut self, input: &str, output: &str) -> Result<()> {
        self.run_with(input, None, output)
    }

    /// [`Group::run`] where every core input is one element of `input`
    /// followed by the whole buffer `operand` (e.g. a matrix row and the
    /// broadcast vector): the element size is the configured input size
    /// less the operand's.
    pub fn run_with(&mut self, input: &str, operand: Option<&str>, output: &str) -> Result<()> {
        let op_len = operand.and_then(|o| self.size_of(o, 0)).unwrap_or(0);
        let call = self.begin_run(input, operand, output)?;
        self.wait(call)?;
        let sizes = self.sizes.get(input).cloned().unwrap_or_default();
        let out = (0..self.size() as usize)
            .map(|r| {
                let (i, o) = self.io?;
                let elem = i.checked_sub(op_len).filter(|&e| e > 0)?;
                sizes.get(r).copied().flatten().map(|s| s / elem * o)
            })
            .collect();
        self.sizes.insert(output.into(), out);
        self.dtypes.remove(output);
        Ok(())
    }

    /// Ends the group; its nodes go back to the server's pool. A group
    /// that already ended (a member failed, and the call that met it said
    /// so) has nothing left to close: `Ok`, so that leaving a scope after
    /// handling that error does not report it a second time.
    pub fn close(mut self) -> Result<()> {
        if self.closed.is_some() {
            return Ok(());
        }
        write_frame(&mut self.writer, GroupCtl::Close.to_frame())
            .map_err(io_err("closing the group"))?;
        let deadline = Instant::now() + self.timeout;
        loop {
            let f = read_until(&mut self.reader, deadline, "waiting for the group to close")?;
            if let (MsgType::GroupCtl, Ok(GroupCtl::Closed { .. })) =
                (f.ty, GroupCtl::decode(&f.payload))
            {
                self.closed = Some("closed by this client".into());
                return Ok(());
            }
        }
    }

    fn size_of(&self, name: &str, rank: u32) -> Option<u64> {
        self.sizes.get(name)?.get(rank as usize).copied().flatten()
    }

    /// Records `name`'s size on `rank` (`None`: every rank).
    fn set_size(&mut self, name: &str, rank: Option<u32>, size: Option<u64>) {
        let n = self.size() as usize;
        let v = self
            .sizes
            .entry(name.into())
            .or_insert_with(|| vec![None; n]);
        match rank {
            Some(r) => v[r as usize] = size,
            None => v.iter_mut().for_each(|s| *s = size),
        }
    }

    /// Records `name`'s element type on `rank` (`None`: every rank).
    fn set_dtype(&mut self, name: &str, rank: Option<u32>, dtype: Option<DType>) {
        let n = self.size() as usize;
        let v = self
            .dtypes
            .entry(name.into())
            .or_insert_with(|| vec![None; n]);
        match rank {
            Some(r) => v[r as usize] = dtype,
            None => v.iter_mut().for_each(|d| *d = dtype),
        }
    }

    /// The element type every rank's `name` is known to hold, if they agree.
    fn dtype_of(&self, name: &str) -> Option<DType> {
        let v = self.dtypes.get(name)?;
        let first = (*v.first()?)?;
        v.iter().all(|&d| d == Some(first)).then_some(first)
    }

    /// Refuses a reduction, before anything is sent, that the nodes would
    /// refuse by ending the group: `src` holding elements of another type
    /// than `dtype` on some rank, or ranks whose `src` differ in length.
    /// Only what the client put or computed is known; the nodes check the
    /// rest.
    fn check_reduction(&self, what: Cmd, src: &str, dtype: DType) -> Result<()> {
        let held = self.dtypes.get(src).filter(|_| dtype != DType::Bytes);
        let wrong = held.and_then(|v| v.iter().flatten().find(|&&d| d != dtype));
        if let Some(d) = wrong {
            return Err(GroupError::Usage(format!(
                "buffer {src:?} holds {d} elements, the {} wants {dtype} (pass dtype {d})",
                what.name()
            )));
        }
        let Some(sizes) = self.sizes.get(src) else {
            return Ok(());
        };
        let known: Vec<u64> = sizes.iter().flatten().copied().collect();
        if known.len() == sizes.len() && known.windows(2).any(|w| w[0] != w[1]) {
            let list = known.iter().map(u64::to_string).collect::<Vec<_>>();
            return Err(GroupError::Usage(format!(
                "{} of buffer {src:?}: its ranks hold {} bytes, and a reduction needs the same \
                 length on every rank (scatter a number of rows that divides by {}, or put \
                 equal blocks)",
                what.name(),
                list.join(", "),
                sizes.len()
            )));
        }
        Ok(())
    }

    fn cmd(&mut self, target: u32, cmd: Cmd) -> GroupCmd {
        self.seq = self.seq.wrapping_add(1);
        let mut c = GroupCmd::new(self.seq, target, cmd);
        c.timeout_ms = self.timeout.as_millis().min(u32::MAX as u128) as u32;
        c
    }

    fn check_open(&self) -> Result<()> {
        match &self.closed {
            Some(r) => Err(GroupError::Closed(r.clone())),
            None => Ok(()),
        }
    }

    /// Starts [`Group::run_with`] without waiting for it.
    pub fn begin_run(&mut self, input: &str, operand: Option<&str>, output: &str) -> Result<Call> {
        let mut c = self.cmd(ALL_RANKS, Cmd::Run);
        (c.a, c.b) = (input.into(), output.into());
        c.data = Bytes::from(operand.unwrap_or("").as_bytes().to_vec());
        self.begin(c)
    }

    /// Waits for a command started with a `begin_` method.
    pub fn finish(&mut self, call: Call) -> Result<()> {
        self.wait(call).map(drop)
    }
}

#[cfg(test)]
pub(crate) mod tests;
