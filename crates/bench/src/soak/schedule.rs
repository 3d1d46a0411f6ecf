//! The campaign's fault schedule, drawn in full from the seed before the
//! load starts: the same seed, kinds, duration and cluster shape give the
//! same faults (kind, target, time, how long), so a failed run is replayed
//! with its seed. What happens around the faults (the users' sessions, the
//! bad peers) is seeded as well but depends on timing; the schedule does
//! not.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// A kind of fault the campaign injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// A node SIGKILLed, started again after `hold`.
    NodeKill,
    /// A node SIGSTOPped, SIGCONTinued after `hold` (a hung board).
    NodeStop,
    /// The server SIGKILLed and started again on the same ports after
    /// `hold`.
    ServerRestart,
    /// The active server SIGKILLed while a standby runs (nodes and users
    /// hold both addresses); the killed one comes back as the standby after
    /// `hold`.
    ServerFailover,
    /// A node's link to the server delays each chunk by `delay` for `hold`.
    NodeDelay,
    /// A node's link delivers nothing either way for `hold`.
    NodeBlackhole,
    /// A node's link is reset in the middle of a frame.
    NodeReset,
    /// A node's link closes the server's side and leaves the node's open
    /// and unanswered for `hold`.
    NodeHalfOpen,
    /// The same four on a user's link.
    UserDelay,
    UserBlackhole,
    UserReset,
    UserHalfOpen,
}

/// What a fault kind hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A node process (never node 0, whose memory is the node's figure and
    /// which keeps work flowing).
    Node,
    /// A node's link through its proxy.
    NodeLink,
    /// A user's link through its proxy.
    UserLink,
    Server,
}

impl FaultKind {
    pub const ALL: [FaultKind; 12] = [
        FaultKind::NodeKill,
        FaultKind::NodeStop,
        FaultKind::ServerRestart,
        FaultKind::ServerFailover,
        FaultKind::NodeDelay,
        FaultKind::NodeBlackhole,
        FaultKind::NodeReset,
        FaultKind::NodeHalfOpen,
        FaultKind::UserDelay,
        FaultKind::UserBlackhole,
        FaultKind::UserReset,
        FaultKind::UserHalfOpen,
    ];

    /// The kinds played when none are named: every one. Users resume a
    /// lost server connection and nodes and users take a list of servers,
    /// so the server's crash and failover are survived like the rest.
    pub const DEFAULT: [FaultKind; 12] = FaultKind::ALL;

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::NodeKill => "node-kill",
            FaultKind::NodeStop => "node-stop",
            FaultKind::ServerRestart => "server-restart",
            FaultKind::ServerFailover => "server-failover",
            FaultKind::NodeDelay => "node-delay",
            FaultKind::NodeBlackhole => "node-blackhole",
            FaultKind::NodeReset => "node-reset",
            FaultKind::NodeHalfOpen => "node-half-open",
            FaultKind::UserDelay => "user-delay",
            FaultKind::UserBlackhole => "user-blackhole",
            FaultKind::UserReset => "user-reset",
            FaultKind::UserHalfOpen => "user-half-open",
        }
    }

    pub fn class(self) -> Class {
        use FaultKind::*;
        match self {
            NodeKill | NodeStop => Class::Node,
            ServerRestart | ServerFailover => Class::Server,
            NodeDelay | NodeBlackhole | NodeReset | NodeHalfOpen => Class::NodeLink,
            UserDelay | UserBlackhole | UserReset | UserHalfOpen => Class::UserLink,
        }
    }

    /// Whether the kind acts on a link through the fault proxy.
    pub fn is_link(self) -> bool {
        matches!(self.class(), Class::NodeLink | Class::UserLink)
    }

    /// How long the fault lasts (the time a killed node or server stays
    /// down, a node stays stopped, a link stays faulty). Short enough that
    /// a frame stalled by a blackhole is not cut by the server's
    /// `--read-timeout` (2 s in the soak), long enough to be felt.
    fn draw_hold(self, rng: &mut StdRng) -> Duration {
        use FaultKind::*;
        let ms = match self {
            NodeKill => rng.gen_range(100..1500),
            NodeStop => rng.gen_range(300..3000),
            // "About a second", as an operator restarts a crashed server.
            ServerRestart => rng.gen_range(800..1200),
            ServerFailover => rng.gen_range(1000..3000),
            NodeDelay | UserDelay => rng.gen_range(1000..4000),
            NodeBlackhole | UserBlackhole => rng.gen_range(300..1500),
            // A reset takes no time; the link resets every connection that
            // carries a frame in this window (a node reconnecting at once
            // is reset again).
            NodeReset | UserReset => rng.gen_range(50..300),
            NodeHalfOpen | UserHalfOpen => rng.gen_range(500..3000),
        };
        Duration::from_millis(ms)
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is no fault kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown fault kind {given:?} (kinds: {known}; or `default`, `all`)")]
pub struct UnknownFault {
    pub given: String,
    pub known: String,
}

impl FromStr for FaultKind {
    type Err = UnknownFault;
    fn from_str(s: &str) -> Result<Self, UnknownFault> {
        FaultKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownFault {
                given: s.to_string(),
                known: FaultKind::ALL.map(FaultKind::name).join(", "),
            })
    }
}

