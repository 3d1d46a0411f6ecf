//! Collective operations among the nodes of a group (seed 003 chapter 4):
//! barrier, bcast, reduce, allreduce, gather, scatter, allgather over the
//! `linear` (pipelined chain), `binomial` and `star` trees ([`tree`]), with
//! long messages cut into chunks that each tree forwards as they arrive.
//!
//! Every member calls the same collectives in the same order (as in MPI);
//! each call gets the next sequence number, carried by every chunk, so
//! chunks of a later collective that arrive early wait in a bounded stash.
//! Every wait is bounded by [`CollOptions::timeout`]: a member that dies,
//! stalls or sends something inconsistent makes the call fail with an error
//! naming that member and the operation, and the failure is flooded to the
//! group so every member reports the same culprit. A group that failed stays
//! failed.

mod algos;
pub mod model;
pub mod reduce;
pub mod tree;

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use corefarm_smp::{Algo, CollHeader, CollOp, DType, ReduceOp};

use crate::peer::{Event, Fabric, FabricError};
use tree::Tree;

/// Tuning and limits of a group's collectives; every member must use the same `chunk`.
#[derive(Debug, Clone)]
pub struct CollOptions {
    /// Longest wait for the next expected chunk (and for room to send one).
    pub timeout: Duration,
    /// Bytes of data per message; long blocks are split and pipelined.
    pub chunk: usize,
    /// Largest block a member accepts from another (allocation bound).
    pub max_block: u64,
    /// Bytes of early chunks (of later collectives) held before giving up.
    pub max_stash: usize,
}

impl Default for CollOptions {
    fn default() -> Self {
        CollOptions {
            timeout: Duration::from_secs(10),
            chunk: 64 * 1024,
            max_block: 1 << 30,
            max_stash: 256 << 20,
        }
    }
}

/// Why a collective failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CollError {
    /// A member is held responsible: it died, stalled, or sent something wrong.
    #[error("{op}: rank {rank} ({member}): {reason}")]
    Peer {
        op: String,
        rank: u32,
        member: String,
        reason: String,
    },
    /// This member's own call is wrong (e.g. data not whole elements).
    #[error("{op}: {reason}")]
    Local { op: String, reason: String },
    /// An earlier collective of this group failed; the group is unusable.
    #[error("{op}: the group failed earlier: {earlier}")]
    Failed { op: String, earlier: Box<CollError> },
}

impl CollError {
    /// The member held responsible, if any.
    pub fn rank(&self) -> Option<u32> {
        match self {
            CollError::Peer { rank, .. } => Some(*rank),
            CollError::Local { .. } => None,
            CollError::Failed { earlier, .. } => earlier.rank(),
        }
    }
}

/// One collective call as this member runs it.
#[derive(Debug, Clone)]
struct Ctx {
    seq: u32,
    op: CollOp,
    algo: Algo,
    root: u32,
    dtype: DType,
    reduce: ReduceOp,
    /// Priority class of its data on the links (not compared with the
    /// chunks' own: a member that predates classes sends the default).
    class: u8,
    tree: Tree,
}

fn label(c: &CollHeader) -> String {
    let mut s = format!("{} #{} ({}, root {}", c.op, c.seq, c.algo, c.root);
    if c.reduce != ReduceOp::None {
        s += &format!(", {} {}", c.dtype, c.reduce);
    }
    s + ")"
}

impl Ctx {
    fn header(&self, phase: u8, block: u32, offset: u64, total: u64) -> CollHeader {
        CollHeader {
            seq: self.seq,
            op: self.op,
            phase,
            algo: self.algo,
            dtype: self.dtype,
            reduce: self.reduce,
            root: self.root,
            block,
            offset,
            total,
            class: self.class,
        }
    }

    fn label(&self) -> String {
        label(&self.header(0, 0, 0, 0))
    }

    /// Does a chunk of this collective's sequence number belong to the same call?
    fn matches(&self, c: &CollHeader) -> bool {
        (c.op, c.algo, c.root, c.dtype, c.reduce)
            == (self.op, self.algo, self.root, self.dtype, self.reduce)
    }
}

