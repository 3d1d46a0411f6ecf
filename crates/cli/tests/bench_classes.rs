//! `corefarm bench classes` end to end on its embedded cluster: it
//! calibrates, measures both classes at each load and sets the model's
//! predictions beside the measurement. The figures themselves are for the
//! benchmark suite; this checks that every part of the report is there and
//! consistent.

use std::process::Command;

mod support;
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
