//! Node manager metrics for `corefarm node --metrics-listen`: per node
//! manager (several run in one process with `--count`), counters written by
//! its session with relaxed atomics and read at scrape time. What a node
//! does for which user is the server's to report; this is what the node
//! itself sees: its connection, configurations, jobs and answers.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corefarm_smp::Configuration;
use corefarm_telemetry::prometheus_client::metrics::MetricType::{Counter, Gauge, Histogram};
use corefarm_telemetry::{family, AtomicHistogram, Labels, Slots};
use serde::Serialize;

use crate::peer::PortStats;

/// Node managers with their own label in one process (`--count` beyond
/// this share `other`).
const NODE_SLOTS: usize = 1024;

const CONFIG_BOUNDS: &[f64] = &[0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0];

/// One node manager's counters.
#[derive(Debug)]
pub struct NodeStats {
    connected: AtomicBool,
    sessions: AtomicU64,
    jobs: AtomicU64,
    answers: AtomicU64,
    configurations: AtomicU64,
    refused: AtomicU64,
    reused: AtomicU64,
    direct: AtomicU64,
    config_time: AtomicHistogram,
    function: Mutex<Option<String>>,
    cores: AtomicU32,
    notes_sent: AtomicU64,
    notes_dropped: AtomicU64,
    /// What its peer port refused (the port counts into it).
    peer_port: Arc<PortStats>,
}

impl Default for NodeStats {
    fn default() -> Self {
        NodeStats {
            connected: AtomicBool::new(false),
            sessions: AtomicU64::new(0),
            jobs: AtomicU64::new(0),
            answers: AtomicU64::new(0),
            configurations: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            reused: AtomicU64::new(0),
            direct: AtomicU64::new(0),
            config_time: AtomicHistogram::new(CONFIG_BOUNDS),
            function: Mutex::new(None),
            cores: AtomicU32::new(0),
            notes_sent: AtomicU64::new(0),
            notes_dropped: AtomicU64::new(0),
            peer_port: Arc::default(),
        }
    }
}

impl NodeStats {
    pub fn connected(&self, yes: bool) {
        self.connected.store(yes, Ordering::Relaxed);
        if yes {
            self.sessions.fetch_add(1, Ordering::Relaxed);
        } else {
            *self.function.lock().expect("function lock") = None;
            self.cores.store(0, Ordering::Relaxed);
        }
    }

    /// The counters its peer port refuses connections into.
    pub fn peer_port(&self) -> Arc<PortStats> {
        self.peer_port.clone()
    }

    /// A data message was accepted as a job.
    pub fn job(&self) {
        self.jobs.fetch_add(1, Ordering::Relaxed);
    }

    /// A group's direct-path data message was queued for its cores.
    pub fn direct_queued(&self) {
        self.direct.fetch_add(1, Ordering::Relaxed);
    }

    /// Results and per-input errors written to the server.
    pub fn answered(&self, n: usize) {
        self.answers.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Handler notifications sent to the server, and dropped (the server
    /// did not agree them, or a message sent more than the node keeps).
    pub fn notifications(&self, sent: u64, dropped: u64) {
        self.notes_sent.fetch_add(sent, Ordering::Relaxed);
        self.notes_dropped.fetch_add(dropped, Ordering::Relaxed);
    }

    /// A configuration was loaded (`Some`) or refused (`None`) after `took`.
    pub fn configured(&self, cfg: Option<&Configuration>, took: Duration) {
        self.config_time.observe(took);
        let mut f = self.function.lock().expect("function lock");
        match cfg {
            Some(c) => {
                self.configurations.fetch_add(1, Ordering::Relaxed);
                *f = Some(function_label(c));
                self.cores.store(c.cores.len() as u32, Ordering::Relaxed);
            }
            None => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                *f = None;
                self.cores.store(0, Ordering::Relaxed);
            }
        }
    }

    /// A configuration identical to the function the node held was
    /// answered without loading (after a reconnection, say).
    pub fn reused(&self, cfg: &Configuration) {
        self.reused.fetch_add(1, Ordering::Relaxed);
        *self.function.lock().expect("function lock") = Some(function_label(cfg));
        self.cores.store(cfg.cores.len() as u32, Ordering::Relaxed);
    }

    fn status(&self, name: &str) -> NodeManagerStatus {
        let jobs = self.jobs.load(Ordering::Relaxed);
        let answers = self.answers.load(Ordering::Relaxed);
        NodeManagerStatus {
            name: name.to_string(),
            connected: self.connected.load(Ordering::Relaxed),
            sessions: self.sessions.load(Ordering::Relaxed),
            function: self.function.lock().expect("function lock").clone(),
            cores: self.cores.load(Ordering::Relaxed),
            jobs,
            answers,
            in_flight: jobs.saturating_sub(answers),
            configurations: self.configurations.load(Ordering::Relaxed),
            configurations_refused: self.refused.load(Ordering::Relaxed),
            configurations_reused: self.reused.load(Ordering::Relaxed),
            direct: self.direct.load(Ordering::Relaxed),
            notifications_sent: self.notes_sent.load(Ordering::Relaxed),
            notifications_dropped: self.notes_dropped.load(Ordering::Relaxed),
        }
    }
}

/// `bench` or `sha256:<12 hex>` of the bitstream, as the server labels it.
fn function_label(cfg: &Configuration) -> String {
    if cfg.benchmark().is_some() {
        return "bench".into();
    }
    use sha2::Digest;
    let digest = sha2::Sha256::digest(&cfg.bitstream);
    format!("sha256:{}", hex::encode(&digest[..6]))
}

/// A node manager as `/status` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct NodeManagerStatus {
    pub name: String,
    pub connected: bool,
    pub sessions: u64,
    pub function: Option<String>,
    pub cores: u32,
    pub jobs: u64,
    pub answers: u64,
    pub in_flight: u64,
    pub configurations: u64,
    pub configurations_refused: u64,
    /// Configurations answered with the function already loaded.
    pub configurations_reused: u64,
    /// Data messages of a group's direct path queued for its cores.
    pub direct: u64,
    pub notifications_sent: u64,
    pub notifications_dropped: u64,
}

