//! The benchmarking configuration of seed 000 §4.2.2 as a [`Core`]: no
//! computation, a processing delay per input, and the first 16 bytes of each
//! input echoed into its output (the rest of the output stays zero).

use std::time::{Duration, Instant};

use corefarm_cores::{Core, CoreError};
use corefarm_smp::{BenchmarkConfig, BENCH_ECHO_LEN};

use crate::handlers::Engine;

/// One simulated core that takes `delay` per input.
pub struct BenchCore {
    delay: Duration,
    /// When the previous input was due; `None` before the first one.
    last_due: Option<Instant>,
    /// When the node queued the current job ([`Core::queued_at`]).
    queued: Option<Instant>,
}

impl BenchCore {
    pub fn new(delay: Duration) -> Self {
        BenchCore {
            delay,
            last_due: None,
            queued: None,
        }
    }

    /// The engine for a benchmarking configuration: one simulated core
    /// (the seed's simulation node).
    pub fn engine(cfg: &BenchmarkConfig) -> Engine {
        let delay = Duration::from_micros(cfg.delay_us as u64);
        Engine {
            cores: vec![Box::new(BenchCore::new(delay))],
            input_size: cfg.input_size as usize,
            output_size: cfg.output_size as usize,
        }
    }
}

/// Deadline of an input the node queued at `queued`. The emulated core is
/// seed 002's accelerator with a set execution time behind a job queue, as
/// a board's DMA queue or the engine's rung-ahead worker: it starts an input
/// as soon as it is free (the previous deadline) and the input has reached
/// it (queued by the node). So every gap of the node's own before the queue
/// — reading, checking, queueing — costs the core its time, as it would cost
/// a board's, while what a board does not have is not charged: the thread's
/// late wake-up from its sleep, and its hand-over of the result to the
/// sending task (on a shared CPU the woken task often takes the core's
/// thread's place; 1.5 % of 919 µs per input measured). A late thread
/// catches up with inputs due at once.
fn next_deadline(queued: Instant, last_due: Option<Instant>, delay: Duration) -> Instant {
    last_due.map_or(queued, |due| due.max(queued)) + delay
}

impl Core for BenchCore {
    /// Without a delay it only copies 16 bytes: its task runs it on the
    /// event loop, no thread in between.
    fn instant(&self) -> bool {
        self.delay.is_zero()
    }

    fn queued_at(&mut self, at: Instant) {
        self.queued = Some(at);
    }

    fn process(&mut self, input: &[u8], output: &mut [u8]) -> Result<(), CoreError> {
        // Sizes are checked when the configuration is parsed; a core must
        // still not panic on a caller's mistake.
        if input.len() < BENCH_ECHO_LEN || output.len() < BENCH_ECHO_LEN {
            return Err(CoreError::Failed(format!(
                "benchmarking core needs {BENCH_ECHO_LEN}-byte inputs and outputs, got {} and {}",
                input.len(),
                output.len()
            )));
        }
        if !self.delay.is_zero() {
            let now = Instant::now();
            // A caller that did not say when it queued the input handed it now.
            let due = next_deadline(
                self.queued.unwrap_or(now).min(now),
                self.last_due,
                self.delay,
            );
            if due > now {
                std::thread::sleep(due - now);
            }
            self.last_due = Some(due);
        }
        output[..BENCH_ECHO_LEN].copy_from_slice(&input[..BENCH_ECHO_LEN]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echoes_sixteen_bytes_and_leaves_the_rest() {
        let mut c = BenchCore::new(Duration::ZERO);
        let input: Vec<u8> = (0..40).collect();
        let mut out = vec![0u8; 32];
        c.process(&input, &mut out).unwrap();
        assert_eq!(&out[..16], &input[..16]);
        assert!(out[16..].iter().all(|&b| b == 0));
        assert!(c.process(&input[..8], &mut out).is_err());
        assert!(c.process(&input, &mut out[..15]).is_err());
    }

    #[test]
    fn an_input_starts_when_the_core_is_free_and_the_input_is_queued() {
        let t0 = Instant::now();
        let d = Duration::from_millis(1);
        let us = Duration::from_micros;
        // The first input starts when it was queued.
        assert_eq!(next_deadline(t0, None, d), t0 + d);
        // Queued while the previous one ran: it starts at that one's
        // deadline, however late the core's thread gets to it (a late
        // wake-up or a result hand-over is not the board's time).
        assert_eq!(next_deadline(t0 + us(300), Some(t0 + d), d), t0 + 2 * d);
        // A late thread catches up: the inputs queued meanwhile are due
        // one delay apart from the old deadline, some already past.
        let next = next_deadline(t0, Some(t0 + d), d);
        assert_eq!(next_deadline(t0, Some(next), d), t0 + 3 * d);
        // Queued 20 µs after the previous deadline (the node was reading
        // it): that gap of the node's own counts.
        assert_eq!(
            next_deadline(t0 + d + us(20), Some(t0 + d), d),
            t0 + 2 * d + us(20)
        );
        // Queued 50 ms later (the node idle): the schedule restarts there.
        let idle = t0 + Duration::from_millis(50);
        assert_eq!(next_deadline(idle, Some(t0 + d), d), idle + d);
    }

    #[test]
    fn a_batch_shares_its_queue_time() {
        let d = Duration::from_micros(200);
        let mut c = BenchCore::new(d);
        let t0 = Instant::now();
        c.queued_at(t0);
        let input = vec![7u8; 3 * 16];
        let mut out = vec![0u8; 3 * 16];
        c.process_batch(&input, &mut out, 3).unwrap();
        // Three inputs queued together run back to back from the queue time.
        assert_eq!(c.last_due, Some(t0 + 3 * d));
        assert!(Instant::now() >= t0 + 3 * d);
        assert_eq!(out, input);
    }

    #[test]
    fn only_the_zero_delay_core_is_instant() {
        let cfg = |delay_us| BenchmarkConfig {
            input_size: 32,
            output_size: 16,
            delay_us,
        };
        let e = BenchCore::engine(&cfg(0));
        assert!(e.cores[0].instant());
        assert_eq!((e.cores.len(), e.input_size, e.output_size), (1, 32, 16));
        assert!(!BenchCore::engine(&cfg(919)).cores[0].instant());
    }
}
