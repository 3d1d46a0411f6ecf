//! The sPIN execution model (seed 004 §2.2) for one node: a message whose
//! first chunk matches a ruleset runs that execution context's handlers —
//! head once, payload once per chunk in parallel on a bounded pool (after
//! the head), tail once after every payload — with a zeroed per-message
//! scratchpad, the context's shared memory and counters, and actions that
//! build the message's outcome.
//!
//! The caller (the node's receive path) feeds chunks as they arrive and
//! gets the [`Outcome`] when the tail has run; it never blocks on a handler.

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

pub use super::memory::ContextMemory;
use super::memory::RawBuf;
use super::rules::{self, Ruleset};

/// Which handler of a set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    Head,
    Payload,
    Tail,
}

/// Limits a handler set runs under (declared by the image, capped by the node).
#[derive(Debug, Clone, Copy)]
pub struct Budgets {
    /// Per-message scratchpad bytes.
    pub scratch: u32,
    /// Result bytes a message's handlers may emit.
    pub output: u64,
    /// Wall time of one handler call. A call that takes longer fails its
    /// message; in-process the call cannot be interrupted, only judged.
    pub per_call: Duration,
    /// Bytes of one notification.
    pub notification: u32,
}

impl Default for Budgets {
    fn default() -> Self {
        Budgets {
            scratch: 64 * 1024,
            output: 256 << 20,
            per_call: Duration::from_secs(1),
            notification: 4096,
        }
    }
}

/// One chunk as a handler sees it.
#[derive(Debug, Clone, Copy)]
pub struct ChunkRef<'a> {
    pub message_id: u32,
    pub index: u32,
    pub offset: u64,
    pub message_len: u64,
    pub data: &'a [u8],
    pub eom: bool,
}

/// Memory a handler call may use: raw, because payload handlers of one
/// message share it concurrently and synchronise in their own code (the
/// header says: atomics). Rust code never forms references to it while a
/// handler runs. Built only here, from a message's scratchpad and its
/// context's memory: the pointers go to C as they are, so a `Memory` made
/// elsewhere could send a handler anywhere.
pub struct Memory {
    pub(crate) scratch: *mut u8,
    pub(crate) scratch_len: u32,
    pub(crate) shared: *mut u8,
    pub(crate) shared_len: u64,
    pub(crate) counters: *mut u64,
    pub(crate) counters_len: u32,
}

/// The actions a handler may take, recorded per message.
pub struct Actions<'a> {
    pub(super) run: &'a RunState,
    /// Where emitted bytes go in the result: (stage, chunk offset).
    pub(super) key: (Stage, u64),
}

impl Actions<'_> {
    /// Appends to the message's result; `false` past the output budget
    /// (the message then fails).
    pub fn emit(&self, bytes: &[u8]) -> bool {
        let mut st = self.run.state.lock().unwrap();
        if st.out_bytes + bytes.len() as u64 > self.run.budgets.output {
            st.fail(format!(
                "{}: {:?} handler emitted more than the output budget of {} bytes",
                self.run.ctx.handlers.name(),
                self.key.0,
                self.run.budgets.output
            ));
            return false;
        }
        st.out_bytes += bytes.len() as u64;
        st.outputs
            .entry(self.key)
            .or_default()
            .extend_from_slice(bytes);
        true
    }

    pub fn forward(&self) {
        self.run.state.lock().unwrap().forward = true;
    }

    pub fn drop_message(&self) {
        self.run.state.lock().unwrap().dropped = true;
    }

    /// `false` when the notification exceeds its budget (the message fails).
    pub fn notify(&self, bytes: &[u8]) -> bool {
        let mut st = self.run.state.lock().unwrap();
        if bytes.len() > self.run.budgets.notification as usize {
            st.fail(format!(
                "{}: {:?} handler sent a notification of {} bytes, over the budget of {}",
                self.run.ctx.handlers.name(),
                self.key.0,
                bytes.len(),
                self.run.budgets.notification
            ));
            return false;
        }
        // Kept bounded here too: a handler that notifies in a loop must
        // not grow the worker's memory any more than the node's.
        if st.notifications.len() < MAX_NOTIFICATIONS {
            st.notifications.push(bytes.to_vec());
        } else {
            st.notifications_dropped += 1;
        }
        true
    }
}

/// A handler set: the three handlers of one execution context.
pub trait Handlers: Send + Sync + 'static {
    /// Name for errors ("handler set sum").
    fn name(&self) -> &str;
    fn has(&self, stage: Stage) -> bool;
    /// Runs one handler; `Err` carries the reason the message fails.
    fn call(
        &self,
        stage: Stage,
        chunk: &ChunkRef<'_>,
        mem: &Memory,
        actions: &Actions<'_>,
    ) -> Result<(), String>;
}

/// What became of a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The handlers' output, in chunk order (head, payloads by offset, tail).
    Result(Vec<u8>),
    /// No handler took it: the message goes to the hardware cores.
    Forward,
    /// Dropped by a handler: an empty result.
    Dropped,
    /// A handler failed: the user gets this error.
    Failed(String),
}

