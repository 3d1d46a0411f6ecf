//! `corefarm bench soak`: a fault campaign on a real server and node
//! managers under saturating load, with users connecting and leaving and
//! bad peers mixed in. The faults ([`schedule::FaultKind`]: nodes SIGKILLed
//! or SIGSTOPped, servers SIGKILLed and restarted or failed over to a
//! standby, peers' links delayed, blackholed, reset inside a frame or left
//! half-open by the in-tree [`proxy`]) are drawn from the seed before the
//! load starts, so a seed replays its schedule. At the end it checks that
//! every input got exactly one correct result, that no user waited longer
//! than the faults its wait overlapped explain, that the server passed on
//! at most 256 notifications of each message a flooding node answered,
//! that the server and a long-lived node kept their memory flat, that the
//! server holds no more file descriptors than before the load (a leaked
//! connection or task would keep one) and that it reports no user and
//! every live node.
//!
//! Everything runs as separate processes of the given binary on loopback
//! with OS-assigned ports, logs in a temporary directory (kept and named on
//! failure), and every process is killed when the soak ends.
//!
//! With [`SoakOptions::auth`] the server runs with `--auth-file` (secrets
//! made up for the run, kept with the logs), its nodes and users prove
//! theirs, and the bad peers include wrong answers to the challenge.
//! Without it, the bad peers that stop before any secret is asked (silent
//! sockets, bad hellos, seed-format first messages) meet the server's
//! unauthenticated paths, which authentication would put out of their
//! reach; so it is an option rather than always on.

