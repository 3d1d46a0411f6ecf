//! Head-of-line blocking on the user↔server link, which chunks and priority
//! classes exist to bound: one user, one
//! thread streaming bulk messages, another sending one-input messages at a
//! fixed rate; the latency of the small ones, in three runs on fresh
//! connections to the same cluster:
//!
//! - `unloaded`: the small ones alone (chunks agreed, class 0);
//! - `unchunked`: under bulk load, no chunks, every message one class;
//! - `chunked`: under bulk load, chunks agreed, small ones in class 0 and
//!   bulk ones in class 7.
//!
//! The benchmarking configuration (seed 000 §4.2.2) with zero delay, so the
//! nodes add as little as they can. The server↔node link chunks or not as
//! the server and its nodes agreed, the same for every run (`bench hol
//! --node-chunk-size 0` keeps it whole, so `unchunked` is unchunked end to
//! end).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use corefarm_client::{Client, ClientOptions, Pending};
use serde::Serialize;

use crate::stats::{LatencyHistogram, LatencySummary};

#[derive(Debug, Clone)]
pub struct HolOptions {
    /// The server's user port.
    pub addr: String,
    /// Bytes per input; a small message is one input.
    pub input_size: u32,
    /// Bytes per output (at least 16).
    pub output_size: u32,
    /// Bulk message sizes cycled through, bytes (whole inputs).
    pub bulk_sizes: Vec<usize>,
    /// Bulk messages in flight.
    pub bulk_window: usize,
    /// Cap on the bulk stream's average rate, bytes per second (`None`:
    /// as fast as it goes). Each bulk message is still written at full
    /// speed; the cap only spaces them, so the link still blocks behind
    /// one, while the CPUs are not saturated by the bulk stream alone.
    pub bulk_rate: Option<f64>,
    /// Small messages per second.
    pub rate: f64,
    /// Small messages measured per run (after `warmup` of them).
    pub samples: usize,
    pub warmup: usize,
    /// Chunk size asked for (`None`: the default).
    pub chunk_size: Option<u32>,
}

