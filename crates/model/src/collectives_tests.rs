use super::*;

const CHUNK: u64 = 64 * 1024;

fn shape(op: Op, algo: Algo, n: u32, bytes: u64) -> Shape {
    Shape { op, algo, n, bytes }
}

/// Seed 003's P/O model: the "+2" stages are t0 = 2P, one stage costs P.
fn seed_params(p: f64, o: f64) -> Params {
    Params {
        t0: 2.0 * p,
        hop: PerTree::same(p),
        combine: o,
        ..Params::default()
    }
}

#[test]
fn single_chunk_matches_seed_003_equations() {
    let (p, o) = (3e-6, 1e-6);
    let m = seed_params(p, o);
    let close = |a: f64, b: f64| (a - b).abs() < 1e-15;
    for n in [2, 4, 8, 16] {
        let l = f64::from(n).log2();
        let others = f64::from(n - 1);
        for (algo, st) in [
            (Algo::Linear, others),
            (Algo::Star, others),
            (Algo::Binomial, l),
        ] {
            let b = predict(&m, shape(Op::Bcast, algo, n, 8), CHUNK);
            assert!(close(b, (2.0 + st) * p), "{algo:?} n={n}: {b}");
            let r = predict(&m, shape(Op::Reduce, algo, n, 8), CHUNK);
            assert!(close(r, (2.0 + st) * p + st * o), "{algo:?} n={n}: {r}");
        }
    }
    // Not a power of two: ⌈log2 5⌉ = 3 stages.
    assert_eq!(stages(Algo::Binomial, 5, 1.0), 3.0);
    assert_eq!(stages(Algo::Linear, 1, 4.0), 0.0);
}

#[test]
fn pipelining_and_per_hop_bandwidth() {
    // One stage of a full chunk costs hop + chunk·byte (seed 001's latency
    // plus packet over bandwidth); the chain takes c + n − 2 of them.
    let p = Params {
        hop: PerTree::same(10e-6),
        byte: PerTree::same(1e-9),
        ..Params::default()
    };
    let m = 16 * CHUNK;
    let t = predict(&p, shape(Op::Bcast, Algo::Linear, 8, m), CHUNK);
    let stage = 10e-6 + CHUNK as f64 * 1e-9;
    assert!((t - (16.0 + 6.0) * stage).abs() < 1e-12, "{t}");
    let t = predict(&p, shape(Op::Bcast, Algo::Binomial, 8, m), CHUNK);
    assert!((t - 3.0 * 16.0 * stage).abs() < 1e-12, "{t}");
    // A partial chunk costs its own bytes only.
    let t = predict(&p, shape(Op::Bcast, Algo::Star, 3, 1000), CHUNK);
    assert!((t - 2.0 * (10e-6 + 1000.0 * 1e-9)).abs() < 1e-15, "{t}");
}

fn truth() -> Params {
    Params {
        t0: 150e-6,
        hop: PerTree {
            linear: 20e-6,
            binomial: 15e-6,
            star: 10e-6,
        },
        byte: PerTree {
            linear: 0.5e-9,
            binomial: 0.6e-9,
            star: 0.4e-9,
        },
        combine: 2e-6,
        combine_byte: 0.3e-9,
        msg: 4e-6,
        work_byte: 0.2e-9,
        relay: 60e-6,
        relay_byte: 1e-9,
        member: 12e-6,
        allgather_byte: 0.1e-9,
    }
}

fn grid(p: &Params, noise: impl Fn(usize) -> f64) -> Vec<Sample> {
    let mut out = Vec::new();
    for op in Op::ALL {
        for algo in Algo::ALL {
            for n in [2, 4, 8, 16] {
                for bytes in [8, 1024, 64 << 10, 1 << 20, 4 << 20] {
                    let s = shape(op, algo, n, bytes);
                    let i = out.len();
                    out.push(Sample {
                        shape: s,
                        seconds: predict(p, s, CHUNK) * (1.0 + noise(i)),
                    });
                }
            }
        }
    }
    out
}

#[test]
fn fit_recovers_synthetic_parameters() {
    let t = truth();
    let got = fit(&grid(&t, |_| 0.0), CHUNK).unwrap();
    for (a, b) in got.to_vec().iter().zip(t.to_vec()) {
        assert!((a - b).abs() <= 1e-6 * b.abs(), "{got:?}");
    }
}

