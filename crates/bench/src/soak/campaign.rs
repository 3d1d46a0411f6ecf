//! The fault campaign: plays the schedule drawn from the seed on the soak's
//! cluster (nodes killed and stopped, servers killed and restarted, links
//! through the fault proxy turned bad), records when each fault began and
//! ended, and afterwards holds every long wait of a user against the faults
//! it overlapped: a wait longer than what those faults explain is a session
//! stuck past its bound.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::procs::{self, Cluster};
use super::proxy::{LinkFault, Proxy};
use super::schedule::{Class, Fault, FaultKind};
use super::users::{Stalls, Wait};

/// Every peer's link: one proxy per server it may use, in the servers'
/// order, so its address list is its proxies' addresses.
pub struct Links {
    pub nodes: Vec<Vec<Proxy>>,
    pub users: Vec<Vec<Proxy>>,
}

impl Links {
    /// Proxies for `nodes` nodes and `users` users to each server, given
    /// as its (node port, user port).
    pub fn build(
        rt: &tokio::runtime::Handle,
        servers: &[(SocketAddr, SocketAddr)],
        nodes: usize,
        users: u32,
    ) -> std::io::Result<Links> {
        let link = |pick: fn(&(SocketAddr, SocketAddr)) -> SocketAddr| {
            servers
                .iter()
                .map(|s| Proxy::start(rt, pick(s)))
                .collect::<std::io::Result<Vec<_>>>()
        };
        Ok(Links {
            nodes: (0..nodes)
                .map(|_| link(|s| s.0))
                .collect::<Result<_, _>>()?,
            users: (0..users)
                .map(|_| link(|s| s.1))
                .collect::<Result<_, _>>()?,
        })
    }