impl Default for HolOptions {
    fn default() -> Self {
        HolOptions {
            addr: String::new(),
            input_size: 4096,
            output_size: 16,
            bulk_sizes: vec![1 << 20, 4 << 20, 16 << 20],
            bulk_window: 2,
            bulk_rate: None,
            rate: 200.0,
            samples: 500,
            warmup: 20,
            chunk_size: None,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct HolRun {
    pub mode: &'static str,
    pub chunks: bool,
    pub small_class: u8,
    pub bulk_class: Option<u8>,
    pub chunk_size: Option<u32>,
    pub small: LatencySummary,
    /// Bulk input bytes answered per second during the run.
    pub bulk_bytes_per_s: f64,
    pub bulk_messages: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct HolReport {
    pub input_size: u32,
    pub output_size: u32,
    pub bulk_sizes: Vec<usize>,
    pub bulk_rate: Option<f64>,
    pub rate: f64,
    pub runs: Vec<HolRun>,
    /// unchunked p99 / chunked p99, and p50 likewise.
    pub p99_gain: f64,
    pub p50_gain: f64,
    /// chunked p99 / unloaded p99.
    pub p99_vs_unloaded: f64,
    pub note: &'static str,
}

pub const NOTE: &str = "the runs differ on the user<->server link; the server<->node link \
chunks or not as the server and its nodes agreed (bench hol --node-chunk-size on the embedded \
cluster), the same for every run";

/// The embedded cluster to measure on when no server is given: `nodes`
/// node managers behind a server whose node links use `node_chunk_size`
/// (0: whole frames, so the `unchunked` run is unchunked end to end).
#[derive(Debug, Clone, Copy)]
pub struct EmbeddedSpec {
    pub nodes: usize,
    pub node_chunk_size: u32,
}

/// [`run`] against `server`'s user port, or, without one, against the
/// `embedded` cluster started in this process for the run (and stopped
/// after it).
pub fn run_on(o: &HolOptions, server: Option<String>, e: EmbeddedSpec) -> Result<HolReport> {
    if e.nodes == 0 {
        bail!("--nodes must be at least 1");
    }
    if let Some(addr) = server {
        return run(&HolOptions { addr, ..o.clone() });
    }
    let server = corefarm_server::ServerOptions {
        nodes_listen: "127.0.0.1:0".into(),
        users_listen: "127.0.0.1:0".into(),
        node_chunk_size: e.node_chunk_size,
        ..corefarm_server::ServerOptions::default()
    };
    let node = corefarm_node::NodeOptions {
        name: "bench-hol".into(),
        reconnect: false,
        ..corefarm_node::NodeOptions::default()
    };
    let cluster = crate::cluster::EmbeddedCluster::start(e.nodes, server, node)?;
    let o = HolOptions {
        addr: cluster.users_addr(),
        ..o.clone()
    };
    let report = run(&o);
    drop(cluster);
    report
}

/// The three runs against the server at `o.addr`.
pub fn run(o: &HolOptions) -> Result<HolReport> {
    if o.input_size < 16 || o.output_size < 16 || o.rate <= 0.0 || o.samples == 0 {
        bail!("input and output sizes at least 16, a positive rate and sample count");
    }
    if o.bulk_sizes.is_empty()
        || o.bulk_sizes
            .iter()
            .any(|&b| b == 0 || b % o.input_size as usize != 0)
    {
        bail!("bulk sizes must be non-zero multiples of the input size");
    }
    let unloaded = one(o, "unloaded", true, 0, None)?;
    let unchunked = one(o, "unchunked", false, 4, Some(4))?;
    let chunked = one(o, "chunked", true, 0, Some(7))?;
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    Ok(HolReport {
        input_size: o.input_size,
        output_size: o.output_size,
        bulk_sizes: o.bulk_sizes.clone(),
        bulk_rate: o.bulk_rate,
        rate: o.rate,
        p99_gain: ratio(unchunked.small.p99_ms, chunked.small.p99_ms),
        p50_gain: ratio(unchunked.small.p50_ms, chunked.small.p50_ms),
        p99_vs_unloaded: ratio(chunked.small.p99_ms, unloaded.small.p99_ms),
        runs: vec![unloaded, unchunked, chunked],
        note: NOTE,
    })
}

fn one(
    o: &HolOptions,
    mode: &'static str,
    chunks: bool,
    small_class: u8,
    bulk_class: Option<u8>,
) -> Result<HolRun> {
    let opts = ClientOptions {
        name: Some(format!("bench hol {mode}")),
        chunks,
        chunk_size: o.chunk_size,
        io_timeout: Some(Duration::from_secs(60)),
        ..ClientOptions::default()
    };
    let c = Arc::new(
        Client::connect(&o.addr, opts).with_context(|| format!("connecting to {}", o.addr))?,
    );
    c.configure_benchmark(o.input_size, o.output_size, 0)?;
    if chunks && c.chunk_size().is_none() {
        bail!("the server did not agree to chunks");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let bulk_bytes = Arc::new(AtomicU64::new(0));
    let bulk_msgs = Arc::new(AtomicU64::new(0));
    let bulk = bulk_class.map(|class| {
        let (c, stop) = (c.clone(), stop.clone());
        let (bytes, msgs) = (bulk_bytes.clone(), bulk_msgs.clone());
        let bodies: Vec<Bytes> = o
            .bulk_sizes
            .iter()
            .map(|&n| Bytes::from(vec![1u8; n]))
            .collect();
        let window = o.bulk_window.max(1);
        let cap = o.bulk_rate.filter(|r| *r > 0.0);
        std::thread::spawn(move || -> Result<()> {
            let mut in_flight: std::collections::VecDeque<(Pending, usize)> = Default::default();
            let (mut i, mut sent, t0) = (0, 0usize, Instant::now());
            while !stop.load(Ordering::Relaxed) {
                while in_flight.len() < window {
                    let b = bodies[i % bodies.len()].clone();
                    i += 1;
                    let n = b.len();
                    if let Some(r) = cap {
                        // Pacing the offered load, not synchronisation.
                        let due = t0 + Duration::from_secs_f64(sent as f64 / r);
                        std::thread::sleep(due.saturating_duration_since(Instant::now()));
                    }
                    sent += n;
                    in_flight.push_back((c.submit_pending_with(b, class)?, n));
                }
                let (p, n) = in_flight.pop_front().expect("non-empty");
                p.wait(Some(Duration::from_secs(60)))?;
                bytes.fetch_add(n as u64, Ordering::Relaxed);
                msgs.fetch_add(1, Ordering::Relaxed);
            }
            for (p, _) in in_flight {
                p.wait(Some(Duration::from_secs(60)))?;
            }
            Ok(())
        })
    });
    let small = Bytes::from(vec![2u8; o.input_size as usize]);
    let period = Duration::from_secs_f64(1.0 / o.rate);
    let mut h = LatencyHistogram::new();
    let mut measured_from = None;
    let (mut b0, mut m0) = (0, 0);
    let mut next = Instant::now();
    for k in 0..o.warmup + o.samples {
        if k == o.warmup {
            measured_from = Some(Instant::now());
            b0 = bulk_bytes.load(Ordering::Relaxed);
            m0 = bulk_msgs.load(Ordering::Relaxed);
        }
        // Pacing, not synchronisation: a fixed offered rate.
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        }
        next += period;
        let started = Instant::now();
        let p = c.submit_pending_with(small.clone(), small_class)?;
        p.wait(Some(Duration::from_secs(60)))?;
        if k >= o.warmup {
            h.record(started.elapsed().as_nanos() as u64);
        }
    }
    let secs = measured_from.map_or(0.0, |t| t.elapsed().as_secs_f64());
    let b1 = bulk_bytes.load(Ordering::Relaxed);
    let m1 = bulk_msgs.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    if let Some(t) = bulk {
        t.join()
            .map_err(|_| anyhow::anyhow!("the bulk thread panicked"))??;
    }
    Ok(HolRun {
        mode,
        chunks,
        small_class,
        bulk_class,
        chunk_size: c.chunk_size(),
        small: h.summary(),
        bulk_bytes_per_s: if secs > 0.0 {
            (b1 - b0) as f64 / secs
        } else {
            0.0
        },
        bulk_messages: m1 - m0,
    })
}
