//! `--metrics-listen` against a real `corefarm local` under load from the
//! benchmarking user: `/metrics` counts exactly what the user received,
//! passes `promtool check metrics`, and `/status` is the status model.

use crate::support;
use crate::tools;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use corefarm_smp::ClusterStatus;
use support::{http_get, local_cluster_with_metrics, Proc, BIN};
use tools::Tool;

const LIMIT: Duration = Duration::from_secs(30);

/// The value of the one sample whose line starts with `series ` (name and labels).
fn sample(text: &str, series: &str) -> f64 {
    let found: Vec<f64> = text
        .lines()
        .filter_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .collect();
    assert_eq!(found.len(), 1, "exactly one sample {series} in:\n{text}");
    found[0]
}

/// Sum of every sample of a family (any labels).
fn sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

fn status(metrics: &str) -> ClusterStatus {
    let (code, body) = http_get(metrics, "/status");
    assert_eq!(code, 200, "{body}");
    ClusterStatus::decode(body.as_bytes()).expect("/status is a ClusterStatus")
}

/// `promtool check metrics` accepts the text (run only if `enabled`).
fn promtool_accepts(enabled: bool, text: &str) {
    if !enabled {
        return;
    }
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    check
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let o = check.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "promtool check metrics failed:\n{}{}\n{text}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Runs the benchmarking user for a second on both nodes; returns the
/// messages it received (every one it sent).
fn bench_user(users: &str) -> u64 {
    let out = Command::new(BIN)
        .args(["bench", "user", "--server", users, "--json", "--nodes", "2"])
        .args(["--duration", "1", "--warmup", "0.2"])
        .args(["--input-size", "64", "--output-size", "32"])
        .stdin(Stdio::null())
        .output()
        .expect("run corefarm bench user");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let received = report["counts"]["received_messages"].as_u64().unwrap();
    let sent = report["counts"]["sent_messages"].as_u64().unwrap();
    assert!(received > 0 && received == sent, "{report}");
    received
}

#[test]
fn metrics_count_what_a_user_received_and_pass_promtool() {
    let promtool = tools::available(&[Tool::Promtool], "checking the /metrics output");
    let (_cluster, [users, _, metrics]) = local_cluster_with_metrics(2, &[]);
    let received = bench_user(&users);

    // The session's end reaches the server after the user process exits:
    // wait for the status to say so.
    let deadline = Instant::now() + LIMIT;
    while !status(&metrics).users.is_empty() {
        assert!(Instant::now() < deadline, "the bench user never left");
        std::thread::sleep(Duration::from_millis(20));
    }

    let (code, text) = http_get(&metrics, "/metrics");
    assert_eq!(code, 200, "{text}");
    let r = received as f64;
    assert_eq!(
        sample(
            &text,
            r#"corefarm_user_results_total{user="corefarm-bench"}"#
        ),
        r
    );
    assert_eq!(
        sample(
            &text,
            r#"corefarm_user_latency_seconds_count{user="corefarm-bench"}"#
        ),
        r
    );
    assert_eq!(
        sample(
            &text,
            r#"corefarm_user_latency_seconds_bucket{le="+Inf",user="corefarm-bench"}"#
        ),
        r
    );
    assert_eq!(sum(&text, "corefarm_node_results_total"), r);
    assert_eq!(sum(&text, "corefarm_node_reconfigurations_total"), 2.0);
    assert_eq!(
        sum(
            &text,
            "corefarm_node_reconfiguration_duration_seconds_count"
        ),
        2.0
    );
    assert!(
        sum(&text, "corefarm_node_busy_seconds_total") > 0.0,
        "{text}"
    );
    assert_eq!(
        sample(&text, r#"corefarm_nodes_connected{state="free"}"#),
        2.0
    );
    assert_eq!(sample(&text, "corefarm_users_connected"), 0.0);
    assert_eq!(sample(&text, "corefarm_queued_messages"), 0.0);
    assert_eq!(sum(&text, "corefarm_errors_total"), 0.0);
    assert_eq!(sample(&text, "corefarm_redispatched_total"), 0.0);
    // Every data message crossed each link once each way: at least its
    // 8-byte header, 4-byte id and payload.
    let bytes = |link: &str, dir: &str| {
        sample(
            &text,
            &format!(r#"corefarm_link_bytes_total{{link="{link}",direction="{dir}"}}"#),
        )
    };
    assert!(bytes("user", "in") >= r * (12.0 + 64.0), "{text}");
    assert!(bytes("node", "out") >= r * (12.0 + 64.0), "{text}");
    assert!(bytes("node", "in") >= r * (12.0 + 32.0), "{text}");
    assert!(bytes("user", "out") >= r * (12.0 + 32.0), "{text}");

    // /status: the same counters.
    let s = status(&metrics);
    assert_eq!(s.nodes.len(), 2);
    assert_eq!(
        s.nodes.iter().map(|n| n.results_total).sum::<u64>(),
        received
    );
    assert!(s.nodes.iter().all(|n| n.reconfigurations == 1));
    assert_eq!(http_get(&metrics, "/nope").0, 404);

    promtool_accepts(promtool, &text);
}

#[test]
fn node_managers_serve_their_own_metrics() {
    let promtool = tools::available(&[Tool::Promtool], "checking the /metrics output");
    // A cluster without nodes of its own, and two node managers in another
    // process with their own endpoint.
    let (_cluster, [users, nodes, server_metrics]) = local_cluster_with_metrics(0, &[]);
    let mut child = Command::new(BIN)
        .args(["node", "--server", &nodes, "--count", "2", "--name", "nm"])
        .args(["--metrics-listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start corefarm node");
    let stdout = child.stdout.take().unwrap();
    let _node = Proc(child);
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
    let metrics = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("metrics="))
        .unwrap_or_else(|| panic!("no metrics= in {line:?}"))
        .to_string();
    let deadline = Instant::now() + LIMIT;
    while status(&server_metrics).nodes.len() < 2 {
        assert!(
            Instant::now() < deadline,
            "the node managers never connected"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let received = bench_user(&users) as f64;

    let (code, text) = http_get(&metrics, "/metrics");
    assert_eq!(code, 200, "{text}");
    for n in ["nm-0", "nm-1"] {
        let l = format!(r#"{{node="{n}"}}"#);
        assert_eq!(
            sample(&text, &format!("corefarm_node_manager_connected{l}")),
            1.0
        );
        let loaded =
            format!(r#"corefarm_node_manager_configurations_total{{node="{n}",outcome="loaded"}}"#);
        assert_eq!(sample(&text, &loaded), 1.0);
    }
    // Every message the user got back was a job on one of the two nodes,
    // answered once; by the time the user has every result, each answer
    // has been written.
    assert_eq!(sum(&text, "corefarm_node_manager_jobs_total"), received);
    assert_eq!(sum(&text, "corefarm_node_manager_answers_total"), received);
    assert_eq!(
        sum(
            &text,
            "corefarm_node_manager_configuration_duration_seconds_count"
        ),
        2.0
    );
    let (code, body) = http_get(&metrics, "/status");
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["node_managers"].as_array().map(Vec::len), Some(2), "{v}");
    promtool_accepts(promtool, &text);
}
