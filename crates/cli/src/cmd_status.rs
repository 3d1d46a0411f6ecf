//! `corefarm status`: the cluster as the server sees it, asked over the
//! status extension by an observer — a hello user with `nodes: 0`, which
//! takes no node away from the users that compute.

use std::time::Duration;

use anyhow::Context;
use clap::Args;
use corefarm_client::{Client, ClientOptions};
use corefarm_smp::{ClusterStatus, NodeState, UserPhase};

#[derive(Args, Clone)]
pub struct StatusArgs {
    /// Server user port, HOST:PORT.
    #[arg(long, default_value_t = format!("127.0.0.1:{}", corefarm_client::DEFAULT_USER_PORT))]
    pub server: String,
    /// Print the server's status answer as JSON (docs/protocol.md, type
    /// 0x14); every node unless --limit, --offset or --state asks for a page.
    #[arg(long)]
    pub json: bool,
    /// Only what each user used since the server started (node-seconds,
    /// inputs, bytes, reprogrammings), with its share and limits; with
    /// --json, `{"uptime_seconds": …, "accounts": […]}`.
    #[arg(long)]
    pub accounting: bool,
    /// List every node (the table lists a page of --limit by default).
    #[arg(long, conflicts_with_all = ["offset", "limit"])]
    pub all: bool,
    /// Node rows to skip (in id order, of the --state asked for).
    #[arg(long)]
    pub offset: Option<u64>,
    /// Node rows to list at most; 0 gives the summary alone [default: 50].
    #[arg(long)]
    pub limit: Option<u64>,
    /// List only the nodes in this state: free, assigned, configuring or ready.
    #[arg(long, value_parser = parse_state)]
    pub state: Option<NodeState>,
    /// Seconds to wait for the connection and for the answer.
    #[arg(long, default_value_t = 10.0)]
    pub timeout: f64,
    /// File holding the user secret of a server with an auth file (mode
    /// 600). Default: $COREFARM_SECRET, or the file $COREFARM_SECRET_FILE.
    #[arg(long)]
    pub secret_file: Option<std::path::PathBuf>,
    /// The user to connect as (`[users.<name>]` of the server's auth file).
    /// Default: $COREFARM_USER, else the anonymous user.
    #[arg(long, env = "COREFARM_USER", value_parser = crate::cmd_bench::user_name)]
    pub user: Option<String>,
    #[command(flatten)]
    pub tls: crate::cmd_tls::ClientTlsArgs,
}

pub fn run(args: StatusArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.timeout.is_finite() && args.timeout > 0.0 && args.timeout < 1e9,
        "--timeout must be a positive number of seconds"
    );
    let secret = corefarm_smp::auth::Secret::from_file_or_env(args.secret_file.as_deref())
        .map_err(anyhow::Error::msg)?;
    let tls = args.tls.load()?;
    let status = fetch_query(
        &args.server,
        Duration::from_secs_f64(args.timeout),
        (secret, args.user.clone()),
        tls,
        &args.query(),
    )?;
    let text = match (args.accounting, args.json) {
        (true, true) => {
            let v = serde_json::json!({
                "uptime_seconds": status.uptime_seconds,
                "accounts": status.accounts,
            });
            serde_json::to_string_pretty(&v)? + "\n"
        }
        (true, false) => accounts(&status),
        (false, true) => serde_json::to_string_pretty(&status)? + "\n",
        (false, false) => render(&status),
    };
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        // `corefarm status | head` is not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

/// Table rows a page lists unless told otherwise.
pub const DEFAULT_LIMIT: u64 = 50;

