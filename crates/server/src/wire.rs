//! A connection's outgoing frames. The task that produces a frame writes it
//! to the socket itself when nothing else is being written (one non-blocking
//! `writev`, no hand-off); only when the socket is busy or full do frames
//! queue for the connection's writer task, which then writes them in order,
//! several per `writev`. Forwarding a message thus costs no task switch as
//! long as the peer keeps up, which is the common case.
//!
//! Order is kept by one rule: a frame is written directly only when the queue
//! is empty and no one else is writing; a direct write the kernel takes only
//! in part puts the rest at the head of the queue and hands the socket to the
//! writer task. The mutex guards that bookkeeping only, never a syscall.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::sync::Mutex;
use std::time::Duration;

use bytes::Buf;
use corefarm_smp::{FrameBatch, OutFrame};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::Notify;

/// Iovecs per `writev`: two per frame (headers, body) for a full batch.
const IOVECS: usize = 2 * FrameBatch::MAX_FRAMES;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Nobody writes; the queue is empty.
    Idle,
    /// A sender is writing a frame directly.
    Direct,
    /// The writer task owns the socket until the queue is empty.
    Task,
}

struct State {
    /// Frames waiting for the writer task, with the sender's tag (see [`Sink::send`]).
    queue: VecDeque<(OutFrame, bool)>,
    mode: Mode,
    /// Set once: the write that failed, or why the sink was closed.
    failed: Option<String>,
    /// No more frames will be sent: the writer task ends once the queue is written.
    finishing: bool,
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

pub struct Sink {
    wr: OwnedWriteHalf,
    state: Mutex<State>,
    /// Wakes the writer task: a hand-off, a failure or the end.
    wake: Notify,
    /// Wakes senders waiting for room in the queue ([`Sink::room`]).
    drained: Notify,
}

impl Sink {
    pub fn new(wr: OwnedWriteHalf) -> Self {
        Sink {
            wr,
            state: Mutex::new(State {
                queue: VecDeque::new(),
                mode: Mode::Idle,
                failed: None,
                finishing: false,
            }),
            wake: Notify::new(),
            drained: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The guarded code never panics; a poisoned lock still holds valid state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends a frame: written at once when the socket is idle and takes it
    /// whole, else queued (unbounded; see [`Sink::room`]). `tag` is handed
    /// back to the writer task's `on_written` for queued frames, so an owner
    /// can count completions of the frames it cares about.
    pub fn send(&self, mut f: OutFrame, tag: bool) -> Sent {
        {
            let mut st = self.lock();
            if st.failed.is_some() || st.finishing {
                return Sent::Closed;
            }
            if st.mode != Mode::Idle {
                st.queue.push_back((f, tag));
                return Sent::Queued;
            }
            st.mode = Mode::Direct;
        }
        let result = write_now(&self.wr, &mut f);
        let mut st = self.lock();
        match result {
            Ok(()) if !f.has_remaining() => {
                if st.queue.is_empty() {
                    st.mode = Mode::Idle;
                    return Sent::Written;
                }
                // Others queued behind this frame meanwhile: the task takes over.
                st.mode = Mode::Task;
                drop(st);
                self.wake.notify_one();
                Sent::Written
            }
            Ok(()) => {
                st.queue.push_front((f, tag));
                st.mode = Mode::Task;
                drop(st);
                self.wake.notify_one();
                Sent::Queued
            }
            Err(e) => {
                st.failed
                    .get_or_insert_with(|| format!("write failed: {e}"));
                st.mode = Mode::Task;
                drop(st);
                self.wake.notify_one();
                Sent::Closed
            }
        }
    }

    /// Waits until at most `max` frames are queued (or the sink failed), so a
    /// producer slows down to the peer's pace instead of queueing without bound.
    pub async fn room(&self, max: usize) {
        loop {
            let drained = self.drained.notified();
            {
                let st = self.lock();
                if st.queue.len() <= max || st.failed.is_some() {
                    return;
                }
            }
            drained.await;
        }
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
        let _ = socket2::SockRef::from(self.wr.as_ref()).shutdown(std::net::Shutdown::Write);
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
            let mut batch = FrameBatch::default();
            let mut tagged = 0u64;
            {
                let mut st = self.lock();
                if let Some(reason) = &st.failed {
                    let reason = reason.clone();
                    drop(st);
                    self.drained.notify_waiters();
                    return Some(reason);
                }
                if st.finishing && st.mode == Mode::Idle {
                    drop(st);
                    self.shutdown();
                    return None;
                }
                if st.mode == Mode::Task {
                    while !batch.is_full() {
                        let Some((f, tag)) = st.queue.pop_front() else {
                            break;
                        };
                        tagged += tag as u64;
                        batch.push(f);
                    }
                    if batch.is_empty() {
                        if st.finishing {
                            drop(st);
                            self.shutdown();
                            return None;
                        }
                        st.mode = Mode::Idle;
                    }
                }
            }
            if batch.is_empty() {
                // A stale wake-up while a sender writes directly is harmless:
                // the mode is checked again after every wake.
                self.wake.notified().await;
                continue;
            }
            self.drained.notify_waiters();
            let err = match tokio::time::timeout(io_timeout, write_all(&self.wr, &mut batch)).await
            {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(format!("write failed: {e}")),
                Err(_) => Some(format!("write made no progress for {io_timeout:?}")),
            };
            if let Some(reason) = err {
                self.close(&reason);
                continue;
            }
            if tagged > 0 {
                on_written(tagged);
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

/// Writes all of `b`, waiting for the socket to become writable as needed.
async fn write_all(wr: &OwnedWriteHalf, b: &mut impl Buf) -> io::Result<()> {
    loop {
        write_now(wr, b)?;
        if !b.has_remaining() {
            return Ok(());
        }
        wr.as_ref().writable().await?;
    }
}
