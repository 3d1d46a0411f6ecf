//! Results routed to whoever waits for them.
//!
//! A data message sent with `submit_pending` registers its id before it is
//! written; the reader thread hands that id's result (or error) to the
//! [`Pending`] returned to the caller and to nobody else, so any number of
//! threads (and `map` calls) can stream through one connection without
//! taking each other's results.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use corefarm_smp::ErrorMsg;

use crate::error::Failure;
use crate::{ClientError, Output, Result};

/// What arrived for one id.
#[derive(Debug)]
pub(crate) enum Outcome {
    Data(Output),
    /// The server's error for this data message.
    Error(ErrorMsg),
    /// The connection ended first.
    Failed(Failure),
}

impl Outcome {
    fn into_result(self) -> Result<Output> {
        match self {
            Outcome::Data(o) => Ok(o),
            Outcome::Error(e) => Err(ClientError::Server(e)),
            Outcome::Failed(f) => Err(f.to_error("while waiting for this result")),
        }
    }
}

type Callback = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct SlotState {
    outcome: Option<Outcome>,
    /// The outcome was handed to a caller already.
    taken: bool,
    /// The `Pending` was dropped: discard the outcome when it comes.
    abandoned: bool,
    waker: Option<Waker>,
    on_ready: Option<Callback>,
}

/// Where the reader thread puts one id's outcome.
pub(crate) struct Slot {
    id: u32,
    state: Mutex<SlotState>,
    cond: Condvar,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot").field("id", &self.id).finish()
    }
}

impl Slot {
    pub(crate) fn new(id: u32) -> Arc<Slot> {
        Arc::new(Slot {
            id,
            state: Mutex::new(SlotState::default()),
            cond: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Its `Pending` was dropped: nobody waits for the outcome.
    pub(crate) fn abandoned(&self) -> bool {
        self.lock().abandoned
    }

    /// Delivers the outcome (first one wins) and runs the waiter's wake-ups
    /// outside the lock.
    pub(crate) fn complete(&self, outcome: Outcome) {
        let mut st = self.lock();
        if st.abandoned || st.taken || st.outcome.is_some() {
            return;
        }
        st.outcome = Some(outcome);
        let waker = st.waker.take();
        let on_ready = st.on_ready.take();
        drop(st);
        self.cond.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
        if let Some(f) = on_ready {
            f();
        }
    }
}

/// The result of one data message sent with
/// [`Client::submit_pending`](crate::Client::submit_pending): only this
/// handle receives it, never [`Client::recv`](crate::Client::recv) or another
/// thread. Wait for it with [`wait`](Pending::wait), poll it with
/// [`try_take`](Pending::try_take), `.await` it (it is a `Future`), or get a
/// callback with [`on_ready`](Pending::on_ready).
///
/// Dropping a `Pending` abandons the result: it is discarded on arrival.
#[derive(Debug)]
pub struct Pending {
    slot: Arc<Slot>,
}

impl Pending {
    pub(crate) fn new(slot: Arc<Slot>) -> Pending {
        Pending { slot }
    }

    /// The id the data message was sent under.
    pub fn id(&self) -> u32 {
        self.slot.id
    }

    /// Whether the outcome has arrived and was not taken yet.
    pub fn is_ready(&self) -> bool {
        self.slot.lock().outcome.is_some()
    }

    /// Takes the outcome if it has arrived. The result is handed out once:
    /// asking again after it was taken is a [`ClientError::Usage`] error.
    pub fn try_take(&self) -> Option<Result<Output>> {
        let mut st = self.slot.lock();
        self.take(&mut st)
    }

    fn take(&self, st: &mut SlotState) -> Option<Result<Output>> {
        if st.taken {
            return Some(Err(self.taken_error()));
        }
        let o = st.outcome.take()?;
        st.taken = true;
        Some(o.into_result())
    }

    fn taken_error(&self) -> ClientError {
        ClientError::Usage(format!(
            "the result of data message {} was already taken",
            self.slot.id
        ))
    }

    /// Blocks until the result arrives (`None`, or a timeout too long for
    /// the clock: without limit). A timeout leaves the result to a later
    /// call.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<Output> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut st = self.slot.lock();
        loop {
            if let Some(r) = self.take(&mut st) {
                return r;
            }
            st = match deadline {
                None => self.slot.cond.wait(st).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(ClientError::Timeout {
                            after: timeout.unwrap_or_default(),
                            during: "waiting for a result",
                        });
                    }
                    let (st, _) = self
                        .slot
                        .cond
                        .wait_timeout(st, left)
                        .unwrap_or_else(|p| p.into_inner());
                    st
                }
            };
        }
    }

    /// Runs `f` once the outcome is available: at once on this thread if it
    /// already is, otherwise on the thread that delivers it (the client's
    /// reader thread, or the one closing the connection). `f` must be quick
    /// and must not block; it replaces an earlier callback.
    pub fn on_ready(&self, f: impl FnOnce() + Send + 'static) {
        let mut st = self.slot.lock();
        if st.outcome.is_some() || st.taken {
            drop(st);
            f();
        } else {
            st.on_ready = Some(Box::new(f));
        }
    }
}

impl Future for Pending {
    type Output = Result<Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut st = self.slot.lock();
        match self.take(&mut st) {
            Some(r) => Poll::Ready(r),
            None => {
                st.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut st = self.slot.lock();
        st.abandoned = true;
        st.on_ready = None;
        st.waker = None;
    }
}
