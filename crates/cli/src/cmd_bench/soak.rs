//! `corefarm bench soak`'s arguments; the soak is `corefarm_bench::soak`.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use corefarm_bench::soak::schedule::{self, FaultKind, UnknownFault};
use corefarm_bench::soak::{self, SoakOptions};

use crate::flags::FlagError;

#[derive(Args)]
pub struct SoakArgs {
    /// How long the load runs, e.g. 120s, 10m, 1h.
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    duration: Duration,
    /// Node manager processes (one is never faulted; the others are
    /// killed, stopped and cut off at random).
    #[arg(long, default_value_t = 4)]
    nodes: usize,
    /// Concurrent users, each connecting, streaming and leaving in a loop.
    #[arg(long, default_value_t = 3)]
    users: u32,
    /// Mean time between node kills, e.g. 5s (when `node-kill` is among
    /// the faults).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    kill_every: Duration,
    /// The fault kinds to inject, comma-separated: node-kill, node-stop,
    /// server-restart, server-failover, node-delay, node-blackhole,
    /// node-reset, node-half-open, user-delay, user-blackhole, user-reset,
    /// user-half-open; `default` and `all` for every one, `""` for none.
    #[arg(long, default_value = "default", value_parser = parse_faults)]
    faults: FaultList,
    /// Mean time between faults other than node kills, e.g. 3s; they take
    /// turns, so every kind asked for is played once a round.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    fault_every: Duration,
    /// The server's --sharing mode: `shared` (a lost replica's work waits
    /// for another; the default here) or `exclusive` (a user whose last
    /// node dies gets an error).
    #[arg(long, default_value = "shared", value_parser = ["shared", "exclusive"])]
    sharing: String,
    /// Seed of every random choice (printed, so a run can be replayed):
    /// the same seed, duration, kinds and cluster shape replay the same
    /// fault schedule.
    #[arg(long)]
    seed: Option<u64>,
    /// Run the server with an auth file (secrets made up for the run): its
    /// nodes and users prove theirs, and the bad peers include wrong
    /// answers to the challenge. Without it, the bad peers meet the
    /// server's paths without authentication.
    #[arg(long)]
    auth: bool,
    /// The log filter of the servers and node managers the soak starts,
    /// e.g. "info,corefarm_server::sched=debug"; their logs are in the
    /// log directory the report names.
    #[arg(long, default_value = "warn")]
    cluster_log: String,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
    /// Only draw the fault schedule for the seed and print it (one JSON
    /// object: seed, summary, every fault); run nothing.
    #[arg(long)]
    schedule_only: bool,
}

/// A `--faults` value: the whole list (given again, the last one wins).
#[derive(Clone)]
struct FaultList(Vec<FaultKind>);

fn parse_faults(s: &str) -> Result<FaultList, UnknownFault> {
    schedule::parse_kinds(s).map(FaultList)
}

fn parse_duration(s: &str) -> Result<Duration, FlagError> {
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or((s, "s"), |i| s.split_at(i));
    let v: f64 = num
        .parse()
        .map_err(|_| FlagError::Duration(s.to_string()))?;
    let secs = match unit {
        "s" => v,
        "m" => v * 60.0,
        "h" => v * 3600.0,
        "ms" => v / 1000.0,
        _ => {
            return Err(FlagError::DurationUnit {
                unit: unit.to_string(),
                given: s.to_string(),
            })
        }
    };
    Duration::try_from_secs_f64(secs).map_err(|error| FlagError::DurationRange {
        given: s.to_string(),
        error,
    })
}

pub fn run(a: SoakArgs) -> Result<()> {
    let seed = a.seed.unwrap_or_else(rand::random);
    let opts = SoakOptions {
        bin: std::env::current_exe().context("locating the corefarm binary")?,
        duration: a.duration,
        nodes: a.nodes,
        users: a.users,
        kill_every: a.kill_every,
        faults: a.faults.0.clone(),
        fault_every: a.fault_every,
        sharing: a.sharing.clone(),
        seed,
        // On stderr, so `--json` (on stdout) keeps it: an hour is long to wait blind.
        progress: true,
        auth: a.auth,
        cluster_log: a.cluster_log.clone(),
    };
    if a.schedule_only {
        let faults = schedule::draw(seed, &opts.plan());
        let out = serde_json::json!({
            "seed": seed,
            "summary": schedule::summary(&faults, opts.duration),
            "schedule": faults,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    if !a.json {
        eprintln!(
            "soak: {:?} with {} nodes and {} users, faults {} (a node killed every ~{:?}, another fault every ~{:?}), {} nodes{} (seed {seed})",
            a.duration,
            a.nodes,
            a.users,
            if a.faults.0.is_empty() {
                "none".to_string()
            } else {
                a.faults.0.iter().map(|k| k.name()).collect::<Vec<_>>().join(",")
            },
            a.kill_every,
            a.fault_every,
            a.sharing,
            if a.auth { ", authentication" } else { "" }
        );
    }
    crate::interrupt::kill_children_on_signal("bench soak");
    let r = soak::run(&opts)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", r.summary());
    }
    if !r.ok {
        bail!("soak failed (seed {seed})");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use crate::flags::FlagError;
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert!(matches!(
            parse_duration("5 parsecs"),
            Err(FlagError::DurationUnit { unit, .. }) if unit == " parsecs"
        ));
        assert!(matches!(parse_duration("-1s"), Err(FlagError::Duration(_))));
    }
}
