//! A user connection in shared mode. It owns no node: configurations and
//! data go to the scheduler, answers come back on the user's channel.
//!
//! What a seed-format user sees is the seed's behaviour: a positive
//! configuration response once at least one replica of its function is
//! configured, its results to it alone, and a new configuration only after
//! its own data in flight has been answered. A full function queue stops
//! reads from the user's socket (TCP back-pressure), unless a hello user
//! asked for the `queue-full` feature: then that message gets an error.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::tls::Stream;
use bytes::Bytes;
use corefarm_smp::codec::FrameReader;
use corefarm_smp::stream::Message;
use corefarm_smp::{
    hello::features, Configuration, Credit, Data, ErrorCode, ErrorMsg, Frame, MsgType, OutFrame,
    UserPhase as Phase,
};
use tokio::sync::mpsc;

use super::places::Places;
use tokio_util::sync::CancellationToken;

use super::driver::{Cmd, Handle, ToUser};
use super::Job;
use crate::greeting::{self, Asked};
use crate::intake::Refused;
use crate::registry::UserEntry;
use crate::userconn::{Next, UserConn};
use crate::wire::Sink;
use crate::Shared;

/// Features the server agrees to in shared mode.
const AGREED: [&str; 6] = [
    features::ERROR,
    features::CREDIT,
    features::STATUS,
    features::QUEUE_FULL,
    features::ANY_LENGTH,
    features::SPIN_NOTIFY,
];

struct Session {
    shared: Arc<Shared>,
    sched: Handle,
    /// The user's connection, its hello, phase and configuration; the
    /// socket is shared with exclusive mode's writer (`wire::Sink`).
    conn: UserConn,
    /// A configuration that waits until this user's data in flight is answered.
    next_cfg: Option<(Configuration, Bytes)>,
    queue: Option<Arc<Places>>,
    /// Per class, a data message read while its class (or the function's
    /// queue) was full. Reads go on, so a message of another class that
    /// has room still gets in, and an urgent one waits for the next place
    /// before bulk does; a second message of a class that already waits
    /// stops reads (`blocked`) until that class gets a place. A pushed back
    /// user thus holds at most one message per class, plus that one.
    waiting: Vec<Option<Job>>,
    blocked: Option<Job>,
    outstanding: u64,
    credit: u64,
    /// Handler notifications dropped: the user did not agree `spin-notify`.
    notes_dropped: crate::notes::Dropped,
}

/// Removes the user from the registry and the scheduler however the session ends.
struct Registered(Arc<Shared>, Handle, u64);

impl Drop for Registered {
    fn drop(&mut self) {
        self.0.registry.remove_user(self.2);
        self.1.send(Cmd::Leave { user: self.2 });
    }
}

pub(crate) async fn run(
    shared: Arc<Shared>,
    sched: Handle,
    stream: Stream,
    peer: SocketAddr,
    stop: CancellationToken,
    prefix: &[u8],
    (user, entry): (u64, Arc<UserEntry>),
) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    sched.send(Cmd::Join { user, tx });
    let _registered = Registered(shared.clone(), sched.clone(), user);
    let (rd, wr) = stream.into_split();
    let out = Arc::new(Sink::new(wr));
    let writer = out.spawn_user_writer(shared.opts.io_timeout, peer, stop.clone());
    let shared_max = shared.opts.max_message;
    let reader = FrameReader::new(rd, shared.opts.max_message)
        .with_read_timeout(shared.opts.read_timeout)
        // What the authentication gate read ahead (docs/operations.md).
        .with_prefix(prefix);
    let mut s = Session {
        conn: UserConn::new((user, entry), peer, reader, out, shared_max),
        shared,
        sched,
        next_cfg: None,
        queue: None,
        waiting: (0..corefarm_smp::stream::CLASSES).map(|_| None).collect(),
        blocked: None,
        outstanding: 0,
        credit: 0,
        notes_dropped: Default::default(),
    };
    match s.main_loop(&stop, &mut rx).await {
        Ok(()) => tracing::info!(user = %peer, "user session ended"),
        Err(e) => tracing::warn!(user = %peer, "user session ended: {e}"),
    }
    s.conn.out.finish();
    drop(s);
    // The writer flushes what is queued (e.g. a final error) then exits.
    let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
}

