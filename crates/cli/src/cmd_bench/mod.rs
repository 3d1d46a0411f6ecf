//! `corefarm bench …`: the arguments of every benchmark; the measurements
//! and their reports are `corefarm_bench`'s.

mod classes;
pub(crate) mod collectives;
mod direct;
mod hol;
mod irq;
mod rtl_cores;
mod scale;
mod sharing;
mod soak;

use std::io::Write;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use corefarm_bench::cpu::CpuTarget;
use corefarm_bench::echo::{self, EchoOptions};
use corefarm_bench::user::{self, UserBenchOptions};

#[derive(Subcommand)]
pub enum BenchCmd {
    /// SMP echo throughput (seed 000 §4.2.1). Without a subcommand, runs an
    /// in-process echo server on 127.0.0.1:0 and the clients against it.
    Echo(EchoArgs),
    /// The benchmarking user (seed 000 §4.2.2): sends the benchmarking
    /// configuration to a server and measures throughput and latency.
    User(UserArgs),
    /// The isolated node manager (seed 000 §4.2.3): listens as a server's
    /// node port, starts one `corefarm node` against it (or waits for one,
    /// --no-spawn), sends the benchmarking configuration with delay 0 and
    /// streams data messages straight to the node. No server involved.
    Node(NodeBenchArgs),
    /// Compare two result files (suite JSON or single reports) point by point;
    /// exits 1 if anything got worse beyond the noise.
    Compare(CompareArgs),
    /// Run the benchmark suite (bench/suite.py) with this binary.
    Suite(SuiteArgs),
    /// Long run under saturating load with nodes killed and restarted,
    /// users coming and going and bad peers; checks that every input got
    /// exactly one correct result and memory stayed flat (exit 1 if not).
    Soak(soak::SoakArgs),
    /// Shared nodes (seed 002 §5.5): concurrent applications calling random
    /// functions on an embedded cluster; makespan and utilisation.
    Sharing(sharing::SharingArgs),
    /// OSU-style latency of group collectives vs message size, group size
    /// and tree, with the calibrated model's prediction beside each point.
    Collectives(collectives::CollectivesArgs),
    /// Throughput of a group's direct data path (no data through the
    /// server), with the server's CPU over the window (one JSON object).
    Direct(direct::DirectArgs),
    /// Head-of-line blocking on one user link: p50/p99 of small messages
    /// at a fixed rate behind a bulk stream, unchunked vs chunked with
    /// priority classes (one JSON object).
    Hol(hol::HolArgs),
    /// Priority classes against the queueing model (seed 001 §IV): two
    /// Poisson classes through one node's queue at loads 0.1-0.9, measured
    /// mean latency beside Cobham's formula (one JSON object).
    Classes(classes::ClassesBenchArgs),
    /// The 64×64 matrix multiplier simulated as an Intel-style (Avalon) and
    /// an AMD-style (AXI, ap_ctrl_hs) core, side by side: cycles per job,
    /// simulated cycles per second, the AXI core's memory traffic (one JSON
    /// object).
    RtlCores(rtl_cores::RtlCoresArgs),
    /// A core's completion by interrupt against polling on a fake Zynq
    /// board: the node's CPU per job while the core runs 1 ms jobs (one
    /// JSON object).
    Irq(irq::IrqArgs),
    /// The server at thousands of nodes: resident memory and CPU per node,
    /// configuration fan-out, status and /metrics against the node count,
    /// the shared scheduler against nodes and functions, server CPU per
    /// event (one JSON object).
    Scale(scale::ScaleArgs),
}

#[derive(Args)]
pub struct CompareArgs {
    old: std::path::PathBuf,
    new: std::path::PathBuf,
    /// Smallest relative change that counts (0.05: 5 %); the recorded
    /// spread of either file widens it.
    #[arg(long, default_value_t = 0.05, value_parser = parse_threshold)]
    threshold: f64,
    /// Print the comparison as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct SuiteArgs {
    /// echo, server, node, node-matmul, cluster, software, headline, forwarding,
    /// all (those eight), or one that `all` does not run: policies, sharing
    /// (seed 002 §5.5, then the multi-tenant workloads), sharing-workloads,
    /// tls, collectives, direct, streams, rtl-cores, irq, hang (a node
    /// SIGSTOPped under load), scale (its quick run is in `all --quick`), seedpeers (the seed's own peers:
    /// `seedpeers -- --seed-build DIR`). An experiment's own options
    /// (`--runs`, `--duration`, …) go after `--`.
    experiment: String,
    /// A few seconds per experiment.
    #[arg(long)]
    quick: bool,
    /// Results directory (default: bench-results/ in the repository).
    #[arg(long)]
    out: Option<std::path::PathBuf>,
    /// Further arguments passed to suite.py.
    #[arg(last = true)]
    rest: Vec<String>,
}

