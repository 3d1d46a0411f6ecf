//! The per-connection reader thread and the state it shares with callers.
//!
//! The thread owns the read half of the socket and turns frames into state
//! changes: credit, configuration and status responses update [`State`]
//! (callers wait on `cond`); a result or data error goes to the [`Pending`]
//! that registered its id, or else to the `recv` queue (callers wait on
//! `results`); a handler notification goes to its own queue
//! ([`crate::notify`]), never to a result's waiter.
//!
//! [`Pending`]: crate::Pending

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use corefarm_smp::blocking::FrameReader;
use corefarm_smp::codec::{Read, ReadError};
use corefarm_smp::stream::{Chunk, Reassembler};
use corefarm_smp::{
    ClusterStatus, ConfigurationResponse, Credit, Data, ErrorMsg, Frame, MsgType, ProtocolError,
};

use crate::error::Failure;
use crate::pending::{Outcome, Slot};
use crate::Output;

/// What `recv` can get.
#[derive(Debug)]
pub(crate) enum Event {
    Data(Output),
    Error(ErrorMsg),
}

#[derive(Debug, Default)]
pub(crate) struct State {
    /// Data messages the server still allows (credit mode only).
    pub credit: u64,
    /// Configurations sent whose responses have not arrived yet: more
    /// than one when a caller stopped waiting for one (its timeout) and
    /// configured again. Responses come in order; the last one decides.
    pub configs_unanswered: u32,
    /// Sizes of the configuration being sent, applied when it succeeds.
    pub pending_sizes: Option<(u32, u32)>,
    /// Configurations sent so far: a `map` started under one refuses to
    /// send its later inputs under the next, which would compute them with
    /// another function.
    pub generation: u64,
    /// Sizes of the configuration in force (input, output).
    pub sizes: Option<(u32, u32)>,
    pub config_reply: Option<ConfigurationResponse>,
    /// Reasons the server gave (Errors without a data id) while configuring:
    /// why it failed, or which nodes were dropped when it succeeded.
    pub config_errors: Vec<ErrorMsg>,
    /// Warnings of the last successful configuration (dropped nodes).
    pub warnings: Vec<String>,
    /// Set once the connection can no longer be used.
    pub failed: Option<Failure>,
    /// Set by `close`, so that the reader's end-of-stream is not blamed on the server.
    pub closing: bool,
    /// Results and errors of plain submissions, oldest first, for `recv`.
    pub queue: VecDeque<Event>,
    /// Plain submissions whose result has not been queued yet.
    pub unclaimed: u64,
    /// Ids whose result goes to a `Pending` (dropped ones included, until
    /// their result arrives and is discarded).
    pub claims: HashMap<u32, Arc<Slot>>,
    /// Caller-chosen ids of plain submissions in flight, with how many
    /// messages carry each: automatic ids skip them, so a `Pending` never
    /// takes the answer meant for `recv`.
    pub chosen: HashMap<u32, u32>,
    /// Next automatic id.
    pub next_id: u32,
    /// Threads blocked in `recv` and in a credit wait (the misuse check and
    /// tests' signals use them).
    pub receivers_waiting: usize,
    pub credit_waiters: usize,
    /// Status requests sent and answers received; the answer to request n
    /// is the n-th (the server answers in order).
    pub status_sent: u64,
    pub status_received: u64,
    pub status_reply: Option<Result<ClusterStatus, ProtocolError>>,
    /// What a resuming client keeps to send again (`None`: resuming off).
    pub kept: Option<crate::resume::Kept>,
    /// The connection in use: 0 for the first, one more per resume.
    pub link: u64,
    /// Connections lost so far (waits that span one start over or fail).
    pub losses: u64,
    /// A lost connection is being replaced: new submissions and
    /// configurations wait until it is, or until resuming gives up.
    pub resuming: bool,
    /// Results dropped because their id had been answered already.
    pub duplicates: u64,
}

/// Where the reader thread and the threads using the client meet: the
/// connection's state under one lock, and the condvars they wait on.
#[derive(Debug, Default)]
pub(crate) struct Rendezvous {
    state: Mutex<State>,
    /// Credit, configuration, status, failure and waiter-count changes.
    pub cond: Condvar,
    /// Something was queued for `recv`, or the connection failed.
    pub results: Condvar,
    /// Handler notifications, apart from results (their own lock).
    pub notes: crate::notify::Notes,
}