impl Session {
    async fn main_loop(
        &mut self,
        stop: &CancellationToken,
        rx: &mut mpsc::UnboundedReceiver<ToUser>,
    ) -> Result<(), String> {
        loop {
            self.housekeeping().await?;
            // A user's messages read and not yet answered to it (computing,
            // or results waiting to go out) are bounded, with or without
            // credit: results come from the scheduler whether or not the
            // user reads them, and each may be as large as a message.
            let results_waiting = self.conn.outbound.as_ref().map_or(0, |o| o.len()) as u64;
            let unanswered = self.outstanding + results_waiting;
            let read = match self.conn.phase {
                Phase::Initial => true,
                Phase::Configuring => false,
                Phase::Routing => {
                    // The window (a registry lock) only matters past a
                    // queue's worth: it is at least 1.
                    let queue = crate::userconn::USER_QUEUE as u64;
                    self.next_cfg.is_none()
                        && self.blocked.is_none()
                        && (unanswered <= queue || unanswered < self.window() + queue)
                }
            };
            let queue = self.queue.clone();
            // Most urgent first: of two classes waiting for the queue's
            // next place, the more urgent takes it.
            let waiting: Vec<u8> = (0..self.waiting.len() as u8)
                .filter(|&c| self.waiting[c as usize].is_some())
                .collect();
            let chunks_waiting = self.conn.outbound.as_ref().is_some_and(|o| !o.is_empty());
            let out = self.conn.out.clone();
            let unflushed = self.conn.out.unflushed();
            tokio::select! {
                biased;
                _ = stop.cancelled() => return Ok(()),
                m = rx.recv() => match m {
                    Some(m) => self.on_sched(m).await?,
                    None => return self.fail(ErrorMsg::NO_ID, ErrorCode::Internal, "scheduler stopped".into()).await,
                },
                (c, p) = async { queue.expect("checked").take_first(&waiting).await }, if !waiting.is_empty() && queue.is_some() => {
                    if let (Some(p), Some(mut job)) = (p, self.waiting[c as usize].take()) {
                        job.permit = Some(p);
                        self.submit(job).await?;
                    }
                    // The message that stopped reads waited for this class.
                    if self.blocked.as_ref().is_some_and(|j| j.class == c) {
                        let job = self.blocked.take().expect("checked");
                        self.admit(job).await?;
                    }
                }
                // One chunk at a time into the sink, picked by class when
                // there is room: an urgent result passes queued bulk.
                _ = out.room(crate::chunked::SINK_DEPTH), if chunks_waiting => {
                    self.conn.feed_chunk()?;
                }
                next = self.conn.next(), if read => match next {
                    Next::Frame(f) => self.on_frame(f).await?,
                    Next::Placed(whole) => self.on_placed(whole).await?,
                    Next::Closed => return Ok(()),
                    Next::Fatal(code, reason) => return self.fail(ErrorMsg::NO_ID, code, reason).await,
                    Next::Failed(e) => return Err(e),
                },
                // Last, so only when nothing else is ready: what this
                // wake-up produced goes out in one write.
                _ = std::future::ready(()), if unflushed => { self.conn.out.flush(); }
            }
        }
    }

    /// Messages a user may have unanswered: what credit grants, and what
    /// bounds the reads of a user without credit (beside a queue's worth of
    /// results to go out).
    fn window(&self) -> u64 {
        let o = &self.shared.opts;
        o.user_window
            .map_or_else(
                || o.credit as u64 * self.shared.registry.node_count().max(1) as u64,
                u64::from,
            )
            .clamp(1, o.queue_limit.max(1) as u64)
    }