/// Notifications kept per message: the protocol's bound
/// ([`corefarm_smp::notify::MAX_PER_MESSAGE`]), which the server enforces too.
pub const MAX_NOTIFICATIONS: usize = corefarm_smp::notify::MAX_PER_MESSAGE;

#[derive(Debug)]
pub struct Finished {
    pub outcome: Outcome,
    /// At most [`MAX_NOTIFICATIONS`], in the order they were sent.
    pub notifications: Vec<Vec<u8>>,
    /// Those past [`MAX_NOTIFICATIONS`].
    pub notifications_dropped: u64,
}

type Job = Box<dyn FnOnce() + Send>;

/// A fixed pool of handler threads shared by every message of a node.
pub struct Pool {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Pool {
    pub fn new(workers: usize) -> std::io::Result<Pool> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let threads = (0..workers.max(1))
            .map(|i| {
                let rx = rx.clone();
                std::thread::Builder::new()
                    .name(format!("spin-{i}"))
                    .spawn(move || loop {
                        let job = rx.lock().unwrap().recv();
                        match job {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    })
            })
            .collect::<std::io::Result<_>>()?;
        Ok(Pool {
            tx: Mutex::new(Some(tx)),
            threads,
        })
    }

    fn submit(&self, job: Job) {
        if let Some(tx) = self.tx.lock().unwrap().as_ref() {
            // The workers only stop when the pool is dropped.
            let _ = tx.send(job);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.tx.lock().unwrap().take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// One execution context: a ruleset selecting messages for a handler set.
pub struct Context {
    pub ruleset: Ruleset,
    pub handlers: Arc<dyn Handlers>,
    pub memory: Arc<ContextMemory>,
    pub budgets: Budgets,
}

/// A handler set whose ruleset is over the limits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{set}: {error}")]
pub struct ContextError {
    pub set: String,
    pub error: super::rules::RulesetError,
}

pub struct Engine {
    contexts: Vec<(Ruleset, Arc<Context>)>,
    pool: Arc<Pool>,
}

impl Engine {
    /// Refuses a context whose ruleset is over the limits (the error
    /// names its handler set).
    pub fn new(contexts: Vec<Context>, pool: Arc<Pool>) -> Result<Engine, ContextError> {
        for c in &contexts {
            c.ruleset.validate().map_err(|error| ContextError {
                set: c.handlers.name().to_string(),
                error,
            })?;
        }
        Ok(Engine {
            contexts: contexts
                .into_iter()
                .map(|c| (c.ruleset.clone(), Arc::new(c)))
                .collect(),
            pool,
        })
    }

    /// Starts a message whose first chunk is `first`: `None` when no
    /// ruleset matches (the message goes to the cores as before).
    pub fn begin(&self, message_id: u32, message_len: u64) -> Begin<'_> {
        Begin {
            engine: self,
            message_id,
            message_len,
        }
    }
}

pub struct Begin<'a> {
    engine: &'a Engine,
    message_id: u32,
    message_len: u64,
}

impl Begin<'_> {
    /// Matches the first chunk and, if a context takes the message, starts
    /// its head handler (and the first chunk's payload handler after it).
    pub fn first_chunk(self, data: Bytes, eom: bool) -> Option<Message> {
        let (_, ctx) = rules::select(&self.engine.contexts, &data)?;
        let run = Arc::new(RunState {
            ctx: ctx.clone(),
            budgets: ctx.budgets,
            message_id: self.message_id,
            message_len: self.message_len,
            scratch: RawBuf::zeroed(ctx.budgets.scratch as usize),
            state: Mutex::new(State::default()),
            pool: self.engine.pool.clone(),
            done: Mutex::new(None),
        });
        let (tx, rx) = mpsc::channel();
        *run.done.lock().unwrap() = Some(tx);
        let msg = Message {
            run: run.clone(),
            rx,
            next_offset: data.len() as u64,
            chunks: 1,
        };
        {
            let mut st = run.state.lock().unwrap();
            st.outstanding = 1;
            st.eom = eom;
        }
        let r = run.clone();
        self.engine.pool.submit(Box::new(move || {
            r.call(Stage::Head, 0, 0, &data, false);
            r.head_finished();
            r.call(Stage::Payload, 0, 0, &data, eom);
            r.payload_finished();
        }));
        Some(msg)
    }
}

/// A message being handled: feed it the rest of its chunks, then wait.
pub struct Message {
    run: Arc<RunState>,
    rx: mpsc::Receiver<Finished>,
    next_offset: u64,
    chunks: u32,
}

impl Message {
    /// The next chunk (in order; chunks are consumed as they arrive).
    pub fn chunk(&mut self, data: Bytes, eom: bool) {
        let (index, offset) = (self.chunks, self.next_offset);
        self.chunks += 1;
        self.next_offset += data.len() as u64;
        let mut st = self.run.state.lock().unwrap();
        st.outstanding += 1;
        st.eom |= eom;
        if st.head_done {
            drop(st);
            let r = self.run.clone();
            self.run.pool.submit(Box::new(move || {
                r.call(Stage::Payload, index, offset, &data, eom);
                r.payload_finished();
            }));
        } else {
            // Payload handlers start after the head (sPIN's ordering); the
            // first chunk's job submits these once the head returned.
            st.deferred.push((index, offset, data, eom));
        }
    }