struct Chunk {
    src: u32,
    coll: CollHeader,
    data: Bytes,
}

/// A member's handle on its group's collectives.
pub struct Group {
    fab: Fabric,
    opts: CollOptions,
    seq: u32,
    stash: HashMap<u32, VecDeque<Chunk>>,
    stash_bytes: usize,
    failed: Option<CollError>,
    /// Priority class of the next calls' data on the links.
    class: u8,
}

impl Group {
    /// Wraps a joined fabric. The chunk size is capped to what one frame holds.
    pub fn new(fab: Fabric, mut opts: CollOptions) -> Self {
        opts.chunk = opts.chunk.clamp(1, fab.max_chunk());
        Group {
            fab,
            opts,
            seq: 0,
            stash: HashMap::new(),
            stash_bytes: 0,
            failed: None,
            class: corefarm_smp::stream::DEFAULT_CLASS,
        }
    }

    pub fn rank(&self) -> u32 {
        self.fab.rank()
    }

    pub fn size(&self) -> u32 {
        self.fab.size()
    }

    pub fn fabric(&self) -> &Fabric {
        &self.fab
    }

    /// Changes the wait bound of the next calls (each group command carries its own).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.opts.timeout = timeout;
    }

    /// Sets the priority class (0 most urgent … 7) of the next calls' data
    /// on the links (each group command carries its own): each member's
    /// outgoing links serve it by class, so an urgent collective's chunks
    /// pass a bulk one's still queued.
    pub fn set_class(&mut self, class: u8) {
        self.class = class.min(corefarm_smp::stream::CLASSES - 1);
    }

    fn peer_err(&self, ctx: &Ctx, rank: u32, reason: impl Into<String>) -> CollError {
        CollError::Peer {
            op: ctx.label(),
            rank,
            member: self.fab.member(rank).to_string(),
            reason: reason.into(),
        }
    }

    fn local_err(&self, ctx: &Ctx, reason: impl Into<String>) -> CollError {
        CollError::Local {
            op: ctx.label(),
            reason: reason.into(),
        }
    }

    fn begin(
        &mut self,
        op: CollOp,
        algo: Algo,
        root: u32,
        dtype: DType,
        reduce: ReduceOp,
    ) -> Result<Ctx, CollError> {
        self.seq = self.seq.wrapping_add(1);
        let n = self.size();
        let ctx = Ctx {
            seq: self.seq,
            op,
            algo,
            root,
            dtype,
            reduce,
            class: self.class,
            tree: Tree::new(algo, n, root.min(n - 1)),
        };
        if let Some(e) = &self.failed {
            return Err(CollError::Failed {
                op: ctx.label(),
                earlier: Box::new(e.clone()),
            });
        }
        let seq = self.seq;
        let before = self.stash.len();
        self.stash.retain(|&s, _| s >= seq);
        if self.stash.len() != before {
            self.stash_bytes = self.stash.values().flatten().map(stashed_size).sum();
        }
        if root >= n {
            return Err(self.local_err(&ctx, format!("root {root} in a group of {n}")));
        }
        Ok(ctx)
    }

    /// Ends a call: a failure is remembered and, unless another member
    /// already reported it, flooded to the group naming the culprit.
    fn finish<T>(&mut self, ctx: &Ctx, r: Result<T, CollError>) -> Result<T, CollError> {
        if let Err(e) = &r {
            if self.failed.is_none() {
                let culprit = e.rank().unwrap_or(self.rank());
                self.fab.abort(culprit, ctx.seq, &e.to_string());
                self.failed = Some(e.clone());
            }
        }
        r
    }

    async fn send(
        &mut self,
        ctx: &Ctx,
        dst: u32,
        coll: CollHeader,
        data: Bytes,
    ) -> Result<(), CollError> {
        match tokio::time::timeout(self.opts.timeout, self.fab.send(dst, coll, data)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(FabricError::NoRoute { rank, .. })) => {
                // A lost link or an abort already waiting explains it better.
                self.pending_failure(ctx)?;
                Err(self.peer_err(ctx, rank, "unreachable: the links toward it are down"))
            }
            Ok(Err(e)) => Err(self.local_err(ctx, e.to_string())),
            Err(_) => Err(self.peer_err(
                ctx,
                dst,
                format!("took nothing for {:?}", self.opts.timeout),
            )),
        }
    }

    /// Sends `data` as chunks of one block to `dst`.
    async fn send_block(
        &mut self,
        ctx: &Ctx,
        phase: u8,
        dst: u32,
        block: u32,
        data: &Bytes,
    ) -> Result<(), CollError> {
        for (off, len) in chunks(data.len(), self.opts.chunk) {
            let h = ctx.header(phase, block, off as u64, data.len() as u64);
            self.send(ctx, dst, h, data.slice(off..off + len)).await?;
        }
        Ok(())
    }

    /// Takes the events already waiting: chunks go to the stash, a lost link
    /// or an abort becomes this call's error.
    fn pending_failure(&mut self, ctx: &Ctx) -> Result<(), CollError> {
        while let Some(ev) = self.fab.try_recv() {
            if let Some(c) = self.on_event(ctx, ev)? {
                self.stash(ctx, c)?;
            }
        }
        Ok(())
    }

    /// Turns an event into a chunk of this or a later call (`None`: stale),
    /// or into this call's error.
    fn on_event(&mut self, ctx: &Ctx, ev: Event) -> Result<Option<Chunk>, CollError> {
        let (src, coll, data) = match ev {
            Event::Chunk { src, coll, data } => (src, coll, data),
            Event::Lost { rank, reason } => {
                let e = self.peer_err(ctx, rank, format!("link lost: {reason}"));
                self.failed = Some(e.clone());
                return Err(e);
            }
            Event::Abort {
                reporter,
                culprit,
                reason,
                ..
            } => {
                let e = self.peer_err(
                    ctx,
                    culprit,
                    format!("reported by rank {reporter}: {reason}"),
                );
                self.failed = Some(e.clone());
                return Err(e);
            }
        };
        // Chunks of an earlier call (that failed elsewhere) are stale.
        if (coll.seq.wrapping_sub(ctx.seq) as i32) < 0 {
            return Ok(None);
        }
        if coll.seq == ctx.seq && !ctx.matches(&coll) {
            return Err(self.peer_err(ctx, src, format!("is running {}", label(&coll))));
        }
        Ok(Some(Chunk { src, coll, data }))
    }

    fn stash(&mut self, ctx: &Ctx, c: Chunk) -> Result<(), CollError> {
        self.stash_bytes += stashed_size(&c);
        if self.stash_bytes > self.opts.max_stash {
            let m = self.opts.max_stash;
            return Err(self.peer_err(
                ctx,
                c.src,
                format!("sent over {m} bytes ahead of this rank"),
            ));
        }
        self.stash.entry(c.coll.seq).or_default().push_back(c);
        Ok(())
    }

    /// The next chunk of this call's `phase` from one of `from`; `blame` is
    /// named if none comes within the timeout.
    async fn recv(
        &mut self,
        ctx: &Ctx,
        phase: u8,
        from: &[u32],
        blame: u32,
    ) -> Result<Chunk, CollError> {
        if let Some(q) = self.stash.get_mut(&ctx.seq) {
            if let Some(i) = q
                .iter()
                .position(|c| c.coll.phase == phase && from.contains(&c.src))
            {
                let c = q.remove(i).expect("position is in range");
                self.stash_bytes -= stashed_size(&c);
                return Ok(c);
            }
        }
        // One deadline for this chunk: traffic of other calls (stashed or
        // stale) must not keep a missing member from being named.
        let deadline = tokio::time::Instant::now() + self.opts.timeout;
        loop {
            let ev = match tokio::time::timeout_at(deadline, self.fab.recv()).await {
                Ok(Some(ev)) => ev,
                Ok(None) => return Err(self.local_err(ctx, "the fabric closed")),
                Err(_) => {
                    let t = self.opts.timeout;
                    return Err(self.peer_err(
                        ctx,
                        blame,
                        format!("sent nothing of this call for {t:?}"),
                    ));
                }
            };
            let Some(c) = self.on_event(ctx, ev)? else {
                continue;
            };
            if c.coll.seq == ctx.seq && c.coll.phase == phase && from.contains(&c.src) {
                return Ok(c);
            }
            self.stash(ctx, c)?;
        }
    }

    /// Broadcasts the root's `data` (other members pass anything, e.g. empty).
    pub async fn bcast(&mut self, algo: Algo, root: u32, data: Bytes) -> Result<Bytes, CollError> {
        let ctx = self.begin(CollOp::Bcast, algo, root, DType::Bytes, ReduceOp::None)?;
        let r = self.bcast_phase(&ctx, 0, data).await;
        self.finish(&ctx, r)
    }

    /// Reduces every member's array element-wise; the root gets the result.
    pub async fn reduce(
        &mut self,
        algo: Algo,
        root: u32,
        dtype: DType,
        op: ReduceOp,
        data: Bytes,
    ) -> Result<Option<Bytes>, CollError> {
        let ctx = self.begin(CollOp::Reduce, algo, root, dtype, op)?;
        let r = self.reduce_phase(&ctx, 0, data).await;
        self.finish(&ctx, r)
    }

    /// Reduce to rank 0, then broadcast: every member gets the result.
    pub async fn allreduce(
        &mut self,
        algo: Algo,
        dtype: DType,
        op: ReduceOp,
        data: Bytes,
    ) -> Result<Bytes, CollError> {
        let ctx = self.begin(CollOp::Allreduce, algo, 0, dtype, op)?;
        let r = async {
            let sum = self.reduce_phase(&ctx, 0, data).await?;
            self.bcast_phase(&ctx, 1, sum.unwrap_or_default()).await
        }
        .await;
        self.finish(&ctx, r)
    }

    /// The root gets every member's block, in rank order.
    pub async fn gather(
        &mut self,
        algo: Algo,
        root: u32,
        data: Bytes,
    ) -> Result<Option<Vec<Bytes>>, CollError> {
        let ctx = self.begin(CollOp::Gather, algo, root, DType::Bytes, ReduceOp::None)?;
        let r = self.gather_phase(&ctx, 0, data).await;
        self.finish(&ctx, r)
    }

    /// The root's `parts[r]` goes to rank r (other members pass an empty Vec).
    pub async fn scatter(
        &mut self,
        algo: Algo,
        root: u32,
        parts: Vec<Bytes>,
    ) -> Result<Bytes, CollError> {
        let ctx = self.begin(CollOp::Scatter, algo, root, DType::Bytes, ReduceOp::None)?;
        let r = self.scatter_phase(&ctx, 0, parts).await;
        self.finish(&ctx, r)
    }

    /// Every member gets every member's block (gather to rank 0, then broadcast).
    pub async fn allgather(&mut self, algo: Algo, data: Bytes) -> Result<Vec<Bytes>, CollError> {
        let ctx = self.begin(CollOp::Allgather, algo, 0, DType::Bytes, ReduceOp::None)?;
        let r = self.allgather_phases(&ctx, data).await;
        self.finish(&ctx, r)
    }

    /// Returns once every member has entered the barrier.
    pub async fn barrier(&mut self, algo: Algo) -> Result<(), CollError> {
        let ctx = self.begin(CollOp::Barrier, algo, 0, DType::U8, ReduceOp::Sum)?;
        let r = async {
            self.reduce_phase(&ctx, 0, Bytes::new()).await?;
            self.bcast_phase(&ctx, 1, Bytes::new()).await.map(drop)
        }
        .await;
        self.finish(&ctx, r)
    }
}

/// (offset, length) of the chunks of a `len`-byte block; one empty chunk for an empty block.
fn chunks(len: usize, chunk: usize) -> impl Iterator<Item = (usize, usize)> {
    let count = len.div_ceil(chunk).max(1);
    (0..count).map(move |i| (i * chunk, chunk.min(len - (i * chunk).min(len))))
}

/// What a stashed chunk counts against `max_stash`: its bytes plus its
/// header, so that empty chunks cannot pile up unbounded.
fn stashed_size(c: &Chunk) -> usize {
    c.data.len() + std::mem::size_of::<Chunk>()
}