    /// A pending configuration once drained; credit toward credit users.
    async fn housekeeping(&mut self) -> Result<(), String> {
        self.conn
            .entry
            .outstanding
            .store(self.outstanding, Ordering::Relaxed);
        let results_out = self.conn.outbound.as_ref().is_none_or(|o| o.is_empty());
        if self.outstanding == 0 && results_out {
            if let Some((cfg, payload)) = self.next_cfg.take() {
                tracing::info!(user = %self.conn.peer, "reconfiguring");
                self.configure(cfg, payload);
            }
        }
        if self.conn.agreed(features::CREDIT)
            && self.conn.phase == Phase::Routing
            && self.next_cfg.is_none()
        {
            let window = self.window();
            // A result still waiting to go out counts as outstanding: credit
            // must not let a user that does not read pile up results here.
            let waiting = self.conn.outbound.as_ref().map_or(0, |o| o.len()) as u64;
            let used = self.outstanding + self.credit + waiting;
            if used < window {
                let grant = (window - used) as u32;
                self.credit += grant as u64;
                self.send(Credit { messages: grant }.to_frame()).await?;
            }
        }
        Ok(())
    }

    fn configure(&mut self, cfg: Configuration, payload: Bytes) {
        self.conn.set_phase(Phase::Configuring);
        self.queue = None;
        let (input_size, output_size) = (cfg.input_size, cfg.output_size);
        self.conn.cfg = Some(cfg);
        self.sched.send(Cmd::Configure {
            user: self.conn.user,
            payload,
            input_size,
            output_size,
        });
    }

    /// Queues a frame for the user; waits first while a queue's worth is
    /// unwritten (the user's pace, not memory, bounds what it is sent).
    async fn send(&mut self, f: OutFrame) -> Result<(), String> {
        Ok(self.conn.send(f).await?)
    }

    async fn send_error(&mut self, id: u32, code: ErrorCode, reason: String) -> Result<(), String> {
        Ok(self.conn.send_error(id, code, reason).await?)
    }

    async fn send_response(&mut self, ok: bool) -> Result<(), String> {
        Ok(self.conn.send_response(ok).await?)
    }

    /// Reports a fatal error as the protocol allows and ends the session.
    async fn fail(&mut self, id: u32, code: ErrorCode, reason: String) -> Result<(), String> {
        self.conn.report(id, code, &reason).await;
        Err(reason)
    }

    async fn on_sched(&mut self, m: ToUser) -> Result<(), String> {
        match m {
            ToUser::Configured { ok, errors, queue } => {
                for e in errors {
                    self.send_error(ErrorMsg::NO_ID, ErrorCode::ConfigurationFailed, e)
                        .await?;
                }
                if ok {
                    self.conn.set_phase(Phase::Routing);
                    self.queue = Some(queue);
                } else {
                    self.conn.set_phase(Phase::Initial);
                    self.conn.cfg = None;
                }
                self.send_response(ok).await
            }
            ToUser::Result {
                id,
                data,
                class,
                count,
            } => {
                self.outstanding = self.outstanding.saturating_sub(1);
                let data = match self.fit_result(data, count) {
                    Ok(data) => data,
                    // Like a failed core (`ToUser::Failed` below).
                    Err(why) if self.conn.agreed(features::ERROR) => {
                        return self.send_error(id, ErrorCode::CoreFailure, why).await
                    }
                    Err(why) => return self.fail(id, ErrorCode::CoreFailure, why).await,
                };
                self.conn.entry.results.fetch_add(1, Ordering::Relaxed);
                if let Some(o) = self.conn.outbound.as_mut() {
                    if let Err(e) = o.push(id, class, data) {
                        return self.fail(id, ErrorCode::Internal, e.to_string()).await;
                    }
                    return Ok(());
                }
                match OutFrame::data(id, data) {
                    Ok(f) => self.send(f).await,
                    Err(e) => self.fail(id, e.code(), e.to_string()).await,
                }
            }
            // Sent before the message's result (which may still go as
            // chunks through `outbound`): the channel is first in, first out.
            ToUser::Notification(note) if self.conn.agreed(features::SPIN_NOTIFY) => {
                match note.to_frame() {
                    Ok(f) => {
                        self.shared.metrics.notification(true);
                        self.send(f).await
                    }
                    Err(e) => {
                        tracing::warn!(user = %self.conn.peer, "notification not relayed: {e}");
                        Ok(())
                    }
                }
            }
            ToUser::Notification(note) => {
                self.notes_dropped.count(&self.conn.peer, &note);
                self.shared.metrics.notification(false);
                Ok(())
            }
            ToUser::Failed { id, code, reason } => {
                self.outstanding = self.outstanding.saturating_sub(1);
                if self.conn.agreed(features::ERROR) {
                    self.send_error(id, code, reason).await
                } else {
                    // A seed user (or a hello without `error`) cannot be
                    // told about one input: the session ends.
                    self.fail(id, code, reason).await
                }
            }
        }
    }