impl StatusArgs {
    /// The node rows asked for: a page by default (the summary counts every
    /// node), every node with --all, and with --json unless a page is named
    /// (what scripts read stays whole).
    pub fn query(&self) -> corefarm_smp::StatusQuery {
        let paged = self.offset.is_some() || self.limit.is_some() || self.state.is_some();
        if self.all || (self.json && !paged) {
            return corefarm_smp::StatusQuery::all();
        }
        corefarm_smp::StatusQuery {
            nodes: Some(corefarm_smp::NodePage {
                offset: self.offset.unwrap_or(0),
                limit: self.limit.unwrap_or(DEFAULT_LIMIT),
                state: self.state,
            }),
        }
    }
}

fn parse_state(s: &str) -> Result<NodeState, String> {
    serde_json::from_value(serde_json::Value::String(s.to_string()))
        .map_err(|_| format!("{s:?}: one of free, assigned, configuring, ready"))
}

/// Connects as an observer and asks once.
/// `secret`: the user secret of a server that has an auth file.
#[allow(dead_code)] // kept for callers without TLS
pub fn fetch(
    server: &str,
    timeout: Duration,
    secret: Option<corefarm_smp::auth::Secret>,
) -> anyhow::Result<ClusterStatus> {
    fetch_tls(server, timeout, secret, None)
}

/// [`fetch`] over TLS when `tls` is given.
pub fn fetch_tls(
    server: &str,
    timeout: Duration,
    secret: Option<corefarm_smp::auth::Secret>,
    tls: Option<corefarm_smp::tls::ClientTls>,
) -> anyhow::Result<ClusterStatus> {
    fetch_query(
        server,
        timeout,
        (secret, None),
        tls,
        &corefarm_smp::StatusQuery::all(),
    )
}

/// [`fetch_tls`] of the node rows `q` asks for, as a named user
/// (`[users.<name>]` of an auth file) when `user` is given.
pub fn fetch_query(
    server: &str,
    timeout: Duration,
    (secret, user): (Option<corefarm_smp::auth::Secret>, Option<String>),
    tls: Option<corefarm_smp::tls::ClientTls>,
    q: &corefarm_smp::StatusQuery,
) -> anyhow::Result<ClusterStatus> {
    let opts = ClientOptions {
        secret,
        user,
        tls,
        nodes: Some(0),
        name: Some("corefarm status".into()),
        connect_timeout: Some(timeout),
        io_timeout: Some(timeout),
        ..ClientOptions::default()
    };
    // The client's error already names the address.
    let client = Client::connect(server, opts).map_err(wrong_port_hint)?;
    let status = client
        .status_query(q)
        .with_context(|| format!("asking {server} for its status"))?;
    client.close();
    Ok(status)
}

/// A connection whose hello exchange failed usually reached some other
/// port (the metrics port answers in HTTP; the node port says itself that
/// users have another): say which port to give.
pub(crate) fn wrong_port_hint(e: corefarm_client::ClientError) -> anyhow::Error {
    match &e {
        corefarm_client::ClientError::Handshake { addr, .. } => anyhow::anyhow!(
            "{e}. Is {addr} the server's user port? `corefarm server` prints it as users=ADDR \
             (default 127.0.0.1:9999); its node port and metrics port do not answer users"
        ),
        _ => e.into(),
    }
}

/// Node ids a user's row names before it says how many more it has.
const USER_NODES: usize = 8;