/// Parses a `--faults` list: kind names separated by commas, where
/// `default` stands for [`FaultKind::DEFAULT`] and `all` for every kind;
/// an empty list means no faults. Sorted, without repeats.
pub fn parse_kinds(s: &str) -> Result<Vec<FaultKind>, UnknownFault> {
    let mut out = Vec::new();
    for w in s.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        match w {
            "default" => out.extend(FaultKind::DEFAULT),
            "all" => out.extend(FaultKind::ALL),
            w => out.push(w.parse()?),
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// One fault of the schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fault {
    /// When it starts, from the start of the load.
    #[serde(serialize_with = "millis")]
    pub at: Duration,
    pub kind: FaultKind,
    /// The node slot (node kinds), user (user-link kinds) or 0 (server).
    pub target: usize,
    #[serde(serialize_with = "millis")]
    pub hold: Duration,
    /// The added delay of a delay kind, zero otherwise.
    #[serde(serialize_with = "millis")]
    pub delay: Duration,
}

fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis() as u64)
}

/// What the schedule is drawn for.
#[derive(Debug, Clone)]
pub struct Plan {
    pub kinds: Vec<FaultKind>,
    pub duration: Duration,
    /// Mean time between node kills (uniform in 0.5×–1.5× of it).
    pub kill_every: Duration,
    /// Mean time between the other faults.
    pub fault_every: Duration,
    pub nodes: usize,
    pub users: u32,
}

/// Time a killed node, or a node whose link was cut, takes to be back
/// (restart, reconnect, register) before it is hit again.
const REJOIN: Duration = Duration::from_secs(2);

/// Draws the schedule for `plan` from `seed`. Node kills come as before
/// (one every `kill_every` on average); the other kinds take turns in a
/// shuffled order, one every `fault_every` on average, so a short campaign
/// plays each of them. No target takes two faults at once and at most one
/// server fault runs at a time: a fault whose every target is still busy
/// keeps its turn for the next slot (a node kill is left out).
pub fn draw(seed: u64, plan: &Plan) -> Vec<Fault> {
    // Its own stream: the schedule does not shift when the soak's other
    // random choices change.
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5c4e_d01e_fa17_0000);
    let mut free: BTreeMap<(u8, usize), Duration> = BTreeMap::new();
    let mut out = Vec::new();
    let mut next_kill = plan
        .kinds
        .contains(&FaultKind::NodeKill)
        .then(|| jitter(&mut rng, plan.kill_every));
    let others: Vec<FaultKind> = plan
        .kinds
        .iter()
        .copied()
        .filter(|&k| k != FaultKind::NodeKill)
        .collect();
    let mut next_other = (!others.is_empty()).then(|| jitter(&mut rng, plan.fault_every));
    let mut deck: Vec<FaultKind> = Vec::new();
    loop {
        let (at, kind) = match (next_kill, next_other) {
            (Some(k), o) if o.is_none_or(|o| k <= o) => {
                next_kill = Some(k + jitter(&mut rng, plan.kill_every));
                (k, FaultKind::NodeKill)
            }
            (_, Some(o)) => {
                if deck.is_empty() {
                    deck = others.clone();
                    deck.shuffle(&mut rng);
                }
                next_other = Some(o + jitter(&mut rng, plan.fault_every));
                (o, deck.pop().expect("refilled"))
            }
            _ => break,
        };
        if at >= plan.duration {
            break;
        }
        let hold = kind.draw_hold(&mut rng);
        let delay = match kind {
            FaultKind::NodeDelay | FaultKind::UserDelay => {
                Duration::from_millis(rng.gen_range(20..200))
            }
            _ => Duration::ZERO,
        };
        // Node faults share the node's slot (a node's process and its link
        // are one target); the server is one target.
        let (class, targets): (u8, Vec<usize>) = match kind.class() {
            Class::Node | Class::NodeLink => (0, (1..plan.nodes).collect()),
            Class::UserLink => (1, (0..plan.users as usize).collect()),
            Class::Server => (2, vec![0]),
        };
        let ready: Vec<usize> = targets
            .into_iter()
            .filter(|&t| free.get(&(class, t)).is_none_or(|&f| f <= at))
            .collect();
        // Drawn whether or not it is used, so one busy target does not
        // shift every later draw.
        let pick = rng.gen_range(0..ready.len().max(1));
        let Some(&target) = ready.get(pick) else {
            // Its turn waits for the next slot (a kill is simply left
            // out: another comes soon), so every kind is played each round.
            if kind != FaultKind::NodeKill {
                deck.push(kind);
            }
            continue;
        };
        let busy = match kind {
            FaultKind::NodeKill | FaultKind::NodeReset | FaultKind::NodeHalfOpen => hold + REJOIN,
            FaultKind::ServerRestart | FaultKind::ServerFailover => hold + 2 * REJOIN,
            _ => hold,
        };
        free.insert((class, target), at + busy);
        out.push(Fault {
            at,
            kind,
            target,
            hold,
            delay,
        });
    }
    out
}

