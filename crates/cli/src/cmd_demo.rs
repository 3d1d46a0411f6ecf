//! `corefarm demo`: the seed's test case (seed 000 §4.3: 64×64 signed int32
//! matrix products) end to end on an embedded local cluster, every result
//! checked, side by side with the single-threaded software baseline of §4.5.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use corefarm_bench::stats::{bits_per_second, human, LatencyHistogram, LatencySummary};
use corefarm_client::{Client, ClientError, ClientOptions};
use corefarm_cores::{image, ArtifactKind, LoadOptions};
use corefarm_node::NodeOptions;
use corefarm_server::ServerOptions;
use corefarm_toolchain::{self as toolchain, BuildKind, ImageBuilder};
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// Matrix dimension of the reference core.
const N: usize = 64;
/// A then B, row-major little-endian int32.
pub const INPUT_SIZE: usize = 2 * N * N * 4;
/// A·B, row-major little-endian int32.
pub const OUTPUT_SIZE: usize = N * N * 4;
/// HLS entry and Verilog top module of cores/matmul.
const ENTRY: &str = "mat_mul_64x64";
/// Embedded so the demo also works from an installed binary; the build cache
/// keys on file name and contents, so these hit the same entries as builds
/// from the repository's files.
const HLS_SOURCE: &str = include_str!("../../../cores/matmul/matmul.cpp");
const VERILOG_SOURCE: &str = include_str!("../../../cores/matmul/matmul.v");
/// Above this many bytes of held results, results are checked as they arrive
/// instead of after the timed run.
const HOLD_LIMIT: usize = 256 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    /// HLS C++ (cores/matmul/matmul.cpp) compiled for this CPU.
    Native,
    /// Verilog (cores/matmul/matmul.v) simulated by Verilator.
    Rtl,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Native => "native",
            Target::Rtl => "rtl",
        }
    }
}

#[derive(Args, Clone, Debug)]
pub struct DemoArgs {
    /// Which form of the matrix multiplier the nodes run.
    #[arg(long, value_enum, default_value_t = Target::Native)]
    pub target: Target,
    /// Node managers in the embedded cluster.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub nodes: u32,
    /// Hardware cores (core-table entries) per node.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub cores: u32,
    /// Matrix pairs to multiply [default: 5000 native, 200 rtl].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub jobs: Option<u64>,
    /// Matrix pairs per data message (the seed's "input count", §4.4.1); a
    /// node runs one message's inputs through one core, one after another.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub count: u32,
    /// Data messages the demo keeps in flight [default: 4 × nodes × cores];
    /// the server's credit may allow fewer.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub window: Option<u32>,
    /// Seed of the random matrices (printed, so a failure can be replayed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Seconds the software baseline runs (at least one product).
    #[arg(long, default_value_t = 1.0)]
    pub baseline_seconds: f64,
    /// Seconds to wait for the next result before giving up.
    #[arg(long, default_value_t = 60.0)]
    pub result_timeout: f64,
    /// Build cache [default: $COREFARM_CACHE, else ~/.cache/corefarm].
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Print one JSON object with every figure instead of the human report.
    #[arg(long)]
    pub json: bool,
}

// ---------------------------------------------------------------- matrices

/// Input `job` of a run: A and B with full-range entries (so products wrap),
/// derived from (seed, job) so it can be regenerated for checking.
pub fn input_for(seed: u64, job: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ job.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut v = vec![0u8; INPUT_SIZE];
    rng.fill(&mut v[..]);
    v
}

fn word(b: &[u8], i: usize) -> i32 {
    i32::from_le_bytes(b[4 * i..4 * i + 4].try_into().expect("4 bytes"))
}

