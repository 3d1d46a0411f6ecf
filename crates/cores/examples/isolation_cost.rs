//! What isolating a core costs per job: the reference matrix multiplier
//! (cores/matmul/matmul.cpp) loaded in-process and isolated, each called in
//! a loop on this thread, one product per call (a data message of count
//! one) and `batch` products per call (`Core::process_batch`, a data message
//! of that count, which is one worker job). The isolated core runs one
//! product per call twice: waiting for each before the next (`x1`), and
//! through its pipeline (`x1 pipelined`: the next product submitted before
//! the current one is collected, as the node's core handler does when its
//! queue holds the next message). Prints wall time per product
//! (the best of several rounds, which filters out other load on the
//! machine) and CPU time per product (this process plus its reaped
//! workers, less the CPU time of a load and one call, measured apart).
//!
//! `cargo build --release -p corefarm-cores --bins --example isolation_cost`, then
//! `target/release/examples/isolation_cost [products] [rounds] [batch]`

use std::path::Path;
use std::time::Instant;

use bytes::Bytes;
use corefarm_cores::image::{self, ArtifactKind};
use corefarm_cores::{load, Isolation, LoadOptions, WorkerCommand};
use corefarm_toolchain::{self as toolchain, BuildKind, ImageBuilder};

const INPUT: u32 = 2 * 64 * 64 * 4;
const OUTPUT: u32 = 64 * 64 * 4;

fn cpu_seconds() -> f64 {
    let (s, c) = cpu_split();
    s + c
}

/// (this process, its reaped children) user+system seconds.
fn cpu_split() -> (f64, f64) {
    let t = |who| {
        // SAFETY: getrusage fills the struct it is given.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(who, &mut u) };
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        tv(u.ru_utime) + tv(u.ru_stime)
    };
    (t(libc::RUSAGE_SELF), t(libc::RUSAGE_CHILDREN))
}

fn main() {
    let mut args = std::env::args().skip(1);
    let jobs: u32 = args.next().map_or(2000, |a| a.parse().expect("jobs"));
    let rounds: u32 = args.next().map_or(5, |a| a.parse().expect("rounds"));
    let batch: usize = args.next().map_or(4, |a| a.parse().expect("batch"));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../cores/matmul/matmul.cpp");
    let so = toolchain::cached_build(
        &BuildKind::Native,
        &[src],
        "",
        &toolchain::default_cache_dir(),
    )
    .expect("build cores/matmul/matmul.cpp");
    let table = image::default_core_table(1, INPUT, OUTPUT).unwrap();
    let img = ImageBuilder::new("mat_mul_64x64", INPUT, OUTPUT, table)
        .artifact(
            image::native_target().unwrap(),
            ArtifactKind::Native,
            "mat_mul_64x64",
            std::fs::read(so).unwrap(),
        )
        .build()
        .unwrap();
    let cfg = image::configuration(Bytes::from(img)).unwrap();
    // The worker: the crate's own worker executable next to this example's
    // directory (target/<profile>/), as `cargo build --bins` puts it.
    let exe = std::env::current_exe().unwrap();
    let worker = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("corefarm-core-worker");
    if !worker.is_file() {
        eprintln!(
            "no worker at {}: build it first with `cargo build --release -p corefarm-cores --bins`",
            worker.display()
        );
        std::process::exit(2);
    }
    let inputs: Vec<u8> = (0..INPUT as usize * batch)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    let mut outputs = vec![0u8; OUTPUT as usize * batch];
    // (isolation, products per call, pipelined)
    let modes = [
        (Isolation::InProcess, 1, false),
        (Isolation::Process, 1, false),
        (Isolation::Process, 1, true),
        (Isolation::InProcess, batch, false),
        (Isolation::Process, batch, false),
    ];
    let mut best = [f64::MAX; 5];
    let mut cpu = [0.0; 5];
    let calls = (jobs as usize / batch).max(1);
    for _ in 0..rounds {
        for (k, &(isolation, n, pipelined)) in modes.iter().enumerate() {
            let opts = LoadOptions {
                isolation,
                worker: WorkerCommand::Program(worker.clone()),
                ..LoadOptions::default()
            };
            let (i, o) = (
                &inputs[..INPUT as usize * n],
                &mut outputs[..OUTPUT as usize * n],
            );
            let calls = if n == 1 { jobs as usize } else { calls };
            let products = (calls * n) as f64;
            // The CPU time of starting (and for `process`, of spawning and
            // reaping a worker) and of one call, subtracted below.
            let c0 = cpu_seconds();
            let mut loaded = load(&cfg, &opts).expect("load");
            loaded.cores[0].process_batch(i, o, n).unwrap();
            drop(loaded);
            let setup = cpu_seconds() - c0;
            let c0 = cpu_seconds();
            let s0 = cpu_split();
            let mut loaded = load(&cfg, &opts).expect("load");
            let core = &mut loaded.cores[0];
            core.process_batch(i, o, n).unwrap();
            let t = Instant::now();
            if pipelined {
                let pipe = core.pipeline().expect("an isolated core has a pipeline");
                pipe.submit(i, n);
                for _ in 1..calls {
                    pipe.submit(i, n);
                    pipe.collect(o).unwrap();
                }
                pipe.collect(o).unwrap();
            } else {
                for _ in 0..calls {
                    core.process_batch(i, o, n).unwrap();
                }
            }
            best[k] = best[k].min(t.elapsed().as_secs_f64() / products);
            drop(loaded); // reaps the worker, whose CPU time joins RUSAGE_CHILDREN
            cpu[k] += (cpu_seconds() - c0 - setup) / products;
            if std::env::var_os("SPLIT").is_some() {
                let s1 = cpu_split();
                eprintln!(
                    "{isolation} x{n}{}: node {:.1} µs/product, worker {:.1} µs/product (with start-up)",
                    if pipelined { " pipelined" } else { "" },
                    (s1.0 - s0.0) / products * 1e6,
                    (s1.1 - s0.1) / products * 1e6
                );
            }
        }
    }
    for (k, &(isolation, n, pipelined)) in modes.iter().enumerate() {
        println!(
            "{:>10} x{n}{}: best wall {:.1} µs/product, mean CPU {:.1} µs/product",
            isolation.to_string(),
            if pipelined { " pipelined" } else { "" },
            best[k] * 1e6,
            cpu[k] / rounds as f64 * 1e6
        );
    }
    for (name, base, k) in [
        ("x1", 0, 1),
        ("x1 pipelined", 0, 2),
        (&format!("x{batch}"), 3, 4),
    ] {
        println!(
            "isolation cost {name}: wall {:+.1} %, CPU {:+.1} %",
            (best[k] / best[base] - 1.0) * 100.0,
            (cpu[k] / cpu[base] - 1.0) * 100.0
        );
    }
}
