//! `corefarm top`: a live view of the cluster in the terminal, in the spirit
//! of `htop`: nodes with their function, a utilisation bar and result rates;
//! users with their throughput and latency percentiles. It asks the server's
//! status once a second as an observer (a hello user with `nodes: 0`, like
//! `corefarm status`) and derives rates from the difference between two
//! answers. `q`, Esc or Ctrl-C quits.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use clap::Args;
use corefarm_client::{Client, ClientOptions};
use corefarm_smp::{ClusterStatus, NodeState};
use crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Paragraph, Row, Table};
use ratatui::Frame;

#[derive(Args, Clone)]
pub struct TopArgs {
    /// Server user port, HOST:PORT.
    #[arg(long, default_value_t = format!("127.0.0.1:{}", corefarm_client::DEFAULT_USER_PORT))]
    pub server: String,
    /// Seconds between refreshes.
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
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

/// What each connection (and reconnection) uses.
struct Target {
    server: String,
    tls: Option<corefarm_smp::tls::ClientTls>,
    secret: Option<corefarm_smp::auth::Secret>,
    user: Option<String>,
}

pub fn run(args: TopArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.interval.is_finite() && args.interval >= 0.1 && args.interval <= 3600.0,
        "--interval must be between 0.1 and 3600 seconds"
    );
    let interval = Duration::from_secs_f64(args.interval);
    {
        use std::io::IsTerminal;
        anyhow::ensure!(
            std::io::stdout().is_terminal() && std::io::stdin().is_terminal(),
            "corefarm top draws on a terminal and reads its keys; without one, use \
             `corefarm status` (or `corefarm status --json`)"
        );
    }
    // Connect before taking over the terminal, so a wrong address is a
    // plain error message.
    let target = Target {
        server: args.server.clone(),
        tls: args.tls.load()?,
        secret: corefarm_smp::auth::Secret::from_file_or_env(args.secret_file.as_deref())
            .map_err(anyhow::Error::msg)?,
        user: args.user.clone(),
    };
    let mut client = Some(connect(&target)?);
    let mut terminal = ratatui::init();
    let mut view = View::new(args.server.clone());
    let result = (|| -> anyhow::Result<()> {
        loop {
            let asked = Instant::now();
            match client.as_ref().map(Client::status) {
                Some(Ok(s)) => view.update(s, asked),
                Some(Err(e)) => {
                    view.error = Some(format!("{e}; reconnecting"));
                    client = None;
                }
                None => match connect(&target) {
                    Ok(c) => {
                        client = Some(c);
                        view.error = None;
                        continue;
                    }
                    Err(e) => view.error = Some(format!("{e:#}")),
                },
            }
            terminal.draw(|f| view.draw(f))?;
            let next = asked + interval;
            while let Some(left) = next.checked_duration_since(Instant::now()) {
                if !event::poll(left)? {
                    break;
                }
                if let Event::Key(k) = event::read()? {
                    let ctrl_c =
                        k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                    if k.kind == KeyEventKind::Press
                        && (matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) || ctrl_c)
                    {
                        return Ok(());
                    }
                }
            }
        }
    })();
    ratatui::restore();
    if let Some(c) = client {
        c.close();
    }
    result
}

fn connect(target: &Target) -> anyhow::Result<Client> {
    let t = Duration::from_secs(5);
    let opts = ClientOptions {
        tls: target.tls.clone(),
        secret: target.secret.clone(),
        user: target.user.clone(),
        nodes: Some(0),
        name: Some("corefarm top".into()),
        connect_timeout: Some(t),
        io_timeout: Some(t),
        ..ClientOptions::default()
    };
    Client::connect(&target.server, opts).map_err(crate::cmd_status::wrong_port_hint)
}

/// Counters of the previous answer, to turn totals into rates.
#[derive(Default)]
struct Prev {
    at: Option<Instant>,
    node_results: HashMap<u64, u64>,
    node_busy: HashMap<u64, f64>,
    user_results: HashMap<u64, u64>,
}

/// What the screen shows: the last status and the rates since the one before.
pub struct View {
    server: String,
    status: Option<ClusterStatus>,
    prev: Prev,
    /// Per node id: (results per second, utilisation 0..=1).
    node_rates: HashMap<u64, (f64, f64)>,
    /// Per user id: results per second.
    user_rates: HashMap<u64, f64>,
    error: Option<String>,
}

impl View {
    pub fn new(server: String) -> Self {
        View {
            server,
            status: None,
            prev: Prev::default(),
            node_rates: HashMap::new(),
            user_rates: HashMap::new(),
            error: None,
        }
    }

