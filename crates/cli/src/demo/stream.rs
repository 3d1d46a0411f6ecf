//! Streaming the matrices through the cluster with the Rust client: a
//! sender thread keeps at most `window` data messages in flight, this thread
//! receives, times each message and checks (or holds) every result.

use std::io::IsTerminal;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use bytes::Bytes;
use corefarm_bench::stats::{LatencyHistogram, LatencySummary};
use corefarm_client::{Client, ClientError};
use corefarm_smp::ErrorMsg;
use serde::Serialize;

use super::workload::{check, input_for, INPUT_SIZE, OUTPUT_SIZE};

/// The first job that did not come back right.
#[derive(Debug, Clone, Serialize)]
pub struct BadJob {
    pub job: u64,
    pub reason: String,
}

pub struct StreamSpec {
    pub jobs: u64,
    /// Inputs (matrix pairs) per data message; the last message may carry fewer.
    pub count: u32,
    pub window: u32,
    pub seed: u64,
    pub timeout: Duration,
    /// Keep results to check after the timed run instead of checking them
    /// as they arrive.
    pub hold: bool,
    pub quiet: bool,
}

/// Jobs (input indices) carried by data message `msg`.
fn message_jobs(msg: usize, count: usize, jobs: usize) -> Range<usize> {
    let first = msg * count;
    first..(first + count).min(jobs)
}

/// What came back, counted as it arrived.
#[derive(Default)]
struct Tally {
    /// Results still to be checked (None: checked inline or failed).
    held: Vec<Option<Bytes>>,
    checked: u64,
    mismatched: u64,
    /// Jobs the cluster answered with an error instead of a result.
    failed: u64,
    first_bad: Option<BadJob>,
}

impl Tally {
    fn note_bad(&mut self, job: u64, reason: String) {
        if self.first_bad.as_ref().is_none_or(|b| job < b.job) {
            self.first_bad = Some(BadJob { job, reason });
        }
    }

    /// Accounts for the answer to the data message carrying `jobs`: its
    /// outputs, or the server's error.
    fn record(
        &mut self,
        jobs: Range<usize>,
        answer: Result<Bytes, ErrorMsg>,
        seed: u64,
        hold: bool,
    ) {
        let n = jobs.len();
        match answer {
            Ok(data) if data.len() != n * OUTPUT_SIZE => {
                self.mismatched += n as u64;
                self.checked += n as u64;
                let reason = format!(
                    "the result of a message of {n} inputs is {} bytes, expected {}",
                    data.len(),
                    n * OUTPUT_SIZE
                );
                self.note_bad(jobs.start as u64, reason);
            }
            Ok(data) => {
                for (i, job) in jobs.enumerate() {
                    // A zero-copy view of this input's output inside the message.
                    let out = data.slice(i * OUTPUT_SIZE..(i + 1) * OUTPUT_SIZE);
                    if hold {
                        self.held[job] = Some(out);
                        continue;
                    }
                    self.checked += 1;
                    if let Err(r) = check(&input_for(seed, job as u64), &out) {
                        self.mismatched += 1;
                        self.note_bad(job as u64, r.to_string());
                    }
                }
            }
            Err(e) => {
                self.failed += n as u64;
                self.note_bad(jobs.start as u64, format!("the server reports: {e}"));
            }
        }
    }
}

/// A finished stream: timings, and the results not yet checked.
pub struct Streamed {
    pub elapsed: f64,
    pub latency: LatencySummary,
    tally: Tally,
}

/// Every result checked.
pub struct Verified {
    /// "after" (results held, checked once the clock stopped) or "inline".
    pub verification: &'static str,
    pub verified: u64,
    pub mismatches: u64,
    pub failed: u64,
    pub first_bad: Option<BadJob>,
}

impl Streamed {
    /// Checks the held results (outside the timed run) and sums up.
    pub fn verify(mut self, seed: u64) -> Verified {
        let t = &mut self.tally;
        let verification = if t.held.is_empty() { "inline" } else { "after" };
        for job in 0..t.held.len() {
            if let Some(data) = t.held[job].take() {
                t.checked += 1;
                if let Err(r) = check(&input_for(seed, job as u64), &data) {
                    t.mismatched += 1;
                    t.note_bad(job as u64, r.to_string());
                }
            }
        }
        Verified {
            verification,
            verified: t.checked - t.mismatched,
            mismatches: t.mismatched,
            failed: t.failed,
            first_bad: t.first_bad.take(),
        }
    }
}

fn progress_bar(jobs: u64, quiet: bool) -> indicatif::ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let b = indicatif::ProgressBar::new(jobs);
    b.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} matrices ({per_sec}, eta {eta})",
        )
        .expect("valid template"),
    );
    b
}

