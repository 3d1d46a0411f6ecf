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
    deadline: Option<Instant>,
}

impl BenchCore {
    pub fn new(delay: Duration) -> Self {
        BenchCore {
            delay,
            deadline: None,
        }
    }

    /// The engine for a benchmarking configuration: one simulated core
    /// (the seed's simulation node), run inline when it has no delay.
    pub fn engine(cfg: &BenchmarkConfig) -> Engine {
        let delay = Duration::from_micros(cfg.delay_us as u64);
        Engine {
            cores: vec![Box::new(BenchCore::new(delay))],
            input_size: cfg.input_size as usize,
            output_size: cfg.output_size as usize,
            inline: delay.is_zero(),
        }
    }
}

/// Deadline of the next input. While inputs arrive back to back, each
/// deadline is the previous one plus the delay, so the wake-up latency of one
/// sleep is absorbed by the next instead of stretching every input (the node
/// keeps its nominal rate); after a real idle gap (more than `slack` late)
/// the schedule restarts from now.
fn next_deadline(now: Instant, previous: Option<Instant>, delay: Duration) -> Instant {
    let slack = Duration::from_micros(500).min(delay);
    match previous {
        Some(d) if now.saturating_duration_since(d) <= slack => d + delay,
        _ => now + delay,
    }
}

impl Core for BenchCore {
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
            let due = next_deadline(now, self.deadline, self.delay);
            self.deadline = Some(due);
            if due > now {
                std::thread::sleep(due - now);
            }
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
    fn deadlines_keep_the_nominal_rate_and_restart_after_a_gap() {
        let t0 = Instant::now();
        let d = Duration::from_millis(1);
        assert_eq!(next_deadline(t0, None, d), t0 + d);
        // Woken 300 µs late: the next input is still due one delay after the last deadline.
        let late = t0 + d + Duration::from_micros(300);
        assert_eq!(next_deadline(late, Some(t0 + d), d), t0 + 2 * d);
        // Idle for a while: restart from now.
        let idle = t0 + Duration::from_millis(50);
        assert_eq!(next_deadline(idle, Some(t0 + d), d), idle + d);
    }

    #[test]
    fn only_the_zero_delay_engine_runs_inline() {
        let cfg = |delay_us| BenchmarkConfig {
            input_size: 32,
            output_size: 16,
            delay_us,
        };
        let e = BenchCore::engine(&cfg(0));
        assert!(e.inline);
        assert_eq!((e.cores.len(), e.input_size, e.output_size), (1, 32, 16));
        assert!(!BenchCore::engine(&cfg(919)).inline);
    }
}