    /// A new answer, asked at `at`.
    pub fn update(&mut self, s: ClusterStatus, at: Instant) {
        let dt = self
            .prev
            .at
            .map(|p| at.duration_since(p).as_secs_f64())
            .filter(|d| *d > 0.0);
        self.node_rates.clear();
        self.user_rates.clear();
        if let Some(dt) = dt {
            for n in &s.nodes {
                let r = self
                    .prev
                    .node_results
                    .get(&n.id)
                    .map(|p| n.results_total.saturating_sub(*p));
                let b = self
                    .prev
                    .node_busy
                    .get(&n.id)
                    .map(|p| (n.busy_seconds - p).max(0.0));
                if let (Some(r), Some(b)) = (r, b) {
                    self.node_rates
                        .insert(n.id, (r as f64 / dt, (b / dt).min(1.0)));
                }
            }
            for u in &s.users {
                if let Some(p) = self.prev.user_results.get(&u.id) {
                    self.user_rates
                        .insert(u.id, u.results.saturating_sub(*p) as f64 / dt);
                }
            }
        }
        self.prev = Prev {
            at: Some(at),
            node_results: s.nodes.iter().map(|n| (n.id, n.results_total)).collect(),
            node_busy: s.nodes.iter().map(|n| (n.id, n.busy_seconds)).collect(),
            user_results: s.users.iter().map(|u| (u.id, u.results)).collect(),
        };
        self.status = Some(s);
        self.error = None;
    }

    pub fn draw(&self, f: &mut Frame) {
        let [head, nodes, users, accounts, foot] = Layout::vertical([
            Constraint::Length(2),
            Constraint::Fill(3),
            Constraint::Fill(2),
            Constraint::Fill(2),
            Constraint::Length(1),
        ])
        .areas(f.area());
        let bold = Style::default().add_modifier(Modifier::BOLD);
        let Some(s) = &self.status else {
            let msg = self
                .error
                .as_deref()
                .unwrap_or("waiting for the first status answer");
            f.render_widget(
                Paragraph::new(format!("corefarm top: {}\n{msg}", self.server)),
                head,
            );
            return;
        };
        let title = format!(
            "corefarm top: {}  policy {}  up {}  nodes {} ({} ready)  users {}    q: quit",
            self.server,
            s.policy,
            duration(s.uptime_seconds),
            s.nodes.len(),
            s.count_nodes(NodeState::Ready),
            s.users.iter().filter(|u| Some(u.id) != s.you).count(),
        );
        let second = self.error.clone().unwrap_or_else(|| {
            format!(
                "bytes: users in {} out {}  nodes in {} out {}",
                bytes(s.bytes.user_in),
                bytes(s.bytes.user_out),
                bytes(s.bytes.node_in),
                bytes(s.bytes.node_out)
            )
        });
        f.render_widget(
            Paragraph::new(vec![Line::styled(title, bold), Line::raw(second)]),
            head,
        );

        let rows = s.nodes.iter().map(|n| {
            let (rate, util) = self.node_rates.get(&n.id).copied().unwrap_or_default();
            Row::new(vec![
                n.name.clone().unwrap_or_else(|| format!("node-{}", n.id)),
                state(n.state).into(),
                n.function.clone().unwrap_or_else(|| "-".into()),
                n.user.map_or("-".into(), |u| u.to_string()),
                bar(util, 10),
                format!("{rate:.0}"),
                n.in_flight.to_string(),
                n.results_total.to_string(),
            ])
        });
        let widths = [
            Constraint::Min(12),
            Constraint::Length(11),
            Constraint::Min(10),
            Constraint::Length(5),
            Constraint::Length(15),
            Constraint::Length(10),
            Constraint::Length(9),
            Constraint::Length(10),
        ];
        let header = Row::new([
            "NODE",
            "STATE",
            "FUNCTION",
            "USER",
            "UTIL",
            "RESULTS/S",
            "IN-FLIGHT",
            "RESULTS",
        ])
        .style(bold);
        f.render_widget(
            Table::new(rows, widths)
                .header(header)
                .block(Block::bordered().title(" nodes ")),
            nodes,
        );

        let rows = s.users.iter().filter(|u| Some(u.id) != s.you).map(|u| {
            let rate = self.user_rates.get(&u.id).copied().unwrap_or_default();
            Row::new(vec![
                u.id.to_string(),
                u.name.clone().unwrap_or_else(|| {
                    if u.hello {
                        "-".into()
                    } else {
                        "(seed user)".into()
                    }
                }),
                u.nodes.len().to_string(),
                u.function.clone().unwrap_or_else(|| "-".into()),
                format!("{rate:.0}"),
                u.latency_p50.map_or("-".into(), millis),
                u.latency_p99.map_or("-".into(), millis),
                u.outstanding.to_string(),
                u.failures.to_string(),
                u.results.to_string(),
            ])
        });
        let widths = [
            Constraint::Length(5),
            Constraint::Min(12),
            Constraint::Length(5),
            Constraint::Min(12),
            Constraint::Length(10),
            Constraint::Length(9),
            Constraint::Length(9),
            Constraint::Length(11),
            Constraint::Length(7),
            Constraint::Length(10),
        ];
        let header = Row::new([
            "ID",
            "NAME",
            "NODES",
            "FUNCTION",
            "RESULTS/S",
            "P50 ms",
            "P99 ms",
            "OUTSTANDING",
            "FAILED",
            "RESULTS",
        ])
        .style(bold);
        f.render_widget(
            Table::new(rows, widths)
                .header(header)
                .block(Block::bordered().title(" users ")),
            users,
        );
        f.render_widget(account_table(s), accounts);
        let errors: Vec<String> = s
            .errors
            .iter()
            .filter(|(_, v)| **v > 0)
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let footer = format!(
            "re-dispatched {}  hedged {}  errors: {}",
            s.redispatched,
            s.hedged,
            if errors.is_empty() {
                "none".into()
            } else {
                errors.join(", ")
            }
        );
        f.render_widget(Paragraph::new(footer), foot);
    }
}

