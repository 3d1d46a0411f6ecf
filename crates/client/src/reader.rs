//! The per-connection reader thread and the state it shares with callers.
//!
//! The thread owns the read half of the socket and turns frames into state
//! changes: credit and configuration responses update [`State`] (callers wait
//! on the condvar), results and data errors go down a channel to `recv`.

use std::net::TcpStream;
use std::sync::mpsc;
use std::sync::{Condvar, Mutex, MutexGuard};

use corefarm_smp::blocking::FrameReader;
use corefarm_smp::codec::ReadError;
use corefarm_smp::{ConfigurationResponse, Credit, Data, ErrorMsg, Frame, MsgType};

use crate::error::Failure;
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
    /// A configuration was sent and its response has not arrived yet.
    pub configuring: bool,
    /// Sizes of the configuration being sent, applied when it succeeds.
    pub pending_sizes: Option<(u32, u32)>,
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
}

#[derive(Debug, Default)]
pub(crate) struct Shared {
    state: Mutex<State>,
    pub cond: Condvar,
}

impl Shared {
    /// Locks the state; a panic elsewhere while holding the lock does not
    /// make the state unusable (it holds plain values only).
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn fail(&self, f: Failure) {
        let mut st = self.lock();
        if st.failed.is_none() {
            st.failed = Some(if st.closing {
                Failure::ClosedLocally
            } else {
                f
            });
        }
        drop(st);
        self.cond.notify_all();
    }
}

pub(crate) fn run(
    mut reader: FrameReader<TcpStream>,
    shared: &Shared,
    events: mpsc::Sender<Event>,
    credit_mode: bool,
) {
    // Output size of the configuration in force, to count outputs per result.
    let mut output_size = shared.lock().sizes.map(|s| s.1).unwrap_or(0);
    loop {
        let frame = match reader.read_frame() {
            Ok(Some(f)) => f,
            Ok(None) => return shared.fail(Failure::Closed),
            Err(ReadError::Io(e)) => return shared.fail(Failure::Io(e.kind(), e.to_string())),
            Err(ReadError::Protocol(e)) => return shared.fail(Failure::Protocol(e)),
        };
        if let Err(f) = handle(frame, shared, &events, credit_mode, &mut output_size) {
            return shared.fail(f);
        }
    }
}

fn handle(
    frame: Frame,
    shared: &Shared,
    events: &mpsc::Sender<Event>,
    credit_mode: bool,
    output_size: &mut u32,
) -> Result<(), Failure> {
    match frame.ty {
        MsgType::Data => {
            let d = Data::parse(frame.payload).map_err(Failure::Protocol)?;
            let count = match *output_size {
                0 => 0,
                n => (d.data.len() / n as usize) as u32,
            };
            // A dropped receiver only means nobody wants results any more.
            let _ = events.send(Event::Data(Output {
                id: d.id,
                data: d.data,
                count,
            }));
        }
        MsgType::ConfigurationResponse => {
            let r = ConfigurationResponse::parse(&frame.payload).map_err(Failure::Protocol)?;
            let mut st = shared.lock();
            if !st.configuring {
                return Err(Failure::Unexpected(
                    "a configuration response without a configuration".into(),
                ));
            }
            st.configuring = false;
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
        MsgType::StatusRequest | MsgType::Status => {
            return Err(Failure::Unexpected(format!(
                "a {} message the client did not ask for",
                frame.ty.name()
            )));
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
            if e.id != ErrorMsg::NO_ID {
                let _ = events.send(Event::Error(e));
                return Ok(());
            }
            let mut st = shared.lock();
            if st.configuring {
                // The reason for the (failed) response that follows.
                st.config_errors.push(e);
            } else {
                if st.failed.is_none() {
                    st.failed = Some(Failure::Server(e.clone()));
                }
                let _ = events.send(Event::Error(e));
            }
            drop(st);
            shared.cond.notify_all();
        }
        MsgType::Hello | MsgType::Configuration => {
            return Err(Failure::Unexpected(format!(
                "a {} message after the hello exchange",
                frame.ty.name()
            )));
        }
    }
    Ok(())
}
