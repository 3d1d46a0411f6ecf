//! Priority classes against the queueing model (seed 001 §IV): does the
//! server's strict-priority queue wait as Cobham's formula predicts?
//!
//! One benchmarking node behind a shared-mode server whose window per node
//! is one message, so data waits in the server's function queue, which
//! serves classes by strict priority: one non-preemptive priority queue.
//! Two classes arrive as Poisson streams; each message holds a geometric
//! number of inputs (the benchmarking core takes a fixed delay per input),
//! so service times vary as in the model. The run:
//!
//! 1. calibrates: service time S(c) = a·c + b from the spacing of results
//!    under saturation at two input counts, and the fixed cost F of the
//!    links from one message at a time to an idle node;
//! 2. for each offered load ρ, measures each class's mean time from submit
//!    to result, and sets it beside Cobham's formula (M/G/1, with the
//!    moments of S from the calibration) and its M/M/1 form (exponential
//!    service, as seed 001 assumes).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use corefarm_client::{Client, ClientOptions};
use corefarm_model::queueing::{priority_classes, priority_classes_general, Class, GeneralClass};
use rand::{Rng, SeedableRng};

use crate::cluster::EmbeddedCluster;

/// What to measure.
#[derive(Debug, Clone)]
pub struct ClassesOptions {
    /// Offered loads ρ to measure (fractions of the node's capacity).
    pub loads: Vec<f64>,
    /// Share of messages in the urgent class (class 0); the rest are class 1.
    pub urgent_share: f64,
    /// The benchmarking core's delay per input, microseconds.
    pub delay_us: u32,
    /// Mean inputs per message (geometric, at least 1).
    pub mean_inputs: f64,
    /// Measured seconds per load (after one second of warm-up).
    pub duration: f64,
    /// Seed of the arrival and size draws (same seed, same run).
    pub seed: u64,
}

const INPUT: u32 = 64;
const OUTPUT: u32 = 16;

/// Service time per message on the node link: `a` per input plus `b`.
#[derive(Debug, Clone, Copy)]
struct Service {
    a: f64,
    b: f64,
}

impl Service {
    /// `E[S]` and `E[S²]` for a geometric number of inputs with mean `m`:
    /// `E[c] = m`, `E[c²] = 2m² − m`.
    fn moments(&self, m: f64) -> (f64, f64) {
        let c2 = 2.0 * m * m - m;
        (
            self.a * m + self.b,
            self.a * self.a * c2 + 2.0 * self.a * self.b * m + self.b * self.b,
        )
    }
}