/// The status as a summary line and two tables. The observer's own session (`you`) is left
/// out: it is this command.
pub fn render(s: &ClusterStatus) -> String {
    let shared = s.sharing == "shared";
    let sharing = match s.sharing.as_str() {
        "" => String::new(),
        m => format!(", sharing {m}"),
    };
    let errors: Vec<String> = s
        .errors
        .iter()
        .filter(|(_, v)| **v > 0)
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    // Only once it happened: a late message copied to a second node.
    let hedged = match s.hedged {
        0 => String::new(),
        n => format!(
            ", hedged {n} ({} second answers dropped)",
            s.hedge_duplicates
        ),
    };
    let mut out = format!(
        "policy {}{sharing}, max message {} bytes, up {:.0} s, re-dispatched {}{hedged}, errors: {}\n\nnodes: {}\n",
        s.policy,
        s.max_message,
        s.uptime_seconds,
        s.redispatched,
        if errors.is_empty() {
            "none".to_string()
        } else {
            errors.join(", ")
        },
        s.node_total()
    );
    if let Some(c) = &s.node_counts {
        out += &format!(
            "  free {}, assigned {}, configuring {}, ready {}\n",
            c.free, c.assigned, c.configuring, c.ready
        );
        if s.nodes.len() as u64 != c.total {
            out += &format!(
                "  listing {} of them (--offset, --limit, --state; --all for every node)\n",
                s.nodes.len()
            );
        }
    }
    if !s.nodes.is_empty() {
        let mut rows = vec![row([
            "ID",
            "NODE",
            "STATE",
            "FUNCTION",
            "CORES",
            "USER",
            "IN-FLIGHT",
            "RESULTS",
            "TOTAL",
            "FAILED",
            "BUSY-S",
        ])];
        for n in &s.nodes {
            let label = match &n.name {
                Some(name) => format!("{name}@{}", n.addr),
                // As the server's logs name a node without a hello.
                None => format!("node-{}@{}", n.id, n.addr),
            };
            rows.push(vec![
                n.id.to_string(),
                label,
                node_state(n.state).into(),
                n.function.clone().unwrap_or_else(|| "-".into()),
                n.cores.to_string(),
                n.user.map_or("-".into(), |u| u.to_string()),
                n.in_flight.to_string(),
                n.results.to_string(),
                n.results_total.to_string(),
                n.failures.to_string(),
                format!("{:.1}", n.busy_seconds),
            ]);
        }
        out += &table(&rows);
    }
    let users: Vec<_> = s.users.iter().filter(|u| Some(u.id) != s.you).collect();
    out += &format!("\nusers: {}\n", users.len());
    if !users.is_empty() {
        let mut rows = vec![row([
            "ID",
            "ADDRESS",
            "NAME",
            "PHASE",
            if shared { "FUNCTION" } else { "NODES" },
            "OUTSTANDING",
            "QUEUED",
            "RESULTS",
            "FAILED",
            "P50-MS",
            "P99-MS",
        ])];
        if shared {
            rows[0].insert(7, "IN-FLIGHT".into());
        }
        for u in users {
            let name = match (&u.name, u.hello) {
                (Some(n), _) => n.clone(),
                (None, false) => "(seed user)".into(),
                (None, true) => "-".into(),
            };
            // A user of thousands of nodes: the first few and how many more.
            let mut nodes: Vec<String> = u
                .nodes
                .iter()
                .take(USER_NODES)
                .map(|n| n.to_string())
                .collect();
            if u.nodes.len() > USER_NODES {
                nodes.push(format!("+{}", u.nodes.len() - USER_NODES));
            }
            rows.push(vec![
                u.id.to_string(),
                u.addr.clone(),
                name,
                user_phase(u.phase).into(),
                if shared {
                    u.function.clone().unwrap_or_else(|| "-".into())
                } else if nodes.is_empty() {
                    "-".into()
                } else {
                    nodes.join(",")
                },
                u.outstanding.to_string(),
                u.queued.to_string(),
                u.results.to_string(),
                u.failures.to_string(),
                u.latency_p50
                    .map_or("-".into(), |l| format!("{:.3}", l * 1e3)),
                u.latency_p99
                    .map_or("-".into(), |l| format!("{:.3}", l * 1e3)),
            ]);
            if shared {
                rows.last_mut()
                    .expect("pushed")
                    .insert(7, u.in_flight.to_string());
            }
        }
        out += &table(&rows);
    }
    if shared {
        out += &functions(s);
    }
    if !s.accounts.is_empty() {
        out += &accounts(s);
    }
    out
}

