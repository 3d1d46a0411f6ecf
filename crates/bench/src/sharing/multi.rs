//! Multi-tenant runs (`corefarm bench sharing --workload NAME`): the users of
//! a generated workload (workloads.rs) replayed in real time against an
//! embedded cluster, one thread per user, in one of four modes:
//!
//! - `exclusive`: server `--sharing exclusive`; each user asks for
//!   nodes / divisor nodes at its hello, takes what is free, waits for the
//!   rest (a refused configuration — no node within `--node-wait` — is
//!   retried every 10 ms, as a user would), programs its own nodes when it
//!   calls another function and holds them until it leaves, or until it has
//!   been idle for `--user-idle-timeout` while another user waits with none;
//! - `static`: the `nodes - 2` most popular functions own one node each,
//!   programmed once before the clock starts; the other functions share the
//!   last 2 nodes, reprogrammed when the function changes; each partition is
//!   one exclusive connection serving one call at a time;
//! - `shared`: server `--sharing shared` (Algorithm 1);
//! - `cowork`: shared, each call through the client's co-working map, the
//!   local side the calibrated software loop at `--speedup`.
//!
//! A call's completion time runs from when its user issues it (for the first
//! call, the user's arrival: connecting and waiting for nodes included) to
//! its last result.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use corefarm_client::{Client, ClientOptions, Cowork, CoworkOptions};
use corefarm_server::ServerOptions;
use corefarm_smp::blocking::write_frame;
use corefarm_smp::{Data, MsgType, OutFrame};

use corefarm_smp::BenchmarkConfig;

use super::apps::{messages, Conn, Software};
use super::soft::SoftCore;
use super::workloads::{delay_us, generate, node_us, Call, User, Workload};
use super::Variant;

/// Nodes that serve the functions a static partition does not place.
const STATIC_TAIL: usize = 2;

/// One multi-tenant run.
#[derive(Debug, Clone)]
pub struct MultiOptions {
    pub workload: Workload,
    /// exclusive, static, shared or cowork.
    pub variant: Variant,
    pub nodes: usize,
    /// Messages a call is split into (at most).
    pub jobs: u32,
    /// `cowork`: software time per input over node time per input.
    pub speedup: f64,
    /// Algorithm 1's monitoring period.
    pub period_ms: u64,
    /// The simulated nodes' programming time.
    pub reconfigure_delay_ms: u64,
    pub seed: u64,
    /// The server's `--user-idle-timeout`.
    pub user_idle_timeout: Duration,
    /// A shortened workload, for a smoke run.
    pub quick: bool,
    /// `cowork`: no backup copies.
    pub no_backup: bool,
}

/// One call as it ran.
#[derive(Debug, Clone, Copy)]
struct Done {
    user: usize,
    completion: f64,
}