    /// A result as this user takes it ([`crate::anylen::for_user`]).
    fn fit_result(&self, data: Bytes, count: u32) -> Result<Bytes, String> {
        let output_size = self.conn.cfg.as_ref().map_or(0, |c| c.output_size as usize);
        let expect = count as usize * output_size;
        let agreed = data.len() != expect && self.conn.agreed(features::ANY_LENGTH);
        crate::anylen::for_user(data, expect, agreed, self.conn.result_limit)
    }

    async fn on_frame(&mut self, f: Frame) -> Result<(), String> {
        match self.conn.asked(f.ty) {
            Asked::Hello => self.on_hello(f).await,
            Asked::Configuration => self.on_configuration(f).await,
            Asked::Data => self.on_data(f).await,
            Asked::Chunk => self.on_chunk(f).await,
            Asked::Status => {
                let status = self.shared.status(Some(self.conn.user));
                self.send(status.to_frame()).await
            }
            Asked::Refused(code, why) => self.fail(ErrorMsg::NO_ID, code, why).await,
        }
    }

    async fn on_hello(&mut self, f: Frame) -> Result<(), String> {
        let h = match greeting::user_hello(&f.payload) {
            Ok(h) => h,
            Err(r) => {
                self.conn.refuse_hello(&r).await;
                return Err(r.reason);
            }
        };
        let greeting::Agreed {
            hello: mut agreed,
            chunks,
        } = greeting::agree(&h, &AGREED, self.shared.opts.max_message, self.conn.peer);
        if let Some(c) = chunks {
            self.conn.inbound = Some(c.inbound);
            self.conn.outbound = Some(c.outbound);
        }
        self.conn.hello = Some(agreed.clone());
        self.conn.result_limit = crate::anylen::user_limit(self.shared.opts.max_message, Some(&h));
        self.conn.entry.set_hello(h.name.clone());
        // Nodes are shared: every connected node may serve this user. An
        // observer (`nodes: 0`, e.g. `corefarm status`) is told it has none.
        agreed.nodes = match h.nodes {
            Some(0) => Some(0),
            _ => Some(self.shared.registry.node_count() as u32),
        };
        self.send(agreed.to_frame()).await
    }

    async fn on_configuration(&mut self, f: Frame) -> Result<(), String> {
        let payload = f.payload.clone();
        let cfg = match Configuration::parse(f.payload) {
            Ok(c) => c,
            Err(e) => {
                let why = format!("invalid configuration: {e}");
                return self.fail(ErrorMsg::NO_ID, e.code(), why).await;
            }
        };
        let max = self.shared.opts.max_message;
        if let Err(e) = cfg.check_limits(max) {
            // Refused before any node sees it; the session goes on as before.
            let why = format!("configuration refused: {e} (--max-message is {max})");
            self.send_error(ErrorMsg::NO_ID, e.code(), why).await?;
            return self.send_response(false).await;
        }
        if self.conn.phase == Phase::Routing {
            // Seed §3.3.1.3: this user's data in flight is answered first.
            self.next_cfg = Some((cfg, payload));
        } else {
            self.configure(cfg, payload);
        }
        Ok(())
    }