#[derive(Args)]
pub struct UserArgs {
    /// The server's user port, or several separated by commas
    /// (host:port,host:port): the first that answers is used, the others
    /// are where the session resumes if that server is lost.
    #[arg(long)]
    server: String,
    /// Seconds to try to resume the session after its server was lost
    /// (reconnecting, configuring again and sending every unanswered
    /// message again); 0 turns resuming off. The report counts resumes.
    #[arg(long, default_value_t = 30.0)]
    reconnect_timeout: f64,
    /// Bytes per input (at least 16: the timestamp the nodes echo).
    #[arg(long, default_value_t = 32768)]
    input_size: u32,
    /// Bytes per output (at least 16).
    #[arg(long, default_value_t = 16384)]
    output_size: u32,
    /// Simulated processing delay per input, microseconds.
    #[arg(long, default_value_t = 0)]
    delay_us: u32,
    /// Inputs per data message.
    #[arg(long, default_value_t = 1)]
    count: u32,
    /// Measured seconds (after the warm-up).
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Seconds at the start excluded from every statistic.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Messages per second, paced by absolute deadlines (default: as fast as possible).
    #[arg(long)]
    rate_hz: Option<f64>,
    /// Nodes to ask the server for in the hello (default: every free node).
    #[arg(long, conflicts_with = "legacy")]
    nodes: Option<u32>,
    /// Seed-only protocol: no hello, no credit, no error messages.
    #[arg(long)]
    legacy: bool,
    /// SO_SNDBUF of the user's socket in bytes (default: the kernel's
    /// autotuning). Without credit, this is what bounds the data waiting on
    /// the user's side, hence its latency.
    #[arg(long)]
    send_buffer: Option<usize>,
    /// Seconds results may still arrive after the sender stopped.
    #[arg(long, default_value_t = 10.0)]
    drain_timeout: f64,
    /// LABEL=PID: a process (the server; with its descendants) whose CPU
    /// time over the measurement window goes into the report (repeatable).
    #[arg(long = "cpu-pid", value_name = "LABEL=PID")]
    cpu_pids: Vec<CpuTarget>,
    /// Print one JSON object (implies --quiet).
    #[arg(long)]
    json: bool,
    /// No progress line on stderr.
    #[arg(long)]
    quiet: bool,
    /// File holding the user secret of a server with an auth file (mode
    /// 600). Default: $COREFARM_SECRET, or the file $COREFARM_SECRET_FILE.
    #[arg(long)]
    secret_file: Option<std::path::PathBuf>,
    /// The user to act for: a `[users.<name>]` of the server's auth file,
    /// whose own secret --secret-file then holds. Default: $COREFARM_USER,
    /// else the anonymous user (the shared user secret).
    #[arg(long, env = "COREFARM_USER", value_parser = user_name)]
    user: Option<String>,
    #[command(flatten)]
    tls: crate::cmd_tls::ClientTlsArgs,
}

/// `--user`: a user name as the server's auth file spells them.
pub(crate) fn user_name(s: &str) -> Result<String, String> {
    corefarm_smp::auth::check_user_name(s).map_err(|e| e.to_string())?;
    Ok(s.to_string())
}

