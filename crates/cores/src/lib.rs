//! Hardware cores behind one interface.
//!
//! The node manager only sees [`Core`]: give it one input, get one output.
//! The RTL simulation and FPGA backends expose a [`bus::Bus`] (an address
//! decoder over Verilator instances, or the mmap'ed HPS-to-FPGA bridge) and
//! the single [`driver::Driver`] runs the job cycle of seed 000 table 3.1
//! over it; a native soft core is a C function called directly
//! ([`native::NativeCore`], which says why it skips the register
//! emulation). [`image`] reads and verifies the container that carries the
//! artifacts; building cores and images is `corefarm-toolchain`'s job, so
//! nodes never link a compiler driver. Image reading stays here rather than
//! in a crate of its own: the node needs it, and nothing would use such a
//! crate alone.
//!
//! Native and RTL cores are user code compiled for the CPU. By default
//! ([`Isolation::Process`]) [`load`] runs each in a worker process of its
//! own ([`worker`]), so a crash, an overrun or a hang fails one job, not the
//! node.

pub mod bus;
mod dl;
pub mod driver;
pub mod dtype;
mod elf;
pub mod fpga;
pub mod image;
pub mod native;
pub mod rtl;
pub mod signature;
pub mod spin;
#[cfg(target_os = "linux")]
pub mod worker;
pub mod zynq;

use std::time::Duration;

use corefarm_smp::{Configuration, CoreInfo};

pub use driver::{Driver, DriverOptions};
pub use image::{ArtifactKind, Image, ImageError};

#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    #[error("{0}")]
    Failed(String),
    #[error("core timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// An isolated core's worker failed the job (crash, overrun, hang, or
    /// an error reported by the worker); the message names the core.
    #[error("{0}")]
    Worker(String),
    /// The driver cannot run this core over this bus.
    #[error(transparent)]
    Setup(#[from] driver::DriverError),
}

impl CoreError {
    /// The SMP code of a data message this failure ended.
    pub fn code(&self) -> corefarm_smp::ErrorCode {
        corefarm_smp::ErrorCode::CoreFailure
    }
}