    /// Waits for the tail; `None` after `timeout` (the message is then
    /// abandoned: its handlers may still finish, their output is dropped).
    pub fn finish(self, timeout: Duration) -> Option<Finished> {
        self.rx.recv_timeout(timeout).ok()
    }

    pub fn counters(&self) -> Vec<u64> {
        self.run.ctx.memory.counters()
    }
}

#[derive(Default)]
pub(super) struct State {
    head_done: bool,
    eom: bool,
    outstanding: usize,
    deferred: Vec<(u32, u64, Bytes, bool)>,
    tail_started: bool,
    chunks_done: u32,
    outputs: BTreeMap<(Stage, u64), Vec<u8>>,
    out_bytes: u64,
    forward: bool,
    dropped: bool,
    notifications: Vec<Vec<u8>>,
    notifications_dropped: u64,
    error: Option<String>,
}

impl State {
    fn fail(&mut self, why: String) {
        self.error.get_or_insert(why);
    }
}

pub(super) struct RunState {
    ctx: Arc<Context>,
    budgets: Budgets,
    message_id: u32,
    message_len: u64,
    scratch: RawBuf,
    pub(super) state: Mutex<State>,
    pool: Arc<Pool>,
    done: Mutex<Option<mpsc::Sender<Finished>>>,
}

impl RunState {
    fn call(&self, stage: Stage, index: u32, offset: u64, data: &[u8], eom: bool) {
        if !self.ctx.handlers.has(stage) || self.state.lock().unwrap().error.is_some() {
            return;
        }
        let chunk = ChunkRef {
            message_id: self.message_id,
            index,
            offset,
            message_len: self.message_len,
            data,
            eom,
        };
        let mem = Memory {
            scratch: self.scratch.ptr,
            scratch_len: self.scratch.len as u32,
            shared: self.ctx.memory.shared,
            shared_len: self.ctx.memory.shared_len as u64,
            counters: self.ctx.memory.counters as *mut u64,
            counters_len: self.ctx.memory.counters_len as u32,
        };
        let actions = Actions {
            run: self,
            key: (stage, offset),
        };
        let t0 = Instant::now();
        let r = self.ctx.handlers.call(stage, &chunk, &mem, &actions);
        let took = t0.elapsed();
        let name = self.ctx.handlers.name();
        let mut st = self.state.lock().unwrap();
        match r {
            Err(why) => st.fail(format!("{name}: {stage:?} handler failed: {why}")),
            Ok(()) if took > self.budgets.per_call => st.fail(format!(
                "{name}: {stage:?} handler ran {took:?}, over its budget of {:?}",
                self.budgets.per_call
            )),
            Ok(()) => {}
        }
    }

    /// The head returned: chunks that arrived meanwhile go to the pool.
    fn head_finished(self: &Arc<Self>) {
        let deferred = {
            let mut st = self.state.lock().unwrap();
            st.head_done = true;
            std::mem::take(&mut st.deferred)
        };
        for (index, offset, data, eom) in deferred {
            let r = self.clone();
            self.pool.submit(Box::new(move || {
                r.call(Stage::Payload, index, offset, &data, eom);
                r.payload_finished();
            }));
        }
    }

    /// Bookkeeping after a payload handler: starts the tail after the last
    /// payload of a message whose last chunk has arrived.
    fn payload_finished(self: &Arc<Self>) {
        let mut st = self.state.lock().unwrap();
        st.outstanding -= 1;
        st.chunks_done += 1;
        if st.eom && st.outstanding == 0 && !st.tail_started {
            st.tail_started = true;
            let count = st.chunks_done;
            drop(st);
            let r = self.clone();
            self.pool.submit(Box::new(move || {
                r.call(Stage::Tail, count, r.message_len, &[], true);
                r.complete();
            }));
        }
    }

    fn complete(&self) {
        let mut st = self.state.lock().unwrap();
        let outcome = if let Some(e) = st.error.take() {
            Outcome::Failed(e)
        } else if st.dropped {
            Outcome::Dropped
        } else if st.forward || st.outputs.is_empty() {
            Outcome::Forward
        } else {
            Outcome::Result(
                std::mem::take(&mut st.outputs)
                    .into_values()
                    .flatten()
                    .collect(),
            )
        };
        let done = Finished {
            outcome,
            notifications: std::mem::take(&mut st.notifications),
            notifications_dropped: std::mem::take(&mut st.notifications_dropped),
        };
        drop(st);
        if let Some(tx) = self.done.lock().unwrap().take() {
            let _ = tx.send(done);
        }
    }
}