/// The software reference: naive A·B with wrapping i32 arithmetic, written
/// independently of the C++ and Verilog cores it checks.
pub fn reference(input: &[u8]) -> Vec<u8> {
    assert_eq!(input.len(), INPUT_SIZE);
    let a: Vec<i32> = (0..N * N).map(|i| word(input, i)).collect();
    let b: Vec<i32> = (0..N * N).map(|i| word(input, N * N + i)).collect();
    let mut c = vec![0i32; N * N];
    // i-k-j order: the same sums as the textbook i-j-k loop (addition mod
    // 2^32 is associative), but the inner loop vectorises.
    for i in 0..N {
        for k in 0..N {
            let aik = a[i * N + k];
            let (row, brow) = (&mut c[i * N..(i + 1) * N], &b[k * N..(k + 1) * N]);
            for (cij, bkj) in row.iter_mut().zip(brow) {
                *cij = cij.wrapping_add(aik.wrapping_mul(*bkj));
            }
        }
    }
    c.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Compares a core's output with the reference; the error names the first
/// differing element.
pub fn check(input: &[u8], output: &[u8]) -> std::result::Result<(), String> {
    if output.len() != OUTPUT_SIZE {
        return Err(format!(
            "output is {} bytes, expected {OUTPUT_SIZE}",
            output.len()
        ));
    }
    let want = reference(input);
    match (0..N * N).find(|&i| word(output, i) != word(&want, i)) {
        None => Ok(()),
        Some(i) => Err(format!(
            "C[{}][{}] = {} but the software computation gives {}",
            i / N,
            i % N,
            word(output, i),
            word(&want, i)
        )),
    }
}

// ---------------------------------------------------------------- building

struct Built {
    native_so: PathBuf,
    rtl_so: Option<PathBuf>,
    seconds: f64,
    /// Every artifact came from the cache (nothing was compiled).
    reused: bool,
}

fn check_tools(target: Target) -> Result<()> {
    if !toolchain::cxx_available() {
        bail!(
            "corefarm demo needs a C++ compiler to build the matrix multiplier (cores/matmul/matmul.cpp) \
             and the software baseline, and none runs ($CXX, default `c++`). Install one, e.g. \
             `sudo apt-get install -y g++`, or set $CXX."
        );
    }
    if target == Target::Rtl && !toolchain::verilator_available() {
        bail!(
            "corefarm demo --target rtl simulates cores/matmul/matmul.v with Verilator, but Verilator \
             (or make) does not run ($VERILATOR, default `verilator`). Install Verilator 5 and make, e.g. \
             `sudo apt-get install -y verilator make`, or run the demo with --target native."
        );
    }
    Ok(())
}

/// Builds (or takes from the content-hash cache) the native core, and the
/// RTL simulation for `--target rtl`.
fn build(target: Target, cache: &Path, say: &dyn Fn(&str)) -> Result<Built> {
    let started = Instant::now();
    let t0 = SystemTime::now();
    let src = tempfile::tempdir().context("creating a temporary directory")?;
    let cpp = src.path().join("matmul.cpp");
    let v = src.path().join("matmul.v");
    std::fs::write(&cpp, HLS_SOURCE).context("writing matmul.cpp")?;
    std::fs::write(&v, VERILOG_SOURCE).context("writing matmul.v")?;
    // A cached object's mtime predates this call; a fresh build's does not.
    let fresh = |p: &Path| {
        std::fs::metadata(p)
            .and_then(|m| m.modified())
            .map(|m| m >= t0)
            .unwrap_or(true)
    };
    say("building the native matrix multiplier (c++ -O3; cached after the first run)");
    let native_so = toolchain::cached_build(&BuildKind::Native, &[cpp], ENTRY, cache)
        .context("building cores/matmul/matmul.cpp")?;
    let mut reused = !fresh(&native_so);
    let rtl_so = if target == Target::Rtl {
        say("building the RTL simulation with Verilator (takes a minute the first time; cached)");
        let so = toolchain::cached_build(&BuildKind::Rtl { top: ENTRY.into() }, &[v], "", cache)
            .context("building cores/matmul/matmul.v")?;
        reused &= !fresh(&so);
        Some(so)
    } else {
        None
    };
    Ok(Built {
        native_so,
        rtl_so,
        seconds: started.elapsed().as_secs_f64(),
        reused,
    })
}

/// An image carrying one artifact of `kind` and the default core table for `cores` cores.
fn make_image(kind: ArtifactKind, so: &Path, cores: u32) -> Result<Bytes> {
    let bytes = std::fs::read(so).with_context(|| format!("reading {}", so.display()))?;
    let target = match kind {
        ArtifactKind::Native => image::native_target(),
        ArtifactKind::Rtl => image::rtl_target(),
        ArtifactKind::Bitstream => Some(image::FPGA_TARGET.to_string()),
    }
    .ok_or_else(|| {
        anyhow!(
            "no target for this architecture ({})",
            std::env::consts::ARCH
        )
    })?;
    let table = image::default_core_table(cores, INPUT_SIZE as u32, OUTPUT_SIZE as u32)?;
    let img = ImageBuilder::new(ENTRY, INPUT_SIZE as u32, OUTPUT_SIZE as u32, table)
        .artifact(target, kind, ENTRY, bytes)
        .build()?;
    Ok(Bytes::from(img))
}

// ---------------------------------------------------------------- streaming

/// The first job that did not come back right.
#[derive(Debug, Clone, Serialize)]
pub struct BadJob {
    pub job: u64,
    pub reason: String,
}

struct Streamed {
    elapsed: f64,
    latency: LatencySummary,
    /// Results still to be checked (None: checked inline or failed).
    held: Vec<Option<Bytes>>,
    checked_inline: u64,
    mismatched_inline: u64,
    failed: u64,
    first_bad: Option<BadJob>,
}

struct StreamSpec {
    jobs: u64,
    /// Inputs (matrix pairs) per data message; the last message may carry fewer.
    count: u32,
    window: u32,
    seed: u64,
    timeout: Duration,
    hold: bool,
    quiet: bool,
}

/// Jobs (input indices) carried by data message `msg`.
fn message_jobs(msg: usize, count: usize, jobs: usize) -> std::ops::Range<usize> {
    let first = msg * count;
    first..(first + count).min(jobs)
}

/// Streams the inputs through the cluster from a sender thread, receiving on
/// this one; at most `window` data messages (of `count` inputs each) are
/// outstanding. Latency is per data message.
fn stream(client: Client, s: &StreamSpec) -> Result<Streamed> {
    let jobs = s.jobs as usize;
    let count = s.count.max(1) as usize;
    let messages = jobs.div_ceil(count);
    let (tx, rx) = client.split();
    let sent: Arc<Vec<AtomicU64>> = Arc::new((0..messages).map(|_| AtomicU64::new(0)).collect());
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

    let bar = if s.quiet || !std::io::stderr().is_terminal() {
        indicatif::ProgressBar::hidden()
    } else {
        let b = indicatif::ProgressBar::new(s.jobs);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} matrices ({per_sec}, eta {eta})",
            )
            .expect("valid template"),
        );
        b
    };
    let mut hist = LatencyHistogram::new();
    let mut held: Vec<Option<Bytes>> = if s.hold { vec![None; jobs] } else { Vec::new() };
    let mut seen = vec![false; messages];
    let (mut received, mut checked_inline, mut mismatched_inline, mut failed) =
        (0usize, 0u64, 0u64, 0u64);
    let mut first_bad: Option<BadJob> = None;
    let mut note_bad = |job: u64, reason: String| {
        if first_bad.as_ref().is_none_or(|b| job < b.job) {
            first_bad = Some(BadJob { job, reason });
        }
    };
    let outcome: Result<()> = loop {
        if received == messages {
            break Ok(());
        }
        let (msg, result) = match rx.recv(Some(s.timeout)) {
            Ok(out) => (out.id as usize, Ok(out.data)),
            Err(ClientError::Server(e)) if (e.id as usize) < messages => {
                (e.id as usize, Err(format!("the server reports: {e}")))
            }
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
        let n = range.len();
        match result {
            Ok(data) if data.len() != n * OUTPUT_SIZE => {
                mismatched_inline += n as u64;
                checked_inline += n as u64;
                note_bad(
                    range.start as u64,
                    format!(
                        "the result of a message of {n} inputs is {} bytes, expected {}",
                        data.len(),
                        n * OUTPUT_SIZE
                    ),
                );
            }
            Ok(data) => {
                for (i, job) in range.enumerate() {
                    // A zero-copy view of this input's output inside the message.
                    let out = data.slice(i * OUTPUT_SIZE..(i + 1) * OUTPUT_SIZE);
                    if s.hold {
                        held[job] = Some(out);
                        continue;
                    }
                    checked_inline += 1;
                    if let Err(r) = check(&input_for(s.seed, job as u64), &out) {
                        mismatched_inline += 1;
                        note_bad(job as u64, r);
                    }
                }
            }
            Err(r) => {
                failed += n as u64;
                note_bad(range.start as u64, r);
            }
        }
        let _ = tok_tx.send(());
        bar.inc(n as u64);
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
        held,
        checked_inline,
        mismatched_inline,
        failed,
        first_bad,
    })
}

