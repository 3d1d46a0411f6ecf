//! The user session (seed 000 §3.3.1): one task per user connection, one
//! state machine for hello and seed-format users in both sharing modes.
//!
//! States: Initial → Nodes Configuration → Data Routing, and back to Nodes
//! Configuration on a new configuration once no data is in flight; the
//! session ends with a [`SessionEnd`]. Every protocol feature (credit,
//! chunks, any-length, status, queue-full, spin-notify, error) is handled
//! here, once. Where a configuration and a data message go, and what losing
//! a node means, is a [`Placement`]'s answer:
//!
//! - [`owned::Owned`] (exclusive mode): the nodes this user configured,
//!   owned by this task, so the data path takes no lock;
//! - [`scheduled::Scheduled`] (shared mode): a handle to the scheduler,
//!   which owns every node and the per-function queues.
//!
//! A hello that asks for a group hands the connection to [`crate::group`].
//! A placement never touches frames: it reports [`Outcome`]s, which the
//! session turns into frames to the user.
//!
//! - this file: the task, its event loop, replies and the session's end;
//! - `frames`: what the user sends (hello, configuration, data, status);
//! - `answers`: outcomes to the user, credit, the idle check;
//! - `placement`: the seam.

mod answers;
mod end;
mod frames;
pub(crate) mod owned;
mod placement;
mod quota;
pub(crate) mod scheduled;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use corefarm_smp::codec::FrameReader;
use corefarm_smp::{Configuration, ErrorCode, OutFrame, UserPhase as Phase};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::limits::Place;
use crate::registry::UserEntry;
use crate::sink::Sink;
use crate::tls::Stream;
use crate::userconn::{Next, UserConn};
use crate::ServerState;

pub(crate) use end::SessionEnd;
pub(crate) use placement::{Admitted, Cx, Input, Outcome, Placement, View};

/// How often timers (node deadlines, the idle user) are checked.
const TICK: Duration = Duration::from_millis(100);

/// A configuration that arrived while routing: applied (or refused) once
/// no data is in flight, so its answer comes after every earlier result.
enum NextCfg {
    Apply(Configuration, Bytes),
    Refuse(corefarm_smp::ProtocolError),
}

pub(crate) struct Session<P: Placement> {
    shared: Arc<ServerState>,
    /// The user's connection, its hello, phase and configuration.
    conn: UserConn,
    placement: P,
    next_cfg: Option<NextCfg>,
    /// What the placement reported and the user has not been told yet;
    /// drained after every call into the placement (kept to reuse its buffer).
    outbox: VecDeque<Outcome>,
    /// Data messages received and not yet answered (the seed's data counter).
    outstanding: u64,
    /// Credits granted to the user and not yet used.
    credit: u64,
    /// Last message from the user or answer to it (for --user-idle-timeout).
    last_activity: Instant,
    /// The connection's `--max-users` place, which a new connection may
    /// take back while this one is not configured (`limits::Places`).
    place: Arc<Place>,
    /// A message has come from the user (else the first-message deadline
    /// applies, see `check_idle`).
    spoke: bool,
    /// Handler notifications dropped: the user did not agree `spin-notify`.
    notes_dropped: crate::notes::Dropped,
    /// What the session took of its user's `max_queued_bytes`.
    quota: quota::Quota,
}

/// Removes the user from the registry however the task ends.
struct Registered(Arc<ServerState>, u64);

impl Drop for Registered {
    fn drop(&mut self) {
        self.0.registry.remove_user(self.1);
    }
}

/// A user connection through its way in, and the place it holds.
pub(crate) struct Conn {
    pub stream: Stream,
    pub peer: SocketAddr,
    pub place: Place,
}