/// Runs the workload in one mode and returns its report (what `--json` prints).
pub fn measure(o: &MultiOptions) -> Result<serde_json::Value> {
    if o.nodes <= STATIC_TAIL || o.jobs == 0 {
        bail!("a multi-tenant workload needs at least 3 nodes and 1 job per call");
    }
    if o.variant == Variant::Software {
        bail!("the multi-tenant workloads compare the cluster's modes: exclusive, static, shared or cowork");
    }
    if o.variant == Variant::Cowork && !(o.speedup.is_finite() && o.speedup > 0.0) {
        bail!("cowork needs a software path (--speedup > 0)");
    }
    let shape = o.workload.shape(o.quick);
    let users = generate(&shape, o.seed);
    let share = (o.nodes as u32 / shape.exclusive_divisor).max(1);
    let work: f64 = users
        .iter()
        .flat_map(|u| u.calls.iter())
        .map(|c| node_us(c) as f64 * 1e-6)
        .sum();
    let opts = ServerOptions {
        nodes_listen: "127.0.0.1:0".into(),
        users_listen: "127.0.0.1:0".into(),
        sharing: o.variant.server().expect("a cluster variant"),
        monitor_period: Duration::from_millis(o.period_ms.max(1)),
        user_idle_timeout: o.user_idle_timeout,
        ..ServerOptions::default()
    };
    let node = corefarm_node::NodeOptions {
        reconfigure_delay: Duration::from_millis(o.reconfigure_delay_ms),
        ..corefarm_node::NodeOptions::default()
    };
    let embedded = crate::cluster::EmbeddedCluster::start(o.nodes, opts, node)?;
    let addr = embedded.cluster.users_addr;
    super::apps::wait_nodes(addr, o.nodes)?;
    let sw = Software {
        iters_per_us: if o.variant == Variant::Cowork {
            super::soft::calibrate()
        } else {
            0.0
        },
        speedup: o.speedup,
    };
    let partition = match o.variant {
        Variant::Static => Some(Partition::start(addr, o.nodes)?),
        _ => None,
    };
    let st0 = super::apps::status(addr)?;
    let reconf0: u64 = st0.nodes.iter().map(|n| n.reconfigurations).sum();
    let busy0: f64 = st0.nodes.iter().map(|n| n.busy_seconds).sum();
    let done = Mutex::new(Vec::<Done>::new());
    let local = AtomicU64::new(0);
    let backups = AtomicU64::new(0);
    let start = Instant::now();
    let ends = std::thread::scope(|s| -> Result<Vec<f64>> {
        let threads: Vec<_> = users
            .iter()
            .enumerate()
            .map(|(k, u)| {
                let (done, local, backups, partition) = (&done, &local, &backups, &partition);
                s.spawn(move || -> Result<f64> {
                    let arrive = start + Duration::from_micros(u.arrive_us);
                    std::thread::sleep(arrive.saturating_duration_since(Instant::now()));
                    let mut record = |t0: Instant| {
                        done.lock().expect("records").push(Done {
                            user: k,
                            completion: t0.elapsed().as_secs_f64(),
                        })
                    };
                    match o.variant {
                        Variant::Exclusive => {
                            user_cluster(addr, Some(share), u, o.jobs, arrive, &mut record)?
                        }
                        Variant::Shared => {
                            user_cluster(addr, None, u, o.jobs, arrive, &mut record)?
                        }
                        Variant::Static => partition.as_ref().expect("started").user(
                            u,
                            o.jobs,
                            arrive,
                            &mut record,
                        )?,
                        Variant::Cowork => {
                            let (l, b) = user_cowork(addr, sw, u, o, arrive, &mut record)?;
                            local.fetch_add(l, Ordering::Relaxed);
                            backups.fetch_add(b, Ordering::Relaxed);
                        }
                        Variant::Software => unreachable!("refused above"),
                    }
                    Ok(start.elapsed().as_secs_f64())
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .map_err(|_| anyhow::anyhow!("a user thread panicked"))?
            })
            .collect()
    })?;
    let makespan = ends.iter().copied().fold(0.0, f64::max);
    drop(partition);
    let st = super::apps::status(addr)?;
    let reconfigurations = st.nodes.iter().map(|n| n.reconfigurations).sum::<u64>() - reconf0;
    let busy: f64 = st.nodes.iter().map(|n| n.busy_seconds).sum::<f64>() - busy0;
    drop(embedded);
    let done = done.into_inner().expect("records");
    let mut jct: Vec<f64> = done.iter().map(|d| d.completion).collect();
    jct.sort_by(f64::total_cmp);
    // Each user's own median and worst call, then their spread over users.
    let mut per_user: HashMap<usize, Vec<f64>> = HashMap::new();
    for d in &done {
        per_user.entry(d.user).or_default().push(d.completion);
    }
    let mut user_p50: Vec<f64> = per_user
        .values_mut()
        .map(|v| {
            v.sort_by(f64::total_cmp);
            quantile(v, 0.5)
        })
        .collect();
    user_p50.sort_by(f64::total_cmp);
    let mut sessions: Vec<f64> = users
        .iter()
        .zip(&ends)
        .map(|(u, &e)| e - u.arrive_us as f64 * 1e-6)
        .collect();
    sessions.sort_by(f64::total_cmp);
    let inputs: u64 = users
        .iter()
        .flat_map(|u| &u.calls)
        .map(|c| c.inputs as u64)
        .sum();
    let ms = |x: f64| (x * 1e5).round() / 100.0;
    Ok(serde_json::json!({
        "workload": o.workload.name(), "variant": o.variant.name(),
        "sharing": o.variant.server().map(|s| s.to_string()),
        "nodes": o.nodes, "jobs": o.jobs, "seed": o.seed, "quick": o.quick,
        "period_ms": o.period_ms, "reconfigure_delay_ms": o.reconfigure_delay_ms,
        "user_idle_timeout_s": o.user_idle_timeout.as_secs_f64(),
        "exclusive_nodes_per_user": share, "speedup": o.speedup,
        "users": users.len(), "calls": jct.len(), "node_work_s": work,
        "makespan_s": makespan,
        "jct_mean_ms": ms(jct.iter().sum::<f64>() / jct.len().max(1) as f64),
        "jct_p50_ms": ms(quantile(&jct, 0.5)), "jct_p99_ms": ms(quantile(&jct, 0.99)),
        "user_p50_jct_p50_ms": ms(quantile(&user_p50, 0.5)),
        "user_p50_jct_p99_ms": ms(quantile(&user_p50, 0.99)),
        "session_p50_s": quantile(&sessions, 0.5), "session_p99_s": quantile(&sessions, 0.99),
        "utilisation": work / (o.nodes as f64 * makespan),
        "nodes_busy_share": busy / (o.nodes as f64 * makespan),
        "reconfigurations": reconfigurations,
        "reprogrammings_per_s": reconfigurations as f64 / makespan,
        "local_share": local.load(Ordering::Relaxed) as f64 / inputs.max(1) as f64,
        "backups": backups.load(Ordering::Relaxed),
        "jct_ms": jct.iter().map(|&x| ms(x)).collect::<Vec<_>>(),
    }))
}

/// The `q` quantile of sorted `v` (nearest rank below), 0 when empty.
fn quantile(v: &[f64], q: f64) -> f64 {
    match v.len() {
        0 => 0.0,
        n => v[((q * n as f64) as usize).min(n - 1)],
    }
}

/// The issue time of call `i`: the user's arrival for the first, after the
/// think time otherwise.
fn issue(i: usize, c: &Call, arrive: Instant) -> Instant {
    if i == 0 {
        arrive
    } else {
        std::thread::sleep(Duration::from_micros(c.wait_us));
        Instant::now()
    }
}

/// Sends call `c`'s messages on `conn` and waits for all its results.
fn run_call(conn: &mut Conn, c: &Call, jobs: u32) -> Result<()> {
    let msgs = messages(c.inputs, jobs);
    for (id, m) in msgs.iter().enumerate() {
        write_frame(&mut conn.w, OutFrame::data(id as u32, m.clone())?)?;
    }
    for _ in 0..msgs.len() {
        Data::parse(conn.next(MsgType::Data)?.payload)?;
    }
    Ok(())
}

/// Function `f`'s configuration: the benchmarking core at `delay_us(f)`,
/// told apart from the functions with the same delay by its output size,
/// so that every function has its own digest.
fn config(f: u32) -> BenchmarkConfig {
    BenchmarkConfig {
        input_size: 16,
        output_size: 16 * (1 + f / 16),
        delay_us: delay_us(f),
    }
}

/// Configures `f`, again every 10 ms while the server refuses it.
fn configure(conn: &mut Conn, f: u32) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    while !conn.try_configure(&config(f))? {
        if Instant::now() > deadline {
            bail!("function {f}: no node for 10 minutes");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// `exclusive` (`nodes`: what the user asks for) and `shared`.
fn user_cluster(
    addr: SocketAddr,
    nodes: Option<u32>,
    u: &User,
    jobs: u32,
    arrive: Instant,
    record: &mut dyn FnMut(Instant),
) -> Result<()> {
    let mut conn = Conn::open_as(addr, nodes, false)?;
    let mut current = None;
    for (i, c) in u.calls.iter().enumerate() {
        let t0 = issue(i, c, arrive);
        if current != Some(c.function) {
            configure(&mut conn, c.function)?;
            current = Some(c.function);
        }
        run_call(&mut conn, c, jobs)?;
        record(t0);
    }
    Ok(())
}

/// `cowork`: each call through the client's co-working map, as the seed
/// workload's cowork variant (apps.rs); returns the inputs computed locally
/// and the backup copies sent.
fn user_cowork(
    addr: SocketAddr,
    sw: Software,
    u: &User,
    o: &MultiOptions,
    arrive: Instant,
    record: &mut dyn FnMut(Instant),
) -> Result<(u64, u64)> {
    let client = Client::connect(
        &addr.to_string(),
        ClientOptions {
            name: Some("bench sharing cowork".into()),
            ..ClientOptions::default()
        },
    )?;
    let mut coworks: HashMap<u32, Cowork> = HashMap::new();
    let (mut local, mut backups) = (0u64, 0u64);
    for (i, c) in u.calls.iter().enumerate() {
        let t0 = issue(i, c, arrive);
        let cw = match coworks.entry(c.function) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => v.insert(Cowork::with_cores(
                &config(c.function).to_configuration(),
                vec![Box::new(SoftCore {
                    iters: sw.iters(c.function % 16),
                })],
                CoworkOptions {
                    threads: 1,
                    jobs: o.jobs as usize,
                    configure: true,
                    backup: !o.no_backup,
                    ..CoworkOptions::default()
                },
            )?),
        };
        let msgs = messages(c.inputs, 4 * o.jobs);
        let run = client.map_cowork(&msgs, msgs.len(), cw)?;
        local += run.report.local_items as u64 * c.inputs as u64 / msgs.len() as u64;
        backups += run.report.backups as u64;
        record(t0);
    }
    Ok((local, backups))
}

/// A static partition: per placed function one connection holding one
/// node, and the tail's connection holding the rest; each serves one call
/// at a time, in the order the users take its lock.
struct Partition {
    placed: Vec<Mutex<Conn>>,
    tail: Mutex<(Conn, Option<u32>)>,
}

impl Partition {
    fn start(addr: SocketAddr, nodes: usize) -> Result<Partition> {
        let placed = (0..(nodes - STATIC_TAIL) as u32)
            .map(|f| {
                let mut c = Conn::open_as(addr, Some(1), false)?;
                configure(&mut c, f)?;
                Ok(Mutex::new(c))
            })
            .collect::<Result<Vec<_>>>()?;
        let tail = Conn::open_as(addr, Some(STATIC_TAIL as u32), false)?;
        Ok(Partition {
            placed,
            tail: Mutex::new((tail, None)),
        })
    }

    fn user(
        &self,
        u: &User,
        jobs: u32,
        arrive: Instant,
        record: &mut dyn FnMut(Instant),
    ) -> Result<()> {
        for (i, c) in u.calls.iter().enumerate() {
            let t0 = issue(i, c, arrive);
            match self.placed.get(c.function as usize) {
                Some(p) => run_call(&mut p.lock().expect("partition"), c, jobs)?,
                None => {
                    let mut g = self.tail.lock().expect("tail");
                    let (conn, held) = &mut *g;
                    if *held != Some(c.function) {
                        configure(conn, c.function)?;
                        *held = Some(c.function);
                    }
                    run_call(conn, c, jobs)?;
                }
            }
            record(t0);
        }
        Ok(())
    }
}

/// One line on a run's report `r` (from [`measure`]) for a reader.
pub fn summary(r: &serde_json::Value) -> String {
    let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
    format!(
        "{} ({} users, {} calls), {}, R {} ms: call completion p50 {:.1} ms, p99 {:.1} ms, \
         mean {:.1} ms; makespan {:.3} s, utilisation {:.1} %, {:.1} reprogrammings/s",
        r["workload"].as_str().unwrap_or("?"),
        r["users"],
        r["calls"],
        r["variant"].as_str().unwrap_or("?"),
        r["reconfigure_delay_ms"],
        f("jct_p50_ms"),
        f("jct_p99_ms"),
        f("jct_mean_ms"),
        f("makespan_s"),
        100.0 * f("utilisation"),
        f("reprogrammings_per_s"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shortened `bursts` workload (4 users, 2 bursts each) in two
    /// modes: every call completes and the report is sane (no timing
    /// assertions: the machine may be busy).
    #[test]
    fn every_call_of_a_short_workload_completes_in_static_and_shared_modes() {
        for variant in [Variant::Static, Variant::Shared] {
            let o = MultiOptions {
                workload: Workload::Bursts,
                variant,
                nodes: 4,
                jobs: 2,
                speedup: 1.0,
                period_ms: 1,
                reconfigure_delay_ms: 1,
                seed: 5,
                user_idle_timeout: Duration::from_secs(20),
                quick: true,
                no_backup: false,
            };
            let users = generate(&Workload::Bursts.shape(true), 5);
            let calls: usize = users.iter().map(|u| u.calls.len()).sum();
            let r = measure(&o).unwrap();
            assert_eq!(r["calls"], calls, "{r}");
            assert_eq!(r["jct_ms"].as_array().unwrap().len(), calls);
            let (p50, p99) = (
                r["jct_p50_ms"].as_f64().unwrap(),
                r["jct_p99_ms"].as_f64().unwrap(),
            );
            assert!(0.0 < p50 && p50 <= p99, "{r}");
            let u = r["utilisation"].as_f64().unwrap();
            assert!(u > 0.0 && u <= 1.0, "{r}");
        }
    }
}