impl Rendezvous {
    /// Locks the state; a panic elsewhere while holding the lock does not
    /// make the state unusable (it holds plain values only).
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the connection unusable and gives every registered `Pending`
    /// the reason.
    pub fn fail(&self, f: Failure) {
        let mut st = self.lock();
        if st.failed.is_none() {
            st.failed = Some(if st.closing {
                Failure::ClosedLocally
            } else {
                f
            });
        }
        let failure = st.failed.clone().expect("set above");
        let claims: Vec<Arc<Slot>> = st.claims.drain().map(|(_, s)| s).collect();
        drop(st);
        self.cond.notify_all();
        self.results.notify_all();
        self.notes.close();
        for slot in claims {
            slot.complete(Outcome::Failed(failure.clone()));
        }
    }

    /// Routes a result or data error: to the `Pending` that claimed its id,
    /// else to the `recv` queue.
    fn deliver(&self, id: u32, event: Event) {
        let mut st = self.lock();
        // Each id is answered once, whatever a resend or a hedging server
        // makes arrive twice.
        if let Some(k) = st.kept.as_mut() {
            if !k.answered(id) {
                st.duplicates += 1;
                drop(st);
                // Rare, and what a test waits on.
                self.cond.notify_all();
                return;
            }
        }
        if let Some(slot) = st.claims.remove(&id) {
            drop(st);
            slot.complete(match event {
                Event::Data(o) => Outcome::Data(o),
                Event::Error(e) => Outcome::Error(e),
            });
            return;
        }
        st.unclaimed = st.unclaimed.saturating_sub(1);
        // Empty unless a caller chose ids: no hashing per result then.
        if !st.chosen.is_empty() {
            if let std::collections::hash_map::Entry::Occupied(mut n) = st.chosen.entry(id) {
                *n.get_mut() -= 1;
                if *n.get() == 0 {
                    n.remove();
                }
            }
        }
        st.queue.push_back(event);
        drop(st);
        self.results.notify_one();
    }
}

/// Reads until the connection fails and returns why (the caller decides
/// between failing the session and resuming it).
pub(crate) fn run(
    mut reader: FrameReader<crate::tls::RecvHalf>,
    shared: &Rendezvous,
    credit_mode: bool,
    mut chunks: Option<Reassembler>,
) -> Failure {
    // Output size of the configuration in force, to count outputs per result.
    let mut output_size = shared.lock().sizes.map(|s| s.1).unwrap_or(0);
    loop {
        // Chunked results after their first chunk are read straight into
        // their buffers.
        let read = match chunks.as_mut() {
            Some(re) => reader.read_placing(re),
            None => reader.read_frame().map(|f| f.map(Read::Frame)),
        };
        let frame = match read {
            Ok(Some(Read::Frame(f))) => f,
            Ok(Some(Read::Placed { whole, .. })) => {
                if let Some(m) = whole {
                    deliver_result(shared, Data::from(m), output_size);
                }
                continue;
            }
            Ok(None) => return Failure::Closed,
            Err(ReadError::Io(e)) => return Failure::Io(e.kind(), e.to_string()),
            Err(ReadError::Protocol(e)) => return Failure::Protocol(e),
        };
        if let Err(f) = handle(frame, shared, credit_mode, &mut output_size, &mut chunks) {
            return f;
        }
    }
}