/// Every node manager of this process, by name.
#[derive(Debug)]
pub struct NodeTelemetry {
    nodes: Slots<NodeStats>,
}

impl Default for NodeTelemetry {
    fn default() -> Self {
        NodeTelemetry {
            nodes: Slots::new(NODE_SLOTS),
        }
    }
}

impl NodeTelemetry {
    pub fn node(&self, name: &str) -> Arc<NodeStats> {
        self.nodes.get(name)
    }

    pub fn status(&self) -> Vec<NodeManagerStatus> {
        self.nodes
            .all()
            .iter()
            .map(|(name, s)| s.status(name))
            .collect()
    }
}

/// What `corefarm node --metrics-listen` serves.
#[derive(Clone)]
pub struct NodeEndpoints(pub Arc<NodeTelemetry>);

impl corefarm_telemetry::Endpoints for NodeEndpoints {
    fn metrics(&self) -> String {
        let me = self.0.clone();
        let mut reg = corefarm_telemetry::registry();
        reg.register_collector(corefarm_telemetry::collector(move |enc| {
            let all = me.nodes.all();
            let st: Vec<(Labels, NodeManagerStatus)> = all
                .iter()
                .map(|(name, s)| (vec![("node", name.clone())], s.status(name)))
                .collect();
            let mut f = family(
                enc,
                "node_manager_connected",
                "Connected to the server (1) or not.",
                Gauge,
            )?;
            for (l, s) in &st {
                f.gauge(l, s.connected as i64)?;
            }
            let mut f = family(
                enc,
                "node_manager_sessions",
                "Connections made to the server.",
                Counter,
            )?;
            for (l, s) in &st {
                f.counter(l, s.sessions)?;
            }
            let mut f = family(enc, "node_manager_jobs", "Data messages accepted.", Counter)?;
            for (l, s) in &st {
                f.counter(l, s.jobs)?;
            }
            let mut f = family(
                enc,
                "node_manager_direct_messages",
                "Data messages of a group's direct path queued for its cores.",
                Counter,
            )?;
            for (l, s) in &st {
                f.counter(l, s.direct)?;
            }
            let mut f = family(
                enc,
                "node_manager_answers",
                "Results and per-input errors written to the server.",
                Counter,
            )?;
            for (l, s) in &st {
                f.counter(l, s.answers)?;
            }
            let mut f = family(
                enc,
                "node_manager_in_flight",
                "Jobs accepted and not answered.",
                Gauge,
            )?;
            for (l, s) in &st {
                f.gauge(l, s.in_flight as i64)?;
            }
            let mut f = family(
                enc,
                "node_manager_cores",
                "Cores in the current configuration.",
                Gauge,
            )?;
            for (l, s) in &st {
                f.gauge(l, s.cores as i64)?;
            }
            let mut f = family(
                enc,
                "node_manager_configurations",
                "Configurations by outcome.",
                Counter,
            )?;
            for (l, s) in &st {
                for (outcome, v) in [
                    ("loaded", s.configurations),
                    ("refused", s.configurations_refused),
                    ("reused", s.configurations_reused),
                ] {
                    let mut l = l.clone();
                    l.push(("outcome", outcome.into()));
                    f.counter(&l, v)?;
                }
            }
            let mut f = family(
                enc,
                "node_manager_notifications",
                "Handler notifications by outcome (dropped: not agreed by the server, or over \
                 a message's limit).",
                Counter,
            )?;
            for (l, s) in &st {
                for (outcome, v) in [
                    ("sent", s.notifications_sent),
                    ("dropped", s.notifications_dropped),
                ] {
                    let mut l = l.clone();
                    l.push(("outcome", outcome.into()));
                    f.counter(&l, v)?;
                }
            }
            let mut f = family(
                enc,
                "node_manager_peer_port_refused",
                "Connections the peer port ended before they became a link, by reason (evicted: \
                 its place went to a newer connection before it said hello).",
                Counter,
            )?;
            for ((l, _), (_, s)) in st.iter().zip(&all) {
                for (why, v) in s.peer_port.all() {
                    let mut l = l.clone();
                    l.push(("reason", why.label().into()));
                    f.counter(&l, v)?;
                }
            }
            let mut f = family(
                enc,
                "node_manager_configuration_duration_seconds",
                "Time to stop the old cores and load (or refuse) a configuration.",
                Histogram,
            )?;
            for ((l, _), (_, s)) in st.iter().zip(&all) {
                f.histogram(l, &s.config_time.snapshot())?;
            }
            Ok(())
        }));
        corefarm_telemetry::encode(&reg)
    }

    fn status(&self) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({ "node_managers": self.0.status() }))
            .expect("status serialises")
    }
}