mod bad;
mod campaign;
mod procs;
pub mod proxy;
pub mod schedule;
mod users;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use corefarm_client::{Client, ClientOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

pub use campaign::ProxyTotals;
use procs::{open_fds, rss_kib, threads, wait_until, Cluster};
pub use schedule::{Fault, FaultKind};
pub use users::UserTotals;

#[derive(Debug, Clone)]
pub struct SoakOptions {
    /// The corefarm binary to run as server and nodes.
    pub bin: PathBuf,
    pub duration: Duration,
    /// Node manager processes.
    pub nodes: usize,
    /// Concurrent user threads (each runs session after session).
    pub users: u32,
    /// Mean seconds between node kills (uniform in 0.5×–1.5× of it).
    pub kill_every: Duration,
    /// The fault kinds the campaign plays ([`FaultKind::DEFAULT`] unless
    /// asked otherwise).
    pub faults: Vec<FaultKind>,
    /// Mean time between faults other than node kills.
    pub fault_every: Duration,
    /// The server's `--sharing` mode.
    pub sharing: String,
    pub seed: u64,
    /// A progress line on stderr every few seconds.
    pub progress: bool,
    /// Run the server with `--auth-file`.
    pub auth: bool,
    /// The log filter of the servers and node managers it starts.
    pub cluster_log: String,
}

impl SoakOptions {
    /// What the fault schedule is drawn for: with the seed, all it
    /// depends on.
    pub fn plan(&self) -> schedule::Plan {
        schedule::Plan {
            kinds: self.faults.clone(),
            duration: self.duration,
            kill_every: self.kill_every,
            fault_every: self.fault_every,
            nodes: self.nodes,
            users: self.users,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
}

#[derive(Debug, Serialize)]
pub struct SoakReport {
    pub seconds: f64,
    pub sharing: String,
    pub seed: u64,
    /// Whether the server ran with `--auth-file`.
    pub auth: bool,
    pub nodes: usize,
    pub users: u32,
    /// Servers run: 2 with a standby.
    pub servers: usize,
    pub fault_kinds: Vec<String>,
    /// Faults per kind in the schedule drawn from the seed.
    pub schedule_summary: String,
    pub schedule: Vec<Fault>,
    /// Faults played per kind, and left out (their target not running).
    pub faults_played: std::collections::BTreeMap<String, u64>,
    pub faults_skipped: std::collections::BTreeMap<String, u64>,
    /// What the fault proxies carried and did (when links were faulted).
    pub proxy: Option<ProxyTotals>,
    /// Waits for a result, a configuration or credit over a second, and those
    /// longer than the faults they overlapped explain (the first 20).
    pub long_waits: u64,
    pub stuck: Vec<String>,
    /// Per server fault, in order: milliseconds from the kill to the first
    /// correct result a user received after it (`null`: none came).
    pub server_stalls_ms: Vec<Option<u64>>,
    pub totals: UserTotals,
    pub nodes_killed: u64,
    pub node_crashes: Vec<String>,
    pub bad_peers_played: u64,
    /// How often each misbehaviour was played (they take turns).
    pub bad_peers_by_kind: std::collections::BTreeMap<String, u64>,
    /// Plays that found nothing to test (e.g. no two free nodes for a group).
    pub bad_peers_untestable: std::collections::BTreeMap<String, u64>,
    pub bad_peer_failures: Vec<String>,
    /// Data messages the notification-flooding nodes answered, and the
    /// notifications the server passed on to users (relayed, or dropped
    /// for a user that did not agree them) by the end: at most 256 of
    /// each message (the soak's own nodes never notify).
    pub flooded_messages: u64,
    pub notifications_passed_on: u64,
    /// Server memory (KiB) once the load had run for a tenth of the
    /// duration, and at the end; the same for the node never killed.
    pub server_rss_kib: (u64, u64),
    pub node_rss_kib: (u64, u64),
    pub server_fds: (u64, u64),
    pub server_threads: (u64, u64),
    pub checks: Vec<Check>,
    pub ok: bool,
    /// Where the processes' logs are (kept when a check failed).
    pub logs: Option<String>,
}

impl SoakReport {
    /// The report for a reader: totals, memory, each check, the first
    /// errors and where the logs are.
    pub fn summary(&self) -> String {
        let t = &self.totals;
        let mut out = format!(
            "{:.0} s: {} sessions, {} messages ({} inputs), {} results correct; {} nodes killed; {} bad peers\n",
            self.seconds, t.sessions, t.messages, t.inputs, t.results_ok, self.nodes_killed, self.bad_peers_played
        );
        let played: Vec<String> = self
            .faults_played
            .iter()
            .map(|(k, n)| format!("{n} {k}"))
            .collect();
        out += &format!(
            "seed {}; faults played: {}{}\n",
            self.seed,
            if played.is_empty() {
                "none".to_string()
            } else {
                played.join(", ")
            },
            if self.faults_skipped.is_empty() {
                String::new()
            } else {
                format!(" (left out: {:?})", self.faults_skipped)
            }
        );
        if !self.server_stalls_ms.is_empty() {
            let mut ms: Vec<u64> = self.server_stalls_ms.iter().flatten().copied().collect();
            ms.sort_unstable();
            let q = |p: f64| {
                ms.get(((ms.len() as f64 * p).ceil() as usize).saturating_sub(1))
                    .map_or("-".to_string(), u64::to_string)
            };
            out += &format!(
                "server faults: {}, first result after the kill p50 {} ms, p99 {} ms, {} never followed by one\n",
                self.server_stalls_ms.len(),
                q(0.5),
                q(0.99),
                self.server_stalls_ms.len() - ms.len()
            );
        }
        if let Some(p) = &self.proxy {
            out += &format!(
                "fault proxies: {} connections, {} bytes, {} reset inside a frame, {} half-open\n",
                p.connections, p.bytes, p.resets, p.half_opened
            );
        }
        out += &format!(
            "server RSS {} -> {} KiB, fds {} -> {}, threads {} -> {}; node RSS {} -> {} KiB\n",
            self.server_rss_kib.0,
            self.server_rss_kib.1,
            self.server_fds.0,
            self.server_fds.1,
            self.server_threads.0,
            self.server_threads.1,
            self.node_rss_kib.0,
            self.node_rss_kib.1
        );
        for c in &self.checks {
            out += &format!(
                "  [{}] {} {}\n",
                if c.ok { "ok" } else { "FAIL" },
                c.name,
                c.detail
            );
        }
        for e in t
            .errors
            .iter()
            .chain(&self.stuck)
            .chain(&self.bad_peer_failures)
            .take(10)
        {
            out += &format!("  {e}\n");
        }
        if let Some(l) = &self.logs {
            out += &format!("  logs kept in {l}\n");
        }
        out
    }
}

/// Runs the soak. `Err` only when it could not run at all (binary missing,
/// server would not start); a soak that ran reports its checks.
pub fn run(opts: &SoakOptions) -> anyhow::Result<SoakReport> {
    anyhow::ensure!(
        opts.nodes >= 2,
        "the soak needs at least 2 nodes (one always stays up)"
    );
    let schedule = schedule::draw(opts.seed, &opts.plan());
    let schedule_summary = schedule::summary(&schedule, opts.duration);
    if opts.progress {
        eprintln!("soak: seed {}; {schedule_summary}", opts.seed);
    }
    let standby = opts.faults.contains(&FaultKind::ServerFailover);
    let proxied = opts.faults.iter().any(|k| k.is_link());
    let logdir = tempfile::Builder::new()
        .prefix("corefarm-soak-")
        .tempdir()
        .context("creating the log directory")?;
    let read_timeout = Duration::from_secs(2);
    let mut server_args: Vec<String> = [
        "--read-timeout",
        &read_timeout.as_secs().to_string(),
        // Short, so the bad peers that hold a place and nothing else are
        // seen closed within their bound; the soak's users never pause
        // this long unconfigured.
        "--user-idle-timeout",
        "4",
        "--message-timeout",
        "3",
        "--node-timeout",
        "10",
        "--node-wait",
        "30",
        "--log",
        &opts.cluster_log,
        "--sharing",
        opts.sharing.as_str(),
    ]
    .map(String::from)
    .to_vec();
    let (secrets, node_args) = if opts.auth {
        let (secrets, auth_file, node_file) = make_secrets(logdir.path(), opts.seed)?;
        server_args.extend(["--auth-file".into(), auth_file]);
        (Some(secrets), vec!["--secret-file".to_string(), node_file])
    } else {
        (None, Vec::new())
    };
    let node_args = [node_args, vec!["--log".into(), opts.cluster_log.clone()]].concat();
    let mut cluster = Cluster::start(
        &opts.bin,
        logdir.path(),
        &server_args,
        &node_args,
        if standby { 2 } else { 1 },
    )?;
    // The proxies' runtime: two threads carry every peer's bytes.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("fault-proxy")
        .enable_all()
        .build()
        .context("starting the fault proxies' runtime")?;
    let links = if proxied {
        let parse = |a: &str| -> anyhow::Result<std::net::SocketAddr> {
            a.parse().with_context(|| format!("server address {a:?}"))
        };
        let ends = cluster
            .servers
            .iter()
            .map(|s| Ok((parse(&s.nodes_addr)?, parse(&s.users_addr)?)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Some(
            campaign::Links::build(rt.handle(), &ends, opts.nodes, opts.users)
                .context("starting the fault proxies")?,
        )
    } else {
        None
    };
    for i in 0..opts.nodes {
        if let Some(l) = &links {
            cluster.set_node_server(i, campaign::Links::addrs(&l.nodes[i]));
        }
        cluster.start_node(i)?;
    }
    // The observer asks every server directly, never through a proxy.
    let observed: Vec<String> = cluster
        .servers
        .iter()
        .map(|s| s.users_addr.clone())
        .collect();
    let direct = observed.join(",");
    let user_addrs: Vec<String> = (0..opts.users as usize)
        .map(|u| match &links {
            Some(l) => campaign::Links::addrs(&l.users[u]),
            None => direct.clone(),
        })
        .collect();
    // Each server's ports and log, for the bad peers to play against
    // whichever holds the nodes (a restarted server keeps its ports).
    let bad_servers: Vec<(String, String, String, std::path::PathBuf)> = cluster
        .servers
        .iter()
        .map(|s| {
            (
                s.users_addr.clone(),
                s.nodes_addr.clone(),
                s.metrics_addr.clone(),
                s.log.clone(),
            )
        })
        .collect();
    let user_secret = secrets.as_ref().map(|s| s.users.clone());
    let count_nodes = |addr: &str| -> Option<(usize, usize)> {
        let c = Client::connect(
            addr,
            ClientOptions {
                nodes: Some(0),
                name: Some("soak-observer".into()),
                io_timeout: Some(Duration::from_secs(10)),
                secret: user_secret.clone(),
                ..Default::default()
            },
        )
        .ok()?;
        let s = c.status().ok()?;
        let you = s.you;
        // The observer itself is a user: leave it out.
        let users = s.users.iter().filter(|u| Some(u.id) != you).count();
        Some((s.nodes.len(), users))
    };
    // Nodes and users over all servers; `None` while one does not answer.
    let census = || -> Option<(usize, usize)> {
        observed.iter().try_fold((0, 0), |(n, u), a| {
            let (n1, u1) = count_nodes(a)?;
            Some((n + n1, u + u1))
        })
    };
    if !wait_until(Duration::from_secs(30), || {
        count_nodes(&observed[0]).is_some_and(|(n, _)| n == opts.nodes)
    }) {
        anyhow::bail!(
            "the {} nodes did not all register within 30 s (logs kept in {})",
            opts.nodes,
            logdir.keep().display()
        );
    }
    // Descriptors of a server holding every node, and of an idle standby.
    let fds_of = |c: &Cluster, k: usize| c.server_pid(k).and_then(open_fds).unwrap_or(0);
    // With a standby, nodes may end up on either server (a restarted node
    // takes the first address that answers): the servers' sum is compared.
    let fds_all = |c: &Cluster| (0..c.servers.len()).map(|k| fds_of(c, k)).sum::<u64>();
    let base_fds = fds_all(&cluster);
    let base_threads = cluster.server_pid(0).and_then(threads).unwrap_or(0);

    let stop = Arc::new(AtomicBool::new(false));
    let totals = Arc::new(Mutex::new(UserTotals::default()));
    let stalls = Arc::new(users::Stalls::default());
    let cfg = Arc::new(users::UserConfig {
        addrs: user_addrs,
        result_timeout: Duration::from_secs(30),
        window: 8,
        secret: user_secret.clone(),
        slow: Duration::from_secs(1),
        waits: Mutex::new(Vec::new()),
        stalls: stalls.clone(),
    });
    let handles = users::spawn_users(
        opts.users,
        opts.seed,
        cfg.clone(),
        stop.clone(),
        totals.clone(),
    );

    let camp = Arc::new(campaign::Campaign {
        cluster: Arc::new(Mutex::new(cluster)),
        links,
        active: AtomicUsize::new(0),
        server_settling: Mutex::new(None),
        server_faults: AtomicU64::new(0),
        played: Mutex::new(Vec::new()),
        notes_of_killed: Mutex::new(0),
        errors: Mutex::new(Vec::new()),
        stalls: stalls.clone(),
    });
    let cluster = camp.cluster.clone();
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let start = Instant::now();
    let end = start + opts.duration;
    let player = {
        let (camp, stop, schedule) = (camp.clone(), stop.clone(), schedule.clone());
        std::thread::spawn(move || camp.run(&schedule, start, &stop))
    };
    let mut next_bad = start + Duration::from_millis(500);
    let mut next_progress = start + Duration::from_secs(10);
    let mut mem_start: Option<(u64, u64)> = None;
    let (mut mem_seen, mut next_mem) = ((0u64, 0u64), start);
    let mut bad_played = 0u64;
    // Whose turn it is among the kinds of bad peer, and how often in a row
    // that kind found nothing to test (a flooding node given no work while
    // users resume): it plays again, a few times, before the next kind.
    let (mut bad_turn, mut bad_retries) = (0usize, 0u32);
    let mut bad_failures = Vec::new();
    let mut bad_by_kind = std::collections::BTreeMap::new();
    let mut bad_untestable = std::collections::BTreeMap::new();
    let mut flooded = 0u64;
    let mut crashes = Vec::new();
    let mut restart_at: Vec<(Instant, usize)> = Vec::new();
    while Instant::now() < end {
        let now = Instant::now();
        let active = camp.active.load(Ordering::Relaxed);
        // The baseline is the most the active server (and node 0) used in
        // the run's first tenth, sampled every second: with server faults
        // the server at the end is another process than any one sample's,
        // and one freshly restarted is smaller than one at work.
        if mem_start.is_none() && now >= next_mem {
            let c = cluster.lock().unwrap();
            if let Some(spid) = c.server_pid(active) {
                let (s, n) = (
                    rss_kib(spid).unwrap_or(0),
                    c.node_pid(0).and_then(rss_kib).unwrap_or(0),
                );
                mem_seen = (mem_seen.0.max(s), mem_seen.1.max(n));
            }
            next_mem = now + Duration::from_secs(1);
            if now >= start + opts.duration / 10 && mem_seen.0 > 0 {
                mem_start = Some(mem_seen);
            }
        }
        {
            let mut c = cluster.lock().unwrap();
            for (i, status) in c.crashed_nodes() {
                crashes.push(format!("node {i} exited on its own: {status}"));
                restart_at.push((now, i));
            }
            for (k, status) in c.crashed_servers() {
                crashes.push(format!("server {k} exited on its own: {status}"));
            }
            restart_at.retain(|&(at, i)| {
                if at <= now && c.dead_nodes().contains(&i) {
                    if let Err(e) = c.start_node(i) {
                        crashes.push(format!("restarting node {i}: {e:#}"));
                    }
                    false
                } else {
                    at > now
                }
            });
        }
        // The bad peers play against the server that holds the nodes, and
        // wait out a server fault: what they check (counters, the log, a
        // prompt answer) needs a server that stays up.
        if now >= next_bad && !camp.server_settling() {
            // In turn, so a short soak plays every one.
            let playable: Vec<bad::Misbehaviour> = bad::ALL
                .into_iter()
                .filter(|k| opts.sharing.as_str() == "shared" || k.in_exclusive_mode())
                .filter(|k| opts.auth || k.without_auth())
                .collect();
            let kind = playable[bad_turn % playable.len()];
            *bad_by_kind.entry(format!("{kind:?}")).or_insert(0u64) += 1;
            let ports = kind.ports();
            let port = match ports {
                [only] => *only,
                _ if rng.gen_bool(0.8) => bad::Port::Users,
                _ => bad::Port::Nodes,
            };
            let (bad_users, bad_nodes, bad_metrics, bad_log) = &bad_servers[active];
            let target = bad::Target {
                users: bad_users,
                nodes: bad_nodes,
                metrics: bad_metrics,
                log: bad_log,
                read_timeout,
                secrets: secrets.as_ref(),
                source: play_source(bad_played),
            };
            bad_played += 1;
            let faults_before = camp.server_faults.load(Ordering::Relaxed);
            let played = bad::play(kind, port, &target, Duration::from_secs(8));
            // A server killed while the peer played cut it off (or lost
            // what it checks) for its own reason: not a verdict on the rule.
            let overlapped = camp.server_faults.load(Ordering::Relaxed) != faults_before;
            let untestable = match &played {
                Ok(bad::Played::Untestable) => true,
                Err(_) => overlapped,
                Ok(_) => false,
            };
            if untestable && bad_retries < BAD_RETRIES {
                bad_retries += 1;
            } else {
                (bad_turn, bad_retries) = (bad_turn + 1, 0);
            }
            match played {
                Ok(bad::Played::CutOff) => {}
                Ok(bad::Played::Flooded(n)) => flooded += n,
                Ok(bad::Played::Untestable) => {
                    *bad_untestable.entry(format!("{kind:?}")).or_insert(0u64) += 1;
                }
                Err(e) if overlapped => {
                    // What a flooding node answered before a server fault
                    // cut it off was passed on too: it counts toward the bound.
                    if let bad::PlayError::NodeDropped { answered, .. } = e {
                        flooded += answered;
                    }
                    *bad_untestable.entry(format!("{kind:?}")).or_insert(0u64) += 1;
                }
                Err(e) => bad_failures.push(e.to_string()),
            }
            next_bad = Instant::now() + Duration::from_millis(rng.gen_range(200..2000));
        }
        if opts.progress && now >= next_progress {
            let t = totals.lock().unwrap().clone();
            let spid = cluster.lock().unwrap().server_pid(active);
            eprintln!(
                "soak: {:>5.0} s  sessions {}  results {}  faults {}  bad peers {}  server RSS {} KiB",
                now.duration_since(start).as_secs_f64(),
                t.sessions,
                t.results_ok,
                camp.played.lock().unwrap().len(),
                bad_played,
                spid.and_then(rss_kib).unwrap_or(0)
            );
            next_progress = now + Duration::from_secs(10);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    // Every fault undone (nodes continued, servers and links back) ...
    let _ = player.join();
    // ... and dead nodes back, so in-flight work can finish everywhere.
    {
        let mut c = cluster.lock().unwrap();
        for i in c.dead_nodes() {
            c.start_node(i)?;
        }
    }
    for h in handles {
        let _ = h.join();
    }
    let seconds = start.elapsed().as_secs_f64();
    let load_end = Instant::now();
    // Quiescent: no user left, every node back.
    let settled = wait_until(Duration::from_secs(30), || {
        census().is_some_and(|(n, u)| n == opts.nodes && u == 0)
    });
    let after = census();
    // The server holding the most nodes now: its memory is the server's
    // figure at the end.
    let holder = (0..observed.len())
        .max_by_key(|&k| count_nodes(&observed[k]).map_or(0, |(n, _)| n))
        .unwrap_or(0);
    let mut c = cluster.lock().unwrap();
    for (k, status) in c.crashed_servers() {
        crashes.push(format!("server {k} exited on its own: {status}"));
    }
    let servers_up = (0..c.servers.len()).all(|k| c.server_pid(k).is_some());
    let spid = c.server_pid(holder);
    let (rss0, nrss0) = mem_start.unwrap_or((0, 0));
    let (rss1, nrss1) = (
        spid.and_then(rss_kib).unwrap_or(0),
        c.node_pid(0).and_then(rss_kib).unwrap_or(0),
    );
    // fds settle a moment after the users' sockets close.
    let mut fds1 = 0;
    wait_until(Duration::from_secs(10), || {
        fds1 = fds_all(&c);
        fds1 <= base_fds
    });
    let threads1 = spid.and_then(threads).unwrap_or(0);
    // Every flooded message's result reached its user by now, and its
    // notifications went before it; servers killed meanwhile counted
    // theirs just before.
    let passed_on = c
        .servers
        .iter()
        .map(|s| campaign::notes_passed_on(&s.metrics_addr))
        .sum::<Option<u64>>()
        .map(|n| n + *camp.notes_of_killed.lock().unwrap());
    drop(c);
    let t = totals.lock().unwrap().clone();
    let played = camp.played.lock().unwrap().clone();
    let waits = std::mem::take(&mut *cfg.waits.lock().unwrap());
    let stuck = campaign::stuck(&waits, &played, load_end);
    let (faults_played, faults_skipped) = camp.counts();
    let fault_errors = camp.errors.lock().unwrap().clone();
    let server_stalls_ms = stalls.millis();
    let flat = |a: u64, b: u64| b <= a + a / 2 + 8 * 1024;
    let mut checks = vec![
        Check {
            name: "server alive",
            ok: servers_up && !crashes.iter().any(|c| c.starts_with("server")),
            detail: String::new(),
        },
        Check {
            name: "every result correct",
            ok: t.results_wrong == 0 && t.results_ok > 0,
            detail: format!("{} correct, {} wrong", t.results_ok, t.results_wrong),
        },
        Check {
            name: "exactly once",
            ok: t.duplicates == 0 && t.missing == 0,
            detail: format!("{} duplicates, {} missing", t.duplicates, t.missing),
        },
        Check {
            name: "no failed session",
            ok: t.session_errors == 0,
            detail: format!(
                "{} failed sessions ({} messages unanswered, the user told){}",
                t.session_errors,
                t.unanswered_in_failed_sessions,
                // The first error here too: a failing test prints the
                // failed checks in full, the report maybe cut short.
                t.errors
                    .first()
                    .map(|e| format!(", the first: {e}"))
                    .unwrap_or_default()
            ),
        },
        Check {
            name: "no session stuck past its bound",
            ok: stuck.is_empty(),
            detail: format!(
                "{} waits over {:?}, the longest {} ms; {} past their bound{}",
                waits.len(),
                cfg.slow,
                t.max_wait_ms,
                stuck.len(),
                stuck
                    .first()
                    .map(|s| format!(", the first: {s}"))
                    .unwrap_or_default()
            ),
        },
        Check {
            name: "faults undone",
            ok: fault_errors.is_empty(),
            detail: fault_errors.join("; "),
        },
        Check {
            name: "no node crashed",
            ok: !crashes.iter().any(|c| c.starts_with("node")),
            detail: crashes.join("; "),
        },
        Check {
            name: "bad peers cut off",
            ok: bad_failures.is_empty(),
            // Failed: kept, or (for the kinds not to be cut off) not dealt
            // with as documented; each failure is listed in the report.
            detail: format!("{} played, {} failed", bad_played, bad_failures.len()),
        },
        Check {
            name: "notifications bounded per message",
            ok: passed_on.is_some_and(|n| {
                n <= bad::NOTES_RELAYED_PER_MESSAGE * flooded && (flooded == 0 || n > 0)
            }),
            detail: format!(
                "{passed_on:?} passed on for {flooded} flooded messages (at most {} each)",
                bad::NOTES_RELAYED_PER_MESSAGE
            ),
        },
        Check {
            name: "server memory flat",
            ok: flat(rss0, rss1),
            detail: format!("{rss0} -> {rss1} KiB"),
        },
        Check {
            name: "node memory flat",
            ok: flat(nrss0, nrss1),
            detail: format!("{nrss0} -> {nrss1} KiB"),
        },
        Check {
            name: "no leaked connection",
            ok: fds1 <= base_fds,
            detail: format!(
                "server fds {base_fds} -> {fds1}{}",
                if standby { " (both servers)" } else { "" }
            ),
        },
    ];
    checks.push(Check {
        name: "settled",
        ok: settled,
        detail: format!("(nodes, users) at the end: {after:?}"),
    });
    let ok = checks.iter().all(|c| c.ok);
    let logs = if ok {
        None
    } else {
        Some(logdir.keep().display().to_string())
    };
    let proxy = camp.links.as_ref().map(campaign::Links::totals);
    // The proxies go before their runtime, which waits on nothing.
    drop(camp);
    rt.shutdown_background();
    Ok(SoakReport {
        seconds,
        sharing: opts.sharing.clone(),
        seed: opts.seed,
        auth: opts.auth,
        nodes: opts.nodes,
        users: opts.users,
        servers: if standby { 2 } else { 1 },
        fault_kinds: opts.faults.iter().map(|k| k.name().to_string()).collect(),
        schedule_summary,
        schedule,
        nodes_killed: faults_played.get("node-kill").copied().unwrap_or(0),
        faults_played,
        faults_skipped,
        proxy,
        long_waits: waits.len() as u64,
        server_stalls_ms,
        stuck: stuck.into_iter().take(20).collect(),
        totals: t,
        node_crashes: crashes,
        bad_peers_played: bad_played,
        bad_peers_by_kind: bad_by_kind,
        bad_peers_untestable: bad_untestable,
        bad_peer_failures: bad_failures,
        flooded_messages: flooded,
        notifications_passed_on: passed_on.unwrap_or(0),
        server_rss_kib: (rss0, rss1),
        node_rss_kib: (nrss0, nrss1),
        server_fds: (base_fds, fds1),
        server_threads: (base_threads, threads1),
        checks,
        ok,
        logs,
    })
}

/// Plays in a row of a kind of bad peer that found nothing to test.
const BAD_RETRIES: u32 = 3;

/// The loopback address bad peer play `n` connects from (where it
/// matters): one of its own, never 127.0.0.1, which the soak's users and
/// nodes use, so the server's counting per source address starts afresh.
fn play_source(n: u64) -> std::net::Ipv4Addr {
    let n = n % (250 * 250);
    std::net::Ipv4Addr::new(127, 64, (n / 250) as u8, (n % 250 + 1) as u8)
}

/// Made-up user and node secrets for the run (from its seed and the
/// clock: nothing outside the run holds them), written as the server's
/// auth file and the nodes' secret file, both private to their owner.
/// Returns the secrets and the two files' paths.
fn make_secrets(
    dir: &std::path::Path,
    seed: u64,
) -> anyhow::Result<(bad::Secrets, String, String)> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut rng = StdRng::seed_from_u64(seed ^ rand::random::<u64>());
    let mut secret = |role: &str| format!("soak-{role}-{:032x}", rng.gen::<u128>());
    let (user, node) = (secret("user"), secret("node"));
    let write = |name: &str, text: &str| -> anyhow::Result<String> {
        use std::io::Write;
        let path = dir.join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(path.display().to_string())
    };
    let auth_file = write(
        "auth.toml",
        &format!("[users]\nsecret = \"{user}\"\n[nodes]\nsecret = \"{node}\"\n"),
    )?;
    let node_file = write("node.secret", &format!("{node}\n"))?;
    let secrets = bad::Secrets {
        users: corefarm_smp::auth::Secret::new(&user)?,
        nodes: corefarm_smp::auth::Secret::new(&node)?,
    };
    Ok((secrets, auth_file, node_file))
}
