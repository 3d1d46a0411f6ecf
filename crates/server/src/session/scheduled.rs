//! Shared mode's placement: a handle to the scheduler, which owns every
//! node and the per-function queues. Configurations and data go to it;
//! answers come back on this user's channel.
//!
//! What a seed-format user sees is the seed's behaviour: a positive
//! configuration response once at least one replica of its function is
//! configured, its results to it alone, and a new configuration only after
//! its own data in flight has been answered. A full function queue stops
//! reads from the user's socket (TCP back-pressure), unless a hello user
//! asked for the `queue-full` feature: then that message gets an error.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use corefarm_smp::{hello::features, Configuration};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{Admitted, Cx, Input, Outcome, Placement, SessionEnd, View};
use crate::sched::driver::{Cmd, Handle, ToUser};
use crate::sched::places::{Place, Places};
use crate::sched::Job;
use crate::ServerState;

/// What wakes a scheduled placement.
pub(crate) enum SchedEvent {
    /// An answer from the scheduler; `None` once it has stopped.
    Sched(Option<ToUser>),
    /// A place in the function's queue for a message of this class.
    Place(u8, Option<Place>),
}

pub(crate) struct Scheduled {
    shared: Arc<ServerState>,
    sched: Handle,
    user: u64,
    rx: mpsc::UnboundedReceiver<ToUser>,
    queue: Option<Arc<Places>>,
    /// Per class, a data message read while its class (or the function's
    /// queue) was full. Reads go on, so a message of another class that
    /// has room still gets in, and an urgent one waits for the next place
    /// before bulk does; a second message of a class that already waits
    /// stops reads (`blocked`) until that class gets a place. A pushed back
    /// user thus holds at most one message per class, plus that one.
    waiting: Vec<Option<Job>>,
    blocked: Option<Job>,
    /// When each unanswered message was admitted, by the user's id: a
    /// result's latency is measured from there (queueing included), as
    /// the scheduler does not report a node round trip. Owned by the
    /// session's task, so the per-user figures take no lock.
    admitted: HashMap<u32, Instant>,
    /// The user agreed `moves-on` in its hello.
    moves_on: bool,
}

