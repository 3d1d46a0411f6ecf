//! `corefarm`: one binary for every role of the system.

use clap::{Parser, Subcommand};

// Payload buffers of tens of KiB are allocated and freed per message on the
// forwarding path; glibc's allocator returns such memory to the kernel and
// faults it back in (page faults and zeroing per message), mimalloc keeps it.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod cmd_bench;
mod cmd_image;
mod cmd_local;
mod cmd_model;
mod cmd_node;
mod cmd_server;
#[cfg(test)]
mod cmd_server_tests;
mod cmd_status;
mod cmd_tls;
mod cmd_top;
mod cmd_worker;
mod demo;
mod flags;
mod interrupt;

#[derive(Parser)]
#[command(name = "corefarm", version, about = "Distributed computing on accelerator nodes over SMP", long_about = None)]
struct Cli {
    /// Log filter (also RUST_LOG), e.g. "info" or "corefarm_server=debug".
    #[arg(long, global = true, default_value = "warn")]
    log: String,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the server: a node port for node managers and a user port for user programs.
    Server(cmd_server::ServerArgs),
    /// Run one or more node managers that connect to a server.
    Node(cmd_node::NodeArgs),
    /// Run a server and N simulated nodes in this process (an embedded local cluster).
    Local(cmd_local::LocalArgs),
    /// Benchmarks: SMP echo, the benchmarking user, the full suite.
    #[command(subcommand)]
    Bench(cmd_bench::BenchCmd),
    /// Performance models: the collectives' latency (calibrate, predict) and
    /// the priority classes' queueing (classes).
    #[command(subcommand)]
    Model(cmd_model::ModelCmd),
    /// Build and inspect configuration images.
    #[command(subcommand)]
    Image(cmd_image::ImageCmd),
    /// Show the cluster (nodes, users, counters) as a server reports it; takes no node.
    Status(cmd_status::StatusArgs),
    /// A live view of the cluster (nodes, utilisation, users, throughput, latency); q quits.
    Top(cmd_top::TopArgs),
    /// Multiply random 64×64 int32 matrices on an embedded cluster, check every result, compare with software.
    Demo(demo::DemoArgs),
    /// Runs one isolated hardware core for a node manager (internal).
    #[command(name = "__core-worker", hide = true)]
    CoreWorker(cmd_worker::WorkerArgs),
}

/// Errors returned by a command are the user's to fix (a missing file, bad
/// Verilog, sizes that disagree): print the message and its causes on one
/// line and exit 1, never a backtrace. Bugs panic, and a panic still prints
/// its backtrace under RUST_BACKTRACE.
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    use std::io::IsTerminal;
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&cli.log));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal: logs piped to a file stay plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match cli.cmd {
        Cmd::Server(a) => cmd_server::run_server(a),
        Cmd::Node(a) => cmd_node::run_node(a),
        Cmd::Local(a) => cmd_local::run_local(a),
        Cmd::Bench(c) => cmd_bench::run(c),
        Cmd::Image(c) => cmd_image::run(c),
        Cmd::Model(c) => cmd_model::run(c),
        Cmd::Demo(a) => demo::run(a),
        Cmd::Status(a) => cmd_status::run(a),
        Cmd::Top(a) => cmd_top::run(a),
        Cmd::CoreWorker(a) => cmd_worker::run(a),
    }
}