/// Input `index` of a batch failed ([`Core::process_batch`]).
#[derive(Debug, thiserror::Error)]
#[error("input {index}: {error}")]
pub struct BatchError {
    pub index: usize,
    pub error: CoreError,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// This node cannot run the configuration (no matching backend).
    #[error("{0}")]
    Unsupported(String),
    /// The configuration itself is wrong (bad image, checksum, sizes, table).
    #[error("{0}")]
    Invalid(String),
    /// A backend failed while instantiating (dlopen, programming, mmap).
    #[error("{0}")]
    Backend(String),
    /// This node runs only signed images (`--trust`), and this one may not
    /// run (unsigned, untrusted key, altered after signing).
    #[error("{0}")]
    Untrusted(#[from] signature::SignatureError),
    /// The image's streaming handler sets break the manifest's rules.
    #[error("{0}")]
    HandlerSets(#[from] spin::manifest::HandlerSetError),
    /// A native artifact does not export its entry symbol.
    #[error("{0}")]
    NoEntry(native::NoEntry),
    /// A board interface (FPGA manager, UIO, u-dma-buf) is missing or failed.
    #[error("{0}")]
    Board(#[from] corefarm_board::BoardError),
}

impl LoadError {
    /// The SMP code of the configuration this refused.
    pub fn code(&self) -> corefarm_smp::ErrorCode {
        corefarm_smp::ErrorCode::ConfigurationFailed
    }
}

/// Counters a core keeps for reporting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CoreStats {
    /// Jobs completed.
    pub jobs: u64,
    /// Jobs that timed out.
    pub timeouts: u64,
    /// Resets performed after a timeout.
    pub resets: u64,
    /// Wall-clock time spent in completed jobs.
    pub busy: Duration,
    /// Simulated clock cycles over all completed jobs (RTL simulation only).
    pub cycles: Option<u64>,
    /// Simulated clock cycles of the last completed job (RTL simulation only).
    pub last_cycles: Option<u64>,
}

/// One hardware core instance, driven by one caller at a time (in a node,
/// the core's task on the event loop).
pub trait Core: Send {
    /// Processes one input (`input_size` bytes) into one output (`output_size` bytes).
    fn process(&mut self, input: &[u8], output: &mut [u8]) -> Result<(), CoreError>;

    /// Processes `count` inputs laid end to end in `inputs` into `count`
    /// outputs laid end to end in `outputs`, stopping at the first input
    /// that fails. Outputs before the failed input are written; the rest
    /// are unspecified. Backends that can hand several inputs over at once
    /// (an isolated core: one worker round trip) override it.
    fn process_batch(
        &mut self,
        inputs: &[u8],
        outputs: &mut [u8],
        count: usize,
    ) -> Result<(), BatchError> {
        if count == 0 {
            return Ok(());
        }
        let (isz, osz) = (inputs.len() / count, outputs.len() / count);
        for index in 0..count {
            let i = &inputs[index * isz..(index + 1) * isz];
            let o = &mut outputs[index * osz..(index + 1) * osz];
            self.process(i, o)
                .map_err(|error| BatchError { index, error })?;
        }
        Ok(())
    }

    /// Counters for reporting; backends without any return the default.
    fn stats(&self) -> CoreStats {
        CoreStats::default()
    }

    /// When the node queued the job whose inputs come next (called before
    /// `process_batch`). Only a core that emulates a board's timing needs
    /// it (the benchmarking core starts an input when it is free and the
    /// input is queued, as a board with a job queue does); others ignore it.
    fn queued_at(&mut self, _at: std::time::Instant) {}

    /// Whether the core finishes an input in negligible time without ever
    /// blocking (the zero-delay benchmarking core): an event loop may then
    /// call it directly instead of handing it to a thread.
    fn instant(&self) -> bool {
        false
    }

    /// The core's pipeline, if it can take the next job while it runs the
    /// current one (an isolated core); `None` for cores that run on the
    /// calling thread, where there is nothing to overlap.
    fn pipeline(&mut self) -> Option<&mut dyn Pipeline> {
        None
    }
}

/// Jobs handed to a core ahead of their collection, so that copying the
/// next job in (and the last one out) overlaps the computation of the
/// current one. Jobs are collected in the order they were submitted;
/// [`Core::process_batch`] must not be called while any are outstanding.
pub trait Pipeline {
    /// Most jobs outstanding at once (submitted, not yet collected).
    fn depth(&self) -> usize;
    /// Whether a job of `count` inputs can be submitted; a larger one goes
    /// through [`Core::process_batch`] once the pipeline is empty.
    fn fits(&self, count: usize) -> bool;
    /// Hands over a job of `count` inputs laid end to end. Errors (wrong
    /// sizes, a full pipeline, a worker that cannot start) are reported by
    /// the matching [`Pipeline::collect`].
    fn submit(&mut self, inputs: &[u8], count: usize);
    /// Waits for the oldest outstanding job and writes its outputs; on
    /// failure says which input failed, and nothing of the job is written.
    fn collect(&mut self, outputs: &mut [u8]) -> Result<(), BatchError>;

    /// For an event loop: a descriptor that turns readable when a job
    /// completes after [`Pipeline::arm`] or when the pipeline's worker
    /// dies (poll it, do not read it; `arm` resets it). `None`: this
    /// pipeline can only be waited for by [`Pipeline::collect`], on a
    /// thread of its own.
    fn ready_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }

    /// [`Pipeline::collect`] without waiting: `None` while the oldest job
    /// still runs. It may still block to restart a lost worker.
    fn try_collect(&mut self, outputs: &mut [u8]) -> Option<Result<(), BatchError>> {
        Some(self.collect(outputs))
    }

    /// Asks to hear of the next completion through [`Pipeline::ready_fd`];
    /// `false` if the oldest job needs no waiting (completed, failed or
    /// none): call [`Pipeline::try_collect`] again instead of waiting.
    fn arm(&mut self) -> bool {
        false
    }

    /// Called by an event loop at least every [`PIPELINE_TICK`] while it
    /// waits: applies the watchdog (and notices a worker that died in a
    /// way its ready descriptor missed), so the next
    /// [`Pipeline::try_collect`] reports either.
    fn tick(&mut self) {}

    /// Whether the next [`Pipeline::submit`] or [`Pipeline::try_collect`]
    /// will start a worker (after one was lost): an event loop makes that
    /// call where blocking is allowed.
    fn needs_start(&self) -> bool {
        false
    }
}

/// How long an event loop may wait on [`Pipeline::ready_fd`] before it
/// calls [`Pipeline::tick`].
pub const PIPELINE_TICK: std::time::Duration = std::time::Duration::from_millis(20);

/// One job's buffers must match the core's sizes exactly: every backend
/// checks this before touching them.
pub(crate) fn check_job_sizes(
    input: &[u8],
    output: &[u8],
    input_size: usize,
    output_size: usize,
) -> Result<(), CoreError> {
    if input.len() != input_size || output.len() != output_size {
        return Err(CoreError::Failed(format!(
            "job of {} input / {} output bytes for a core of {input_size} / {output_size}",
            input.len(),
            output.len(),
        )));
    }
    Ok(())
}

/// Node-side options that decide which backends may load and how.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Run native soft cores (`native-<arch>-linux` artifacts).
    pub native: bool,
    /// Run Verilator-built RTL simulations (`rtl-<arch>-linux` artifacts).
    pub rtl: bool,
    /// The Cyclone V FPGA backend; `None` (the default) disables it, and
    /// raw bitstreams and `fpga-cyclonev` artifacts are then refused.
    pub fpga: Option<fpga::FpgaOptions>,
    /// The AMD Zynq backend; `None` (the default) disables it, and
    /// `fpga-zynq` artifacts are then refused.
    pub zynq: Option<zynq::ZynqOptions>,
    /// Which artifact kind wins when an image carries several this node can run.
    pub prefer: Vec<ArtifactKind>,
    /// FPGA families whose native and RTL artifacts this node runs (an
    /// image may carry the same function as an Intel-style and an
    /// AMD-style core; the result does not depend on which one runs).
    pub families: Vec<image::Family>,
    /// Job timeout and poll interval of the driver. The timeout also bounds
    /// one job of an isolated core (its watchdog).
    pub driver: DriverOptions,
    /// Where native and RTL cores run.
    pub isolation: Isolation,
    /// The executable started for each isolated core.
    pub worker: WorkerCommand,
    /// Signing keys this node trusts; when not empty, only images signed
    /// by one of them load (`corefarm node --trust`).
    pub trust: signature::Trust,
}