fn jitter(rng: &mut StdRng, mean: Duration) -> Duration {
    mean.mul_f64(rng.gen_range(0.5..1.5))
}

/// Faults per kind, in the order of [`FaultKind::ALL`].
pub fn counts(faults: &[Fault]) -> BTreeMap<FaultKind, u64> {
    let mut m = BTreeMap::new();
    for f in faults {
        *m.entry(f.kind).or_insert(0) += 1;
    }
    m
}

/// One line: how many faults of each kind, over how long.
pub fn summary(faults: &[Fault], duration: Duration) -> String {
    let per: Vec<String> = counts(faults)
        .into_iter()
        .map(|(k, n)| format!("{n} {k}"))
        .collect();
    format!(
        "{} faults in {:?}: {}",
        faults.len(),
        duration,
        if per.is_empty() {
            "none".to_string()
        } else {
            per.join(", ")
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(kinds: &[FaultKind]) -> Plan {
        Plan {
            kinds: kinds.to_vec(),
            duration: Duration::from_secs(120),
            kill_every: Duration::from_secs(4),
            fault_every: Duration::from_secs(2),
            nodes: 4,
            users: 3,
        }
    }

    #[test]
    fn one_seed_replays_one_schedule() {
        let p = plan(&FaultKind::ALL);
        let a = draw(2027, &p);
        assert_eq!(a, draw(2027, &p));
        assert_ne!(a, draw(2028, &p));
        assert!(a.len() > 40, "{}", a.len());
    }

    #[test]
    fn every_kind_takes_its_turn_and_targets_stay_apart() {
        let p = plan(&FaultKind::ALL);
        for seed in 0..20 {
            let s = draw(seed, &p);
            let c = counts(&s);
            for k in FaultKind::ALL {
                assert!(c.get(&k).is_some_and(|&n| n > 0), "seed {seed}: no {k}");
            }
            for f in &s {
                assert!(f.at < p.duration);
                match f.kind.class() {
                    Class::Node | Class::NodeLink => assert!((1..4).contains(&f.target)),
                    Class::UserLink => assert!(f.target < 3),
                    Class::Server => assert_eq!(f.target, 0),
                }
                // No target is hit again while its last fault lasts.
                let same_class = |g: &Fault| match (f.kind.class(), g.kind.class()) {
                    (Class::Node | Class::NodeLink, Class::Node | Class::NodeLink) => true,
                    (a, b) => a == b,
                };
                for g in &s {
                    if g.at > f.at && same_class(g) && g.target == f.target {
                        assert!(g.at >= f.at + f.hold, "seed {seed}: {f:?} then {g:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn kinds_parse_by_name_and_by_group() {
        assert_eq!(parse_kinds("").unwrap(), vec![]);
        assert_eq!(parse_kinds("default").unwrap(), FaultKind::DEFAULT.to_vec());
        assert_eq!(parse_kinds("all").unwrap(), FaultKind::ALL.to_vec());
        assert_eq!(
            parse_kinds("node-stop,server-restart,node-stop").unwrap(),
            vec![FaultKind::NodeStop, FaultKind::ServerRestart]
        );
        let e = parse_kinds("node-kill,disk-full").unwrap_err();
        assert_eq!(e.given, "disk-full");
        // Only kill kinds: no other stream.
        let s = draw(1, &plan(&[FaultKind::NodeKill]));
        assert!(s.iter().all(|f| f.kind == FaultKind::NodeKill) && s.len() > 10);
        assert!(draw(1, &plan(&[])).is_empty());
    }
}