#[derive(Args)]
pub struct NodeBenchArgs {
    /// Address to listen on as a server node port.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// Do not start a node: print `listening IP:PORT` and wait for one
    /// (`corefarm node --server IP:PORT`) to connect.
    #[arg(long)]
    no_spawn: bool,
    /// Extra argument for the spawned `corefarm node` (repeatable).
    #[arg(long = "node-arg", allow_hyphen_values = true)]
    node_args: Vec<String>,
    /// Bytes per input (at least 16).
    #[arg(long, default_value_t = 32768)]
    input_size: u32,
    /// Bytes per output (at least 16) [default: the input size].
    #[arg(long)]
    output_size: Option<u32>,
    /// Inputs per data message.
    #[arg(long, default_value_t = 1)]
    count: u32,
    /// Data messages in flight at most.
    #[arg(long, default_value_t = 16)]
    window: u32,
    /// Measured seconds (after the warm-up).
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Seconds at the start excluded from every statistic.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Seconds results may still arrive after the sender stopped.
    #[arg(long, default_value_t = 10.0)]
    drain_timeout: f64,
    /// Seconds to wait for the node to connect.
    #[arg(long, default_value_t = 15.0)]
    accept_timeout: f64,
    /// Print one JSON object (the `bench user` report, benchmark "node").
    #[arg(long)]
    json: bool,
    /// No progress line on stderr.
    #[arg(long)]
    quiet: bool,
}

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct EchoArgs {
    #[command(subcommand)]
    role: Option<EchoRole>,
    #[command(flatten)]
    client: EchoClientArgs,
}

#[derive(Subcommand)]
enum EchoRole {
    /// Run only the echo server; prints `listening IP:PORT` on stdout.
    Server {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
    },
    /// Run only the clients against an echo server.
    Client(EchoClientArgs),
}

#[derive(Args, Clone)]
struct EchoClientArgs {
    /// Echo server address (required for `echo client`).
    #[arg(long)]
    addr: Option<String>,
    /// Data bytes per message (after the 4-byte id).
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Concurrent client connections.
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// Measured seconds (after the warm-up).
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Seconds of warm-up excluded from the measurement.
    #[arg(long, default_value_t = 0.5)]
    warmup: f64,
    /// Skip the byte-by-byte comparison of echoes with what was sent.
    #[arg(long)]
    no_verify: bool,
    /// LABEL=PID: a process (the echo server; with its descendants) whose
    /// CPU time over the measurement window goes into the report (repeatable).
    #[arg(long = "cpu-pid", value_name = "LABEL=PID")]
    cpu_pids: Vec<CpuTarget>,
    /// Print one JSON object instead of a human summary.
    #[arg(long)]
    json: bool,
}

pub fn run(cmd: BenchCmd) -> Result<()> {
    match cmd {
        BenchCmd::Echo(a) => {
            match a.role {
                Some(EchoRole::Server { listen }) => echo_server(&listen),
                Some(EchoRole::Client(c)) => {
                    if c.addr.is_none() {
                        bail!("`echo client` needs --addr (omit the subcommand for an in-process server)");
                    }
                    echo_client(c)
                }
                None => echo_client(a.client),
            }
        }
        BenchCmd::User(u) => user_bench(u),
        BenchCmd::Node(n) => node_bench(n),
        BenchCmd::Compare(c) => compare(c),
        BenchCmd::Suite(s) => suite(s),
        BenchCmd::Soak(s) => soak::run(s),
        BenchCmd::Sharing(s) => sharing::run(s),
        BenchCmd::Collectives(a) => collectives::run(a),
        BenchCmd::Direct(a) => direct::run(a),
        BenchCmd::Hol(a) => hol::run(a),
        BenchCmd::RtlCores(a) => rtl_cores::run(a),
        BenchCmd::Classes(a) => classes::run(a),
        BenchCmd::Irq(a) => irq::run(a),
        BenchCmd::Scale(a) => scale::run(a),
    }
}

fn secs(v: f64, what: &str) -> Result<Duration> {
    Duration::try_from_secs_f64(v).with_context(|| format!("invalid {what}: {v}"))
}

fn echo_server(listen: &str) -> Result<()> {
    echo::serve_until_interrupted(listen, |addr| {
        println!("listening {addr}");
        let _ = std::io::stdout().flush();
    })
}

fn echo_client(c: EchoClientArgs) -> Result<()> {
    // Zero seconds measures nothing: the rates would be 0/0.
    anyhow::ensure!(
        c.duration > 0.0,
        "--duration must be more than 0 seconds (it is the measured window)"
    );
    let opts = EchoOptions {
        addr: c.addr,
        size: c.size,
        clients: c.clients,
        duration: secs(c.duration, "--duration")?,
        warmup: secs(c.warmup, "--warmup")?,
        verify: !c.no_verify,
        cpu_watch: c.cpu_pids,
    };
    let rep = echo::run(&opts)?;
    if c.json {
        println!("{}", serde_json::to_string(&rep)?);
    } else {
        print!("{}", rep.summary());
    }
    if rep.errors > 0 {
        bail!(
            "{} echoes were wrong or missing: {}",
            rep.errors,
            rep.error_samples.join("; ")
        );
    }
    Ok(())
}