/// Calibrates, measures every load and returns the report (one JSON
/// object); progress lines go to standard error.
pub fn run(a: &ClassesOptions) -> Result<serde_json::Value> {
    if a.loads.is_empty() || a.loads.iter().any(|r| !(*r > 0.0 && *r < 1.0)) {
        bail!("--loads must be fractions strictly between 0 and 1");
    }
    if !(0.0..=1.0).contains(&a.urgent_share) || a.mean_inputs < 1.0 || a.delay_us == 0 {
        bail!("--urgent-share 0..1, --mean-inputs at least 1, --delay-us positive");
    }
    if !(a.duration.is_finite() && a.duration > 0.0) {
        bail!("--duration must be positive");
    }
    let cluster = start_cluster()?;
    let client = Client::connect(
        &cluster.users_addr(),
        ClientOptions {
            chunks: true,
            name: Some("bench classes".into()),
            io_timeout: Some(Duration::from_secs(60)),
            ..ClientOptions::default()
        },
    )
    .context("connecting to the embedded server")?;
    client.configure_benchmark(INPUT, OUTPUT, a.delay_us)?;
    let client = Arc::new(client);

    let (service, fixed) = calibrate(&client, a.mean_inputs)?;
    let (mean_s, s2) = service.moments(a.mean_inputs);
    eprintln!(
        "calibration: S(c) = {:.1} µs × inputs + {:.1} µs; E[S] = {:.2} ms; links {:.0} µs",
        service.a * 1e6,
        service.b * 1e6,
        mean_s * 1e3,
        fixed * 1e6
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(a.seed);
    let mut points = Vec::new();
    for &rho in &a.loads {
        let m = measure(&client, a, rho, mean_s, &mut rng)?;
        // The rates this run's draw actually offered in its window: a
        // Poisson sample of 20 s strays a few percent from the nominal ρ,
        // and near saturation the wait is steep in it.
        let general: Vec<GeneralClass> = m
            .offered
            .iter()
            .map(|&lambda| GeneralClass {
                lambda,
                mean: mean_s,
                second_moment: s2,
            })
            .collect();
        let exponential: Vec<Class> = m
            .offered
            .iter()
            .map(|&lambda| Class {
                lambda,
                mu: 1.0 / mean_s,
            })
            .collect();
        let mg1 = priority_classes_general(&general);
        let mm1 = priority_classes(&exponential);
        let mut classes = Vec::new();
        for k in 0..2 {
            let measured = m.mean[k];
            let predict = |f: Option<corefarm_model::queueing::ClassFigures>| {
                f.map(|f| f.time_in_system + fixed)
            };
            let (p_g, p_m) = (predict(mg1[k]), predict(mm1[k]));
            let err = |p: Option<f64>| p.zip(measured).map(|(p, m)| (p - m).abs() / m);
            eprintln!(
                "ρ {rho:.2} class {k}: {} messages, measured {}, M/G/1 {} ({}), M/M/1 {} ({})",
                m.count[k],
                ms(measured),
                ms(p_g),
                pct(err(p_g)),
                ms(p_m),
                pct(err(p_m)),
            );
            classes.push(serde_json::json!({
                "class": k, "messages": m.count[k], "measured_mean_s": measured,
                "measured_p50_s": m.p50[k], "measured_p99_s": m.p99[k],
                "predicted_mg1_s": p_g, "error_mg1": err(p_g),
                "predicted_mm1_s": p_m, "error_mm1": err(p_m),
            }));
        }
        points.push(serde_json::json!({
            "load": rho, "offered_load": (m.offered[0] + m.offered[1]) * mean_s,
            "achieved_load": m.achieved_rate * mean_s, "classes": classes,
        }));
    }
    let report = serde_json::json!({
        "benchmark": "classes",
        "delay_us": a.delay_us, "mean_inputs": a.mean_inputs, "urgent_share": a.urgent_share,
        "duration_s": a.duration, "seed": a.seed,
        "calibration": {"per_input_s": service.a, "per_message_s": service.b,
            "mean_service_s": mean_s, "second_moment_s2": s2, "links_s": fixed},
        "points": points,
    });
    Ok(report)
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{:.2} ms", v * 1e3))
}

fn pct(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{:.0} %", v * 100.0))
}

fn inputs(count: u32) -> Bytes {
    Bytes::from(vec![0x5A; (INPUT * count) as usize])
}

/// Results of `n` messages of `count` inputs submitted at once: the mean
/// spacing of their results is the node link's service time at that size
/// (with a window of one, the next message leaves the server when the
/// previous result is back).
fn saturated_spacing(client: &Client, count: u32, n: usize) -> Result<f64> {
    for _ in 0..n {
        client.submit_with(inputs(count), 1)?;
    }
    let mut first = None;
    let mut last = Instant::now();
    for _ in 0..n {
        client.recv(Some(Duration::from_secs(60)))?;
        last = Instant::now();
        first.get_or_insert(last);
    }
    let first = first.expect("n > 0");
    Ok((last - first).as_secs_f64() / (n - 1) as f64)
}

/// S(c) = a·c + b from saturation at 1 and 2m inputs; the links' own cost
/// F from one message at a time to an idle node (its latency minus S(1)).
fn calibrate(client: &Client, mean_inputs: f64) -> Result<(Service, f64)> {
    saturated_spacing(client, 1, 20)?; // warm-up: the node is programmed, paths are hot
    let big = (2.0 * mean_inputs).round().max(2.0) as u32;
    let s1 = saturated_spacing(client, 1, 200)?;
    let sb = saturated_spacing(client, big, 100)?;
    let a = ((sb - s1) / f64::from(big - 1)).max(0.0);
    let service = Service {
        a,
        b: (s1 - a).max(0.0),
    };
    // One message at a time, each after the node has been idle for longer
    // than its pacing slack (the benchmarking core schedules an input that
    // follows the previous one closely from the previous deadline, which
    // hides the link's round trip under saturation but not for a message
    // that finds the node idle, as most do at low load).
    let idle = Duration::from_secs_f64(s1.max(0.001) * 4.0);
    let mut lat = Vec::new();
    for _ in 0..100 {
        std::thread::sleep(idle);
        let t = Instant::now();
        client.submit_with(inputs(1), 1)?;
        client.recv(Some(Duration::from_secs(60)))?;
        lat.push(t.elapsed().as_secs_f64());
    }
    lat.sort_by(f64::total_cmp);
    let fixed = (lat[lat.len() / 2] - service.a - service.b).max(0.0);
    Ok((service, fixed))
}

struct Measured {
    count: [usize; 2],
    mean: [Option<f64>; 2],
    p50: [Option<f64>; 2],
    p99: [Option<f64>; 2],
    achieved_rate: f64,
    /// Arrivals per second of each class inside the measured window.
    offered: [f64; 2],
}

/// Poisson arrivals at rate `ρ/E[S]` for one second of warm-up and then
/// `duration` seconds; every message's time from submit to result.
fn measure(
    client: &Arc<Client>,
    a: &ClassesOptions,
    rho: f64,
    mean_s: f64,
    rng: &mut rand::rngs::StdRng,
) -> Result<Measured> {
    let lambda = rho / mean_s;
    let start = Instant::now();
    let measured_from = start + Duration::from_secs(1);
    let end = measured_from + Duration::from_secs_f64(a.duration);
    let sent: Arc<Mutex<HashMap<u32, (Instant, u8)>>> = Default::default();
    // Draw the schedule first so the sender does no work between arrivals.
    let mut schedule = Vec::new();
    let mut t = 0.0;
    let p = 1.0 / a.mean_inputs;
    loop {
        t += -(1.0 - rng.gen::<f64>()).ln() / lambda;
        let at = start + Duration::from_secs_f64(t);
        if at >= end {
            break;
        }
        let class = u8::from(rng.gen::<f64>() >= a.urgent_share);
        // Geometric on 1, 2, … with mean 1/p.
        let count = 1 + ((1.0 - rng.gen::<f64>()).ln() / (1.0 - p).ln()).floor() as u32;
        schedule.push((at, class, count.min(1024)));
    }
    let total = schedule.len();
    let mut offered = [0.0; 2];
    for (at, class, _) in &schedule {
        if *at >= measured_from {
            offered[*class as usize] += 1.0 / a.duration;
        }
    }
    let sender = {
        let (client, sent) = (client.clone(), sent.clone());
        std::thread::spawn(move || -> Result<()> {
            for (at, class, count) in schedule {
                if let Some(wait) = at.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                // The id is known only after the submit; the entry is made
                // under the lock the receiver takes, so it sees it first.
                let mut map = sent.lock().unwrap_or_else(|e| e.into_inner());
                let now = Instant::now();
                let id = client.submit_with(inputs(count), class)?;
                map.insert(id, (now, class));
            }
            Ok(())
        })
    };
    let mut lat: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut in_window = 0usize;
    for _ in 0..total {
        let out = client.recv(Some(Duration::from_secs(120)))?;
        let done = Instant::now();
        let (at, class) = sent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&out.id)
            .context("a result for an id never sent")?;
        if at >= measured_from {
            lat[class as usize].push((done - at).as_secs_f64());
            in_window += 1;
        }
    }
    sender.join().expect("sender thread")?;
    let mut m = Measured {
        count: [lat[0].len(), lat[1].len()],
        mean: [None; 2],
        p50: [None; 2],
        p99: [None; 2],
        achieved_rate: in_window as f64 / a.duration,
        offered,
    };
    for (k, v) in lat.iter_mut().enumerate() {
        if v.is_empty() {
            continue;
        }
        v.sort_by(f64::total_cmp);
        m.mean[k] = Some(v.iter().sum::<f64>() / v.len() as f64);
        m.p50[k] = Some(v[v.len() / 2]);
        m.p99[k] = Some(v[(v.len() * 99 / 100).min(v.len() - 1)]);
    }
    Ok(m)
}