/// One line per user (tenant): its share, its limits and what its
/// sessions used since the server started.
pub fn accounts(s: &ClusterStatus) -> String {
    let mut out = format!(
        "\naccounts: {} (since the server started, {:.0} s ago)\n",
        s.accounts.len(),
        s.uptime_seconds
    );
    if s.accounts.is_empty() {
        return out;
    }
    let mut rows = vec![row([
        "USER",
        "WEIGHT",
        "MAX-NODES",
        "MAX-QUEUED-B",
        "SESSIONS",
        "ACTIVE",
        "NODE-S",
        "INPUTS",
        "BYTES-IN",
        "BYTES-OUT",
        "RECONFIGS",
    ])];
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    for a in &s.accounts {
        rows.push(vec![
            a.user.clone(),
            a.weight.to_string(),
            or_dash(a.max_nodes.map(|n| n.to_string())),
            or_dash(a.max_queued_bytes.map(|n| n.to_string())),
            a.sessions.to_string(),
            a.active.to_string(),
            format!("{:.3}", a.node_seconds),
            a.inputs.to_string(),
            a.bytes_in.to_string(),
            a.bytes_out.to_string(),
            // Shared programmings are split among their users.
            format!("{:.2}", a.reconfigurations),
        ]);
    }
    out += &table(&rows);
    out
}

/// Shared mode: one line per function (seed 002's monitor metrics).
fn functions(s: &ClusterStatus) -> String {
    let mut out = format!("\nfunctions: {}\n", s.functions.len());
    if s.functions.is_empty() {
        return out;
    }
    let mut rows = vec![row([
        "FUNCTION",
        "REPLICAS",
        "LOADING",
        "QUEUED",
        "IN-FLIGHT",
        "DEMAND-MS",
        "SERVICE-US",
        "RECONFIGS",
        "USERS",
        // Last: a name may hold spaces, and users match theirs by it.
        "NAME",
    ])];
    for f in &s.functions {
        let users: Vec<String> = f.users.iter().map(|u| u.to_string()).collect();
        rows.push(vec![
            f.id.clone(),
            f.replicas.to_string(),
            f.loading.to_string(),
            f.queued.to_string(),
            f.in_flight.to_string(),
            format!("{:.1}", f.demand * 1e3),
            f.service_us.map_or("-".into(), |t| format!("{t:.1}")),
            f.reconfigurations.to_string(),
            if users.is_empty() {
                "-".into()
            } else {
                users.join(",")
            },
            f.name.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    out += &table(&rows);
    out
}

fn row<const N: usize>(cells: [&str; N]) -> Vec<String> {
    cells.iter().map(|c| c.to_string()).collect()
}

/// Left-aligned columns two spaces apart, indented by two.
fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let width: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let cells: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(c, s)| format!("{s:<w$}", w = width[c]))
            .collect();
        out += "  ";
        out += cells.join("  ").trim_end();
        out += "\n";
    }
    out
}

fn node_state(s: NodeState) -> &'static str {
    match s {
        NodeState::Free => "free",
        NodeState::Assigned => "assigned",
        NodeState::Configuring => "configuring",
        NodeState::Ready => "ready",
    }
}