/// Streams the inputs through the cluster from a sender thread, receiving on
/// this one; at most `window` data messages (of `count` inputs each) are
/// outstanding. Latency is per data message.
pub fn stream(client: Client, s: &StreamSpec) -> Result<Streamed> {
    let jobs = s.jobs as usize;
    let count = s.count.max(1) as usize;
    let messages = jobs.div_ceil(count);
    let (tx, rx) = client.split();
    let sent: Arc<Vec<AtomicU64>> = Arc::new((0..messages).map(|_| AtomicU64::new(0)).collect());
    // One token per message the window allows; a result returns its token.
    let (tok_tx, tok_rx) = mpsc::sync_channel::<()>(s.window as usize);
    for _ in 0..s.window {
        tok_tx.send(()).expect("capacity is the window");
    }
    let start = Instant::now();
    let sender = std::thread::spawn({
        let (sent, seed) = (sent.clone(), s.seed);
        move || -> Result<(), ClientError> {
            for msg in 0..messages {
                if tok_rx.recv().is_err() {
                    return Ok(()); // the receiver gave up; it reports why
                }
                let range = message_jobs(msg, count, jobs);
                let mut data = Vec::with_capacity(range.len() * INPUT_SIZE);
                for job in range {
                    data.extend_from_slice(&input_for(seed, job as u64));
                }
                sent[msg].store(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
                if let Err(e) = tx.submit_with_id(msg as u32, Bytes::from(data)) {
                    tx.close(); // wakes the receiver
                    return Err(e);
                }
            }
            Ok(())
        }
    });

    let bar = progress_bar(s.jobs, s.quiet);
    let mut hist = LatencyHistogram::new();
    let mut tally = Tally {
        held: if s.hold { vec![None; jobs] } else { Vec::new() },
        ..Tally::default()
    };
    let mut seen = vec![false; messages];
    let mut received = 0usize;
    let outcome: Result<()> = loop {
        if received == messages {
            break Ok(());
        }
        let (msg, answer) = match rx.recv(Some(s.timeout)) {
            Ok(out) => (out.id as usize, Ok(out.data)),
            Err(ClientError::Server(e)) if (e.id as usize) < messages => (e.id as usize, Err(e)),
            Err(e) => {
                break Err(anyhow!(e).context(format!(
                    "streaming stopped after {received} of {messages} results"
                )))
            }
        };
        if msg >= messages || seen[msg] {
            break Err(anyhow!(
                "the server returned id {msg}, which is not an outstanding data message"
            ));
        }
        seen[msg] = true;
        received += 1;
        let now = start.elapsed().as_nanos() as u64;
        hist.record(now.saturating_sub(sent[msg].load(Ordering::Relaxed)));
        let range = message_jobs(msg, count, jobs);
        let n = range.len() as u64;
        tally.record(range, answer, s.seed, s.hold);
        let _ = tok_tx.send(());
        bar.inc(n);
    };
    let elapsed = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    if outcome.is_err() {
        rx.close(); // unblocks a sender waiting for credit
    }
    drop(tok_tx);
    let sender_result = sender
        .join()
        .map_err(|_| anyhow!("the sending thread panicked"))?;
    match sender_result {
        // Closed by the receiver above: its own error says why.
        Err(ClientError::ClosedLocally) => {}
        // The sender closes the connection on failure, so its error is the cause.
        Err(e) => return Err(anyhow!(e).context("sending matrices")),
        Ok(()) => {}
    }
    outcome?;
    Ok(Streamed {
        elapsed,
        latency: hist.summary(),
        tally,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demo::workload::reference;

    #[test]
    fn messages_cover_every_job_once() {
        let (jobs, count): (usize, usize) = (11, 4);
        let all: Vec<usize> = (0..jobs.div_ceil(count))
            .flat_map(|m| message_jobs(m, count, jobs))
            .collect();
        assert_eq!(all, (0..jobs).collect::<Vec<_>>());
        assert_eq!(message_jobs(2, 4, 11), 8..11);
        assert_eq!(message_jobs(0, 1, 1), 0..1);
    }

    fn outputs(seed: u64, jobs: Range<usize>) -> Bytes {
        let v: Vec<u8> = jobs
            .flat_map(|j| reference(&input_for(seed, j as u64)))
            .collect();
        Bytes::from(v)
    }

    fn streamed(tally: Tally) -> Streamed {
        Streamed {
            elapsed: 1.0,
            latency: LatencySummary::default(),
            tally,
        }
    }

    #[test]
    fn held_and_inline_results_are_checked_alike() {
        for hold in [false, true] {
            let mut t = Tally {
                held: if hold { vec![None; 5] } else { Vec::new() },
                ..Tally::default()
            };
            t.record(0..3, Ok(outputs(9, 0..3)), 9, hold);
            let mut wrong = outputs(9, 3..5).to_vec();
            wrong[OUTPUT_SIZE + 4 * 7] ^= 1; // job 4, C[0][7]
            t.record(3..5, Ok(Bytes::from(wrong)), 9, hold);
            let v = streamed(t).verify(9);
            assert_eq!(v.verification, if hold { "after" } else { "inline" });
            assert_eq!((v.verified, v.mismatches, v.failed), (4, 1, 0));
            let bad = v.first_bad.unwrap();
            assert_eq!(bad.job, 4);
            assert!(bad.reason.starts_with("C[0][7] = "), "{}", bad.reason);
        }
    }

    #[test]
    fn short_results_and_errors_name_the_earliest_job() {
        let mut t = Tally::default();
        let boom = ErrorMsg {
            id: 6,
            code: 0,
            reason: "boom".into(),
        };
        t.record(6..8, Err(boom), 1, false);
        t.record(2..4, Ok(Bytes::from_static(b"short")), 1, false);
        let v = streamed(t).verify(1);
        assert_eq!((v.verified, v.mismatches, v.failed), (0, 2, 2));
        let bad = v.first_bad.unwrap();
        assert_eq!(bad.job, 2);
        assert!(bad.reason.contains("is 5 bytes"), "{}", bad.reason);
    }
}
