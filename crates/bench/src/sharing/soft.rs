//! The applications' software path: a loop calibrated once so that one
//! input of function `f` costs `speedup × delay_us(f)` of CPU time, as a
//! software version of an accelerator `speedup` times faster would. A
//! counted loop, not a wait on the clock: when the CPU is shared the
//! software gets slower, as real software would.

use std::hint::black_box;
use std::time::Instant;

use corefarm_cores::{Core, CoreError};

/// Spins `n` iterations of a dependent multiply-add the optimiser keeps.
pub fn spin(n: u64) {
    let mut x = 1u64;
    for i in 0..n {
        x = black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i));
    }
    black_box(x);
}

/// Iterations of [`spin`] per microsecond: the best of a few short runs,
/// i.e. this CPU's speed when nothing else runs on it.
pub fn calibrate() -> f64 {
    const N: u64 = 1 << 21;
    spin(N); // warm-up: frequency scaling, page faults
    (0..5)
        .map(|_| {
            let t = Instant::now();
            spin(N);
            N as f64 / (t.elapsed().as_secs_f64() * 1e6).max(1e-3)
        })
        .fold(0.0, f64::max)
}

/// The software version of the benchmarking core: `iters` iterations per
/// input, and the benchmarking core's output (the input's first 16 bytes,
/// the rest zero), so results match whichever side computed them.
pub struct SoftCore {
    pub iters: u64,
}

impl Core for SoftCore {
    fn process(&mut self, input: &[u8], output: &mut [u8]) -> Result<(), CoreError> {
        spin(self.iters);
        let n = input.len().min(output.len()).min(16);
        output[..n].copy_from_slice(&input[..n]);
        output[n..].fill(0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soft_core_echoes_like_the_benchmarking_core() {
        let mut c = SoftCore { iters: 10 };
        let input: Vec<u8> = (0..16).collect();
        let mut out = vec![0xAAu8; 16];
        c.process(&input, &mut out).unwrap();
        assert_eq!(out, input);
    }

    #[test]
    fn calibration_is_positive_and_finite() {
        let r = calibrate();
        assert!(r.is_finite() && r > 0.0, "{r}");
    }
}