/// Serves one user connection until it ends; `placement` says where its
/// work goes.
pub(crate) async fn run<P: Placement>(
    shared: Arc<ServerState>,
    placement: P,
    Conn {
        stream,
        peer,
        place,
    }: Conn,
    stop: CancellationToken,
    prefix: &[u8],
    (user, entry): (u64, Arc<UserEntry>),
) {
    let _registered = Registered(shared.clone(), user);
    // Given back once the connection is closed, not before its last words.
    let place = Arc::new(place);
    let _place = place.clone();
    let (rd, wr) = stream.into_split();
    let out = Arc::new(Sink::new(wr));
    let writer = out.spawn_user_writer(shared.opts.io_timeout, peer, stop.clone());
    let reader = FrameReader::new(rd, shared.opts.max_message)
        // What the authentication gate read ahead (docs/operations.md).
        .with_prefix(prefix)
        .with_read_timeout(shared.opts.read_timeout)
        .with_meter(Box::new(shared.budget.charge()));
    let max = shared.opts.max_message;
    let mut s = Session {
        conn: UserConn::new((user, entry), peer, reader, out, max),
        shared,
        placement,
        next_cfg: None,
        outbox: VecDeque::new(),
        outstanding: 0,
        credit: 0,
        last_activity: Instant::now(),
        place,
        spoke: false,
        notes_dropped: Default::default(),
        quota: Default::default(),
    };
    let mut end = s.main_loop(&stop).await;
    if let SessionEnd::Group = end {
        // The agreed hello was queued by the main loop, which would have
        // written it before its next wait: the group code takes over first.
        s.flush_writes();
        let (shared, conn) = (&s.shared, &mut s.conn);
        let account = conn.entry.account().cloned();
        end = match crate::group::serve(shared, user, account, &mut conn.reader, &conn.out, &stop)
            .await
        {
            Ok(()) => SessionEnd::Closed,
            Err(e) => SessionEnd::GroupEnded(e),
        };
    }
    s.close(&end).await;
    s.placement.finish();
    s.conn.out.finish();
    drop(s);
    // The writer flushes what is queued (e.g. a final error) then exits.
    let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
}

impl<P: Placement> Session<P> {
    async fn main_loop(&mut self, stop: &CancellationToken) -> SessionEnd {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let evicted = self.place.evicted().clone();
        loop {
            // Made before `pump` looks for room for a held input, so an
            // answer to another of the user's sessions in between wakes it.
            let waiting = self.quota.waiting_on(|| self.account().clone());
            let room = waiting.as_deref().map(crate::accounts::Account::room);
            let room = async {
                match room {
                    Some(r) => r.await,
                    None => std::future::pending().await,
                }
            };
            if let Err(e) = self.pump().await {
                return e;
            }
            self.publish();
            let held = self.quota.held.is_some();
            let read_user = self.wants_user_input();
            let unflushed = self.unflushed();
            let out = self.conn.out.clone();
            let chunks_waiting = self.results_waiting() > 0;
            let r = tokio::select! {
                biased;
                _ = stop.cancelled() => return SessionEnd::Closed,
                _ = evicted.cancelled() => return self.evicted(),
                ev = self.placement.event() => self.on_placement(ev).await,
                _ = tick.tick() => self.on_tick().await,
                // Another answer to the user: room for the held input, maybe.
                _ = room, if held => Ok(()),
                // After the placement's events, so a result that just
                // arrived competes by class for the next chunk; before user
                // input, so reads do not hold results back while the socket
                // takes them.
                _ = out.room(crate::chunked::SINK_DEPTH), if chunks_waiting => self.feed_chunk(),
                next = self.conn.next(), if read_user => {
                    self.last_activity = Instant::now();
                    self.spoke = true;
                    if self.conn.cfg.is_none() {
                        self.place.touch();
                    }
                    match next {
                        Next::Frame(f) => self.on_user_frame(f).await,
                        Next::Placed(whole) => self.on_placed(whole).await,
                        Next::Closed => Err(SessionEnd::Closed),
                        Next::Fatal(code, reason) => Err(SessionEnd::Broke { code, reason }),
                        Next::BadHello(r) => Err(SessionEnd::HelloRefused(r)),
                        Next::Held(h) => Err(SessionEnd::Held(h)),
                        Next::Failed(e) => Err(SessionEnd::Link(e)),
                    }
                }
                // Last, so only when nothing else is ready: what this
                // wake-up produced goes out in one write per socket.
                _ = std::future::ready(()), if unflushed => {
                    self.flush_writes();
                    Ok(())
                }
            };
            if let Err(e) = r {
                return e;
            }
        }
    }

