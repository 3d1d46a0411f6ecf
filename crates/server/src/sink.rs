//! A connection's outgoing frames, written with as few syscalls and task
//! switches as possible. The task that produces frames queues them
//! ([`Sink::push`]) and writes everything queued with one non-blocking
//! `writev` when it is about to wait ([`Sink::flush`]): frames produced by
//! one wake-up share a syscall, and no other task is involved as long as the
//! peer keeps up, which is the common case. Only when the kernel takes a
//! batch in part does the connection's writer task take over, write the
//! rest as the socket drains, and hand the socket back once the queue is
//! empty.
//!
//! A TLS connection has no non-blocking `writev` to call from the producer
//! (encrypting takes the stream's lock and a copy), so its sink always
//! works as [`Sink::via_task`]: the writer task encrypts and writes.
//!
//! Order is kept by one rule: only one party writes at a time (the mode),
//! and a batch taken in part is finished before anything queued after it.
//! The mutex guards that bookkeeping only, never a syscall.
//!
//! On a link that negotiated chunks ([`Sink::set_chunk_size`]) the queue is
//! an [`Outbox`]: data messages larger than the chunk size go out a chunk
//! at a time, by priority class, and a batch stops at [`CHUNKED_BATCH`]
//! bytes so that an urgent message waits behind at most that much of a
//! bulk one. Without chunks the queue is the plain FIFO it always was.

use std::io::{self, IoSlice};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use bytes::Buf;
use corefarm_smp::stream::{Outbox, DEFAULT_CLASS};
use corefarm_smp::FrameBatch;
use corefarm_smp::OutFrame;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::Notify;

use crate::tls::WriteHalf;

/// Iovecs per `writev`: two per frame (headers, body) for a full batch.
const IOVECS: usize = 2 * FrameBatch::MAX_FRAMES;

/// Bytes a batch takes at most once chunks are on: what an urgent message
/// may find ahead of it in a batch being written (plus the kernel's buffer).
pub const CHUNKED_BATCH: usize = 256 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Nobody writes; frames queue until the next flush.
    Idle,
    /// A flush is writing a batch.
    Direct,
    /// The writer task owns the socket until the queue is empty.
    Task,
}

/// Frames being written, with how many of them carry the sender's tag.
struct Batch {
    frames: FrameBatch,
    tagged: u64,
}

struct State {
    /// Frames not yet handed to the kernel, with the sender's tag (see [`Sink::push`]).
    queue: Outbox<bool>,
    /// A batch the kernel took in part: written first by the writer task.
    partial: Option<Batch>,
    mode: Mode,
    /// Set once: the write that failed, or why the sink was closed.
    failed: Option<String>,
    /// No more frames will be sent: the writer task ends once the queue is written.
    finishing: bool,
}

impl State {
    /// Up to a batch of queued frames.
    fn take_batch(&mut self) -> Batch {
        let mut b = Batch {
            frames: FrameBatch::default(),
            tagged: 0,
        };
        let cap = match self.queue.chunk_size() {
            0 => usize::MAX,
            _ => CHUNKED_BATCH,
        };
        while !b.frames.is_full() && b.frames.remaining() < cap {
            let Some((f, tag)) = self.queue.pop() else {
                break;
            };
            // A chunked message counts once, with its last chunk.
            b.tagged += tag.unwrap_or(false) as u64;
            b.frames.push(f);
        }
        b
    }
}

/// What became of a frame handed to [`Sink::send`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// Already in the kernel's socket buffer.
    Written,
    /// Queued for the writer task.
    Queued,
    /// The connection's writing side is gone; the frame was dropped.
    Closed,
}

/// Where a sink's bytes go.
enum Out {
    /// Plain TCP: non-blocking `writev` from whoever holds the mode.
    Tcp(OwnedWriteHalf),
    /// TLS: only the writer task writes (the lock is never contended);
    /// `sock` sends FIN from `close` without it.
    Stream {
        wr: tokio::sync::Mutex<WriteHalf>,
        sock: Option<std::sync::Arc<socket2::Socket>>,
    },
}

