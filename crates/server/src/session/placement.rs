//! The seam between the session and where its work runs. A placement
//! answers three questions — where a configuration goes, where a data
//! message goes, what losing a node means — and reports what came of them
//! as [`Outcome`]s, in order. It never touches a frame to the user.

use std::collections::VecDeque;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use corefarm_smp::{Configuration, ErrorCode, Notification};

use super::SessionEnd;

/// A data message the session accepted (checked, counted, credit spent).
pub(crate) struct Input {
    /// The user's id for it.
    pub id: u32,
    pub data: Bytes,
    /// Inputs it carries.
    pub count: u32,
    /// Priority class, 0 most urgent: the class of its chunks, or
    /// `stream::DEFAULT_CLASS` for a message sent whole.
    pub class: u8,
}

/// What became of a data message handed to a placement.
pub(crate) enum Admitted {
    /// It is the placement's now; an answer follows as an [`Outcome`].
    Placed,
    /// Its function's queue is full and the user asked to hear so
    /// (`queue-full`): the message is the user's again, with this reason.
    QueueFull(String),
}

/// What a placement reports to the session, in the order it happened.
pub(crate) enum Outcome {
    /// The answer to the configuration: `warnings` go to the user (as error
    /// messages, before the response), then the response.
    Configured {
        ok: bool,
        warnings: Vec<(ErrorCode, String)>,
    },
    /// A data message's result, as the node sent it.
    Result {
        id: u32,
        class: u8,
        data: Bytes,
        /// Inputs of the data message: the result's expected length.
        count: u32,
        /// Dispatch to result, when the placement timed it.
        rtt: Option<Duration>,
        /// The node it came from, to name in an error ([`Placement::label`]).
        node: Option<u64>,
    },
    /// A data message failed (a core failed on it, or its node cannot serve it).
    Failed {
        id: u32,
        code: ErrorCode,
        reason: String,
    },
    /// A handler's notification, with the user's id; before its result.
    Notification(Notification),
    /// A data message that will not be served, told by id ahead of the
    /// session's end (not counted as answered: the session ends).
    Unserved {
        id: u32,
        code: ErrorCode,
        reason: String,
    },
    /// The session cannot go on.
    End(SessionEnd),
}

/// What the session lends a placement while it handles an event.
pub(crate) struct Cx<'a> {
    pub out: &'a mut VecDeque<Outcome>,
    /// A credit user has no credit left: a result came back while the user
    /// was held by credit (the adaptive window grows only then).
    pub credit_blocked: bool,
}

impl Cx<'_> {
    pub fn report(&mut self, o: Outcome) {
        self.out.push_back(o);
    }
}

/// The session's counters a placement decides by.
pub(crate) struct View {
    /// Data messages read and not yet answered.
    pub outstanding: u64,
    /// Results waiting to go out as chunks.
    pub results_waiting: u64,
    /// The user agreed `credit`.
    pub credit: bool,
}

pub(crate) trait Placement: Send {
    /// What wakes the placement (a node's message, the scheduler's answer).
    type Event: Send;

    /// Extension features the server agrees to when a user asks for them.
    const FEATURES: &'static [&'static str];

    /// The user's socket receive buffer bounds what it has sent and not
    /// had read: a user without credit is read only when a node can take
    /// its message (see `Session::bound_receive_buffer`).
    const PACED_BY_READS: bool;

    /// A hello asking for `want` nodes (`Some(0)`: none, an observer);
    /// `chunks`: the user agreed chunks; `moves_on`: it agreed `moves-on`
    /// (it has other servers, so it is not held waiting for nodes while
    /// none is connected). Returns the node count the hello's answer names.
    fn hello(
        &mut self,
        want: Option<u32>,
        chunks: bool,
        moves_on: bool,
    ) -> impl Future<Output = u32> + Send;

    /// A configuration checked by the session, to apply; `first` when the
    /// session was unconfigured (else it replaces the previous one, with no
    /// data in flight). Its answer is an [`Outcome::Configured`], now or later.
    fn configure(
        &mut self,
        cfg: &Configuration,
        payload: Bytes,
        first: bool,
        cx: &mut Cx<'_>,
    ) -> impl Future<Output = ()> + Send;

    /// Whether a data message read now could be placed at once (otherwise
    /// it waits in the user's socket: TCP back-pressure).
    fn ready_for_data(&mut self, v: &View) -> bool;

    /// A data message to place. `queue_full`: the user agreed `queue-full`.
    fn data(
        &mut self,
        input: Input,
        queue_full: bool,
        cx: &mut Cx<'_>,
    ) -> Result<Admitted, SessionEnd>;

    /// Housekeeping after every event while routing (re-dispatch).
    fn pump(&mut self);

    /// Messages a credit user may have unanswered.
    fn credit_window(&self) -> u64;

    /// The next event; cancel-safe (the session waits on it in a `select!`).
    fn event(&mut self) -> impl Future<Output = Self::Event> + Send;

    /// Handles an event; what came of it goes to `cx`.
    fn handle(&mut self, ev: Self::Event, cx: &mut Cx<'_>);

    /// A timer tick: deadlines of the placement's own.
    fn tick(&mut self);

    /// For an idle session: `Some(nodes it holds)` when another user waits
    /// for them and nothing of this user waits in the placement.
    fn wanted_elsewhere(&self) -> Option<usize>;

    /// A node's name, for a reason the user reads.
    fn label(&self, node: u64) -> Option<String>;

    /// Data messages waiting in the placement for a node.
    fn queued(&self) -> u64;

    /// Frames queued to nodes and not written yet.
    fn unflushed(&self) -> bool;
    fn flush(&mut self);

    /// The session has ended: give back what it held.
    fn finish(&mut self);
}
