//! What the sending loop, the receiving loop and the monitor share, and the
//! 16-byte tag that lets the receiver check every result.

use super::*;

pub(super) struct InFlight {
    pub(super) ts: u64,
    pub(super) count: u32,
}

/// State shared by the sending loop, the receiving loop and the monitor.
pub(super) struct RunState {
    pub(super) inflight: Mutex<HashMap<u32, InFlight>>,
    pub(super) credits: Mutex<u64>,
    pub(super) credit_cv: Condvar,
    /// Set once the sender has left its loop.
    pub(super) sender_done: AtomicBool,
    /// Set to make every loop return now.
    pub(super) abort: AtomicBool,
    pub(super) sent_msgs: AtomicU64,
    pub(super) sent_inputs: AtomicU64,
    pub(super) window_sent_msgs: AtomicU64,
    pub(super) recv_msgs: AtomicU64,
    pub(super) recv_outputs: AtomicU64,
    pub(super) recv_in_bytes: AtomicU64,
    pub(super) recv_out_bytes: AtomicU64,
    pub(super) window_msgs: AtomicU64,
    pub(super) window_in_bytes: AtomicU64,
    pub(super) window_out_bytes: AtomicU64,
    /// Latency sum/count since the last progress line.
    pub(super) tick_lat_ns: AtomicU64,
    pub(super) tick_lat_n: AtomicU64,
    pub(super) corrupted: AtomicU64,
    pub(super) failed: AtomicU64,
    pub(super) errors: Mutex<Vec<String>>,
    /// Every result (or per-message error) returns one credit to the sender:
    /// a local window instead of server credit.
    pub(super) local_credit: bool,
    /// The connection data is written to. A resumed session replaces it
    /// and bumps `link_gen` (under the `inflight` lock, so that a message
    /// is either sent again by the resume or written by the sender, never
    /// both).
    pub(super) link: Mutex<SendHalf>,
    pub(super) link_gen: AtomicU64,
    /// A lost server is being replaced: the sender waits.
    pub(super) resuming: AtomicBool,
    /// Sessions resumed after a lost server.
    pub(super) resumes: AtomicU64,
}

impl RunState {
    pub(super) fn return_credit(&self) {
        if self.local_credit {
            *self.credits.lock().unwrap_or_else(|p| p.into_inner()) += 1;
            self.credit_cv.notify_one();
        }
    }

    pub(super) fn error(&self, e: String) {
        let mut v = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        if v.len() < MAX_ERROR_SAMPLES {
            v.push(e);
        }
    }

    pub(super) fn corrupt(&self, e: String) {
        self.corrupted.fetch_add(1, Ordering::Relaxed);
        self.error(e);
    }
}

/// Clock points of a run, in `now_ns()` nanoseconds.
#[derive(Debug, Clone, Copy)]
pub(super) struct Window {
    pub(super) start: u64,
    pub(super) end: u64,
}

impl Window {
    pub(super) fn contains(&self, t: u64) -> bool {
        t >= self.start && t < self.end
    }
}

/// Writes the 16-byte tag of input `index` of message `id`.
pub(super) fn stamp(input: &mut [u8], ts: u64, id: u32, index: u32) {
    input[..8].copy_from_slice(&ts.to_le_bytes());
    input[8..12].copy_from_slice(&id.to_le_bytes());
    input[12..16].copy_from_slice(&index.to_le_bytes());
}

/// Checks one result against what was sent. Returns a description of the
/// first problem, if any.
pub(super) fn check_result(
    data: &[u8],
    id: u32,
    sent: &InFlight,
    output_size: u32,
) -> Option<String> {
    let want = sent.count as usize * output_size as usize;
    if data.len() != want {
        return Some(format!(
            "result {id}: {} bytes, expected {} outputs of {} bytes",
            data.len(),
            sent.count,
            output_size
        ));
    }
    let mut tag = [0u8; BENCH_ECHO_LEN];
    for (i, out) in data.chunks_exact(output_size as usize).enumerate() {
        stamp(&mut tag, sent.ts, id, i as u32);
        if out[..BENCH_ECHO_LEN] != tag {
            return Some(format!(
                "result {id}: output {i} does not carry its input's timestamp"
            ));
        }
    }
    None
}

pub(super) fn is_timeout(e: &ReadError) -> bool {
    matches!(e, ReadError::Io(io) if matches!(io.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut))
}
