//! The soak in its short form, 70 s twice (the suite's time budget; a
//! 70 s soak still plays every kind of bad peer twice and kills a node
//! more than ten times): `corefarm bench soak` runs a real server and four
//! node processes under load, SIGKILLs and restarts nodes, lets users come
//! and go and mixes in bad peers; it must report every result correct and
//! exactly once, flat memory and no leaked connection. Once without
//! authentication and once with `--auth` (the server with an auth file,
//! and wrong answers to its challenge among the bad peers). The hour-long
//! figures are in docs/benchmarks.md.

use std::process::Command;
use std::sync::Mutex;

use crate::support;

/// One soak at a time: two at once would share the machine's CPUs, and
/// each measures its own load.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs a 70-second soak with `extra` flags; asserts what every soak must
/// show and returns its report.
fn short_soak(extra: &[&str]) -> serde_json::Value {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let out = Command::new(support::BIN)
        .args([
            "bench",
            "soak",
            "--duration",
            "70s",
            "--kill-every",
            "4s",
            "--json",
        ])
        .args(extra)
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
    assert!(t["sessions"].as_u64().unwrap() >= 20, "{text}");
    // A notification-flooding node was kept and served users, and the
    // server passed on at most 256 of each message's notifications.
    assert!(r["flooded_messages"].as_u64().unwrap() > 0, "{text}");
    let passed_on = r["notifications_passed_on"].as_u64().unwrap();
    assert!(passed_on > 0, "{text}");
    assert!(
        passed_on <= 256 * r["flooded_messages"].as_u64().unwrap(),
        "{text}"
    );
    r
}

/// The kinds of bad peer played, each at least once (they take turns),
/// and none of them without anything to test.
fn kinds(r: &serde_json::Value) -> Vec<String> {
    let text = r.to_string();
    let untestable = r["bad_peers_untestable"]
        .as_object()
        .expect("bad_peers_untestable");
    for kind in ["NotificationFlood", "WrongAuthAnswer"] {
        assert!(!untestable.contains_key(kind), "{text}");
    }
    r["bad_peers_by_kind"]
        .as_object()
        .expect("bad_peers_by_kind")
        .keys()
        .cloned()
        .collect()
}

#[test]
fn short_soak_loses_nothing() {
    let r = short_soak(&[]);
    let kinds = kinds(&r);
    // Every kind but the wrong answers, which need a challenge.
    assert_eq!(kinds.len(), 13, "{kinds:?}");
    assert!(kinds.iter().any(|k| k == "NotificationFlood"), "{kinds:?}");
    assert!(!kinds.iter().any(|k| k == "WrongAuthAnswer"), "{kinds:?}");
}

#[test]
fn short_soak_with_authentication_loses_nothing() {
    let r = short_soak(&["--auth"]);
    assert_eq!(r["auth"], true);
    let kinds = kinds(&r);
    assert_eq!(kinds.len(), 14, "{kinds:?}");
    for kind in ["NotificationFlood", "WrongAuthAnswer"] {
        assert!(kinds.iter().any(|k| k == kind), "{kind} in {kinds:?}");
    }
}
