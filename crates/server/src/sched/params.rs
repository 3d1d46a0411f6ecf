//! `--sharing` and the scheduler's parameters.

use std::time::Duration;

use crate::dispatch::Policy;

/// `--sharing`: who the nodes belong to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    /// Seed 000: a user owns the nodes it configured until it leaves.
    Exclusive,
    /// Seed 002: nodes hold functions; users of one function share its replicas.
    Shared,
}

impl std::str::FromStr for Sharing {
    type Err = crate::dispatch::UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "exclusive" => Ok(Sharing::Exclusive),
            "shared" => Ok(Sharing::Shared),
            o => Err(crate::dispatch::UnknownName {
                what: "sharing",
                given: o.into(),
                expected: "shared or exclusive",
            }),
        }
    }
}

impl std::fmt::Display for Sharing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Sharing::Exclusive => "exclusive",
            Sharing::Shared => "shared",
        })
    }
}

/// The scheduler's parameters (docs/sharing.md explains each default).
#[derive(Debug, Clone)]
pub struct Params {
    pub policy: Policy,
    pub credit: u32,
    pub credit_adaptive: bool,
    pub credit_max_bytes: u64,
    /// Monitoring period P.
    pub period: Duration,
    /// A node whose function kept it busy less than this fraction of the
    /// period (per replica) may be reconfigured (C_RECONFIG).
    pub c_reconfig: f64,
    /// A function whose replicas had more than this fraction of the period
    /// of work each is worth another replica (C_REPLICATE).
    pub c_replicate: f64,
    /// How far ahead a replication's gain is counted against its cost.
    pub horizon: Duration,
    /// How long a function without a replica waits before it may take the
    /// only replica of a busy function (never less than 10 reprogrammings).
    pub max_wait: Duration,
    /// Service time per input assumed before a function was measured.
    pub service_prior: Duration,
    /// How long users wait for a replica while no node is connected at all.
    pub node_wait: Duration,
    /// Functions get their fair share of the nodes (the nodes split over
    /// the users of wanted functions) at once: a new function on that many
    /// spare nodes, and nodes beyond a function's share move to one below
    /// its share without waiting for the period. Off: one spare node per
    /// new function, the rest left to Algorithm 1 (the unit tests place
    /// functions node by node).
    pub fair_share: bool,
    /// Hung nodes: late jobs are hedged, nodes without progress take no
    /// new work ([`crate::dispatch::progress`]); `None`: off. The driver
    /// takes it from `--hedge-factor` and `--hedge-floor-ms`.
    pub hedge: Option<crate::dispatch::progress::Hedge>,
}

impl Params {
    pub fn new(period: Duration) -> Params {
        Params {
            policy: Policy::Credit,
            credit: 4,
            credit_adaptive: true,
            credit_max_bytes: 32 << 20,
            period,
            c_reconfig: 0.5,
            c_replicate: 1.0,
            horizon: period * 100,
            max_wait: period * 50,
            service_prior: Duration::from_millis(1),
            node_wait: Duration::from_secs(5),
            fair_share: true,
            hedge: None,
        }
    }
}
