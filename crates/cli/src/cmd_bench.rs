//! `corefarm bench …`: the benchmarks of seed 000 chapter 4.

use std::io::Write;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use corefarm_bench::echo::{self, EchoOptions, EchoReport};
use corefarm_bench::stats::{human_bps, human_size};

#[derive(Subcommand)]
pub enum BenchCmd {
    /// SMP echo throughput (seed 000 §4.2.1). Without a subcommand, runs an
    /// in-process echo server on 127.0.0.1:0 and the clients against it.
    Echo(EchoArgs),
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
    }
}

fn secs(v: f64, what: &str) -> Result<Duration> {
    Duration::try_from_secs_f64(v).with_context(|| format!("invalid {what}: {v}"))
}

fn echo_server(listen: &str) -> Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let l = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding {listen}"))?;
        println!("listening {}", l.local_addr()?);
        std::io::stdout().flush()?;
        tokio::select! {
            r = echo::serve(l) => r.context("echo server")?,
            _ = tokio::signal::ctrl_c() => {}
        }
        Ok(())
    })
}

fn echo_client(c: EchoClientArgs) -> Result<()> {
    let opts = EchoOptions {
        addr: c.addr,
        size: c.size,
        clients: c.clients,
        duration: secs(c.duration, "--duration")?,
        warmup: secs(c.warmup, "--warmup")?,
        verify: !c.no_verify,
    };
    let rep = echo::run(&opts)?;
    if c.json {
        println!("{}", serde_json::to_string(&rep)?);
    } else {
        print_echo(&rep);
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

fn print_echo(r: &EchoReport) {
    println!(
        "echo {} x {} client(s): {} ({:.0} msg/s) over {:.1} s, {} errors",
        human_size(r.size as u64),
        r.clients,
        human_bps(r.throughput_bps),
        r.messages_per_s,
        r.window_s,
        r.errors
    );
}