/// A shared-mode server with one benchmarking node and a window of one
/// message per node, in this process; stops on drop.
fn start_cluster() -> Result<EmbeddedCluster> {
    let server = corefarm_server::ServerOptions {
        nodes_listen: "127.0.0.1:0".into(),
        users_listen: "127.0.0.1:0".into(),
        sharing: corefarm_server::Sharing::Shared,
        policy: corefarm_server::Policy::Credit,
        credit: 1,
        credit_adaptive: false,
        // The user may have every arrival outstanding: waiting happens
        // in the server's class queues, not in the client.
        user_window: Some(1 << 16),
        ..corefarm_server::ServerOptions::default()
    };
    let node = corefarm_node::NodeOptions {
        name: "classes".into(),
        reconnect: false,
        ..corefarm_node::NodeOptions::default()
    };
    EmbeddedCluster::start(1, server, node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_of_a_geometric_number_of_inputs() {
        let s = Service { a: 2.0, b: 1.0 };
        // One input always: S = 3, E[S²] = 9.
        assert_eq!(s.moments(1.0), (3.0, 9.0));
        // m = 4: E[c] = 4, E[c²] = 28; E[S] = 9, E[S²] = 4·28 + 2·2·1·4 + 1.
        assert_eq!(s.moments(4.0), (9.0, 129.0));
    }
}
