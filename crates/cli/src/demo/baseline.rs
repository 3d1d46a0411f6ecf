//! The software baseline of seed 000 §4.5: the matrix multiplier's C++
//! function on one thread, no network.

use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use corefarm_cores::image::Family;
use serde::Serialize;

use super::workload::{check, input_for, INPUT_SIZE, OUTPUT_SIZE};
use super::Target;

#[derive(Debug, Serialize)]
pub struct Software {
    pub implementation: String,
    pub matrices: u64,
    pub seconds: f64,
    pub matrices_per_s: f64,
    /// Input bytes per second (how seed §4.5 reports its 96 MB/s).
    pub mbyte_per_s_in: f64,
    /// The function's output for one input equals the Rust reference.
    pub output_verified: bool,
}

/// Runs the very shared object the native nodes run, loaded by
/// corefarm-cores' native backend as a single core, in a loop on this
/// thread for at least `seconds` (and at least one product). The backend
/// adds a copy of each input and output and a hand-off to its core thread,
/// small beside a 64×64×64 product.
pub fn measure(native_so: &Path, seconds: f64, seed: u64) -> Result<Software> {
    let mut core = super::load_one_core(Target::Native, Family::Intel, native_so)?;
    let inputs: Vec<Vec<u8>> = (0..8).map(|i| input_for(seed ^ 0xBA5E, i)).collect();
    let mut out = vec![0u8; OUTPUT_SIZE];
    core.process(&inputs[0], &mut out)?;
    // Not fatal here: the same object runs on native nodes, whose results
    // are checked one by one and reported first.
    let output_verified = check(&inputs[0], &out).is_ok();
    let start = Instant::now();
    let mut n = 0u64;
    while n == 0 || start.elapsed().as_secs_f64() < seconds {
        let input = &inputs[(n % inputs.len() as u64) as usize];
        core.process(input, &mut out)?;
        std::hint::black_box(&out);
        n += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    Ok(Software {
        implementation:
            "cores/matmul/matmul.cpp (seed §4.3.2.1), c++ -O3 -fwrapv, one core called in a loop \
                         on one thread through corefarm-cores' native backend (no network)"
                .into(),
        matrices: n,
        seconds: secs,
        matrices_per_s: n as f64 / secs,
        mbyte_per_s_in: n as f64 * INPUT_SIZE as f64 / secs / 1e6,
        output_verified,
    })
}