impl Scheduled {
    /// Joins the scheduler as the user of `entry`.
    pub(crate) fn new(
        shared: Arc<ServerState>,
        sched: Handle,
        entry: Arc<crate::registry::UserEntry>,
    ) -> Scheduled {
        let (tx, rx) = mpsc::unbounded_channel();
        let user = entry.id;
        sched.send(Cmd::Join { user, tx, entry });
        Scheduled {
            shared,
            sched,
            user,
            rx,
            queue: None,
            waiting: (0..corefarm_smp::stream::CLASSES).map(|_| None).collect(),
            blocked: None,
            admitted: HashMap::new(),
            moves_on: false,
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

    /// A job already counted as outstanding: submitted if its class has a
    /// place now, else parked.
    fn admit(&mut self, mut job: Job) -> Result<(), SessionEnd> {
        match self.queue.as_ref().map(|q| q.try_take(job.class)) {
            Some(Ok(p)) => {
                job.permit = Some(p);
                self.submit(job)
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
    fn submit(&mut self, job: Job) -> Result<(), SessionEnd> {
        let id = job.id;
        if !self.sched.send(Cmd::Data(job)) {
            return Err(SessionEnd::SchedulerStopped { id });
        }
        Ok(())
    }

    fn on_sched(&mut self, m: ToUser, cx: &mut Cx<'_>) {
        let o = match m {
            ToUser::Configured { ok, errors, queue } => {
                if ok {
                    self.queue = Some(queue);
                } else {
                    // Once per configuration refused to the user.
                    self.shared
                        .metrics
                        .error(crate::metrics::ErrorKind::ConfigurationFailed);
                }
                let warnings = errors
                    .into_iter()
                    .map(|e| (corefarm_smp::ErrorCode::ConfigurationFailed, e))
                    .collect();
                Outcome::Configured { ok, warnings }
            }
            ToUser::Result {
                id,
                data,
                class,
                count,
            } => Outcome::Result {
                id,
                class,
                data,
                count,
                rtt: self.admitted.remove(&id).map(|t| t.elapsed()),
                node: None,
            },
            ToUser::Notification(q) => Outcome::Notification(q.into_note()),
            ToUser::Failed { id, code, reason } => {
                self.admitted.remove(&id);
                Outcome::Failed { id, code, reason }
            }
        };
        cx.report(o);
    }
}

impl Drop for Scheduled {
    fn drop(&mut self) {
        self.sched.send(Cmd::Leave { user: self.user });
    }
}

impl Placement for Scheduled {
    type Event = SchedEvent;

    const FEATURES: &'static [&'static str] = &[
        features::ERROR,
        features::CREDIT,
        features::STATUS,
        features::QUEUE_FULL,
        features::ANY_LENGTH,
        features::SPIN_NOTIFY,
        features::MOVES_ON,
    ];

    /// A full function queue, not the socket buffer, paces a user here.
    const PACED_BY_READS: bool = false;

    async fn hello(&mut self, want: Option<u32>, _chunks: bool, moves_on: bool) -> u32 {
        self.moves_on = moves_on;
        // Nodes are shared: every connected node may serve this user. An
        // observer (`nodes: 0`, e.g. `corefarm status`) is told it has none.
        match want {
            Some(0) => 0,
            _ => self.shared.registry.node_count() as u32,
        }
    }

    async fn configure(
        &mut self,
        cfg: &Configuration,
        payload: Bytes,
        _first: bool,
        _cx: &mut Cx<'_>,
    ) {
        self.queue = None;
        self.sched.send(Cmd::Configure {
            user: self.user,
            payload,
            input_size: cfg.input_size,
            output_size: cfg.output_size,
            moves_on: self.moves_on,
        });
    }

    fn ready_for_data(&mut self, v: &View) -> bool {
        // A user's messages read and not yet answered to it (computing, or
        // results waiting to go out) are bounded, with or without credit:
        // results come from the scheduler whether or not the user reads
        // them, and each may be as large as a message. The window (a
        // registry lock) only matters past a queue's worth: it is at least 1.
        let unanswered = v.outstanding + v.results_waiting;
        let queue = crate::userconn::USER_QUEUE as u64;
        self.blocked.is_none() && (unanswered <= queue || unanswered < self.window() + queue)
    }

    fn data(
        &mut self,
        input: Input,
        queue_full: bool,
        _cx: &mut Cx<'_>,
    ) -> Result<Admitted, SessionEnd> {
        let mut job = Job::new(self.user, input.id, input.data, input.count);
        job.class = input.class;
        let admitted = match self.queue.as_ref().map(|q| q.try_take(input.class)) {
            Some(Err(full)) if queue_full => return Ok(Admitted::QueueFull(full.to_string())),
            Some(Ok(p)) => {
                job.permit = Some(p);
                self.submit(job)
            }
            _ => {
                self.park(job);
                Ok(())
            }
        };
        admitted?;
        self.admitted.insert(input.id, Instant::now());
        Ok(Admitted::Placed)
    }

    fn pump(&mut self) {}

    fn credit_window(&self) -> u64 {
        self.window()
    }

    async fn event(&mut self) -> SchedEvent {
        // Most urgent first: of two classes waiting for the queue's next
        // place, the more urgent takes it.
        let waiting: Vec<u8> = (0..self.waiting.len() as u8)
            .filter(|&c| self.waiting[c as usize].is_some())
            .collect();
        let queue = self.queue.clone().filter(|_| !waiting.is_empty());
        tokio::select! {
            biased;
            m = self.rx.recv() => SchedEvent::Sched(m),
            (c, p) = async { queue.expect("checked").take_first(&waiting).await }, if queue.is_some() => {
                SchedEvent::Place(c, p)
            }
        }
    }

    fn handle(&mut self, ev: SchedEvent, cx: &mut Cx<'_>) {
        let r = match ev {
            SchedEvent::Sched(Some(m)) => {
                self.on_sched(m, cx);
                Ok(())
            }
            SchedEvent::Sched(None) => Err(SessionEnd::SchedulerStopped {
                id: corefarm_smp::ErrorMsg::NO_ID,
            }),
            SchedEvent::Place(c, p) => {
                let mut r = Ok(());
                if let (Some(p), Some(mut job)) = (p, self.waiting[c as usize].take()) {
                    job.permit = Some(p);
                    r = self.submit(job);
                }
                // The message that stopped reads waited for this class.
                if r.is_ok() && self.blocked.as_ref().is_some_and(|j| j.class == c) {
                    let job = self.blocked.take().expect("checked");
                    r = self.admit(job);
                }
                r
            }
        };
        if let Err(e) = r {
            cx.report(Outcome::End(e));
        }
    }

    fn tick(&mut self) {}

    /// The scheduler shares nodes among users: an idle one holds none.
    fn wanted_elsewhere(&self) -> Option<usize> {
        None
    }

    fn label(&self, _node: u64) -> Option<String> {
        None
    }

    /// Waiting work is the function queue's, which the scheduler's part
    /// of the status shows.
    fn queued(&self) -> u64 {
        0
    }

    fn unflushed(&self) -> bool {
        false
    }

    fn flush(&mut self) {}

    fn finish(&mut self) {}
}
