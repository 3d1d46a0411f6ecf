//! `corefarm bench sharing`: seed 002 §5.5 scaled to this machine. An
//! embedded cluster (simulated nodes programming in `--reconfigure-delay-ms`)
//! serves `--apps` concurrent applications; each calls a random sequence of
//! `--functions` functions (benchmarking configurations with different
//! per-input delays), each call 1–100 ms of node time split into `--jobs`
//! messages. Reports the makespan normalised to software-only (every call's
//! work run one after the other, as one CPU per application would at
//! speedup 1) and the utilisation U = T_e / T_o (eqs. 5.7/5.8): node time
//! executed over node time available (nodes × makespan).
//!
//! `--sharing exclusive` gives each application nodes / apps nodes of its own
//! (it reprograms them when it calls another function); `shared` lets the
//! server place functions (Algorithm 1).

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::Args;
use corefarm_server::{ServerOptions, Sharing};
use corefarm_smp::blocking::{write_frame, FrameReader};
use corefarm_smp::{
    hello::features, BenchmarkConfig, ConfigurationResponse, Data, ErrorMsg, Hello, MsgType,
    OutFrame,
};

#[derive(Args)]
pub struct SharingArgs {
    /// shared or exclusive.
    #[arg(long, default_value = "shared")]
    sharing: Sharing,
    /// Simulated nodes.
    #[arg(long, default_value_t = 8)]
    nodes: usize,
    /// Concurrent applications (user connections).
    #[arg(long, default_value_t = 4)]
    apps: u32,
    /// Distinct functions the applications pick from.
    #[arg(long, default_value_t = 16)]
    functions: u32,
    /// Calls per application.
    #[arg(long, default_value_t = 20)]
    calls: u32,
    /// Messages one call is split into (the seed's n_j).
    #[arg(long, default_value_t = 6)]
    jobs: u32,
    /// Monitoring period P in ms; the nodes' programming time is the same
    /// unless --reconfigure-delay-ms says otherwise (seed table 5.3).
    #[arg(long, default_value_t = 10)]
    period_ms: u64,
    #[arg(long)]
    reconfigure_delay_ms: Option<u64>,
    /// Seed of the random call sequences (same seed, same workload).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// xorshift64*: a reproducible workload needs no more.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

/// One call: function index and number of inputs.
type Call = (u32, u32);

/// Per-input delay of function `f`: 100 µs to 1.6 ms, so calls of 1–100 ms
/// have from one to about a thousand inputs.
fn delay_us(f: u32) -> u32 {
    100 * (f + 1)
}

fn workload(a: &SharingArgs) -> Vec<Vec<Call>> {
    let mut rng = Rng(a.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    (0..a.apps)
        .map(|_| {
            (0..a.calls)
                .map(|_| {
                    let f = rng.below(a.functions as u64) as u32;
                    let work_us = 1000 + rng.below(99_000) as u32;
                    (f, (work_us / delay_us(f)).max(1))
                })
                .collect()
        })
        .collect()
}

pub fn run(a: SharingArgs) -> Result<()> {
    if a.apps == 0 || a.nodes == 0 || a.functions == 0 || a.jobs == 0 {
        bail!("--apps, --nodes, --functions and --jobs must be at least 1");
    }
    let calls = workload(&a);
    let executed: f64 = calls
        .iter()
        .flatten()
        .map(|&(f, n)| n as f64 * delay_us(f) as f64 * 1e-6)
        .sum();
    let software: f64 = calls
        .iter()
        .map(|c| {
            c.iter()
                .map(|&(f, n)| n as f64 * delay_us(f) as f64 * 1e-6)
                .sum::<f64>()
        })
        .fold(0.0, f64::max);
    let period = Duration::from_millis(a.period_ms.max(1));
    let opts = ServerOptions {
        nodes_listen: "127.0.0.1:0".into(),
        users_listen: "127.0.0.1:0".into(),
        sharing: a.sharing,
        monitor_period: period,
        ..ServerOptions::default()
    };
    let node = corefarm_node::NodeOptions {
        reconfigure_delay: Duration::from_millis(a.reconfigure_delay_ms.unwrap_or(a.period_ms)),
        ..corefarm_node::NodeOptions::default()
    };
    let rt = crate::cmd_server::runtime()?;
    let (cluster, _handle) = rt.block_on(crate::cmd_server::start_local(a.nodes, opts, node))?;
    let addr = cluster.users_addr;
    wait_nodes(addr, a.nodes)?;
    let share = (a.sharing == Sharing::Exclusive).then(|| (a.nodes as u32 / a.apps).max(1));
    let start = Instant::now();
    let threads: Vec<_> = calls
        .into_iter()
        .map(|c| {
            let jobs = a.jobs;
            std::thread::spawn(move || app(addr, share, c, jobs))
        })
        .collect();
    for t in threads {
        t.join()
            .map_err(|_| anyhow::anyhow!("an application thread panicked"))??;
    }
    let makespan = start.elapsed().as_secs_f64();
    let reconfigurations: u64 = status(addr)?
        .functions
        .iter()
        .map(|f| f.reconfigurations)
        .sum();
    cluster.stop.cancel();
    let report = serde_json::json!({
        "sharing": a.sharing.to_string(), "nodes": a.nodes, "apps": a.apps,
        "functions": a.functions, "calls": a.calls, "period_ms": a.period_ms,
        "makespan_s": makespan, "software_s": software,
        "normalised_makespan": makespan / software,
        "utilisation": executed / (a.nodes as f64 * makespan),
        "reconfigurations": reconfigurations,
    });
    if a.json {
        println!("{report}");
    } else {
        println!(
            "{} apps, {} nodes, {}: makespan {:.3} s = {:.1} % of software-only, utilisation {:.1} %{}",
            a.apps,
            a.nodes,
            a.sharing,
            makespan,
            100.0 * makespan / software,
            100.0 * executed / (a.nodes as f64 * makespan),
            if a.sharing == Sharing::Shared {
                format!(", {reconfigurations} reconfigurations")
            } else {
                String::new()
            }
        );
    }
    Ok(())
}

struct Conn {
    w: TcpStream,
    r: FrameReader<TcpStream>,
}

impl Conn {
    fn open(addr: SocketAddr, nodes: Option<u32>) -> Result<Conn> {
        let s = TcpStream::connect(addr).context("connecting to the embedded cluster")?;
        s.set_read_timeout(Some(Duration::from_secs(120)))?;
        let mut c = Conn {
            w: s.try_clone()?,
            r: FrameReader::new(s, 1 << 30),
        };
        let mut h = Hello::new("user");
        h.name = Some("bench sharing".into());
        h.features = vec![features::ERROR.into(), features::STATUS.into()];
        h.nodes = nodes;
        write_frame(&mut c.w, h.to_frame())?;
        c.next(MsgType::Hello)?;
        Ok(c)
    }

    fn next(&mut self, want: MsgType) -> Result<corefarm_smp::Frame> {
        loop {
            let f = self
                .r
                .read_frame()?
                .context("the server closed the connection")?;
            match f.ty {
                t if t == want => return Ok(f),
                MsgType::Error => eprintln!("server: {}", ErrorMsg::parse(&f.payload)?),
                other => bail!("unexpected {} from the server", other.name()),
            }
        }
    }
}

fn status(addr: SocketAddr) -> Result<corefarm_smp::ClusterStatus> {
    let mut c = Conn::open(addr, Some(0))?;
    write_frame(&mut c.w, corefarm_smp::ClusterStatus::request_frame())?;
    let f = c.next(MsgType::Status)?;
    Ok(corefarm_smp::ClusterStatus::decode(&f.payload)?)
}

fn wait_nodes(addr: SocketAddr, n: usize) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while status(addr)?.nodes.len() < n {
        if Instant::now() > deadline {
            bail!("the simulated nodes did not connect");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// One application: its calls in order, each configured (when the function
/// changes) and split into `jobs` messages, waiting for all results.
fn app(addr: SocketAddr, nodes: Option<u32>, calls: Vec<Call>, jobs: u32) -> Result<()> {
    let mut c = Conn::open(addr, nodes)?;
    let mut current = None;
    for (f, inputs) in calls {
        if current != Some(f) {
            let cfg = BenchmarkConfig {
                input_size: 16,
                output_size: 16,
                delay_us: delay_us(f),
            };
            write_frame(&mut c.w, cfg.to_configuration().to_frame()?)?;
            let r = c.next(MsgType::ConfigurationResponse)?;
            if !ConfigurationResponse::parse(&r.payload)?.ok() {
                bail!("configuration of function {f} refused");
            }
            current = Some(f);
        }
        let per = inputs.div_ceil(jobs.min(inputs));
        let mut sent = 0;
        let mut left = 0;
        while sent < inputs {
            let n = per.min(inputs - sent);
            let body = Bytes::from(vec![0u8; 16 * n as usize]);
            write_frame(&mut c.w, OutFrame::data(left, body)?)?;
            (sent, left) = (sent + n, left + 1);
        }
        for _ in 0..left {
            Data::parse(c.next(MsgType::Data)?.payload)?;
        }
    }
    Ok(())
}
