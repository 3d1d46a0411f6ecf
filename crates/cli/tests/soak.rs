//! The soak in its two-minute form: `corefarm bench soak` runs a
//! real server and four node processes under load, SIGKILLs and restarts
//! nodes, lets users come and go and mixes in bad peers; it must report
//! every result correct and exactly once, flat memory and no leaked
//! connection. The hour-long figures are in docs/benchmarks.md.

use std::process::Command;

use crate::support;

#[test]
fn two_minute_soak_loses_nothing() {
    let out = Command::new(support::BIN)
        .args([
            "bench",
            "soak",
            "--duration",
            "2m",
            "--kill-every",
            "4s",
            "--json",
        ])
        .output()
        .expect("running corefarm bench soak");
    let text = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let r: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("soak printed no report ({e}):\n{text}\n{stderr}"));
    let failed: Vec<_> = r["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter(|c| c["ok"] != true)
        .collect();
    assert!(failed.is_empty(), "failed checks: {failed:#?}\n{text}");
    assert!(out.status.success(), "{stderr}");
    // It did what it claims: load, kills and bad peers all happened.
    let t = &r["totals"];
    assert!(t["results_ok"].as_u64().unwrap() > 1000, "{text}");
    assert_eq!(t["results_wrong"], 0);
    assert!(r["nodes_killed"].as_u64().unwrap() >= 10, "{text}");
    assert!(r["bad_peers_played"].as_u64().unwrap() >= 20, "{text}");
    // They take turns: every kind was played at least once.
    let kinds = r["bad_peers_by_kind"]
        .as_object()
        .expect("bad_peers_by_kind");
    assert!(kinds.len() >= 12, "{text}");
    assert!(t["sessions"].as_u64().unwrap() >= 20, "{text}");
}
