//! Results routed to their submitter: `Pending` (one data message's result)
//! and `Completions`, the queue through which the asyncio layer learns that
//! results have arrived without the client's reader thread ever touching
//! Python (it only pushes a token and signals a condvar).

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use corefarm_client::Pending as RustPending;
use pyo3::prelude::*;

use crate::{secs, timeout_to_none, wait_in_slices, Output};

/// The result of one data message sent with `submit_pending`; no other
/// caller (`recv`, another thread's `map`) can take it.
#[pyclass(frozen, module = "corefarm._corefarm")]
pub(crate) struct Pending {
    inner: RustPending,
}

impl From<RustPending> for Pending {
    fn from(inner: RustPending) -> Self {
        Pending { inner }
    }
}

#[pymethods]
impl Pending {
    /// The id of the data message whose result this is.
    #[getter]
    fn id(&self) -> u32 {
        self.inner.id()
    }

    /// Whether the result has arrived (and was not taken yet).
    fn done(&self) -> bool {
        self.inner.is_ready()
    }

    /// result(timeout=None) -> Output; raises the server's error for this
    /// data message, TimeoutError after `timeout` s (the result stays).
    #[pyo3(signature = (timeout=None))]
    fn result(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Output> {
        wait_in_slices(py, timeout, "waiting for a result", |slice| {
            timeout_to_none(self.inner.wait(Some(slice)))
        })
        .map(Output::from)
    }

    /// Pushes `token` into `completions` once the result is available.
    fn notify(&self, completions: &Completions, token: u64) {
        let q = completions.queue.clone();
        self.inner.on_ready(move || q.push(token));
    }

    fn __repr__(&self) -> String {
        format!(
            "Pending(id={}, done={})",
            self.inner.id(),
            self.inner.is_ready()
        )
    }
}

#[derive(Default)]
struct QueueState {
    tokens: VecDeque<u64>,
    closed: bool,
}

#[derive(Default)]
struct Queue {
    state: Mutex<QueueState>,
    cond: Condvar,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, token: u64) {
        self.lock().tokens.push_back(token);
        self.cond.notify_one();
    }
}

/// Tokens of `Pending`s whose results arrived (see `Pending.notify`).
#[pyclass(frozen, module = "corefarm._corefarm")]
pub(crate) struct Completions {
    queue: Arc<Queue>,
}

#[pymethods]
impl Completions {
    #[new]
    fn new() -> Self {
        Completions {
            queue: Arc::default(),
        }
    }

    /// wait(timeout=None) -> list of tokens (at least one), [] after the
    /// timeout, or None once closed. Waits without the GIL.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Vec<u64>>> {
        let deadline = secs(timeout)?.map(|t| Instant::now() + t);
        let q = &self.queue;
        // Short slices keep Ctrl-C and interpreter shutdown responsive.
        let r = wait_in_slices(py, None, "waiting for results", |slice| {
            let mut st = q.lock();
            if st.tokens.is_empty() && !st.closed {
                st = q
                    .cond
                    .wait_timeout(st, slice)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            if !st.tokens.is_empty() {
                return Ok(Some(Some(st.tokens.drain(..).collect())));
            }
            if st.closed {
                return Ok(Some(None));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(Some(Some(Vec::new())));
            }
            Ok(None)
        })?;
        Ok(r)
    }

    /// Wakes `wait` for good (it returns None from now on).
    fn close(&self) {
        self.queue.lock().closed = true;
        self.queue.cond.notify_all();
    }
}
