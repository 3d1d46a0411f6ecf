//! `corefarm model calibrate` / `predict` and `corefarm bench collectives`
//! run as the real binary on tiny grids (each starts its own embedded
//! cluster on loopback port 0 and stops it before exiting).

use std::path::Path;
use std::process::{Command, Output};

use corefarm_model::collectives::{Algo, Calibration, Op};

use crate::support;

use support::{Proc, BIN};

/// Runs the binary with its cache directory inside `cache`, so the user's
/// real calibration is neither read nor overwritten.
fn corefarm(cache: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("XDG_CACHE_HOME", cache)
        .env_remove("RUST_LOG")
        .args(["--log", "error"])
        .output()
        .expect("run corefarm")
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

#[test]
fn calibrate_writes_the_default_file_and_predict_reads_it() {
    let cache = tempfile::tempdir().unwrap();
    // Nothing calibrated yet: predict says what to do.
    let o = corefarm(
        cache.path(),
        &[
            "model", "predict", "--op", "bcast", "--bytes", "8", "-n", "4",
        ],
    );
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("corefarm model calibrate"));

    let out = ok(&corefarm(
        cache.path(),
        &[
            "model",
            "calibrate",
            "--nodes",
            "2,4",
            "--sizes",
            "8,64K",
            "--budget",
            "0",
        ],
    ));
    let file = cache.path().join("corefarm").join("collectives-model.json");
    assert!(out.contains(&file.display().to_string()), "{out}");
    let cal = Calibration::load(&file).expect("a valid calibration");
    // Per group size: 2 sizes × (4 collectives × 3 trees + scatter + gather) + 3 barriers.
    assert_eq!(cal.samples.len(), 2 * (2 * (4 * 3 + 2) + 3));
    assert!(cal
        .samples
        .iter()
        .all(|s| s.seconds > 0.0 && s.seconds < 60.0));
    assert!(cal
        .samples
        .iter()
        .any(|s| s.shape.op == Op::Allgather && s.shape.n == 4));
    // A command's fixed cost, split by the fit between t0 and its
    // per-member part (either may be zero on a grid this small).
    let p = &cal.params;
    assert!(p.t0 + 2.0 * p.member > 0.0, "{p:?}");
    assert!(cal.rms_error.is_finite());

    let json = ok(&corefarm(
        cache.path(),
        &[
            "model",
            "predict",
            "--op",
            "allreduce",
            "--bytes",
            "64K",
            "-n",
            "4",
            "--json",
        ],
    ));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    for algo in Algo::ALL {
        let t = v["predicted_us"][algo.name()].as_f64().unwrap();
        let want = cal.predict(corefarm_model::collectives::Shape {
            op: Op::Allreduce,
            algo,
            n: 4,
            bytes: 65536,
        }) * 1e6;
        assert!((t - want).abs() <= 1e-6 * want, "{algo:?}: {t} vs {want}");
    }
    let auto: Algo = serde_json::from_value(v["auto"].clone()).unwrap();
    assert_eq!(auto, cal.best(Op::Allreduce, 4, 65536));

    // --out elsewhere; the text form names the tree `auto` picks.
    let other = cache.path().join("x.json");
    let o = corefarm(
        cache.path(),
        &[
            "model",
            "calibrate",
            "--nodes",
            "2",
            "--sizes",
            "8",
            "--budget",
            "0",
            "--out",
        ],
    );
    assert!(!o.status.success(), "--out needs a value");
    ok(&corefarm(
        cache.path(),
        &[
            "model",
            "calibrate",
            "--nodes",
            "2,3",
            "--sizes",
            "8,4K",
            "--budget",
            "0",
            "--out",
            other.to_str().unwrap(),
        ],
    ));
    let text = ok(&corefarm(
        cache.path(),
        &[
            "model",
            "predict",
            "--op",
            "bcast",
            "--bytes",
            "8",
            "-n",
            "3",
            "--model",
            other.to_str().unwrap(),
        ],
    ));
    assert_eq!(text.lines().count(), 3, "{text}");
    assert_eq!(text.matches("← auto").count(), 1, "{text}");
}

#[test]
fn bench_collectives_reports_json_with_predictions() {
    let cache = tempfile::tempdir().unwrap();
    let out = cache.path().join("coll.json");
    ok(&corefarm(
        cache.path(),
        &[
            "bench",
            "collectives",
            "--nodes",
            "2,3",
            "--sizes",
            "8,1K",
            "--ops",
            "bcast,reduce,barrier,gather",
            "--algos",
            "linear,binomial",
            "--warmup",
            "1",
            "--min-iters",
            "2",
            "--iters",
            "2",
            "--quiet",
            "--out",
            out.to_str().unwrap(),
        ],
    ));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let points = v["points"].as_array().unwrap();
    // Per group size: 2 sizes × (2 ops × 2 trees + gather) + 2 barriers.
    assert_eq!(points.len(), 2 * (2 * (2 * 2 + 1) + 2));
    for p in points {
        assert_eq!(p["iters"], 2);
        let (med, p99) = (
            p["median_us"].as_f64().unwrap(),
            p["p99_us"].as_f64().unwrap(),
        );
        assert!(med > 0.0 && p99 >= med, "{p}");
        assert!(p["predicted_us"].as_f64().unwrap() >= 0.0, "{p}");
        assert!(p["model_error"].as_f64().unwrap().is_finite(), "{p}");
    }
    let gather = points.iter().find(|p| p["op"] == "gather").unwrap();
    assert!(gather["algo"].is_null());
    assert!(points
        .iter()
        .any(|p| p["op"] == "reduce" && p["n"] == 3 && p["bytes"] == 1024));
    // No calibration in this cache: the model is fitted to the run and says so.
    assert!(v["model"]["source"].as_str().unwrap().contains("this run"));

    // A bad grid is refused before anything runs.
    let o = corefarm(
        cache.path(),
        &["bench", "collectives", "--sizes", "6", "--nodes", "2"],
    );
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("multiple of 4"));
}

#[test]
fn bench_direct_streams_past_the_server() {
    let (server, nodes, users) = support::server(&[]);
    let _nodes = Proc(
        Command::new(BIN)
            .args(["node", "--server", &nodes.to_string(), "--count", "2"])
            .args(["--peer-listen", "127.0.0.1:0", "--log", "error"])
            .spawn()
            .expect("start corefarm node"),
    );
    let cache = tempfile::tempdir().unwrap();
    let pid = server.0.id().to_string();
    let out = ok(&corefarm(
        cache.path(),
        &[
            "bench",
            "direct",
            "--server",
            &users.to_string(),
            "--nodes",
            "2",
            "--input-size",
            "4096",
            "--output-size",
            "64",
            "--batch",
            "16",
            "--duration",
            "0.5",
            "--warmup",
            "0",
            "--priority",
            "1",
            "--cpu-pid",
            &format!("server={pid}"),
        ],
    ));
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["path"], "direct");
    assert_eq!(v["priority"], 1);
    let msgs = v["messages"].as_u64().unwrap();
    assert!(msgs >= 16 && msgs.is_multiple_of(16), "{v}");
    // Outputs of the benchmarking core: 64 bytes per 4096-byte input.
    let t = &v["throughput"];
    let ratio = t["output_bps"].as_f64().unwrap() / t["input_bps"].as_f64().unwrap();
    assert!((ratio - 64.0 / 4096.0).abs() < 1e-9, "{v}");
    assert_eq!(v["cpu"][0]["label"], "server");
    assert!(v["cpu"][0]["cpu_s"].as_f64().unwrap() >= 0.0);
}