    /// Counters for the status extension: two relaxed stores per event.
    fn publish(&self) {
        let entry = &self.conn.entry;
        entry.outstanding.store(self.outstanding, Ordering::Relaxed);
        entry
            .queued
            .store(self.placement.queued(), Ordering::Relaxed);
    }

    /// Result chunks waiting to go out to a `chunks` user.
    fn results_waiting(&self) -> u64 {
        self.conn.outbound.as_ref().map_or(0, |o| o.len()) as u64
    }

    /// What the placement needs to know of the session to decide.
    fn view(&self) -> View {
        View {
            outstanding: self.outstanding,
            results_waiting: self.results_waiting(),
            credit: self.conn.agreed(corefarm_smp::hello::features::CREDIT),
        }
    }

    /// Reads from the user only when the message could be acted on at once;
    /// otherwise the data waits in the user's socket (TCP back-pressure).
    fn wants_user_input(&mut self) -> bool {
        match self.conn.phase {
            Phase::Initial => true,
            Phase::Configuring => false,
            Phase::Routing => {
                let view = self.view();
                self.next_cfg.is_none()
                    && self.quota.held.is_none()
                    && self.placement.ready_for_data(&view)
            }
        }
    }

    /// A placement's event, and what it reported.
    async fn on_placement(&mut self, ev: P::Event) -> Result<(), SessionEnd> {
        let mut cx = Cx {
            out: &mut self.outbox,
            credit_blocked: self.conn.agreed(corefarm_smp::hello::features::CREDIT)
                && self.credit == 0,
        };
        self.placement.handle(ev, &mut cx);
        self.deliver().await
    }

    async fn on_tick(&mut self) -> Result<(), SessionEnd> {
        self.check_idle()?;
        self.placement.tick();
        Ok(())
    }

    /// Frames queued for the user or a node and not written yet.
    fn unflushed(&self) -> bool {
        self.conn.out.unflushed() || self.placement.unflushed()
    }

    /// Writes what this wake-up queued: one `writev` per socket for every
    /// message and credit produced since the session last waited.
    fn flush_writes(&mut self) {
        self.placement.flush();
        self.conn.out.flush();
    }

    async fn send_user(&mut self, f: OutFrame) -> Result<(), SessionEnd> {
        // Back-pressure: when the user stops reading, the session (and so
        // the results) waits after a few queued messages. Written when the
        // session is about to wait (`flush_writes`).
        Ok(self.conn.send(f).await?)
    }

    /// A result to the user: whole, or as chunks of its class to a
    /// `chunks` user. The chunks go out as the socket takes them
    /// ([`Session::feed_chunk`]); like [`Session::send_user`], the session
    /// waits once a queue's worth of results is waiting.
    async fn send_result(&mut self, id: u32, class: u8, data: Bytes) -> Result<(), SessionEnd> {
        let Some(o) = self.conn.outbound.as_mut() else {
            return match OutFrame::data(id, data) {
                Ok(f) => self.send_user(f).await,
                Err(e) => Err(SessionEnd::Unsendable {
                    id,
                    code: e.code(),
                    reason: e.to_string(),
                }),
            };
        };
        if let Err(e) = o.push(id, class, data) {
            return Err(SessionEnd::Unsendable {
                id,
                code: ErrorCode::Internal,
                reason: e.to_string(),
            });
        }
        while self.results_waiting() > crate::userconn::USER_QUEUE as u64 {
            self.conn.out.room(crate::chunked::SINK_DEPTH).await;
            self.feed_chunk()?;
        }
        Ok(())
    }

    /// Hands the most urgent waiting chunk to the user's sink.
    fn feed_chunk(&mut self) -> Result<(), SessionEnd> {
        Ok(self.conn.feed_chunk()?)
    }

    async fn send_error(
        &mut self,
        id: u32,
        code: ErrorCode,
        reason: impl Into<String>,
    ) -> Result<(), SessionEnd> {
        Ok(self.conn.send_error(id, code, reason).await?)
    }

    async fn send_response(&mut self, ok: bool) -> Result<(), SessionEnd> {
        Ok(self.conn.send_response(ok).await?)
    }
}
