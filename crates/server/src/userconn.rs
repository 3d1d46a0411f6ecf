//! A user's connection as the session sees it: the socket's two halves,
//! what the hello agreed, the session's phase and configuration, and the
//! chunks in and out; how a frame is read and counted, which frame is
//! allowed when, and how an error reaches a user that agreed to hear it or
//! one of the seed's format.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use bytes::Bytes;
use corefarm_smp::codec::{FrameReader, Read, ReadError};
use corefarm_smp::stream::Message;
use corefarm_smp::{
    hello::features, Configuration, ConfigurationResponse, ErrorCode, ErrorMsg, Frame, Hello,
    MsgType, OutFrame, ProtocolError, UserPhase as Phase,
};

use crate::chunked::{Inbound, Outbound};
use crate::greeting::{self, Asked};
use crate::intake::{self, Refused};
use crate::registry::UserEntry;
use crate::sink::Sink;
use crate::tls::ReadHalf;

/// Frames a session may queue for the user before it waits for the
/// socket: the user's reading pace, not the server's memory, bounds what
/// it is sent.
pub(crate) const USER_QUEUE: usize = 32;

/// The user's socket is closed: nothing more can reach it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Closed;

impl From<Closed> for String {
    fn from(_: Closed) -> String {
        "user connection closed".into()
    }
}

/// What the next read from the user brought.
pub(crate) enum Next {
    /// A whole frame (a first chunk among them).
    Frame(Frame),
    /// A chunk read into its message's buffer, and the message it completed.
    Placed(Option<Message>),
    /// The user closed the connection between messages.
    Closed,
    /// A broken rule or a read deadline: the session ends, and tells the
    /// user why as the protocol allows ([`UserConn::report`]).
    Fatal(ErrorCode, String),
    /// The hello could not be read (over the size limit, say): told in an
    /// error, as one that does not decode is.
    BadHello(greeting::Refused),
    /// Over the server's memory budget, or a chunked message unfinished
    /// past its deadline: the session ends, and tells the user why.
    Held(crate::budget::Held),
    /// The connection failed: nobody left to tell.
    Failed(String),
}

pub(crate) struct UserConn {
    pub(crate) user: u64,
    pub(crate) peer: SocketAddr,
    pub(crate) entry: Arc<UserEntry>,
    pub(crate) reader: FrameReader<ReadHalf>,
    /// The user's socket: frames are written by the session itself when
    /// the socket is idle, an urgent result chunk at once, ahead of queued
    /// bulk (`Sink::push_class`).
    pub(crate) out: Arc<Sink>,
    /// Features agreed in the hello; `None` for a seed-format user.
    pub(crate) hello: Option<Hello>,
    /// The largest result payload this user reads (`anylen::user_limit`).
    pub(crate) result_limit: u32,
    /// With `chunks` agreed: the user's chunks being reassembled, and
    /// results waiting to go back as chunks.
    pub(crate) inbound: Option<Inbound>,
    pub(crate) outbound: Option<Outbound>,
    pub(crate) phase: Phase,
    pub(crate) cfg: Option<Configuration>,
    /// The reading clock: how long the session has waited for the user's
    /// bytes, in all (the deadline of an unfinished message runs on it).
    reading: Duration,
}

/// Adds the time a read waited to the reading clock, however the read
/// ends (a `select!` may drop it).
struct Reading<'a> {
    clock: &'a mut Duration,
    since: Instant,
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        *self.clock += self.since.elapsed();
    }
}

impl UserConn {
    pub(crate) fn new(
        (user, entry): (u64, Arc<UserEntry>),
        peer: SocketAddr,
        reader: FrameReader<ReadHalf>,
        out: Arc<Sink>,
        result_limit: u32,
    ) -> Self {
        UserConn {
            user,
            peer,
            entry,
            reader,
            out,
            hello: None,
            result_limit,
            inbound: None,
            outbound: None,
            phase: Phase::Initial,
            cfg: None,
            reading: Duration::ZERO,
        }
    }

    pub(crate) fn agreed(&self, feature: &str) -> bool {
        self.hello.as_ref().is_some_and(|h| h.has(feature))
    }

    /// What a frame of type `ty` asks for in the session's present state.
    pub(crate) fn asked(&self, ty: MsgType) -> Asked {
        let (cfg, chunks) = (self.cfg.is_some(), self.inbound.is_some());
        let session = greeting::Session::new(self.phase, self.hello.as_ref(), cfg, chunks);
        greeting::classify(ty, session)
    }

    pub(crate) fn set_phase(&mut self, p: Phase) {
        self.phase = p;
        self.entry.set_phase(p);
    }

    /// The next frame or placed chunk from the user, counted on its link.
    /// Cancel-safe: a session reads it in a `select!`.
    pub(crate) async fn next(&mut self) -> Next {
        match self.read().await {
            // The first frame was a hello: its sender speaks the extensions
            // even if the frame never arrived whole (`greeting::Refused`).
            Next::Fatal(code, reason)
                if self.reader.begun_type() == Some(MsgType::Hello as u8)
                    && self.asked(MsgType::Hello) == Asked::Hello =>
            {
                Next::BadHello(greeting::unreadable(code, reason))
            }
            // A hello over the memory budget is told alike, as `too-large`.
            Next::Held(h)
                if self.reader.begun_type() == Some(MsgType::Hello as u8)
                    && self.asked(MsgType::Hello) == Asked::Hello =>
            {
                Next::BadHello(greeting::unreadable(h.told().1, h.to_string()))
            }
            next => next,
        }
    }