fn handle(
    frame: Frame,
    shared: &Rendezvous,
    credit_mode: bool,
    output_size: &mut u32,
    chunks: &mut Option<Reassembler>,
) -> Result<(), Failure> {
    match frame.ty {
        MsgType::Data => {
            let d = Data::parse(frame.payload).map_err(Failure::Protocol)?;
            deliver_result(shared, d, *output_size);
        }
        MsgType::Chunk if chunks.is_some() => {
            let re = chunks.as_mut().expect("checked");
            let c = Chunk::parse(frame.payload).map_err(Failure::Protocol)?;
            if let Some(m) = re.push(c).map_err(Failure::Protocol)? {
                deliver_result(shared, Data::from(m), *output_size);
            }
        }
        // To their own queue, never to a result's waiter.
        MsgType::Notification => shared
            .notes
            .deliver(frame.payload)
            .map_err(Failure::Protocol)?,
        MsgType::ConfigurationResponse => {
            let r = ConfigurationResponse::parse(&frame.payload).map_err(Failure::Protocol)?;
            let mut st = shared.lock();
            if st.configs_unanswered == 0 {
                return Err(Failure::Unexpected(
                    "a configuration response without a configuration".into(),
                ));
            }
            st.configs_unanswered -= 1;
            if st.configs_unanswered > 0 {
                // The answer to a configuration nobody waits for any more:
                // its reasons were its own.
                st.config_errors.clear();
                return Ok(());
            }
            if r.ok() {
                st.sizes = st.pending_sizes;
                *output_size = st.sizes.map(|s| s.1).unwrap_or(0);
                // Unused credits stay valid across a reconfiguration: the
                // server counts them as granted (it only pauses new grants).
            }
            st.config_reply = Some(r);
            drop(st);
            shared.cond.notify_all();
        }
        MsgType::Status => {
            let mut st = shared.lock();
            if st.status_received >= st.status_sent {
                return Err(Failure::Unexpected(
                    "a status message the client did not ask for".into(),
                ));
            }
            st.status_received += 1;
            // A bad answer fails the request, not the connection: the
            // frame boundaries are intact.
            st.status_reply = Some(ClusterStatus::decode(&frame.payload));
            drop(st);
            shared.cond.notify_all();
        }
        MsgType::StatusRequest => {
            return Err(Failure::Unexpected(
                "a status request: only users ask for status".into(),
            ));
        }
        MsgType::Credit => {
            let c = Credit::parse(&frame.payload).map_err(Failure::Protocol)?;
            let mut st = shared.lock();
            // Every grant counts, even one crossing our reconfiguration on
            // the wire: the server's count of our credit includes it.
            if credit_mode {
                st.credit += u64::from(c.messages);
                drop(st);
                shared.cond.notify_all();
            }
        }
        MsgType::Error => {
            let e = ErrorMsg::parse(&frame.payload).map_err(Failure::Protocol)?;
            if crate::resume::moves_on(&shared.lock(), &e) {
                return Err(Failure::Server(e));
            }
            if e.id != ErrorMsg::NO_ID {
                shared.deliver(e.id, Event::Error(e));
                return Ok(());
            }
            let mut st = shared.lock();
            if st.configs_unanswered > 0 {
                // The reason for the (failed) response that follows.
                st.config_errors.push(e);
            } else {
                // A session-wide error ends the session for every waiter.
                drop(st);
                shared.fail(Failure::Server(e));
                return Ok(());
            }
            drop(st);
            shared.cond.notify_all();
        }
        MsgType::Hello
        | MsgType::Configuration
        | MsgType::AuthChallenge
        | MsgType::AuthResponse => {
            return Err(Failure::Unexpected(format!(
                "a {} message after the hello exchange",
                frame.ty.name()
            )));
        }
        MsgType::Peer => {
            return Err(Failure::Unexpected(
                "a peer message: only nodes send those, on their peer port".into(),
            ));
        }
        MsgType::Chunk => {
            return Err(Failure::Unexpected(
                "a chunk, which this client did not agree to".into(),
            ));
        }
        // This connection never asked for a group (crate::group has its own).
        MsgType::GroupCtl | MsgType::GroupCmd | MsgType::GroupReply => {
            return Err(Failure::Unexpected(format!(
                "a {} message on a connection without a group",
                frame.ty.name()
            )));
        }
    }
    Ok(())
}

/// A result, whole or reassembled, to whoever waits for its id. Any length
/// is delivered whole (`any-length`): `count` is the whole outputs in it.
fn deliver_result(shared: &Rendezvous, d: Data, output_size: u32) {
    let count = match output_size {
        0 => 0,
        n => (d.data.len() / n as usize) as u32,
    };
    shared.deliver(
        d.id,
        Event::Data(Output {
            id: d.id,
            data: d.data,
            count,
        }),
    );
}
