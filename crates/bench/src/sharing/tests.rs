//! Tiny runs of every variant: valid reports with sane values (no timing
//! assertions: the machine may be busy).

use super::*;

fn tiny(variant: Variant, functions: u32, speedup: f64) -> SharingOptions {
    SharingOptions {
        variant,
        nodes: 2,
        apps: 2,
        functions,
        calls: 2,
        jobs: 2,
        speedup,
        period_ms: 1,
        reconfigure_delay_ms: Some(1),
        seed: 7,
        no_backup: false,
    }
}

fn check(r: &serde_json::Value, variant: &str) {
    assert_eq!(r["variant"], variant);
    for k in [
        "makespan_s",
        "software_s",
        "expected_s",
        "normalised_makespan",
        "utilisation",
    ] {
        let v = r[k]
            .as_f64()
            .unwrap_or_else(|| panic!("{k} missing in {r}"));
        assert!(v.is_finite() && v > 0.0, "{k} = {v} in {r}");
    }
    let share = r["local_share"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&share), "{r}");
    // The expected makespan is a lower bound on the observed one, up to
    // the calibration of the software loop.
    assert!(r["utilisation"].as_f64().unwrap() < 1.5, "{r}");
}

#[test]
fn software_runs_everything_locally() {
    let r = measure(&tiny(Variant::Software, 4, 0.1)).unwrap();
    check(&r, "software");
    assert_eq!(r["local_share"], 1.0);
}

#[test]
fn exclusive_and_shared_run_everything_on_nodes() {
    for v in [Variant::Exclusive, Variant::Shared] {
        let r = measure(&tiny(v, 4, 1.0)).unwrap();
        check(&r, v.name());
        assert_eq!(r["local_share"], 0.0);
    }
}

#[test]
fn static_partition_places_the_first_functions_and_runs_the_rest_locally() {
    // 4 functions on 2 nodes: functions 0 and 1 have a node, 2 and 3 run
    // in software, so some but not all inputs are local (seed 7's calls
    // use both kinds).
    let r = measure(&tiny(Variant::Static, 4, 0.1)).unwrap();
    check(&r, "static");
    let share = r["local_share"].as_f64().unwrap();
    assert!(share > 0.0 && share < 1.0, "{r}");
    // One function: every node holds it and nothing is local.
    let r = measure(&tiny(Variant::Static, 1, 0.0)).unwrap();
    check(&r, "static");
    assert_eq!(r["local_share"], 0.0);
}

#[test]
fn cowork_runs_and_refuses_a_missing_software_path() {
    let r = measure(&tiny(Variant::Cowork, 2, 0.5)).unwrap();
    check(&r, "cowork");
    assert_eq!(r["sharing"], "shared");
    assert_eq!(r["backup"], true);
    assert!(r["backups"].is_u64(), "{r}");
    let mut off = tiny(Variant::Cowork, 2, 0.5);
    off.no_backup = true;
    let r = measure(&off).unwrap();
    assert_eq!((&r["backup"], &r["backups"]), (&false.into(), &0.into()));
    let e = measure(&tiny(Variant::Cowork, 2, 0.0)).unwrap_err();
    assert!(e.to_string().contains("software path"), "{e}");
}

#[test]
fn bad_arguments_are_refused() {
    let mut a = tiny(Variant::Shared, 2, 1.0);
    a.apps = 0;
    assert!(measure(&a).is_err());
    let mut a = tiny(Variant::Shared, 2, f64::NAN);
    a.apps = 1;
    assert!(measure(&a).is_err());
}

#[test]
fn every_application_gets_the_same_share_of_the_work() {
    let mut a = tiny(Variant::Shared, 16, 1.0);
    (a.apps, a.calls) = (8, 10);
    let node_us = |c: &[Call]| -> u64 {
        c.iter()
            .map(|&(f, n)| u64::from(n) * u64::from(delay_us(f)))
            .sum()
    };
    let w = workload(&a);
    assert_eq!(w.len(), 8);
    let share = 10 * MEAN_CALL_US;
    for calls in &w {
        let t = node_us(calls);
        // Within one input of the share (an input is 0.1–1.6 ms).
        assert!(t.abs_diff(share) < 1600, "{t} µs of {share}");
        assert!(calls
            .iter()
            .all(|&(f, n)| n >= 1 && u64::from(n) * u64::from(delay_us(f)) <= 100_000));
    }
    // Different draws per application, and the same workload for the same seed.
    assert_ne!(w[0], w[1]);
    assert_eq!(w, workload(&a));
}

/// bench/sharing_bound.py models this workload and pins the same values
/// (bench/tests/test_sharing_bound.py): a change to the generator must
/// change both.
#[test]
fn the_workload_is_pinned() {
    let a = SharingOptions {
        apps: 2,
        calls: 20,
        functions: 16,
        seed: 1,
        ..tiny(Variant::Shared, 16, 1.0)
    };
    let w = workload(&a);
    assert_eq!(w.iter().map(Vec::len).collect::<Vec<_>>(), [28, 23]);
    assert_eq!(w[0][..4], [(10, 37), (8, 34), (5, 20), (13, 4)]);
    assert_eq!(w[1][..4], [(5, 53), (14, 2), (2, 241), (12, 72)]);
    let work: u64 = w
        .iter()
        .flatten()
        .map(|&(f, n)| u64::from(n) * u64::from(delay_us(f)))
        .sum();
    assert_eq!(work, 2_020_100);
}