/// Each user's (tenant's) account: its weight, its sessions open now, and
/// its part of all node-seconds used since the server started.
fn account_table(s: &ClusterStatus) -> Table<'static> {
    let total: f64 = s.accounts.iter().map(|a| a.node_seconds).sum();
    let rows = s.accounts.iter().map(|a| {
        let part = if total > 0.0 {
            a.node_seconds / total
        } else {
            0.0
        };
        Row::new(vec![
            a.user.clone(),
            a.weight.to_string(),
            a.active.to_string(),
            format!("{:.1}", a.node_seconds),
            bar(part, 10),
            a.inputs.to_string(),
            format!("{:.1}", a.reconfigurations),
        ])
    });
    let widths = [
        Constraint::Min(12),
        Constraint::Length(6),
        Constraint::Length(6),
        Constraint::Length(10),
        Constraint::Length(17),
        Constraint::Length(12),
        Constraint::Length(9),
    ];
    let header = Row::new([
        "USER",
        "WEIGHT",
        "ACTIVE",
        "NODE-S",
        "OF ALL NODE-S",
        "INPUTS",
        "RECONFIGS",
    ])
    .style(Style::default().add_modifier(Modifier::BOLD));
    Table::new(rows, widths)
        .header(header)
        .block(Block::bordered().title(" accounts (since the server started) "))
}

/// `[█████░░░░░]  50%`: `width` cells, rounded down.
fn bar(frac: f64, width: usize) -> String {
    let frac = frac.clamp(0.0, 1.0);
    let full = (frac * width as f64) as usize;
    format!(
        "{}{} {:>3.0}%",
        "█".repeat(full),
        "░".repeat(width - full),
        frac * 100.0
    )
}

fn millis(s: f64) -> String {
    format!("{:.3}", s * 1e3)
}

fn duration(s: f64) -> String {
    let s = s as u64;
    format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

fn bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn state(s: NodeState) -> &'static str {
    match s {
        NodeState::Free => "free",
        NodeState::Assigned => "assigned",
        NodeState::Configuring => "configuring",
        NodeState::Ready => "ready",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corefarm_smp::{NodeStatus, UserPhase, UserStatus};
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    fn status(results: u64, busy: f64) -> ClusterStatus {
        ClusterStatus {
            policy: "credit".into(),
            you: Some(9),
            nodes: vec![NodeStatus {
                id: 1,
                name: Some("n0".into()),
                addr: "127.0.0.1:1".into(),
                state: NodeState::Ready,
                user: Some(3),
                function: Some("bench".into()),
                results_total: results,
                busy_seconds: busy,
                ..Default::default()
            }],
            users: vec![
                UserStatus {
                    id: 3,
                    addr: "127.0.0.1:2".into(),
                    name: Some("prog".into()),
                    hello: true,
                    phase: UserPhase::Routing,
                    nodes: vec![1],
                    results,
                    latency_p50: Some(0.0005),
                    latency_p99: Some(0.002),
                    ..Default::default()
                },
                UserStatus {
                    id: 9,
                    name: Some("corefarm top".into()),
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn rates_come_from_two_answers_and_show_on_screen() {
        let mut v = View::new("srv:1".into());
        let t0 = Instant::now();
        v.update(status(100, 1.0), t0);
        assert!(v.node_rates.is_empty(), "no rate from a single answer");
        v.update(status(600, 1.5), t0 + Duration::from_secs(2));
        assert_eq!(v.node_rates[&1], (250.0, 0.25));
        assert_eq!(v.user_rates[&3], 250.0);

        let mut t = Terminal::new(TestBackend::new(120, 20)).unwrap();
        t.draw(|f| v.draw(f)).unwrap();
        let screen: String = t
            .backend()
            .buffer()
            .content()
            .chunks(120)
            .map(|l| l.iter().map(|c| c.symbol()).collect::<String>() + "\n")
            .collect();
        assert!(
            screen.contains("n0") && screen.contains("bench"),
            "{screen}"
        );
        assert!(screen.contains("██░░░░░░░░  25%"), "{screen}");
        assert!(
            screen.contains("prog") && screen.contains("250"),
            "{screen}"
        );
        assert!(
            screen.contains("0.500") && screen.contains("2.000"),
            "{screen}"
        );
        assert!(
            !screen.contains("corefarm top  "),
            "the observer itself is left out:\n{screen}"
        );
    }

    #[test]
    fn helpers_format() {
        assert_eq!(bar(1.5, 4), "████ 100%");
        assert_eq!(bar(0.0, 2), "░░   0%");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(duration(3725.0), "1:02:05");
    }
}
