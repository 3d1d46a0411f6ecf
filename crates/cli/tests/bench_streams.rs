//! The streams benchmarks (priority classes, head-of-line blocking) end to
//! end on their embedded
//! clusters: `bench classes` calibrates, measures both classes at each load
//! and sets the model's predictions beside the measurement; `bench hol`
//! measures small messages behind a bulk stream in its three modes. The
//! figures themselves are for the benchmark suite; these check that every
//! part of each report is there and consistent.

use std::process::Command;

use crate::support;
use support::BIN;

#[test]
fn classes_reports_measurement_and_model_for_each_load_and_class() {
    let out = Command::new(BIN)
        .args(["bench", "classes", "--loads", "0.2,0.6", "--duration", "1"])
        .args(["--delay-us", "200", "--mean-inputs", "2", "--seed", "7"])
        .output()
        .expect("run corefarm bench classes");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("calibration:"), "{stderr}");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let cal = &r["calibration"];
    let mean_s = cal["mean_service_s"].as_f64().unwrap();
    assert!(mean_s > 0.0, "{cal}");
    // E[S²] ≥ E[S]² for any distribution.
    assert!(
        cal["second_moment_s2"].as_f64().unwrap() >= mean_s * mean_s,
        "{cal}"
    );
    let points = r["points"].as_array().unwrap();
    assert_eq!(points.len(), 2);
    for p in points {
        let classes = p["classes"].as_array().unwrap();
        assert_eq!(classes.len(), 2);
        for c in classes {
            assert!(c["messages"].as_u64().unwrap() > 0, "{p}");
            let measured = c["measured_mean_s"].as_f64().unwrap();
            let predicted = c["predicted_mg1_s"].as_f64().unwrap();
            // Nothing is faster than one service time.
            assert!(measured >= mean_s * 0.5 && predicted >= mean_s, "{p}");
            assert!(c["error_mg1"].as_f64().unwrap() >= 0.0);
        }
        // The urgent class never waits longer in the model.
        let pred = |k: usize| classes[k]["predicted_mg1_s"].as_f64().unwrap();
        assert!(pred(0) <= pred(1), "{p}");
    }
}

#[test]
fn hol_reports_the_three_modes_with_every_small_message_measured() {
    let out = Command::new(BIN)
        .args([
            "bench",
            "hol",
            "--nodes",
            "1",
            "--bulk-mib",
            "1",
            "--samples",
            "30",
        ])
        .args(["--rate", "300", "--node-chunk-size", "0"])
        .output()
        .expect("run corefarm bench hol");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let runs = r["runs"].as_array().unwrap();
    let modes: Vec<&str> = runs.iter().map(|m| m["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["unloaded", "unchunked", "chunked"], "{r}");
    for m in runs {
        assert_eq!(m["small"]["samples"].as_u64(), Some(30), "{m}");
    }
    // Only the chunked run sends the small ones in class 0 as chunks.
    assert_eq!(runs[2]["chunks"], true);
    assert_eq!(runs[2]["small_class"], 0);
    assert_eq!(runs[1]["chunks"], false);
    // Bulk messages were answered while the small ones were measured.
    assert!(runs[1]["bulk_messages"].as_u64().unwrap() > 0, "{r}");
    assert!(r["p99_gain"].as_f64().unwrap() > 0.0, "{r}");
}