// ---------------------------------------------------------------- baselines

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

/// Seed §4.5: the same naive C++ function compiled with full optimisation,
/// called in a loop on one thread. This is the very shared object the
/// native nodes run, called directly (no driver, no network).
fn software_baseline(so: &Path, seconds: f64, seed: u64) -> Result<Software> {
    type Entry = unsafe extern "C" fn(*const u8, *mut u8);
    // SAFETY: the object was just built by the toolchain from the embedded
    // matmul.cpp; loading runs only its (compiler-generated) initialisers.
    let lib = unsafe { libloading::Library::new(so) }
        .with_context(|| format!("loading {}", so.display()))?;
    // SAFETY: the native soft-core ABI (docs/interfaces.md) fixes the type.
    let entry: Entry = *unsafe { lib.get::<Entry>(ENTRY.as_bytes()) }
        .with_context(|| format!("{} has no symbol {ENTRY}", so.display()))?;
    let inputs: Vec<Vec<u8>> = (0..8).map(|i| input_for(seed ^ 0xBA5E, i)).collect();
    let mut out = vec![0u8; OUTPUT_SIZE];
    // SAFETY: `in` holds INPUT_SIZE bytes and `out` OUTPUT_SIZE bytes, the
    // sizes the function reads and writes.
    unsafe { entry(inputs[0].as_ptr(), out.as_mut_ptr()) };
    // Not fatal here: the same object runs on native nodes, whose results
    // are checked one by one and reported first.
    let output_verified = check(&inputs[0], &out).is_ok();
    let start = Instant::now();
    let mut n = 0u64;
    while n == 0 || start.elapsed().as_secs_f64() < seconds {
        let input = &inputs[(n % inputs.len() as u64) as usize];
        // SAFETY: as above.
        unsafe { entry(input.as_ptr(), out.as_mut_ptr()) };
        std::hint::black_box(&out);
        n += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    Ok(Software {
        implementation: "cores/matmul/matmul.cpp (seed §4.3.2.1), c++ -O3 -fwrapv, called in a loop on one thread".into(),
        matrices: n,
        seconds: secs,
        matrices_per_s: n as f64 / secs,
        mbyte_per_s_in: n as f64 * INPUT_SIZE as f64 / secs / 1e6,
        output_verified,
    })
}

#[derive(Debug, Serialize)]
pub struct RtlFigures {
    /// Simulated cycles of one job, bus transfers included (Core::stats).
    pub cycles_per_job: u64,
    /// One instance alone in this process after the cluster stopped: simulated
    /// cycles ÷ wall time inside its jobs (Core::stats).
    pub standalone_cycles_per_s: f64,
    pub standalone_jobs: u64,
    /// jobs × cycles_per_job ÷ cluster wall time ÷ instances: the average
    /// simulation speed each instance sustained in the cluster, sharing the CPUs.
    pub cluster_cycles_per_s_per_instance: f64,
}

/// Times one RTL instance through corefarm_cores (the nodes' own load path)
/// and checks its outputs too.
fn rtl_standalone(so: &Path, seed: u64, seconds: f64) -> Result<(u64, f64, u64)> {
    let img = make_image(ArtifactKind::Rtl, so, 1)?;
    let cfg = image::configuration(img)?;
    let opts = LoadOptions {
        native: false,
        rtl: true,
        ..LoadOptions::default()
    };
    let mut loaded = corefarm_cores::load(&cfg, &opts).map_err(|e| anyhow!(e))?;
    let core = loaded
        .cores
        .first_mut()
        .ok_or_else(|| anyhow!("the RTL image loaded no core"))?;
    let mut out = vec![0u8; OUTPUT_SIZE];
    let start = Instant::now();
    let mut n = 0u64;
    while n < 2 || start.elapsed().as_secs_f64() < seconds {
        let input = input_for(seed ^ 0x5717, n);
        core.process(&input, &mut out)?;
        check(&input, &out).map_err(|r| anyhow!("standalone RTL core, job {n}: {r}"))?;
        n += 1;
    }
    let st = core.stats();
    let (Some(total), Some(last)) = (st.cycles, st.last_cycles) else {
        bail!("the RTL core reports no cycle count");
    };
    Ok((
        last,
        total as f64 / st.busy.as_secs_f64().max(1e-9),
        st.jobs,
    ))
}

// ---------------------------------------------------------------- report

#[derive(Debug, Serialize)]
pub struct Report {
    pub target: Target,
    pub artifact: String,
    pub nodes: u32,
    pub cores_per_node: u32,
    pub instances: u32,
    pub jobs: u64,
    /// Inputs per data message.
    pub count: u32,
    /// Data messages sent (jobs ÷ count, rounded up).
    pub messages: u64,
    /// Data messages the demo kept in flight at most.
    pub window: u32,
    pub seed: u64,
    pub image_bytes: usize,
    pub build_seconds: f64,
    pub build_reused_cache: bool,
    pub cache_dir: String,
    /// Results equal to the software computation.
    pub verified: u64,
    pub mismatches: u64,
    /// Jobs the cluster answered with an error instead of a result.
    pub failed: u64,
    pub all_verified: bool,
    /// "after" (results held, checked once the clock stopped) or "inline".
    pub verification: &'static str,
    pub first_bad_job: Option<BadJob>,
    pub seconds: f64,
    pub matrices_per_s: f64,
    pub gbit_per_s_in: f64,
    pub gbit_per_s_out: f64,
    pub latency_ms: LatencySummary,
    pub software: Software,
    /// corefarm matrices/s ÷ software matrices/s.
    pub ratio_vs_software: f64,
    pub rtl: Option<RtlFigures>,
}

fn print_human(r: &Report) {
    let l = &r.latency_ms;
    println!(
        "corefarm demo: {} products of 64×64 int32 matrices (seed 000 §4.3) on {} node(s) × {} {} core(s), {} per message",
        r.jobs,
        r.nodes,
        r.cores_per_node,
        r.target.name(),
        r.count
    );
    println!(
        "  image      {ENTRY}, {}, {} bytes ({} in {:.1} s, cache {})",
        r.artifact,
        r.image_bytes,
        if r.build_reused_cache {
            "reused from the cache"
        } else {
            "built"
        },
        r.build_seconds,
        r.cache_dir
    );
    println!(
        "  checked    {}/{} results equal the software computation (Rust, naive, wrapping i32; checked {})",
        r.verified,
        r.jobs,
        if r.verification == "after" { "after the timed run" } else { "as they arrived, inside the timed run" }
    );
    println!(
        "  corefarm   {:.1} matrices/s over {:.2} s; in {}, out {}",
        r.matrices_per_s,
        r.seconds,
        human(r.gbit_per_s_in * 1e9, "bit/s"),
        human(r.gbit_per_s_out * 1e9, "bit/s")
    );
    println!(
        "  latency    avg {:.2} ms, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (submit to result; demo window {}, server credit may allow fewer)",
        l.avg_ms, l.p50_ms, l.p99_ms, l.max_ms, r.window
    );
    println!(
        "  software   {:.1} matrices/s ({:.1} MB/s in; seed §4.5 measured 96 MB/s on its machine): {}",
        r.software.matrices_per_s, r.software.mbyte_per_s_in, r.software.implementation
    );
    println!(
        "  ratio      corefarm / software = {:.2}× ({} instances sharing {} CPU(s) with the server, nodes and this client)",
        r.ratio_vs_software,
        r.instances,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    if let Some(rtl) = &r.rtl {
        println!(
            "  rtl        {} simulated cycles/job (bus transfers included); one instance alone: {} cycles/s; \
             in the cluster: {} cycles/s per instance (jobs × cycles/job ÷ wall time ÷ {} instances)",
            rtl.cycles_per_job,
            human(rtl.standalone_cycles_per_s, ""),
            human(rtl.cluster_cycles_per_s_per_instance, ""),
            r.instances
        );
    }
}

// ---------------------------------------------------------------- run

pub fn run(args: DemoArgs) -> Result<()> {
    anyhow::ensure!(
        args.baseline_seconds.is_finite() && args.baseline_seconds >= 0.0,
        "--baseline-seconds must be a non-negative number"
    );
    anyhow::ensure!(
        args.result_timeout.is_finite() && args.result_timeout > 0.0,
        "--result-timeout must be a positive number of seconds"
    );
    let quiet = args.json;
    let say = |m: &str| {
        if !quiet {
            eprintln!("{m}");
        }
    };
    check_tools(args.target)?;
    let cache = args
        .cache_dir
        .clone()
        .unwrap_or_else(toolchain::default_cache_dir);
    let built = build(args.target, &cache, &say)?;
    let (kind, so) = match args.target {
        Target::Native => (ArtifactKind::Native, built.native_so.clone()),
        Target::Rtl => (
            ArtifactKind::Rtl,
            built.rtl_so.clone().expect("built for rtl"),
        ),
    };
    let img = make_image(kind, &so, args.cores)?;
    let image_bytes = img.len();
    let artifact = image::Image::parse(img.clone())?.targets().join(",");
    let cfg = image::configuration(img)?;

    let jobs = args.jobs.unwrap_or(match args.target {
        Target::Native => 2000,
        Target::Rtl => 200,
    });
    let instances = args.nodes * args.cores;
    let window = args.window.unwrap_or(4 * instances);
    // 32 random bits: short to type back, exact in any JSON reader.
    let seed = args
        .seed
        .unwrap_or_else(|| rand::thread_rng().gen::<u32>() as u64);
    let timeout = Duration::from_secs_f64(args.result_timeout);

    // The embedded cluster: a server and `nodes` node managers restricted to
    // the demo's backend, on OS-assigned loopback ports.
    let rt = crate::cmd_server::runtime()?;
    let server = ServerOptions {
        nodes_listen: "127.0.0.1:0".into(),
        users_listen: "127.0.0.1:0".into(),
        // Enough credit per node to keep every core busy with one queued behind it.
        credit: (2 * args.cores).max(4),
        ..ServerOptions::default()
    };
    let node = NodeOptions {
        name: "demo-node".into(),
        reconnect: false,
        load: LoadOptions {
            native: args.target == Target::Native,
            rtl: args.target == Target::Rtl,
            ..LoadOptions::default()
        },
        ..NodeOptions::default()
    };
    let (cluster, handle) = rt.block_on(crate::cmd_server::start_local(
        args.nodes as usize,
        server,
        node,
    ))?;
    say(&format!(
        "local cluster on {} with {} node(s); seed {seed}",
        cluster.users_addr, args.nodes
    ));
    let streamed = (|| -> Result<Streamed> {
        let client = Client::connect(
            &cluster.users_addr.to_string(),
            ClientOptions {
                name: Some("corefarm-demo".into()),
                nodes: Some(args.nodes),
                io_timeout: Some(timeout),
                ..ClientOptions::default()
            },
        )?;
        if let Some(n) = client.nodes() {
            anyhow::ensure!(
                n == args.nodes,
                "the server assigned {n} of {} node(s)",
                args.nodes
            );
        }
        client.configure(&cfg).context("configuring the cluster")?;
        stream(
            client,
            &StreamSpec {
                jobs,
                count: args.count,
                window,
                seed,
                timeout,
                hold: (jobs as usize).saturating_mul(OUTPUT_SIZE) <= HOLD_LIMIT,
                quiet,
            },
        )
    })();
    cluster.stop.cancel();
    rt.block_on(async {
        let _ = tokio::time::timeout(Duration::from_secs(5), handle).await;
    });
    rt.shutdown_timeout(Duration::from_secs(2));
    let mut streamed = streamed?;

    // Measurements that need the CPU to themselves run after the cluster stopped.
    say("running the software baseline");
    let software = software_baseline(&built.native_so, args.baseline_seconds, seed)?;
    let rtl = match &built.rtl_so {
        Some(so) => {
            say("timing one RTL instance alone");
            let (cycles_per_job, alone, standalone_jobs) =
                rtl_standalone(so, seed, args.baseline_seconds)?;
            Some(RtlFigures {
                cycles_per_job,
                standalone_cycles_per_s: alone,
                standalone_jobs,
                cluster_cycles_per_s_per_instance: jobs as f64 * cycles_per_job as f64
                    / streamed.elapsed
                    / instances as f64,
            })
        }
        None => None,
    };

    let verification = if streamed.held.is_empty() {
        "inline"
    } else {
        "after"
    };
    let mut checked = streamed.checked_inline;
    let mut mismatches = streamed.mismatched_inline;
    for (job, out) in streamed.held.iter_mut().enumerate() {
        if let Some(data) = out.take() {
            checked += 1;
            if let Err(r) = check(&input_for(seed, job as u64), &data) {
                mismatches += 1;
                if streamed
                    .first_bad
                    .as_ref()
                    .is_none_or(|b| (job as u64) < b.job)
                {
                    streamed.first_bad = Some(BadJob {
                        job: job as u64,
                        reason: r,
                    });
                }
            }
        }
    }
    let verified = checked - mismatches;
    let all_verified = verified == jobs && streamed.failed == 0;
    let report = Report {
        target: args.target,
        artifact,
        nodes: args.nodes,
        cores_per_node: args.cores,
        instances,
        jobs,
        count: args.count,
        messages: jobs.div_ceil(args.count as u64),
        window,
        seed,
        image_bytes,
        build_seconds: built.seconds,
        build_reused_cache: built.reused,
        cache_dir: cache.display().to_string(),
        verified,
        mismatches,
        failed: streamed.failed,
        all_verified,
        verification,
        first_bad_job: streamed.first_bad.clone(),
        seconds: streamed.elapsed,
        matrices_per_s: jobs as f64 / streamed.elapsed,
        gbit_per_s_in: bits_per_second(jobs * INPUT_SIZE as u64, streamed.elapsed) / 1e9,
        gbit_per_s_out: bits_per_second(jobs * OUTPUT_SIZE as u64, streamed.elapsed) / 1e9,
        latency_ms: streamed.latency,
        ratio_vs_software: (jobs as f64 / streamed.elapsed) / software.matrices_per_s,
        software,
        rtl,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_human(&report);
    }
    if let Some(bad) = &report.first_bad_job {
        bail!(
            "{} of {jobs} results are wrong or missing ({} mismatched, {} failed); first bad job: {} (seed {seed}): {}",
            jobs - verified,
            mismatches,
            report.failed,
            bad.job,
            bad.reason
        );
    }
    anyhow::ensure!(
        all_verified,
        "only {verified} of {jobs} results were verified"
    );
    anyhow::ensure!(
        report.software.output_verified,
        "the software baseline ({}) computes a wrong product",
        built.native_so.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrices(a: impl Fn(usize, usize) -> i32, b: impl Fn(usize, usize) -> i32) -> Vec<u8> {
        let mut v = Vec::with_capacity(INPUT_SIZE);
        for f in [&a as &dyn Fn(usize, usize) -> i32, &b] {
            for i in 0..N {
                for j in 0..N {
                    v.extend_from_slice(&f(i, j).to_le_bytes());
                }
            }
        }
        v
    }

    #[test]
    fn reference_multiplies_with_wrapping() {
        // Identity times B is B.
        let input = matrices(|i, j| (i == j) as i32, |i, j| (i * 1000 + j) as i32 - 7);
        let out = reference(&input);
        for i in 0..N {
            for j in 0..N {
                assert_eq!(word(&out, i * N + j), (i * 1000 + j) as i32 - 7);
            }
        }
        // A row of i32::MAX times a column of 2s: 64 · 2 · MAX wraps to -128.
        let input = matrices(|_, _| i32::MAX, |_, _| 2);
        assert_eq!(
            word(&reference(&input), 0),
            (64i64 * 2 * i32::MAX as i64) as i32
        );
        assert_eq!(word(&reference(&input), 0), -128);
        // A general entry against a direct i64 sum reduced mod 2^32.
        let input = input_for(7, 3);
        let out = reference(&input);
        let (i, j) = (5, 61);
        let sum: i128 = (0..N)
            .map(|k| word(&input, i * N + k) as i128 * word(&input, N * N + k * N + j) as i128)
            .sum();
        assert_eq!(word(&out, i * N + j), sum as i32);
    }

    #[test]
    fn check_names_the_first_wrong_element() {
        let input = input_for(1, 0);
        let mut out = reference(&input);
        assert_eq!(check(&input, &out), Ok(()));
        out[4 * (2 * N + 9)] ^= 1;
        out[4 * (40 * N)] ^= 0x80;
        let e = check(&input, &out).unwrap_err();
        assert!(e.starts_with("C[2][9] = "), "{e}");
        let e = check(&input, &out[..100]).unwrap_err();
        assert!(e.contains("100 bytes"), "{e}");
    }

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

    #[test]
    fn inputs_are_reproducible_and_distinct() {
        assert_eq!(input_for(42, 9), input_for(42, 9));
        assert_ne!(input_for(42, 9), input_for(42, 10));
        assert_ne!(input_for(42, 9), input_for(43, 9));
        assert_eq!(input_for(0, 0).len(), INPUT_SIZE);
    }
}

/// Tests of the node backend flags (`NodeTuning` in cmd_server.rs, a file
/// shared with other work, so its tests live here).
#[cfg(test)]
mod node_flag_tests {
    use clap::Parser;
    use corefarm_cores::fpga::Programmer;

    use crate::cmd_server::NodeTuning;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        node: NodeTuning,
    }

    fn parse(args: &[&str]) -> Result<corefarm_node::NodeOptions, clap::Error> {
        let t = T::try_parse_from(std::iter::once("t").chain(args.iter().copied()))?;
        Ok(t.node.options("127.0.0.1:1".into()))
    }

    #[test]
    fn defaults_are_native_and_rtl_without_fpga() {
        let o = parse(&[]).unwrap();
        assert!(o.load.native && o.load.rtl && o.load.fpga.is_none());
        assert_eq!(o.load.driver.timeout, std::time::Duration::from_secs(10));
    }

    #[test]
    fn backends_restrict_what_loads() {
        let o = parse(&["--backends", "rtl"]).unwrap();
        assert!(!o.load.native && o.load.rtl && o.load.fpga.is_none());
        let o = parse(&["--backends", "native", "--core-timeout", "2.5"]).unwrap();
        assert!(o.load.native && !o.load.rtl);
        assert_eq!(
            o.load.driver.timeout,
            std::time::Duration::from_millis(2500)
        );
        assert!(parse(&["--backends", "gpu"]).is_err());
        assert!(parse(&["--core-timeout", "0"]).is_err());
        assert!(parse(&["--core-timeout", "inf"]).is_err());
    }

    #[test]
    fn fpga_options_map_to_the_backend() {
        let o = parse(&[
            "--backends",
            "fpga,native",
            "--fpga-device",
            "/tmp/bridge",
            "--fpga-base",
            "0xFF200000",
            "--fpga-span",
            "65536",
            "--fpga-programmer",
            "sh -c 'cat {bitstream} > /dev/null'",
        ])
        .unwrap();
        assert!(o.load.native && !o.load.rtl);
        let f = o.load.fpga.expect("fpga enabled");
        assert_eq!(f.device, std::path::PathBuf::from("/tmp/bridge"));
        assert_eq!(
            (f.base, f.device_offset, f.span),
            (0xFF20_0000, 0xFF20_0000, 65536)
        );
        assert_eq!(
            f.programmer,
            Programmer::Command(vec![
                "sh".into(),
                "-c".into(),
                "cat {bitstream} > /dev/null".into()
            ])
        );
        let o = parse(&["--backends", "fpga", "--fpga-device-offset", "0"]).unwrap();
        let f = o.load.fpga.unwrap();
        assert_eq!((f.base, f.device_offset), (0xC000_0000, 0));
        assert_eq!(f.programmer, Programmer::default());
        assert!(parse(&["--fpga-base", "0xZZ"]).is_err());
        assert!(parse(&["--fpga-programmer", "dd 'of=x"]).is_err());
        assert!(parse(&["--fpga-programmer", "  "]).is_err());
    }
}
