//! `corefarm bench rtl-cores`: the 64×64 matrix multiplier simulated in
//! both styles side by side, through corefarm's own driver: the Intel-style
//! core (Avalon agents, the host writing the matrices into the core's
//! memories) and the AMD-style one (ap_ctrl_hs, the core fetching them from
//! host memory through its AXI4 master). Per family: simulated cycles per
//! job, simulated cycles per second of wall time, and how many cycles are
//! not the multiply-accumulates; for the AXI core also the cycles its
//! master port was busy, as the simulated memory counts them. One JSON
//! object on stdout.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, ensure, Context, Result};
use clap::Args;
use corefarm_cores::bus::{Bus, BusError, DmaWindow};
use corefarm_cores::image::{Control, Family};
use corefarm_cores::rtl::{AddressMap, RtlBus, RtlLib};
use corefarm_cores::{Core, Driver, DriverOptions};
use corefarm_toolchain::{self as toolchain, BuildKind};
use serde::Serialize;

const ENTRY: &str = "mat_mul_64x64";
const AVALON: &str = include_str!("../../../../cores/matmul/matmul.v");
const AXI: &str = include_str!("../../../../cores/matmul/matmul_axi.v");
const VITIS: &str = include_str!("../../../../cores/matmul/matmul_vitis.cpp");
const N: usize = 64;
const INPUT: usize = 2 * N * N * 4;
const OUTPUT: usize = N * N * 4;
/// One multiply-accumulate per cycle in both cores (cores/README.md).
const MAC_CYCLES: u64 = (N * N * N) as u64;

#[derive(Args)]
pub struct RtlCoresArgs {
    /// Jobs per family per round (plus one untimed warm-up job each).
    #[arg(long, default_value_t = 10)]
    jobs: u32,
    /// Rounds; the families take turns, so both see the same machine load.
    #[arg(long, default_value_t = 2)]
    rounds: u32,
    /// Build cache [default: $COREFARM_CACHE, else ~/.cache/corefarm].
    #[arg(long)]
    cache_dir: Option<PathBuf>,
}

#[derive(Debug, Default, Serialize)]
struct Figures {
    family: Family,
    protocol: &'static str,
    jobs: u64,
    /// Every output equal to the host's product.
    all_verified: bool,
    /// Simulated cycles of one job, register accesses and data movement included.
    cycles_per_job: u64,
    /// The multiply-accumulates (the same in both cores).
    mac_cycles: u64,
    /// cycles_per_job − mac_cycles: moving the matrices, the control protocol.
    other_cycles: u64,
    /// AXI core: cycles with a request pending or data moving on its master
    /// port (the simulated memory counts them); `None` for the Avalon core,
    /// whose data the host writes through the agents (in `other_cycles`).
    master_busy_cycles: Option<u64>,
    /// Simulated cycles ÷ wall time spent in the jobs.
    sim_cycles_per_s: f64,
}

/// A bus shared with the benchmark, which reads the AXI wrapper's counters
/// after the driver ran its jobs over it.
struct Shared(Arc<Mutex<RtlBus>>);

impl Bus for Shared {
    fn read64(&mut self, addr: u64) -> Result<u64, BusError> {
        self.0.lock().unwrap().read64(addr)
    }
    fn write64(&mut self, addr: u64, value: u64) -> Result<(), BusError> {
        self.0.lock().unwrap().write64(addr, value)
    }
    fn read_block(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), BusError> {
        self.0.lock().unwrap().read_block(addr, buf)
    }
    fn write_block(&mut self, addr: u64, data: &[u8]) -> Result<(), BusError> {
        self.0.lock().unwrap().write_block(addr, data)
    }
    fn idle(&mut self, budget: Duration) {
        self.0.lock().unwrap().idle(budget)
    }
    fn irq(&mut self, control: u64) -> Option<bool> {
        self.0.lock().unwrap().irq(control)
    }
    fn reset(&mut self, control: u64) -> bool {
        self.0.lock().unwrap().reset(control)
    }
    fn cycles(&self, control: u64) -> Option<u64> {
        self.0.lock().unwrap().cycles(control)
    }
    fn dma_window(&self) -> Option<DmaWindow> {
        self.0.lock().unwrap().dma_window()
    }
}

struct Bench {
    family: Family,
    driver: Driver,
    bus: Arc<Mutex<RtlBus>>,
    fig: Figures,
    cycles: u64,
    busy: Duration,
    master: u64,
}

fn product(input: &[u8]) -> Vec<u8> {
    let w = |i: usize| i32::from_le_bytes(input[4 * i..4 * i + 4].try_into().unwrap());
    let mut out = Vec::with_capacity(OUTPUT);
    for i in 0..N {
        for j in 0..N {
            let mut s = 0i32;
            for k in 0..N {
                s = s.wrapping_add(w(i * N + k).wrapping_mul(w(N * N + k * N + j)));
            }
            out.extend_from_slice(&s.to_le_bytes());
        }
    }
    out
}