pub struct Sink {
    out: Out,
    /// Pushed frames are written by a flush of the producer; otherwise the
    /// writer task writes every frame (see [`Sink::via_task`]).
    direct: bool,
    state: Mutex<State>,
    /// Frames were pushed since the last flush (read without the lock).
    unflushed: AtomicBool,
    /// Wakes the writer task: a hand-off, a failure or the end.
    wake: Notify,
    /// Wakes senders waiting for room in the queue ([`Sink::room`]).
    drained: Notify,
}

impl Sink {
    pub fn new(wr: impl Into<WriteHalf>) -> Self {
        Self::build(wr.into(), true)
    }

    /// A sink whose frames are always written by the writer task, for an
    /// owner that paces itself by write completions (the queue and stack
    /// policies hand a node its next message once the previous write
    /// completed): written by the owner itself, a completion would come at
    /// once, and a user without credit could push data into a slow node
    /// without bound.
    pub fn via_task(wr: impl Into<WriteHalf>) -> Self {
        Self::build(wr.into(), false)
    }

    fn build(wr: WriteHalf, direct: bool) -> Self {
        let (out, direct) = match wr {
            WriteHalf::Plain(w) => (Out::Tcp(w), direct),
            WriteHalf::Tls(w, sock) => (
                Out::Stream {
                    wr: tokio::sync::Mutex::new(WriteHalf::Tls(w, sock.clone())),
                    sock,
                },
                false,
            ),
        };
        Sink {
            out,
            direct,
            state: Mutex::new(State {
                queue: Outbox::new(),
                partial: None,
                mode: Mode::Idle,
                failed: None,
                finishing: false,
            }),
            unflushed: AtomicBool::new(false),
            wake: Notify::new(),
            drained: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The guarded code never panics; a poisoned lock still holds valid state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The chunk size the peer agreed to (0: no chunks): from now on data
    /// messages larger than it go as chunks, served by class.
    pub fn set_chunk_size(&self, size: u32) {
        self.lock().queue.set_chunk_size(size as usize);
    }

    /// Queues a frame for the next [`Sink::flush`] (or for the writer task,
    /// if it holds the socket). `tag` is counted in what the flush or the
    /// writer task reports, so an owner can count completions of the frames
    /// it cares about. False if the connection's writing side is gone.
    pub fn push(&self, f: OutFrame, tag: bool) -> bool {
        self.push_class(f, DEFAULT_CLASS, tag)
    }

    /// [`Sink::push`] of a data message in priority `class` (0 first, 7
    /// last); the class orders the queue once chunks are on.
    ///
    /// A frame more urgent than the default class is written at once when
    /// the socket is idle instead of at the producer's next flush: a
    /// producer flushes only when it has nothing else to do, and a user
    /// streaming bulk chunks keeps its handler busy reading, so an urgent
    /// message (or result) queued there waited until the user's socket ran
    /// dry — tens of milliseconds under load (bench/manual/streams.md).
    pub fn push_class(&self, f: OutFrame, class: u8, tag: bool) -> bool {
        let mut st = self.lock();
        if st.failed.is_some() || st.finishing {
            return false;
        }
        st.queue.push(f, class, tag);
        if st.mode == Mode::Idle {
            if self.direct {
                self.unflushed.store(true, Ordering::Release);
                if class < DEFAULT_CLASS {
                    drop(st);
                    self.flush();
                }
            } else {
                st.mode = Mode::Task;
                drop(st);
                self.wake.notify_one();
            }
        }
        true
    }

    /// Frames were pushed that only a flush will write.
    pub fn unflushed(&self) -> bool {
        self.unflushed.load(Ordering::Acquire)
    }

    /// Writes what is queued with one non-blocking `writev` if nobody else
    /// is writing; whatever the kernel does not take goes to the writer
    /// task. Returns how many tagged frames are now in the kernel.
    pub fn flush(&self) -> u64 {
        if !self.unflushed.swap(false, Ordering::AcqRel) {
            return 0;
        }
        let mut b = {
            let mut st = self.lock();
            if st.mode != Mode::Idle || st.queue.is_empty() {
                return 0;
            }
            st.mode = Mode::Direct;
            st.take_batch()
        };
        let result = match &self.out {
            Out::Tcp(wr) => write_now(wr, &mut b.frames),
            // Never direct; were it, the batch would simply go to the task.
            Out::Stream { .. } => Ok(()),
        };
        let mut st = self.lock();
        match result {
            Ok(()) if !b.frames.has_remaining() => {
                if st.queue.is_empty() {
                    st.mode = Mode::Idle;
                    return b.tagged;
                }
                // More than a batch was queued: the task writes the rest.
                st.mode = Mode::Task;
                drop(st);
                self.wake.notify_one();
                b.tagged
            }
            Ok(()) => {
                st.partial = Some(b);
                st.mode = Mode::Task;
                drop(st);
                self.wake.notify_one();
                0
            }
            Err(e) => {
                st.failed
                    .get_or_insert_with(|| format!("write failed: {e}"));
                st.mode = Mode::Task;
                drop(st);
                self.wake.notify_one();
                0
            }
        }
    }

    /// [`Sink::push`] then [`Sink::flush`]: for frames sent outside a
    /// producer's event loop (replies, configurations).
    pub fn send(&self, f: OutFrame, tag: bool) -> Sent {
        if !self.push(f, tag) {
            return Sent::Closed;
        }
        self.flush();
        let st = self.lock();
        if st.failed.is_some() {
            Sent::Closed
        } else if st.mode == Mode::Idle {
            Sent::Written
        } else {
            Sent::Queued
        }
    }

    /// Waits until at most `max` frames are queued (or the sink failed), so a
    /// producer slows down to the peer's pace instead of queueing without
    /// bound. Flushes first: the queue may only be waiting for that.
    pub async fn room(&self, max: usize) {
        loop {
            // Created before the checks: a batch taken after them still wakes us.
            let drained = self.drained.notified();
            if self.has_room(max) {
                return;
            }
            self.flush();
            // The flush may have written everything, and then nobody else will.
            if self.has_room(max) {
                return;
            }
            drained.await;
        }
    }

    fn has_room(&self, max: usize) -> bool {
        let st = self.lock();
        st.queue.len() <= max || st.failed.is_some()
    }

    /// No further frames: the writer task writes what is queued and ends.
    pub fn finish(&self) {
        let mut st = self.lock();
        st.finishing = true;
        if st.mode == Mode::Idle {
            st.mode = Mode::Task;
        }
        drop(st);
        self.wake.notify_one();
    }

    /// Fails the sink: later sends are dropped, the peer sees the end of
    /// the stream, and the writer task ends with `reason`.
    pub fn close(&self, reason: &str) {
        self.lock().failed.get_or_insert_with(|| reason.to_string());
        self.shutdown();
        self.wake.notify_one();
        self.drained.notify_waiters();
    }

    /// Sends FIN now: the write half may outlive the connection's tasks (its
    /// owner holds the sink), so dropping it is not what ends the stream.
    fn shutdown(&self) {
        let sock = match &self.out {
            Out::Tcp(wr) => socket2::SockRef::from(wr.as_ref()),
            Out::Stream { sock: Some(s), .. } => socket2::SockRef::from(&**s),
            Out::Stream { sock: None, .. } => return,
        };
        let _ = sock.shutdown(std::net::Shutdown::Write);
    }

    /// The end after [`Sink::finish`]: a TLS stream says `close_notify` first.
    async fn finish_stream(&self, io_timeout: Duration) {
        if let Out::Stream { wr, .. } = &self.out {
            let mut wr = wr.lock().await;
            let _ = tokio::time::timeout(io_timeout, wr.shutdown()).await;
        }
        self.shutdown();
    }

    /// Queues a frame for a user: waits first while more than `max` frames
    /// are unwritten (the user's pace, not memory, bounds what it is sent),
    /// and counts its bytes. False if the connection is gone.
    pub async fn push_to_user(
        &self,
        f: OutFrame,
        max: usize,
        metrics: &crate::metrics::LinkCounters,
    ) -> bool {
        self.room(max).await;
        metrics.sent(f.wire_len());
        self.push(f, false)
    }

    /// Spawns the writer task of a user's socket: when it ends (the user
    /// stopped reading for `io_timeout`, the socket failed, or after
    /// [`Sink::finish`]) the session is stopped through `stop`.
    pub fn spawn_user_writer(
        self: &std::sync::Arc<Self>,
        io_timeout: Duration,
        peer: std::net::SocketAddr,
        stop: tokio_util::sync::CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let out = self.clone();
        tokio::spawn(async move {
            if let Some(reason) = out.run(io_timeout, |_| {}).await {
                tracing::info!(user = %peer, "closing: {reason}");
            }
            stop.cancel();
        })
    }

    /// The writer task's body: writes queued frames whenever the socket is
    /// handed over, reporting the tags of written frames to `on_written`.
    /// Returns why it ended (a failure, or `None` after [`Sink::finish`]).
    pub async fn run(
        &self,
        io_timeout: Duration,
        mut on_written: impl FnMut(u64),
    ) -> Option<String> {
        loop {
            let mut batch = None;
            let finished;
            {
                let mut st = self.lock();
                if let Some(reason) = &st.failed {
                    let reason = reason.clone();
                    drop(st);
                    self.drained.notify_waiters();
                    return Some(reason);
                }
                if st.mode == Mode::Task {
                    let b = st.partial.take().unwrap_or_else(|| st.take_batch());
                    if b.frames.is_empty() {
                        st.mode = Mode::Idle;
                    } else {
                        batch = Some(b);
                    }
                }
                finished = st.finishing && st.mode == Mode::Idle;
            }
            if finished {
                self.finish_stream(io_timeout).await;
                return None;
            }
            let Some(mut b) = batch else {
                // A stale wake-up while a flush writes is harmless: the
                // mode is checked again after every wake.
                self.wake.notified().await;
                continue;
            };
            self.drained.notify_waiters();
            let err = match write_all(&self.out, &mut b.frames, io_timeout).await {
                Ok(()) => None,
                Err(e) if e.kind() == io::ErrorKind::TimedOut => Some(e.to_string()),
                Err(e) => Some(format!("write failed: {e}")),
            };
            if let Some(reason) = err {
                self.close(&reason);
                continue;
            }
            if b.tagged > 0 {
                on_written(b.tagged);
            }
        }
    }
}

/// Writes as much of `b` as the socket takes without waiting.
fn write_now(wr: &OwnedWriteHalf, b: &mut impl Buf) -> io::Result<()> {
    while b.has_remaining() {
        let mut iov = [IoSlice::new(&[]); IOVECS];
        let n = b.chunks_vectored(&mut iov);
        match wr.as_ref().try_write_vectored(&iov[..n]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(k) => b.advance(k),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes all of `b`, waiting for the socket as needed. Fails with
/// `TimedOut` when one wait for progress lasts `stall`: a peer that stops
/// reading is cut off, one that reads slowly (a 256 MiB result over a slow
/// link) is not.
async fn write_all(out: &Out, b: &mut impl Buf, stall: Duration) -> io::Result<()> {
    let stalled = |_| {
        let why = format!("write made no progress for {stall:?}");
        io::Error::new(io::ErrorKind::TimedOut, why)
    };
    let wr = match out {
        Out::Tcp(wr) => wr,
        Out::Stream { wr, .. } => {
            let mut wr = wr.lock().await;
            while b.has_remaining() {
                let mut iov = [IoSlice::new(&[]); IOVECS];
                let n = b.chunks_vectored(&mut iov);
                let write = wr.write_vectored(&iov[..n]);
                match tokio::time::timeout(stall, write)
                    .await
                    .map_err(stalled)??
                {
                    0 => return Err(io::ErrorKind::WriteZero.into()),
                    k => b.advance(k),
                }
            }
            return tokio::time::timeout(stall, wr.flush())
                .await
                .map_err(stalled)?;
        }
    };
    loop {
        write_now(wr, b)?;
        if !b.has_remaining() {
            return Ok(());
        }
        tokio::time::timeout(stall, wr.as_ref().writable())
            .await
            .map_err(stalled)??;
    }
}

#[cfg(test)]
mod tests;