fn user_phase(p: UserPhase) -> &'static str {
    match p {
        UserPhase::Initial => "initial",
        UserPhase::Configuring => "configuring",
        UserPhase::Routing => "routing",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corefarm_smp::{NodeStatus, UserStatus};

    #[test]
    fn tables_name_nodes_like_the_logs_and_leave_out_the_observer() {
        let s = ClusterStatus {
            you: Some(9),
            policy: "credit".into(),
            max_message: 1024,
            nodes: vec![
                NodeStatus {
                    id: 1,
                    name: Some("n0".into()),
                    addr: "10.0.0.5:40112".into(),
                    state: NodeState::Ready,
                    user: Some(3),
                    in_flight: 2,
                    results: 118,
                    function: Some("bench".into()),
                    results_total: 300,
                    busy_seconds: 2.25,
                    ..Default::default()
                },
                NodeStatus {
                    id: 2,
                    addr: "10.0.0.6:1".into(),
                    ..NodeStatus::default()
                },
            ],
            users: vec![
                UserStatus {
                    id: 3,
                    addr: "10.0.0.9:51234".into(),
                    name: Some("prog".into()),
                    hello: true,
                    phase: UserPhase::Routing,
                    nodes: vec![1],
                    outstanding: 2,
                    queued: 0,
                    results: 118,
                    latency_p50: Some(0.0005),
                    latency_p99: Some(0.0021),
                    ..Default::default()
                },
                UserStatus {
                    id: 9,
                    addr: "127.0.0.1:2".into(),
                    name: Some("corefarm status".into()),
                    hello: true,
                    ..UserStatus::default()
                },
            ],
            uptime_seconds: 61.2,
            redispatched: 3,
            hedged: 5,
            hedge_duplicates: 4,
            errors: [("node_lost".to_string(), 1), ("refused".to_string(), 0)].into(),
            ..Default::default()
        };
        let expected = "\
policy credit, max message 1024 bytes, up 61 s, re-dispatched 3, hedged 5 (4 second answers dropped), errors: node_lost 1

nodes: 2
  ID  NODE               STATE  FUNCTION  CORES  USER  IN-FLIGHT  RESULTS  TOTAL  FAILED  BUSY-S
  1   n0@10.0.0.5:40112  ready  bench     0      3     2          118      300    0       2.2
  2   node-2@10.0.0.6:1  free   -         0      -     0          0        0      0       0.0

users: 1
  ID  ADDRESS         NAME  PHASE    NODES  OUTSTANDING  QUEUED  RESULTS  FAILED  P50-MS  P99-MS
  3   10.0.0.9:51234  prog  routing  1      2            0       118      0       0.500   2.100
";
        assert_eq!(render(&s), expected);
    }

    #[test]
    fn shared_mode_lists_functions_and_what_each_node_and_user_holds() {
        use corefarm_smp::FunctionStatus;
        let s = ClusterStatus {
            policy: "credit".into(),
            max_message: 64,
            sharing: "shared".into(),
            nodes: vec![NodeStatus {
                id: 1,
                name: Some("n0".into()),
                addr: "h:1".into(),
                state: NodeState::Ready,
                function: Some("crc (sha256:5b05cb74bb3d)".into()),
                ..Default::default()
            }],
            users: vec![UserStatus {
                id: 3,
                addr: "h:2".into(),
                phase: UserPhase::Routing,
                function: Some("crc (sha256:5b05cb74bb3d)".into()),
                outstanding: 5,
                queued: 4,
                in_flight: 1,
                ..Default::default()
            }],
            functions: vec![FunctionStatus {
                id: "0a1b2c3d4e5f".into(),
                name: Some("crc (sha256:5b05cb74bb3d)".into()),
                replicas: 1,
                queued: 4,
                in_flight: 1,
                demand: 0.0125,
                service_us: Some(2500.0),
                reconfigurations: 1,
                users: vec![3],
                ..Default::default()
            }],
            ..ClusterStatus::default()
        };
        let expected = "\
policy credit, sharing shared, max message 64 bytes, up 0 s, re-dispatched 0, errors: none

nodes: 1
  ID  NODE    STATE  FUNCTION                   CORES  USER  IN-FLIGHT  RESULTS  TOTAL  FAILED  BUSY-S
  1   n0@h:1  ready  crc (sha256:5b05cb74bb3d)  0      -     0          0        0      0       0.0

users: 1
  ID  ADDRESS  NAME         PHASE    FUNCTION                   OUTSTANDING  QUEUED  IN-FLIGHT  RESULTS  FAILED  P50-MS  P99-MS
  3   h:2      (seed user)  routing  crc (sha256:5b05cb74bb3d)  5            4       1          0        0       -       -

functions: 1
  FUNCTION      REPLICAS  LOADING  QUEUED  IN-FLIGHT  DEMAND-MS  SERVICE-US  RECONFIGS  USERS  NAME
  0a1b2c3d4e5f  1         0        4       1          12.5       2500.0      1          3      crc (sha256:5b05cb74bb3d)
";
        assert_eq!(render(&s), expected);
    }

    #[test]
    fn an_empty_cluster_has_empty_sections() {
        let s = ClusterStatus {
            policy: "queue".into(),
            max_message: 16,
            ..ClusterStatus::default()
        };
        assert_eq!(
            render(&s),
            "policy queue, max message 16 bytes, up 0 s, re-dispatched 0, errors: none\n\n\
             nodes: 0\n\nusers: 0\n"
        );
    }

    #[test]
    fn accounts_are_a_table_after_the_others() {
        let s = ClusterStatus {
            policy: "credit".into(),
            uptime_seconds: 61.0,
            accounts: vec![corefarm_smp::AccountStatus {
                user: "alice".into(),
                weight: 3,
                max_nodes: Some(2),
                sessions: 4,
                active: 1,
                node_seconds: 12.5,
                inputs: 900,
                bytes_in: 1000,
                bytes_out: 2000,
                reconfigurations: 1.5,
                ..Default::default()
            }],
            ..Default::default()
        };
        let expected = "
accounts: 1 (since the server started, 61 s ago)
  USER   WEIGHT  MAX-NODES  MAX-QUEUED-B  SESSIONS  ACTIVE  NODE-S  INPUTS  BYTES-IN  BYTES-OUT  RECONFIGS
  alice  3       2          -             4         1       12.500  900     1000      2000       1.50
";
        assert_eq!(accounts(&s), expected);
        assert!(render(&s).ends_with(expected));
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: StatusArgs,
    }

    fn query(argv: &[&str]) -> corefarm_smp::StatusQuery {
        use clap::Parser;
        let argv = std::iter::once("status").chain(argv.iter().copied());
        Cli::parse_from(argv).args.query()
    }

    #[test]
    fn the_table_asks_for_a_page_and_json_for_every_node_unless_told() {
        use corefarm_smp::{NodePage, StatusQuery};
        let page = |offset, limit, state| StatusQuery {
            nodes: Some(NodePage {
                offset,
                limit,
                state,
            }),
        };
        assert_eq!(query(&[]), page(0, DEFAULT_LIMIT, None));
        assert_eq!(query(&["--all"]), StatusQuery::all());
        assert_eq!(query(&["--json"]), StatusQuery::all());
        assert_eq!(
            query(&["--json", "--state", "ready", "--offset", "100"]),
            page(100, DEFAULT_LIMIT, Some(NodeState::Ready))
        );
        assert_eq!(query(&["--limit", "0"]), page(0, 0, None));
    }

    #[test]
    fn a_page_says_how_many_nodes_it_leaves_out() {
        let mut counts = corefarm_smp::NodeCounts::default();
        for _ in 0..3 {
            counts.add(NodeState::Free);
        }
        counts.add(NodeState::Ready);
        let s = ClusterStatus {
            policy: "credit".into(),
            nodes: vec![NodeStatus {
                id: 4,
                addr: "10.0.0.6:1".into(),
                ..NodeStatus::default()
            }],
            users: vec![UserStatus {
                id: 7,
                addr: "10.0.0.9:2".into(),
                nodes: (1..=20).collect(),
                ..Default::default()
            }],
            node_counts: Some(counts),
            ..ClusterStatus::default()
        };
        let text = render(&s);
        assert!(
            text.contains("nodes: 4\n  free 3, assigned 0, configuring 0, ready 1\n"),
            "{text}"
        );
        assert!(text.contains("listing 1 of them"), "{text}");
        // A user of many nodes: the first few and how many more.
        assert!(text.contains("1,2,3,4,5,6,7,8,+12"), "{text}");
    }
}
