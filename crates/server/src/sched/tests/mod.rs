//! The scheduler against a fake clock: every event carries its time, so
//! these tests decide exactly when periods end and how long nodes take.

use super::*;

mod algorithm1;
mod failures;
mod fairness;
mod groups;
mod hedging;
mod index;
mod placement;
mod reference;
mod routing;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// P = 10 ms, one message in flight per node (fixed window): dispatch
/// order is then fully determined by the queue. One node per new function
/// (no fair share), so the tests place functions node by node.
fn sched() -> Sched {
    Sched::new(Params {
        credit: 1,
        credit_adaptive: false,
        fair_share: false,
        ..Params::new(ms(10))
    })
}

/// [`sched`] with fair shares: functions take their users' share of the
/// nodes at once.
fn fair_sched() -> Sched {
    Sched::new(Params {
        fair_share: true,
        ..sched().p
    })
}

/// [`fair_sched`] with nodes 1..=`nodes`, user 1 configured for "a",
/// which every node loaded by 1 ms.
fn fair_sched_with_a(nodes: u64) -> Sched {
    let mut s = fair_sched();
    for n in 1..=nodes {
        s.add_node(n, ms(0));
    }
    s.configure(1, payload("a"), 8, 8, ms(0));
    for (n, _) in configures(&s.take_actions()) {
        s.on_config_response(n, true, ms(1)).unwrap();
    }
    s
}

fn payload(name: &str) -> Bytes {
    Bytes::from(format!("configuration {name}"))
}

fn job(user: u64, id: u32) -> Job {
    Job::new(user, id, Bytes::from_static(&[0; 8]), 1)
}

/// Configure actions: (node, payload).
fn configures(a: &[Action]) -> Vec<(u64, Bytes)> {
    a.iter()
        .filter_map(|a| match a {
            Action::Configure { node, payload, .. } => Some((*node, payload.clone())),
            _ => None,
        })
        .collect()
}

/// Send actions: (node, internal id).
fn sends(a: &[Action]) -> Vec<(u64, u32)> {
    a.iter()
        .filter_map(|a| match a {
            Action::Send { node, internal, .. } => Some((*node, *internal)),
            _ => None,
        })
        .collect()
}

fn answers(a: &[Action]) -> Vec<(u64, bool)> {
    a.iter()
        .filter_map(|a| match a {
            Action::Configured { user, ok, .. } => Some((*user, *ok)),
            _ => None,
        })
        .collect()
}

fn results(a: &[Action]) -> Vec<(u64, u32)> {
    a.iter()
        .filter_map(|a| match a {
            Action::Result { user, id, .. } => Some((*user, *id)),
            _ => None,
        })
        .collect()
}

/// Configures `user` for `name` and lets whichever node is asked answer
/// after `took`. Returns the node that loaded it (if one was asked).
fn configure(s: &mut Sched, user: u64, name: &str, now: Duration, took: Duration) -> Option<u64> {
    s.configure(user, payload(name), 8, 8, now);
    let a = s.take_actions();
    let node = configures(&a).first().map(|c| c.0);
    if let Some(n) = node {
        s.on_config_response(n, true, now + took).unwrap();
    }
    node
}

/// Answers the Send actions with results, at `now`.
fn answer(s: &mut Sched, sent: &[(u64, u32)], now: Duration) -> Vec<Action> {
    let mut out = Vec::new();
    for &(node, internal) in sent {
        s.on_result(node, internal, Bytes::from_static(&[1; 8]), false, now)
            .unwrap();
        out.extend(s.take_actions());
    }
    out
}