    async fn read(&mut self) -> Next {
        // The unfinished message begun first must be finished within what
        // is left of its time: only time spent waiting here counts, not
        // time the session held the user back.
        let due = self.inbound.as_mut().and_then(|i| {
            i.stamp(self.reading);
            i.due(self.reading)
        });
        let _reading = Reading {
            clock: &mut self.reading,
            since: Instant::now(),
        };
        let read = self.reader.read_with(self.inbound.as_mut());
        let r = match due {
            None => read.await,
            Some((id, left)) => match tokio::time::timeout(left, read).await {
                Ok(r) => r,
                Err(_) => {
                    let after = self.inbound.as_ref().and_then(|i| i.timeout());
                    let after = after.unwrap_or_default();
                    return Next::Held(crate::budget::Held::Unfinished { id, after });
                }
            },
        };
        let link = &self.entry.m.link;
        match r {
            Ok(Some(Read::Frame(f))) => {
                link.received(f.payload.len() + corefarm_smp::HEADER_LEN);
                Next::Frame(f)
            }
            Ok(Some(Read::Placed { chunk, whole })) => {
                link.received(crate::chunked::wire_len(&chunk));
                Next::Placed(whole)
            }
            Ok(None) => Next::Closed,
            Err(ReadError::Io(e)) if e.kind() == std::io::ErrorKind::TimedOut => {
                Next::Fatal(ErrorCode::Timeout, format!("{e} (--read-timeout)"))
            }
            Err(ReadError::Io(e)) => Next::Failed(format!("read failed: {e}")),
            Err(ReadError::Protocol(ProtocolError::OverBudget(why))) => {
                Next::Held(crate::budget::Held::OverBudget(why))
            }
            Err(ReadError::Protocol(e)) => Next::Fatal(e.code(), e.to_string()),
        }
    }

    /// A data message of `len` bytes under id `id` checked on its way in
    /// (`intake::check`): its input count. `credit` is the session's
    /// unused grant, spent here if the user agreed `credit`.
    pub(crate) fn intake(&self, credit: &mut u64, id: u32, len: usize) -> Result<u32, Refused> {
        let cfg = self.cfg.as_ref().expect("routing implies a configuration");
        let credit = self.agreed(features::CREDIT).then_some(credit);
        intake::check(cfg, credit, self.result_limit, self.hello.as_ref(), id, len)
    }

    /// A chunk frame's payload: the message it completes, if any.
    pub(crate) fn chunk(&mut self, payload: Bytes) -> Result<Option<Message>, ProtocolError> {
        self.inbound
            .as_mut()
            .expect("a chunk is only asked for with chunks agreed")
            .push(corefarm_smp::stream::Chunk::parse(payload)?)
    }

    /// Queues a frame for the user; waits first while [`USER_QUEUE`] are
    /// unwritten.
    pub(crate) async fn send(&self, f: OutFrame) -> Result<(), Closed> {
        if self
            .out
            .push_to_user(f, USER_QUEUE, &self.entry.m.link)
            .await
        {
            Ok(())
        } else {
            Err(Closed)
        }
    }

    /// An error message, to a user that agreed `error`; nothing otherwise.
    pub(crate) async fn send_error(
        &self,
        id: u32,
        code: ErrorCode,
        reason: impl Into<String>,
    ) -> Result<(), Closed> {
        if self.agreed(features::ERROR) {
            self.send(ErrorMsg::new(id, code, reason).to_frame())
                .await?;
        }
        Ok(())
    }

    pub(crate) async fn send_response(&self, ok: bool) -> Result<(), Closed> {
        let status = if ok {
            ConfigurationResponse::OK
        } else {
            ConfigurationResponse::FAILED
        };
        self.send(ConfigurationResponse { status }.to_frame()).await
    }

    /// Tells the user why its session ends, as the protocol allows: an
    /// error message after a hello; a seed-format user only understands a
    /// negative configuration response, and only while it configures.
    /// Ends a session whose hello was refused (see `greeting::Refused`).
    pub(crate) async fn refuse_hello(&mut self, r: &crate::greeting::Refused) {
        if r.reads_errors {
            let msg = ErrorMsg::new(ErrorMsg::NO_ID, r.code, r.reason.as_str());
            let _ = self.send(msg.to_frame()).await;
        } else {
            self.report(ErrorMsg::NO_ID, r.code, &r.reason).await;
        }
    }

    pub(crate) async fn report(&mut self, id: u32, code: ErrorCode, reason: &str) {
        self.drain_results().await;
        if self.hello.is_some() {
            let _ = self.send_error(id, code, reason).await;
        } else if self.phase == Phase::Initial {
            let _ = self.send_response(false).await;
        }
    }

    /// Result chunks still waiting go out ahead of a session-ending error,
    /// so every result the session counted as answered is delivered. A user
    /// that stopped reading fails the writer after `--io-timeout` without
    /// progress, which ends this too.
    async fn drain_results(&mut self) {
        while self.outbound.as_ref().is_some_and(|o| !o.is_empty()) {
            self.out.room(crate::chunked::SINK_DEPTH).await;
            if self.feed_chunk().is_err() {
                return;
            }
        }
    }

    /// Hands the most urgent waiting result chunk to the user's sink.
    pub(crate) fn feed_chunk(&mut self) -> Result<(), crate::chunked::FeedError> {
        match self.outbound.as_mut() {
            Some(o) => o.feed(&self.out, &self.entry.m.link),
            None => Ok(()),
        }
    }
}