fn user_bench(a: UserArgs) -> Result<()> {
    let opts = UserBenchOptions {
        server: a.server,
        reconnect_timeout: match a.reconnect_timeout {
            0.0 => None,
            t => Some(secs(t, "--reconnect-timeout")?),
        },
        input_size: a.input_size,
        output_size: a.output_size,
        delay_us: a.delay_us,
        count: a.count,
        duration: secs(a.duration, "--duration")?,
        warmup: secs(a.warmup, "--warmup")?,
        rate_hz: a.rate_hz,
        nodes: a.nodes,
        legacy: a.legacy,
        send_buffer: a.send_buffer,
        drain_timeout: secs(a.drain_timeout, "--drain-timeout")?,
        connect_timeout: Duration::from_secs(10),
        progress: !(a.json || a.quiet),
        cpu_watch: a.cpu_pids,
        secret: corefarm_smp::auth::Secret::from_file_or_env(a.secret_file.as_deref())
            .map_err(anyhow::Error::msg)?,
        user: a.user,
        tls: a.tls.load()?,
    };
    let rep = user::run(&opts)?;
    print_user_report(&rep, a.json)
}

/// A benchmarking user's report (`bench user`, `bench node`): JSON or the
/// summary, and a failed run is the command's failure.
fn print_user_report(rep: &corefarm_bench::user::UserReport, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(rep)?);
    } else {
        print!("{}", rep.summary());
    }
    if !rep.ok {
        bail!("benchmark failed: {}", rep.errors.join("; "));
    }
    Ok(())
}

fn node_bench(a: NodeBenchArgs) -> Result<()> {
    use corefarm_bench::node::{self, NodeBenchOptions, NodeSource};
    let source = if a.no_spawn {
        NodeSource::Accept
    } else {
        NodeSource::Spawn {
            program: std::env::current_exe().context("locating the corefarm binary")?,
            args: a.node_args.clone(),
        }
    };
    let opts = NodeBenchOptions {
        listen: a.listen.clone(),
        source,
        window: a.window,
        accept_timeout: secs(a.accept_timeout, "--accept-timeout")?,
        run: UserBenchOptions {
            server: String::new(),
            reconnect_timeout: None,
            input_size: a.input_size,
            output_size: a.output_size.unwrap_or(a.input_size),
            delay_us: 0,
            count: a.count,
            duration: secs(a.duration, "--duration")?,
            warmup: secs(a.warmup, "--warmup")?,
            rate_hz: None,
            nodes: None,
            legacy: false,
            send_buffer: None,
            drain_timeout: secs(a.drain_timeout, "--drain-timeout")?,
            connect_timeout: Duration::from_secs(10),
            progress: !(a.json || a.quiet),
            cpu_watch: Vec::new(),
            secret: None,
            user: None,
            tls: None,
        },
    };
    let announce = a.no_spawn;
    if !a.no_spawn {
        crate::interrupt::kill_children_on_signal("bench node");
    }
    let rep = node::run(&opts, |addr| {
        if announce {
            println!("listening {addr}");
            let _ = std::io::stdout().flush();
        }
    })?;
    print_user_report(&rep, a.json)
}

/// A relative change: finite and not negative.
fn parse_threshold(s: &str) -> Result<f64, crate::flags::FlagError> {
    match s.parse::<f64>() {
        Ok(t) if t.is_finite() && t >= 0.0 => Ok(t),
        _ => Err(crate::flags::FlagError::Threshold(s.to_string())),
    }
}

fn compare(a: CompareArgs) -> Result<()> {
    let c = corefarm_bench::compare::compare_files(&a.old, &a.new, a.threshold)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&c)?);
    } else {
        print!(
            "{}",
            c.summary(&a.old.display().to_string(), &a.new.display().to_string())
        );
    }
    if c.regressions > 0 {
        std::process::exit(1);
    }
    Ok(())
}

fn suite(a: SuiteArgs) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let script = corefarm_bench::suite::script()?;
    // The suite drives this very binary unless told otherwise.
    let err = corefarm_bench::suite::command(
        &script,
        &a.experiment,
        a.quick,
        a.out.as_deref(),
        &a.rest,
        &std::env::current_exe()?,
    )
    .exec();
    Err(err).with_context(|| format!("running python3 {}", script.display()))
}