fn setup(family: Family, cache: &std::path::Path, src: &std::path::Path) -> Result<Bench> {
    let (kind, file, text, control) = match family {
        Family::Intel => (
            BuildKind::Rtl { top: ENTRY.into() },
            "matmul.v",
            AVALON,
            None,
        ),
        Family::Amd => {
            let iface = toolchain::vitis::parse_interface(VITIS, ENTRY, &[])
                .map_err(|e| anyhow!("matmul_vitis.cpp: {e}"))?;
            (
                BuildKind::RtlAxi { top: ENTRY.into() },
                "matmul_axi.v",
                AXI,
                Some(Control::ap_ctrl_hs(iface.args())),
            )
        }
    };
    let v = src.join(file);
    std::fs::write(&v, text).with_context(|| format!("writing {file}"))?;
    eprintln!("building the {family} matrix multiplier (cached after the first run)");
    let so = toolchain::cached_build(&kind, &[v], "", cache)
        .with_context(|| format!("building cores/matmul/{file}"))?;
    let lib = Arc::new(RtlLib::open(&so)?);
    let table = corefarm_cores::image::default_core_table(1, INPUT as u32, OUTPUT as u32)?;
    let map = Arc::new(AddressMap::with_control(
        &table,
        INPUT as u32,
        OUTPUT as u32,
        control.as_ref(),
    ));
    let bus = Arc::new(Mutex::new(RtlBus::new(lib, map, 0)?));
    let driver = Driver::with_control(
        Box::new(Shared(bus.clone())),
        table[0],
        INPUT as u32,
        OUTPUT as u32,
        control.as_ref(),
        DriverOptions {
            timeout: Duration::from_secs(120),
            poll: Duration::from_millis(1),
        },
    )?;
    Ok(Bench {
        family,
        driver,
        bus,
        fig: Figures {
            family,
            protocol: if control.is_some() {
                "ap_ctrl_hs"
            } else {
                "avalon_csr"
            },
            all_verified: true,
            ..Figures::default()
        },
        cycles: 0,
        busy: Duration::ZERO,
        master: 0,
    })
}

impl Bench {
    /// One job; `timed` jobs count towards the figures.
    fn job(&mut self, seed: u64, timed: bool) -> Result<()> {
        let mut x = seed | 1;
        let input: Vec<u8> = (0..INPUT)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let mut out = vec![0u8; OUTPUT];
        let before = self.driver.stats();
        let m0 = self.bus.lock().unwrap().mem_cycles();
        self.driver.process(&input, &mut out)?;
        let after = self.driver.stats();
        let m1 = self.bus.lock().unwrap().mem_cycles();
        if out != product(&input) {
            self.fig.all_verified = false;
        }
        if timed {
            let c = after.last_cycles.unwrap_or(0);
            self.fig.jobs += 1;
            self.fig.cycles_per_job = c;
            self.cycles += c;
            self.busy += after.busy - before.busy;
            if let (Some(a), Some(b)) = (m0, m1) {
                self.master += b - a;
            }
        }
        Ok(())
    }

    fn finish(mut self) -> Figures {
        let jobs = self.fig.jobs.max(1);
        self.fig.cycles_per_job = self.cycles / jobs;
        self.fig.mac_cycles = MAC_CYCLES;
        self.fig.other_cycles = self.fig.cycles_per_job.saturating_sub(MAC_CYCLES);
        self.fig.master_busy_cycles = (self.family == Family::Amd).then_some(self.master / jobs);
        self.fig.sim_cycles_per_s = self.cycles as f64 / self.busy.as_secs_f64().max(1e-9);
        self.fig
    }
}

pub fn run(a: RtlCoresArgs) -> Result<()> {
    ensure!(
        a.jobs > 0 && a.rounds > 0,
        "--jobs and --rounds must be positive"
    );
    let cache = a
        .cache_dir
        .clone()
        .unwrap_or_else(toolchain::default_cache_dir);
    let src = tempfile::tempdir().context("creating a temporary directory")?;
    let mut benches = Vec::new();
    for family in Family::ALL {
        let mut b = setup(family, &cache, src.path())?;
        b.job(0, false)?;
        benches.push(b);
    }
    for round in 0..a.rounds {
        for b in &mut benches {
            for j in 0..a.jobs {
                b.job(u64::from(round * a.jobs + j + 1), true)?;
            }
        }
    }
    let figures: Vec<Figures> = benches.into_iter().map(Bench::finish).collect();
    ensure!(
        figures.iter().all(|f| f.all_verified),
        "a core computed a wrong product: {figures:?}"
    );
    let ratio = figures[1].cycles_per_job as f64 / figures[0].cycles_per_job as f64;
    let speed = figures[1].sim_cycles_per_s / figures[0].sim_cycles_per_s;
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::json!({
            "families": figures,
            "amd_over_intel_cycles_per_job": ratio,
            "amd_over_intel_sim_cycles_per_s": speed,
        }))?
    );
    Ok(())
}