/// Where native and RTL cores (user code compiled for the CPU) run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Isolation {
    /// One worker process per core: a core that crashes, writes past its
    /// memories or hangs fails its job and is restarted; the node goes on.
    #[default]
    Process,
    /// In the loading process itself, without protection: a faulty core
    /// can corrupt or kill that process, and a native core that never
    /// returns blocks its core for good. For the client's co-working and
    /// for tests; `corefarm node` and `corefarm local` never load user code
    /// this way (the pipelined worker is no slower).
    InProcess,
}

impl Isolation {
    pub fn name(self) -> &'static str {
        match self {
            Isolation::Process => "process",
            Isolation::InProcess => "in-process",
        }
    }
}

/// Text that names no [`Isolation`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an isolation (process, in-process)")]
pub struct UnknownIsolation(pub String);

impl std::str::FromStr for Isolation {
    type Err = UnknownIsolation;
    fn from_str(s: &str) -> Result<Self, UnknownIsolation> {
        match s {
            "process" => Ok(Isolation::Process),
            "in-process" => Ok(Isolation::InProcess),
            _ => Err(UnknownIsolation(s.to_string())),
        }
    }
}

impl std::fmt::Display for Isolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The program a core worker runs: it is started with the argument
/// `__core-worker` and must call `corefarm_cores::worker::main()` then.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum WorkerCommand {
    /// This process's own executable (the `corefarm` binary handles the
    /// subcommand).
    #[default]
    CurrentExe,
    /// Another executable, e.g. in tests the crate's `corefarm-core-worker`.
    Program(std::path::PathBuf),
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            native: true,
            rtl: true,
            fpga: None,
            zynq: None,
            prefer: vec![
                ArtifactKind::Bitstream,
                ArtifactKind::Native,
                ArtifactKind::Rtl,
            ],
            families: image::Family::ALL.to_vec(),
            driver: DriverOptions::default(),
            isolation: Isolation::default(),
            worker: WorkerCommand::default(),
            trust: signature::Trust::default(),
        }
    }
}

/// The cores a configuration instantiates on this node.
pub struct Loaded {
    pub cores: Vec<Box<dyn Core>>,
    /// Human-readable description for logs ("2 × native mat_mul_64x64").
    pub description: String,
}