    async fn on_data(&mut self, f: Frame) -> Result<(), String> {
        let d = match Data::parse(f.payload) {
            Ok(d) => d,
            Err(e) => return self.fail(ErrorMsg::NO_ID, e.code(), e.to_string()).await,
        };
        self.accept_data(d, corefarm_smp::stream::DEFAULT_CLASS)
            .await
    }

    /// A chunk; the message it completes is queued in the chunks' class.
    async fn on_chunk(&mut self, f: Frame) -> Result<(), String> {
        match self.conn.chunk(f.payload) {
            Ok(whole) => self.on_whole(whole).await,
            Err(e) => self.fail(ErrorMsg::NO_ID, e.code(), e.to_string()).await,
        }
    }

    /// A chunk read into its message's buffer: allowed when a chunk frame
    /// would be, then as one.
    async fn on_placed(&mut self, whole: Option<Message>) -> Result<(), String> {
        if let Asked::Refused(code, why) = self.conn.asked(MsgType::Chunk) {
            return self.fail(ErrorMsg::NO_ID, code, why).await;
        }
        self.on_whole(whole).await
    }

    /// The message a chunk completed, if any, queued in the chunks' class.
    async fn on_whole(&mut self, whole: Option<Message>) -> Result<(), String> {
        let Some(m) = whole else { return Ok(()) };
        let class = m.class;
        self.accept_data(Data::from(m), class).await
    }

    async fn accept_data(&mut self, d: Data, class: u8) -> Result<(), String> {
        let count = match self.conn.intake(&mut self.credit, d.id, d.data.len()) {
            Ok(n) => n,
            Err(Refused::ById(id, code, why)) => return self.send_error(id, code, why).await,
            Err(Refused::End(id, code, why)) => return self.fail(id, code, why).await,
        };
        let mut job = Job::new(self.conn.user, d.id, d.data, count);
        job.class = class;
        let place = self.queue.as_ref().map(|q| q.try_take(class));
        match place {
            Some(Err(full)) if self.conn.agreed(features::QUEUE_FULL) => {
                let why = format!("{full}; send it again later");
                // Sent even without the error feature: queue-full asked for it.
                self.send(ErrorMsg::new(d.id, ErrorCode::QueueFull, why).to_frame())
                    .await
            }
            Some(Ok(p)) => {
                job.permit = Some(p);
                self.outstanding += 1;
                self.submit(job).await
            }
            _ => {
                self.outstanding += 1;
                self.park(job);
                Ok(())
            }
        }
    }

    /// A job already counted as outstanding: submitted if its class has a
    /// place now, else parked.
    async fn admit(&mut self, mut job: Job) -> Result<(), String> {
        match self.queue.as_ref().map(|q| q.try_take(job.class)) {
            Some(Ok(p)) => {
                job.permit = Some(p);
                self.submit(job).await
            }
            _ => {
                self.park(job);
                Ok(())
            }
        }
    }

    /// Back-pressure: the job waits for a place in its class; if one of
    /// its class already waits, reads stop until that one has a place.
    fn park(&mut self, job: Job) {
        let last = self.waiting.len() - 1;
        let slot = &mut self.waiting[(job.class as usize).min(last)];
        if slot.is_none() {
            *slot = Some(job);
        } else {
            self.blocked = Some(job);
        }
    }

    /// Hands an admitted job to the scheduler.
    async fn submit(&mut self, job: Job) -> Result<(), String> {
        let id = job.id;
        if !self.sched.send(Cmd::Data(job)) {
            return self
                .fail(id, ErrorCode::Internal, "scheduler stopped".into())
                .await;
        }
        Ok(())
    }
}