#[test]
fn noisy_fit_predicts_within_the_noise() {
    let t = truth();
    // ±5 % deterministic noise.
    let samples = grid(&t, |i| if i % 2 == 0 { 0.05 } else { -0.05 });
    let c = Calibration::from_samples(samples, CHUNK, "synthetic".into()).unwrap();
    assert!(c.max_error < 0.12, "max error {}", c.max_error);
    assert!(
        c.rms_error > 0.0 && c.rms_error < 0.08,
        "rms {}",
        c.rms_error
    );
    let exact = predict(&t, shape(Op::Allreduce, Algo::Linear, 8, 1 << 20), CHUNK);
    let fitted = c.predict(shape(Op::Allreduce, Algo::Linear, 8, 1 << 20));
    assert!((fitted - exact).abs() / exact < 0.1);
}

#[test]
fn best_tree_small_binomial_large_linear() {
    let c = Calibration::from_samples(grid(&truth(), |_| 0.0), CHUNK, "t".into()).unwrap();
    assert_eq!(c.best(Op::Bcast, 16, 8), Algo::Binomial);
    assert_eq!(c.best(Op::Allreduce, 16, 1024), Algo::Binomial);
    assert_eq!(c.best(Op::Bcast, 16, 4 << 20), Algo::Linear);
    assert_eq!(c.best(Op::Reduce, 8, 4 << 20), Algo::Linear);
    // Two members: every tree is one stage, so the cheapest stage (here the
    // star's) wins; with equal stage costs the tie goes to binomial.
    assert_eq!(c.best(Op::Bcast, 2, 8), Algo::Star);
    let mut same = c.clone();
    same.params.hop = PerTree::same(1e-5);
    same.params.byte = PerTree::same(1e-9);
    assert_eq!(same.best(Op::Bcast, 2, 8), Algo::Binomial);
}

#[test]
fn fit_needs_samples() {
    assert!(fit(&[], CHUNK).is_none());
    let bad = [Sample {
        shape: shape(Op::Bcast, Algo::Linear, 4, 8),
        seconds: f64::NAN,
    }];
    assert!(fit(&bad, CHUNK).is_none());
}

#[test]
fn json_round_trip_and_validation() {
    let c = Calibration::from_samples(grid(&truth(), |_| 0.0), CHUNK, "t".into()).unwrap();
    let back = Calibration::from_json(&c.to_json()).unwrap();
    // serde_json's float parsing may differ in the last bit.
    assert_eq!((back.samples.len(), back.chunk), (c.samples.len(), c.chunk));
    for (a, b) in back.params.to_vec().iter().zip(c.params.to_vec()) {
        assert!((a - b).abs() <= 1e-12 * b.abs());
    }
    assert!(c.to_json().contains("\"op\": \"allreduce\""));

    let mut bad = c.clone();
    bad.params.hop.star = -1.0;
    assert!(matches!(
        Calibration::from_json(&bad.to_json()),
        Err(ModelError::Parameter(v)) if v == -1.0
    ));
    bad = c.clone();
    bad.format = "other/9".into();
    assert!(matches!(
        Calibration::from_json(&bad.to_json()),
        Err(ModelError::Format { found, .. }) if found == "other/9"
    ));
    bad = c;
    bad.chunk = 0;
    assert!(matches!(
        Calibration::from_json(&bad.to_json()),
        Err(ModelError::Chunk(0))
    ));
    assert!(matches!(
        Calibration::from_json("{"),
        Err(ModelError::Json(_))
    ));
    assert!(matches!(
        Calibration::from_json("[]"),
        Err(ModelError::Json(_))
    ));
}

#[test]
fn names_parse() {
    assert_eq!("allgather".parse::<Op>().unwrap(), Op::Allgather);
    assert_eq!("star".parse::<Algo>().unwrap(), Algo::Star);
    assert!(matches!("ring".parse::<Algo>(), Err(ModelError::UnknownAlgo(s)) if s == "ring"));
    assert!(matches!("scan".parse::<Op>(), Err(ModelError::UnknownOp(s)) if s == "scan"));
    assert!(!Op::Scatter.has_tree() && Op::Barrier.has_tree());
}