/// Configuration targets this node can run, as its hello announces them
/// ([`corefarm_smp::targets`]): a Cyclone V bitstream is Intel-style, a
/// Zynq's runs either style, native and RTL artifacts run in the families
/// of [`LoadOptions::families`].
pub fn supported_targets(opts: &LoadOptions) -> Vec<String> {
    let mut t = Vec::new();
    if opts.fpga.is_some() {
        t.push(image::FPGA_TARGET.to_string());
    }
    if opts.zynq.is_some() {
        t.push(zynq::ZYNQ_TARGET.to_string());
    }
    // Native and RTL artifacts of the families the node runs: the target
    // alone for every family, else once per family, qualified.
    let every = image::Family::ALL.iter().all(|f| opts.families.contains(f));
    let mut soft = |target: Option<String>| {
        let Some(target) = target else { return };
        if every {
            t.push(target);
        } else {
            t.extend(
                image::Family::ALL
                    .iter()
                    .filter(|f| opts.families.contains(f))
                    .map(|f| corefarm_smp::targets::qualified(&target, f.name())),
            );
        }
    };
    if opts.native && native::dlopen_works() {
        soft(image::native_target());
    }
    if opts.rtl && native::dlopen_works() {
        soft(image::rtl_target());
    }
    t
}

/// Address windows of one core, for overlap checks: (name, start, length).
fn windows(c: &CoreInfo, input_size: u32, output_size: u32) -> [(&'static str, u64, u64); 3] {
    let r8 = |n: u32| (n as u64).div_ceil(8) * 8;
    [
        ("control", c.control as u64, bus::csr::SPAN),
        ("input", c.input as u64, r8(input_size)),
        ("output", c.output as u64, r8(output_size)),
    ]
}

/// Refuses core tables no hardware design could have: unaligned bases,
/// windows past 4 GiB, or two windows that overlap.
fn check_core_table(cfg: &Configuration) -> Result<(), LoadError> {
    let mut all = Vec::new();
    for (i, c) in cfg.cores.iter().enumerate() {
        for (name, start, len) in windows(c, cfg.input_size, cfg.output_size) {
            if start % 8 != 0 {
                return Err(LoadError::Invalid(format!(
                    "core {i}: {name} base address {start:#x} is not 8-byte aligned"
                )));
            }
            if start + len > 1 << 32 {
                return Err(LoadError::Invalid(format!(
                    "core {i}: {name} window {start:#x}+{len:#x} runs past the 32-bit address space"
                )));
            }
            if len > 0 {
                all.push((start, len, i, name));
            }
        }
    }
    all.sort();
    for w in all.windows(2) {
        let ((s0, l0, c0, n0), (s1, _, c1, n1)) = (w[0], w[1]);
        if s0 + l0 > s1 {
            return Err(LoadError::Invalid(format!(
                "core table overlaps: core {c0} {n0} window {s0:#x}+{l0:#x} covers core {c1} {n1} base {s1:#x}"
            )));
        }
    }
    Ok(())
}

/// With `--trust`, only signed images from trusted keys go any further:
/// loading runs the user's code.
fn check_trust(cfg: &Configuration, trust: &signature::Trust) -> Result<(), LoadError> {
    if trust.is_empty() {
        return Ok(());
    }
    if !image::is_image(&cfg.bitstream) {
        return Err(LoadError::Untrusted(
            signature::SignatureError::RawBitstream,
        ));
    }
    let img = Image::parse(cfg.bitstream.clone()).map_err(|e| LoadError::Invalid(e.to_string()))?;
    Ok(trust.check(&img)?)
}

/// Instantiates the cores of a (non-benchmark) configuration.
pub fn load(cfg: &Configuration, opts: &LoadOptions) -> Result<Loaded, LoadError> {
    if cfg.benchmark().is_some() {
        return Err(LoadError::Invalid(
            "the benchmarking configuration is handled by the node manager, not by a core backend"
                .into(),
        ));
    }
    if cfg.cores.is_empty() {
        return Err(LoadError::Invalid(
            "configuration declares no hardware cores".into(),
        ));
    }
    check_core_table(cfg)?;
    check_trust(cfg, &opts.trust)?;

    if !image::is_image(&cfg.bitstream) {
        return match (&opts.fpga, &opts.zynq) {
            (Some(f), _) => fpga::load(f, cfg, &cfg.bitstream, "raw bitstream", opts.driver),
            (None, Some(z)) => {
                zynq::load(z, cfg, &cfg.bitstream, "raw bitstream", None, opts.driver)
            }
            (None, None) => Err(LoadError::Unsupported(format!(
                "configuration carries a raw FPGA bitstream ({} bytes, no corefarm image magic) \
                 but this node has no FPGA backend enabled; it runs {:?}",
                cfg.bitstream.len(),
                supported_targets(opts)
            ))),
        };
    }

    let img = Image::parse(cfg.bitstream.clone()).map_err(|e| LoadError::Invalid(e.to_string()))?;
    let m = &img.manifest;
    if m.input_size != cfg.input_size || m.output_size != cfg.output_size {
        return Err(LoadError::Invalid(format!(
            "image {:?} is built for {} input / {} output bytes but the configuration says {} / {}",
            m.name, m.input_size, m.output_size, cfg.input_size, cfg.output_size
        )));
    }
    if m.cores != cfg.cores {
        return Err(LoadError::Invalid(format!(
            "image {:?} describes {} cores but the configuration's core table ({} cores) differs from it",
            m.name,
            m.cores.len(),
            cfg.cores.len()
        )));
    }
    for r in img.verify() {
        r.map_err(|e| LoadError::Invalid(e.to_string()))?;
    }

    for kind in &opts.prefer {
        let (target, families) = match kind {
            // A node has one FPGA: the Zynq's bitstream where it runs one,
            // with whichever control protocol its manifest names.
            ArtifactKind::Bitstream
                if opts.zynq.is_some() && img.find(zynq::ZYNQ_TARGET).is_some() =>
            {
                (Some(zynq::ZYNQ_TARGET.to_string()), &image::Family::ALL[..])
            }
            // The Cyclone V backend runs Intel's bridge and CSR only.
            ArtifactKind::Bitstream if opts.fpga.is_some() => (
                Some(image::FPGA_TARGET.to_string()),
                &[image::Family::Intel][..],
            ),
            ArtifactKind::Native if opts.native => (image::native_target(), &opts.families[..]),
            ArtifactKind::Rtl if opts.rtl => (image::rtl_target(), &opts.families[..]),
            _ => (None, &[][..]),
        };
        let Some(idx) = target.as_deref().and_then(|t| img.find_for(t, families)) else {
            continue;
        };
        let a = &m.artifacts[idx];
        if a.kind != *kind {
            return Err(LoadError::Invalid(format!(
                "artifact {idx} has target {} but kind {}",
                a.target,
                a.kind.name()
            )));
        }
        let bytes = img
            .verified_artifact(idx)
            .map_err(|e| LoadError::Invalid(e.to_string()))?;
        let isolated = opts.isolation == Isolation::Process && *kind != ArtifactKind::Bitstream;
        let cores = match kind {
            _ if isolated => isolated_cores(*kind, &bytes, a, &m.name, cfg, opts)?,
            ArtifactKind::Native => native_cores(&bytes, a, cfg)?,
            ArtifactKind::Rtl => rtl_cores(&bytes, a, cfg, opts.driver)?,
            ArtifactKind::Bitstream => {
                if let (zynq::ZYNQ_TARGET, Some(z)) = (a.target.as_str(), &opts.zynq) {
                    return zynq::load(z, cfg, &bytes, &m.name, a.control.as_ref(), opts.driver);
                }
                let f = opts.fpga.as_ref().expect("checked above");
                return fpga::load(f, cfg, &bytes, &m.name, opts.driver);
            }
        };
        return Ok(Loaded {
            description: format!(
                "{} × {} {} ({}, {}, {})",
                cores.len(),
                kind.name(),
                m.name,
                a.target,
                a.family,
                if isolated { "isolated" } else { "in-process" }
            ),
            cores,
        });
    }
    Err(LoadError::Unsupported(format!(
        "image {:?} carries artifacts for {:?} but this node runs {:?}",
        m.name,
        img.targets(),
        supported_targets(opts)
    )))
}

/// One native core per core-table entry, each with its own dlopen'ed copy.
/// The table only locates hardware windows; a native core has none.
fn native_cores(
    so: &[u8],
    a: &image::ArtifactEntry,
    cfg: &Configuration,
) -> Result<Vec<Box<dyn Core>>, LoadError> {
    cfg.cores
        .iter()
        .map(|_| {
            // An AMD-style native core is called through the shim the
            // toolchain generated, with the same signature as any other.
            let lib = native::NativeLib::load(so, &a.entry)?;
            let core = native::NativeCore::new(lib, cfg.input_size, cfg.output_size);
            Ok(Box::new(core) as Box<dyn Core>)
        })
        .collect()
}

#[cfg(target_os = "linux")]
fn isolated_cores(
    kind: ArtifactKind,
    so: &[u8],
    a: &image::ArtifactEntry,
    name: &str,
    cfg: &Configuration,
    opts: &LoadOptions,
) -> Result<Vec<Box<dyn Core>>, LoadError> {
    worker::load_cores(kind, so, &a.entry, a.control.as_ref(), name, cfg, opts)
}

#[cfg(not(target_os = "linux"))]
fn isolated_cores(
    _: ArtifactKind,
    _: &[u8],
    _: &image::ArtifactEntry,
    _: &str,
    _: &Configuration,
    _: &LoadOptions,
) -> Result<Vec<Box<dyn Core>>, LoadError> {
    Err(LoadError::Unsupported(
        "isolated cores need Linux; this node must run them in-process (unsafe)".into(),
    ))
}

/// Refuses an RTL object built from another top module than the manifest names.
pub(crate) fn check_rtl_top(lib: &rtl::RtlLib, top: &str) -> Result<(), LoadError> {
    if !top.is_empty() && lib.top() != top {
        return Err(LoadError::Invalid(format!(
            "RTL artifact was built from top module {:?} but the manifest names {top:?}",
            lib.top()
        )));
    }
    Ok(())
}

fn rtl_cores(
    so: &[u8],
    a: &image::ArtifactEntry,
    cfg: &Configuration,
    dopts: DriverOptions,
) -> Result<Vec<Box<dyn Core>>, LoadError> {
    let lib = std::sync::Arc::new(rtl::RtlLib::load(so)?);
    check_rtl_top(&lib, &a.entry)?;
    let control = a.control.as_ref();
    let map = std::sync::Arc::new(rtl::AddressMap::with_control(
        &cfg.cores,
        cfg.input_size,
        cfg.output_size,
        control,
    ));
    cfg.cores
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let bus = rtl::RtlBus::new(lib.clone(), map.clone(), i)?;
            let d = Driver::with_control(
                Box::new(bus),
                *c,
                cfg.input_size,
                cfg.output_size,
                control,
                dopts,
            )
            .map_err(|e| LoadError::Backend(e.to_string()))?;
            Ok(Box::new(d) as Box<dyn Core>)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supported_targets_follow_options() {
        let all = supported_targets(&LoadOptions {
            fpga: Some(fpga::FpgaOptions::default()),
            ..LoadOptions::default()
        });
        assert_eq!(all[0], image::FPGA_TARGET);
        if let Some(n) = image::native_target() {
            assert!(all.contains(&n) && all.contains(&image::rtl_target().unwrap()));
        }
        let none = supported_targets(&LoadOptions {
            native: false,
            rtl: false,
            ..LoadOptions::default()
        });
        assert!(none.is_empty());
        let default = supported_targets(&LoadOptions::default());
        assert!(!default.iter().any(|t| t == image::FPGA_TARGET));
    }

    #[test]
    fn a_node_running_one_family_announces_its_soft_targets_for_it() {
        let (Some(n), Some(r)) = (image::native_target(), image::rtl_target()) else {
            return;
        };
        if !native::dlopen_works() {
            return;
        }
        let amd = supported_targets(&LoadOptions {
            families: vec![image::Family::Amd],
            fpga: Some(fpga::FpgaOptions::default()),
            ..LoadOptions::default()
        });
        // The Cyclone V runs Intel cores whatever the flag says.
        assert_eq!(
            amd,
            [
                image::FPGA_TARGET.to_string(),
                format!("{n}:amd"),
                format!("{r}:amd")
            ]
        );
        let intel = supported_targets(&LoadOptions {
            families: vec![image::Family::Intel],
            rtl: false,
            ..LoadOptions::default()
        });
        assert_eq!(intel, [format!("{n}:intel")]);
        // Both families: the targets alone, as a node before families did.
        let both = supported_targets(&LoadOptions::default());
        assert_eq!(both, [n, r]);
    }

    #[test]
    fn benchmark_and_empty_configurations_are_not_loaded() {
        let bench = corefarm_smp::BenchmarkConfig {
            input_size: 16,
            output_size: 16,
            delay_us: 0,
        }
        .to_configuration();
        assert!(matches!(
            load(&bench, &LoadOptions::default()),
            Err(LoadError::Invalid(_))
        ));
        let mut empty = bench.clone();
        empty.bitstream = bytes::Bytes::from_static(b"12345");
        let e = load(&empty, &LoadOptions::default()).err().unwrap();
        assert!(e.to_string().contains("no hardware cores"), "{e}");
    }
}
