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
    /// The previous input: when it was due, and when the core's thread
    /// woke from waiting for that; `None` before the first one.
    last: Option<Last>,
}

#[derive(Debug, Clone, Copy)]
struct Last {
    due: Instant,
    woke: Instant,
}

impl BenchCore {
    pub fn new(delay: Duration) -> Self {
        BenchCore { delay, last: None }
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

/// Deadline of the next input, handed over at `now`. The emulated core
/// (seed 002's accelerator with a set execution time, a hardware timer)
/// finished the previous input at its deadline; its thread only noticed at
/// `woke`, a sleep's wake-up latency that a board does not have. That
/// lateness is taken off: the time the node took from the core's finish to
/// the next input is counted from the deadline, so a late wake-up does not
/// stretch the core (a burst of late ones is caught up by inputs due at
/// once) while every gap of the node's own — reading, queueing, sending —
/// still costs the core its time, as it would cost a board's.
fn next_deadline(now: Instant, last: Option<Last>, delay: Duration) -> Instant {
    match last {
        Some(l) => {
            let late = l.woke.saturating_duration_since(l.due);
            now.checked_sub(late).unwrap_or(now).max(l.due) + delay
        }
        None => now + delay,
    }
}

impl Core for BenchCore {
    /// Without a delay it only copies 16 bytes: its task runs it on the
    /// event loop, no thread in between.
    fn instant(&self) -> bool {
        self.delay.is_zero()
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
            let due = next_deadline(now, self.last, self.delay);
            let woke = if due > now {
                std::thread::sleep(due - now);
                Instant::now()
            } else {
                now
            };
            self.last = Some(Last { due, woke });
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
    fn a_late_wake_up_is_taken_off_and_the_nodes_own_gaps_are_not() {
        let t0 = Instant::now();
        let d = Duration::from_millis(1);
        let us = Duration::from_micros;
        assert_eq!(next_deadline(t0, None, d), t0 + d);
        // Due at t0 + d, woken 300 µs late, the next input handed 20 µs
        // later: due one delay after the deadline plus those 20 µs.
        let last = Last {
            due: t0 + d,
            woke: t0 + d + us(300),
        };
        assert_eq!(
            next_deadline(t0 + d + us(320), Some(last), d),
            t0 + 2 * d + us(20)
        );
        // Woken 2.5 delays late: the next inputs are due at once (in the
        // past), until the core has caught up.
        let last = Last {
            due: t0 + d,
            woke: t0 + d + us(2500),
        };
        let next = next_deadline(t0 + d + us(2500), Some(last), d);
        assert_eq!(next, t0 + 2 * d);
        let last = Last {
            due: next,
            woke: t0 + d + us(2500),
        };
        assert_eq!(next_deadline(t0 + d + us(2500), Some(last), d), t0 + 3 * d);
        // Woken on time, the next input 50 ms later (the node idle, or busy
        // on its own): that gap counts, the schedule restarts from now.
        let last = Last {
            due: t0 + d,
            woke: t0 + d,
        };
        let idle = t0 + Duration::from_millis(50);
        assert_eq!(next_deadline(idle, Some(last), d), idle + d);
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