    /// The address list a peer is given: its proxies, comma-separated.
    pub fn addrs(link: &[Proxy]) -> String {
        link.iter()
            .map(|p| p.addr().to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    fn set(&self, class: Class, target: usize, f: LinkFault) {
        let link = match class {
            Class::UserLink => &self.users[target],
            _ => &self.nodes[target],
        };
        for p in link {
            p.set(f);
        }
    }

    pub fn totals(&self) -> ProxyTotals {
        let mut t = ProxyTotals::default();
        for p in self.nodes.iter().chain(&self.users).flatten() {
            let s = p.stats();
            let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
            t.connections += get(&s.connections);
            t.bytes += get(&s.bytes);
            t.resets += get(&s.resets);
            t.half_opened += get(&s.half_opened);
            t.dropped_bytes += get(&s.dropped);
        }
        t
    }
}

/// What the fault proxies did, summed.
#[derive(Debug, Default, Clone, Serialize)]
pub struct ProxyTotals {
    pub connections: u64,
    pub bytes: u64,
    pub resets: u64,
    pub half_opened: u64,
    pub dropped_bytes: u64,
}

/// A fault as it was played.
#[derive(Debug, Clone)]
pub struct Played {
    pub fault: Fault,
    pub from: Instant,
    /// When it was undone (a node restarted or continued, a server
    /// restarted, a link back to pass-through).
    pub to: Option<Instant>,
    /// Why it was not played (its target was not running).
    pub skipped: Option<String>,
    /// The server it killed.
    server: usize,
}

/// The campaign's state shared with the soak's main loop.
pub struct Campaign {
    pub cluster: Arc<Mutex<Cluster>>,
    pub links: Option<Links>,
    /// The server that holds the nodes (changes on a failover).
    pub active: AtomicUsize,
    /// Until then, a server is down or its peers are still coming back:
    /// the bad peers wait.
    pub server_settling: Mutex<Option<Instant>>,
    /// Server faults begun so far: a bad peer's play that a server fault
    /// overlapped proves nothing either way.
    pub server_faults: AtomicU64,
    pub played: Mutex<Vec<Played>>,
    /// Notifications passed on by server incarnations killed since.
    pub notes_of_killed: Mutex<u64>,
    /// Problems undoing a fault (a node or server that would not start).
    pub errors: Mutex<Vec<String>>,
    pub stalls: Arc<Stalls>,
}

/// How long after a server fault the bad peers keep waiting: its nodes
/// reconnect and register within it.
const SERVER_SETTLE: Duration = Duration::from_secs(3);

impl Campaign {
    /// Whether a server fault is under way or just ended.
    pub fn server_settling(&self) -> bool {
        self.server_settling
            .lock()
            .unwrap()
            .is_some_and(|t| Instant::now() < t)
    }

    /// Plays `schedule` from `start` until it ends or `stop` is set, then
    /// undoes every fault still in force.
    pub fn run(&self, schedule: &[Fault], start: Instant, stop: &AtomicBool) {
        // Each fault begins at its time and is undone `hold` later; undoing
        // goes first at equal times.
        let mut actions: Vec<(Duration, bool, usize)> = schedule
            .iter()
            .enumerate()
            .flat_map(|(i, f)| [(f.at, true, i), (f.at + f.hold, false, i)])
            .collect();
        actions.sort_by_key(|&(t, begin, i)| (t, begin, i));
        let mut slot: Vec<Option<usize>> = vec![None; schedule.len()];
        'actions: for (t, begin, i) in actions {
            let due = start + t;
            loop {
                if stop.load(Ordering::Relaxed) {
                    break 'actions;
                }
                let now = Instant::now();
                if now >= due {
                    break;
                }
                std::thread::sleep((due - now).min(Duration::from_millis(50)));
            }
            if begin {
                slot[i] = Some(self.begin(&schedule[i]));
            } else if let Some(p) = slot[i] {
                self.undo(p);
            }
        }
        let open: Vec<usize> = {
            let played = self.played.lock().unwrap();
            (0..played.len())
                .filter(|&p| played[p].to.is_none() && played[p].skipped.is_none())
                .collect()
        };
        for p in open {
            self.undo(p);
        }
    }

    fn begin(&self, f: &Fault) -> usize {
        let mut skipped = None;
        let mut server = 0;
        match f.kind {
            FaultKind::NodeKill => {
                let mut c = self.cluster.lock().unwrap();
                if c.node_pid(f.target).is_some() {
                    c.kill_node(f.target);
                } else {
                    skipped = Some("node not running".to_string());
                }
            }
            FaultKind::NodeStop => {
                if !self
                    .cluster
                    .lock()
                    .unwrap()
                    .signal_node(f.target, libc::SIGSTOP)
                {
                    skipped = Some("node not running".to_string());
                }
            }
            FaultKind::ServerRestart | FaultKind::ServerFailover => {
                *self.server_settling.lock().unwrap() =
                    Some(Instant::now() + Duration::from_secs(3600));
                self.server_faults.fetch_add(1, Ordering::Relaxed);
                let mut c = self.cluster.lock().unwrap();
                server = self.active.load(Ordering::Relaxed);
                let counted = notes_passed_on(&c.servers[server].metrics_addr).unwrap_or(0);
                *self.notes_of_killed.lock().unwrap() += counted;
                c.kill_server(server);
                self.stalls.begin(Instant::now());
                // With a standby, its peers move there.
                if c.servers.len() > 1 {
                    self.active.store(1 - server, Ordering::Relaxed);
                }
            }
            k => {
                let fault = match k {
                    FaultKind::NodeDelay | FaultKind::UserDelay => LinkFault::Delay(f.delay),
                    FaultKind::NodeBlackhole | FaultKind::UserBlackhole => LinkFault::Blackhole,
                    FaultKind::NodeReset | FaultKind::UserReset => LinkFault::ResetMidFrame,
                    _ => LinkFault::HalfOpen,
                };
                match &self.links {
                    Some(l) => l.set(k.class(), f.target, fault),
                    None => skipped = Some("no fault proxy".to_string()),
                }
            }
        }
        let mut played = self.played.lock().unwrap();
        played.push(Played {
            fault: f.clone(),
            from: Instant::now(),
            to: None,
            skipped,
            server,
        });
        played.len() - 1
    }

    fn undo(&self, p: usize) {
        let (f, server) = {
            let played = self.played.lock().unwrap();
            if played[p].skipped.is_some() || played[p].to.is_some() {
                return;
            }
            (played[p].fault.clone(), played[p].server)
        };
        let mut error = None;
        match f.kind {
            FaultKind::NodeKill => {
                let mut c = self.cluster.lock().unwrap();
                if c.node_pid(f.target).is_none() {
                    if let Err(e) = c.start_node(f.target) {
                        error = Some(format!("restarting node {}: {e:#}", f.target));
                    }
                }
            }
            FaultKind::NodeStop => {
                self.cluster
                    .lock()
                    .unwrap()
                    .signal_node(f.target, libc::SIGCONT);
            }
            FaultKind::ServerRestart | FaultKind::ServerFailover => {
                if let Err(e) = self.cluster.lock().unwrap().restart_server(server) {
                    error = Some(format!("restarting server {server}: {e:#}"));
                }
                *self.server_settling.lock().unwrap() = Some(Instant::now() + SERVER_SETTLE);
            }
            k => {
                if let Some(l) = &self.links {
                    l.set(k.class(), f.target, LinkFault::Pass);
                }
            }
        }
        if let Some(e) = error {
            self.errors.lock().unwrap().push(e);
        }
        self.played.lock().unwrap()[p].to = Some(Instant::now());
    }

    /// Faults played and left out, per kind.
    pub fn counts(&self) -> (BTreeMap<String, u64>, BTreeMap<String, u64>) {
        let (mut played, mut skipped) = (BTreeMap::new(), BTreeMap::new());
        for p in self.played.lock().unwrap().iter() {
            let into = if p.skipped.is_some() {
                &mut skipped
            } else {
                &mut played
            };
            *into.entry(p.fault.kind.name().to_string()).or_insert(0u64) += 1;
        }
        (played, skipped)
    }
}

/// Notifications a server passed on (relayed, or dropped for a user that
/// did not agree them), from its metrics.
pub fn notes_passed_on(metrics_addr: &str) -> Option<u64> {
    ["relayed", "dropped"]
        .map(|o| {
            let series = format!("corefarm_notifications_total{{outcome=\"{o}\"}}");
            procs::metric(metrics_addr, &series)
        })
        .into_iter()
        .sum::<Option<f64>>()
        .map(|n| n as u64)
}

/// The longest a user may wait with no fault under way: generous, so only
/// a real stall shows, not a loaded machine.
pub const BASE_BOUND: Duration = Duration::from_secs(5);
/// A node cut off (killed, its link reset or half-open) is back and
/// registered within this of its fault's end.
const NODE_BACK: Duration = Duration::from_secs(5);
/// A user whose server connection was lost resumes within this: the
/// clients' default `reconnect_timeout`.
pub const RECONNECT_BOUND: Duration = Duration::from_secs(30);

/// How much longer a user may wait because of fault `f`, in force for
/// `held`: what the fault takes away, and the time its victims need to
/// come back.
pub fn fault_bound(f: &Fault, held: Duration) -> Duration {
    use FaultKind::*;
    match f.kind {
        NodeKill | NodeReset | NodeHalfOpen => held + NODE_BACK,
        // A stopped node keeps its inputs until it continues (or until the
        // server's `--node-timeout`, longer than any drawn stop).
        NodeStop | NodeBlackhole | UserBlackhole => held,
        NodeDelay | UserDelay => held + 2 * f.delay,
        ServerRestart | ServerFailover | UserReset | UserHalfOpen => held + RECONNECT_BOUND,
    }
}

/// Every wait in `waits` longer than [`BASE_BOUND`] plus the bounds of the
/// faults it overlapped, said with what it waited for and why that bound.
pub fn stuck(waits: &[Wait], played: &[Played], end: Instant) -> Vec<String> {
    let mut out = Vec::new();
    for w in waits {
        let mut bound = BASE_BOUND;
        let mut why = vec![format!("{:.1} s base", BASE_BOUND.as_secs_f64())];
        for p in played.iter().filter(|p| p.skipped.is_none()) {
            let to = p.to.unwrap_or(end);
            // Its victims come back a while after it ends.
            if p.from < w.to && to + NODE_BACK > w.from {
                let b = fault_bound(&p.fault, to.duration_since(p.from));
                bound += b;
                why.push(format!(
                    "{} of {} {:.1} s",
                    p.fault.kind,
                    p.fault.target,
                    b.as_secs_f64()
                ));
            }
        }
        let waited = w.to.duration_since(w.from);
        if waited > bound {
            out.push(format!(
                "user {} session {} waited {:.1} s for {} (bound {:.1} s: {})",
                w.user,
                w.session,
                waited.as_secs_f64(),
                w.what,
                bound.as_secs_f64(),
                why.join(" + ")
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(from: Instant, secs: f64) -> Wait {
        Wait {
            user: 1,
            session: 2,
            what: "the result of message 3".into(),
            from,
            to: from + Duration::from_secs_f64(secs),
        }
    }

    /// A wait is judged by the faults it overlapped: a stopped node
    /// explains a wait as long as the stop, not one longer.
    #[test]
    fn a_wait_is_held_against_the_faults_it_overlapped() {
        let t0 = Instant::now();
        let stop = Played {
            fault: Fault {
                at: Duration::ZERO,
                kind: FaultKind::NodeStop,
                target: 2,
                hold: Duration::from_secs(3),
                delay: Duration::ZERO,
            },
            from: t0 + Duration::from_secs(10),
            to: Some(t0 + Duration::from_secs(13)),
            skipped: None,
            server: 0,
        };
        let end = t0 + Duration::from_secs(100);
        // Within 5 s + 3 s of the stop it overlapped.
        let played = [stop];
        let within = stuck(&[wait(t0 + Duration::from_secs(9), 7.9)], &played, end);
        assert!(within.is_empty(), "{within:?}");
        let late = stuck(&[wait(t0 + Duration::from_secs(9), 8.5)], &played, end);
        assert_eq!(late.len(), 1);
        assert!(late[0].contains("node-stop of 2 3.0 s"), "{late:?}");
        // Long after it: the base bound alone.
        let alone = stuck(&[wait(t0 + Duration::from_secs(40), 6.0)], &played, end);
        assert_eq!(alone.len(), 1, "{alone:?}");
        assert!(alone[0].contains("waited 6.0 s for the result of message 3 (bound 5.0 s"));
    }
}
