//! The server's Prometheus families, encoded at scrape time from one status
//! snapshot plus what the status does not carry (per-name user slots and
//! per-node configuration-time histograms).

use corefarm_smp::{ClusterStatus, NodeState, NodeStatus};
use corefarm_telemetry::prometheus_client::encoding::DescriptorEncoder;
use corefarm_telemetry::prometheus_client::metrics::MetricType::{Counter, Gauge, Histogram};
use corefarm_telemetry::{family, Labels};

use super::{Metrics, NameTotals};

fn node_label(n: &NodeStatus) -> String {
    match &n.name {
        Some(name) => format!("{name}@{}", n.addr),
        None => format!("node-{}@{}", n.id, n.addr),
    }
}

/// Every server family, from one status snapshot plus the per-name totals
/// and per-node histograms it does not carry.
pub fn encode(
    enc: &mut DescriptorEncoder,
    m: &Metrics,
    s: &ClusterStatus,
    names: &[NameTotals],
    config_times: &[(u64, corefarm_telemetry::HistogramSnapshot)],
    (held, budget): (u64, u64),
) -> Result<(), std::fmt::Error> {
    let none: Labels = vec![];
    family(
        enc,
        "memory_held_bytes",
        "Bytes peers make the server hold of messages they have begun and not finished.",
        Gauge,
    )?
    .gauge(&none, held as i64)?;
    family(
        enc,
        "memory_budget_bytes",
        "The most memory_held_bytes may reach (--memory-budget).",
        Gauge,
    )?
    .gauge(&none, budget as i64)?;
    family(enc, "users_connected", "User sessions open now.", Gauge)?
        .gauge(&none, s.users.len() as i64)?;
    let mut f = family(enc, "nodes_connected", "Node connections by state.", Gauge)?;
    for (name, st) in [
        ("free", NodeState::Free),
        ("assigned", NodeState::Assigned),
        ("configuring", NodeState::Configuring),
        ("ready", NodeState::Ready),
    ] {
        f.gauge(&vec![("state", name.into())], s.count_nodes(st) as i64)?;
    }
    family(
        enc,
        "node_series",
        "Nodes with a series of their own in the node_* families (none past --metrics-nodes).",
        Gauge,
    )?
    .gauge(&none, s.nodes.len() as i64)?;
    let nodes: Vec<(Labels, &NodeStatus)> = s
        .nodes
        .iter()
        .map(|n| (vec![("node", node_label(n))], n))
        .collect();
    let mut f = family(
        enc,
        "node_function",
        "The function a node is configured for (1).",
        Gauge,
    )?;
    for (l, n) in &nodes {
        if let Some(func) = &n.function {
            let mut l = l.clone();
            l.push(("function", func.clone()));
            f.gauge(&l, 1)?;
        }
    }
    let mut f = family(enc, "node_cores", "Cores in a node's configuration.", Gauge)?;
    for (l, n) in &nodes {
        f.gauge(l, n.cores as i64)?;
    }
    let mut f = family(
        enc,
        "node_in_flight",
        "Messages sent to a node and not answered.",
        Gauge,
    )?;
    for (l, n) in &nodes {
        f.gauge(l, n.in_flight as i64)?;
    }
    let mut f = family(
        enc,
        "node_busy_seconds",
        "Time a node had at least one message in flight.",
        Counter,
    )?;
    for (l, n) in &nodes {
        f.counter_f64(l, n.busy_seconds)?;
    }
    let mut f = family(enc, "node_results", "Results a node returned.", Counter)?;
    for (l, n) in &nodes {
        f.counter(l, n.results_total)?;
    }
    let mut f = family(
        enc,
        "node_failures",
        "Inputs a node's cores failed on.",
        Counter,
    )?;
    for (l, n) in &nodes {
        f.counter(l, n.failures)?;
    }
    let mut f = family(
        enc,
        "node_reconfigurations",
        "Configurations a node accepted.",
        Counter,
    )?;
    for (l, n) in &nodes {
        f.counter(l, n.reconfigurations)?;
    }
    let mut f = family(
        enc,
        "node_reconfiguration_duration_seconds",
        "From sending a configuration to the node's positive response.",
        Histogram,
    )?;
    // By id: a search per node would make the scrape quadratic.
    let times: std::collections::HashMap<u64, &corefarm_telemetry::HistogramSnapshot> =
        config_times.iter().map(|(id, h)| (*id, h)).collect();
    for (l, n) in &nodes {
        if let Some(h) = times.get(&n.id) {
            f.histogram(l, h)?;
        }
    }
    let user = |name: &str| vec![("user", name.to_string())];
    let mut f = family(
        enc,
        "user_results",
        "Results delivered to users, by user name.",
        Counter,
    )?;
    for n in names {
        f.counter(&user(&n.name), n.results)?;
    }
    let mut f = family(
        enc,
        "user_failures",
        "Inputs answered with a core failure.",
        Counter,
    )?;
    for n in names {
        f.counter(&user(&n.name), n.failures)?;
    }
    let mut f = family(
        enc,
        "user_latency_seconds",
        "From handing a message to a node to its result, by user name.",
        Histogram,
    )?;
    for n in names {
        f.histogram(&user(&n.name), &n.latency)?;
    }
    let (outstanding, queued) = s
        .users
        .iter()
        .fold((0, 0), |(o, q), u| (o + u.outstanding, q + u.queued));
    family(
        enc,
        "outstanding_messages",
        "Data messages accepted and not answered.",
        Gauge,
    )?
    .gauge(&none, outstanding as i64)?;
    family(
        enc,
        "queued_messages",
        "Data messages waiting in the server for a node.",
        Gauge,
    )?
    .gauge(&none, queued as i64)?;
    family(
        enc,
        "redispatched",
        "Messages moved to another node after a node loss.",
        Counter,
    )?
    .counter(&none, s.redispatched)?;
    let (hedged, duplicates) = m.hedges();
    family(
        enc,
        "hedged",
        "Messages late on a node that made no progress, sent again to another node.",
        Counter,
    )?
    .counter(&none, hedged)?;
    family(
        enc,
        "hedge_duplicates",
        "Answers of a hedged message's second copy, dropped because the first answer won.",
        Counter,
    )?
    .counter(&none, duplicates)?;
    let (relayed, dropped) = m.notifications();
    let mut f = family(
        enc,
        "notifications",
        "Handler notifications from nodes: relayed to their user, or dropped (the user did not agree spin-notify).",
        Counter,
    )?;
    f.counter(&vec![("outcome", "relayed".into())], relayed)?;
    f.counter(&vec![("outcome", "dropped".into())], dropped)?;
    let mut f = family(enc, "errors", "Errors by kind.", Counter)?;
    for (kind, v) in &s.errors {
        f.counter(&vec![("kind", kind.clone())], *v)?;
    }
    let mut f = family(
        enc,
        "link_bytes",
        "Bytes on the wire, by link and direction.",
        Counter,
    )?;
    let b = &s.bytes;
    for (link, dir, v) in [
        ("user", "in", b.user_in),
        ("user", "out", b.user_out),
        ("node", "in", b.node_in),
        ("node", "out", b.node_out),
    ] {
        f.counter(&vec![("link", link.into()), ("direction", dir.into())], v)?;
    }
    family(
        enc,
        "uptime_seconds",
        "Seconds since the server started.",
        Gauge,
    )?
    .gauge(&none, s.uptime_seconds as i64)?;
    Ok(())
}
