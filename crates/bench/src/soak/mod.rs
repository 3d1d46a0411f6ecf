//! `corefarm bench soak`: a real server and node managers under saturating
//! load for a long time, with nodes SIGKILLed and restarted at random,
//! users connecting and leaving, and bad peers mixed in. At the end it
//! checks that every input got exactly one correct result, that the server
//! passed on at most 256 notifications of each message a flooding node
//! answered, that the server and a long-lived node kept their memory flat,
//! that the server holds no more file descriptors than before the load (a
//! leaked connection or task would keep one) and that it reports no user
//! and every live node.
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
mod procs;
pub mod proxy;
pub mod schedule;
mod users;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use corefarm_client::{Client, ClientOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use procs::{open_fds, rss_kib, threads, wait_until, Cluster};
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
    /// The server's `--sharing` mode.
    pub sharing: String,
    pub seed: u64,
    /// A progress line on stderr every few seconds.
    pub progress: bool,
    /// Run the server with `--auth-file`.
    pub auth: bool,
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
        for e in t.errors.iter().chain(&self.bad_peer_failures).take(10) {
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
        "warn",
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
    let mut cluster = Cluster::start(&opts.bin, logdir.path(), &server_args, &node_args)?;
    for i in 0..opts.nodes {
        cluster.start_node(i)?;
    }
    let users_addr = cluster.users_addr.clone();
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
    anyhow::ensure!(
        wait_until(Duration::from_secs(30), || count_nodes(&users_addr)
            .is_some_and(|(n, _)| n == opts.nodes)),
        "the {} nodes did not all register within 30 s",
        opts.nodes
    );
    let spid = cluster.server_pid();
    let base_fds = open_fds(spid).unwrap_or(0);
    let base_threads = threads(spid).unwrap_or(0);

    let stop = Arc::new(AtomicBool::new(false));
    let totals = Arc::new(Mutex::new(UserTotals::default()));
    let cfg = Arc::new(users::UserConfig {
        addr: users_addr.clone(),
        result_timeout: Duration::from_secs(30),
        window: 8,
        secret: user_secret.clone(),
    });
    let handles = users::spawn_users(opts.users, opts.seed, cfg, stop.clone(), totals.clone());

    // Node 0 is never killed: its memory is the node's figure.
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let start = Instant::now();
    let end = start + opts.duration;
    let mut next_kill = start + jitter(&mut rng, opts.kill_every);
    let mut next_bad = start + Duration::from_millis(500);
    let mut next_progress = start + Duration::from_secs(10);
    let mut mem_start: Option<(u64, u64)> = None;
    let (mut killed, mut bad_played) = (0u64, 0u64);
    let mut bad_failures = Vec::new();
    let mut bad_by_kind = std::collections::BTreeMap::new();
    let mut bad_untestable = std::collections::BTreeMap::new();
    let mut flooded = 0u64;
    let mut crashes = Vec::new();
    let mut restart_at: Vec<(Instant, usize)> = Vec::new();
    while Instant::now() < end {
        let now = Instant::now();
        if mem_start.is_none() && now >= start + opts.duration / 10 {
            mem_start = Some((
                rss_kib(spid).unwrap_or(0),
                cluster.node_pid(0).and_then(rss_kib).unwrap_or(0),
            ));
        }
        for (i, status) in cluster.crashed_nodes() {
            crashes.push(format!("node {i} exited on its own: {status}"));
            restart_at.push((now, i));
        }
        if now >= next_kill {
            let live: Vec<usize> = cluster
                .live_nodes()
                .into_iter()
                .filter(|&i| i != 0)
                .collect();
            if !live.is_empty() {
                let i = live[rng.gen_range(0..live.len())];
                cluster.kill_node(i);
                killed += 1;
                restart_at.push((now + Duration::from_millis(rng.gen_range(100..1500)), i));
            }
            next_kill = now + jitter(&mut rng, opts.kill_every);
        }
        restart_at.retain(|&(at, i)| {
            if at <= now && cluster.dead_nodes().contains(&i) {
                if let Err(e) = cluster.start_node(i) {
                    crashes.push(format!("restarting node {i}: {e:#}"));
                }
                false
            } else {
                at > now
            }
        });
        if now >= next_bad {
            // In turn, so a short soak plays every one.
            let playable: Vec<bad::Misbehaviour> = bad::ALL
                .into_iter()
                .filter(|k| opts.sharing.as_str() == "shared" || k.in_exclusive_mode())
                .filter(|k| opts.auth || k.without_auth())
                .collect();
            let kind = playable[bad_played as usize % playable.len()];
            *bad_by_kind.entry(format!("{kind:?}")).or_insert(0u64) += 1;
            let ports = kind.ports();
            let port = match ports {
                [only] => *only,
                _ if rng.gen_bool(0.8) => bad::Port::Users,
                _ => bad::Port::Nodes,
            };
            let target = bad::Target {
                users: &cluster.users_addr,
                nodes: &cluster.nodes_addr,
                metrics: &cluster.metrics_addr,
                logs: logdir.path(),
                read_timeout,
                secrets: secrets.as_ref(),
                source: play_source(bad_played),
            };
            bad_played += 1;
            match bad::play(kind, port, &target, Duration::from_secs(8)) {
                Ok(bad::Played::CutOff) => {}
                Ok(bad::Played::Flooded(n)) => flooded += n,
                Ok(bad::Played::Untestable) => {
                    *bad_untestable.entry(format!("{kind:?}")).or_insert(0u64) += 1;
                }
                Err(e) => bad_failures.push(e.to_string()),
            }
            next_bad = Instant::now() + Duration::from_millis(rng.gen_range(200..2000));
        }
        if opts.progress && now >= next_progress {
            let t = totals.lock().unwrap().clone();
            eprintln!(
                "soak: {:>5.0} s  sessions {}  results {}  killed {}  bad peers {}  server RSS {} KiB",
                now.duration_since(start).as_secs_f64(),
                t.sessions,
                t.results_ok,
                killed,
                bad_played,
                rss_kib(spid).unwrap_or(0)
            );
            next_progress = now + Duration::from_secs(10);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    // Dead nodes come back, so in-flight work can finish everywhere.
    for i in cluster.dead_nodes() {
        cluster.start_node(i)?;
    }
    for h in handles {
        let _ = h.join();
    }
    let seconds = start.elapsed().as_secs_f64();
    let server_alive = cluster.server_alive();
    // Quiescent: no user left, every node back.
    let settled = wait_until(Duration::from_secs(30), || {
        count_nodes(&users_addr).is_some_and(|(n, u)| n == opts.nodes && u == 0)
    });
    let after = count_nodes(&users_addr);
    let (rss0, nrss0) = mem_start.unwrap_or((0, 0));
    let (rss1, nrss1) = (
        rss_kib(spid).unwrap_or(0),
        cluster.node_pid(0).and_then(rss_kib).unwrap_or(0),
    );
    // fds settle a moment after the users' sockets close.
    let mut fds1 = 0;
    wait_until(Duration::from_secs(10), || {
        fds1 = open_fds(spid).unwrap_or(0);
        fds1 <= base_fds
    });
    let threads1 = threads(spid).unwrap_or(0);
    // Every flooded message's result reached its user by now, and its
    // notifications went before it.
    let passed_on = ["relayed", "dropped"]
        .map(|o| {
            let series = format!("corefarm_notifications_total{{outcome=\"{o}\"}}");
            procs::metric(&cluster.metrics_addr, &series)
        })
        .into_iter()
        .sum::<Option<f64>>()
        .map(|n| n as u64);
    let t = totals.lock().unwrap().clone();
    let flat = |a: u64, b: u64| b <= a + a / 2 + 8 * 1024;
    let mut checks = vec![
        Check {
            name: "server alive",
            ok: server_alive,
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
                "{} failed sessions ({} messages unanswered, the user told)",
                t.session_errors, t.unanswered_in_failed_sessions
            ),
        },
        Check {
            name: "no node crashed",
            ok: crashes.is_empty(),
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
            detail: format!("server fds {base_fds} -> {fds1}"),
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
    Ok(SoakReport {
        seconds,
        sharing: opts.sharing.clone(),
        seed: opts.seed,
        auth: opts.auth,
        nodes: opts.nodes,
        users: opts.users,
        totals: t,
        nodes_killed: killed,
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

fn jitter(rng: &mut StdRng, mean: Duration) -> Duration {
    mean.mul_f64(rng.gen_range(0.5..1.5))
}
