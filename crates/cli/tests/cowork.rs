//! CPU/cluster co-working against real processes: the matrix-multiplier
//! image is built with `corefarm image build`, a `corefarm local` cluster
//! (server + two simulated native nodes) runs it, and the client runs the
//! same image's native artifact itself. Co-worked results must be the same
//! bytes, in the same order, as the all-cluster and all-local runs.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use corefarm_client::{Client, ClientOptions, Cowork, CoworkOptions};
use corefarm_cores::image;
use rand::{Rng, SeedableRng};
use tools::Tool;

use crate::support;
use crate::tools;

const N: usize = 64;
const INPUT: usize = 2 * N * N * 4;
const OUTPUT: usize = N * N * 4;

fn build_image(dir: &Path) -> Bytes {
    let (input, output) = (INPUT.to_string(), OUTPUT.to_string());
    support::hls_image(
        dir,
        "matmul/matmul.cpp",
        &[
            "--entry",
            "mat_mul_64x64",
            "--cores",
            "2",
            "--input-size",
            &input,
            "--output-size",
            &output,
        ],
    )
}

fn connect(users: &str, nodes: u32) -> Client {
    Client::connect(
        users,
        ClientOptions {
            nodes: Some(nodes),
            io_timeout: Some(Duration::from_secs(60)),
            ..ClientOptions::default()
        },
    )
    .unwrap()
}

/// Naive A·B with wrapping i32 arithmetic, for a spot check.
fn product(input: &[u8]) -> Vec<u8> {
    let w = |i: usize| i32::from_le_bytes(input[4 * i..4 * i + 4].try_into().unwrap());
    let mut out = Vec::with_capacity(OUTPUT);
    for i in 0..N {
        for j in 0..N {
            let mut s = 0i32;
            for k in 0..N {
                s = s.wrapping_add(w(i * N + k).wrapping_mul(w(N * N + k * N + j)));
            }
            out.extend_from_slice(&s.to_le_bytes());
        }
    }
    out
}

#[test]
fn cowork_results_equal_all_local_and_all_cluster() {
    if !tools::available(
        &[Tool::Cxx],
        "this test builds the native matrix multiplier",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = image::configuration(build_image(dir.path())).unwrap();
    let (_cluster, users) = support::local_cluster(2, &[]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    let inputs: Vec<Bytes> = (0..120)
        .map(|_| {
            let mut v = vec![0u8; INPUT];
            rng.fill(&mut v[..]);
            Bytes::from(v)
        })
        .collect();

    let client = connect(&users, 2);
    client.configure(&cfg).unwrap();
    let all_cluster: Vec<Bytes> = client
        .map(inputs.iter().cloned(), 16)
        .collect::<Result<_, _>>()
        .unwrap();
    for i in [0, 57, 119] {
        assert!(all_cluster[i][..] == product(&inputs[i])[..], "input {i}");
    }

    let opts = CoworkOptions {
        threads: 2,
        ..CoworkOptions::default()
    };
    let cowork = Cowork::for_client(&client, opts.clone()).unwrap();
    assert_eq!(cowork.threads(), 2);
    assert!(
        cowork.description().contains("native"),
        "{}",
        cowork.description()
    );

    // A client that was never configured (it asks for no nodes): the
    // cluster path never becomes ready and everything is computed locally.
    let observer = connect(&users, 0);
    let local_only = Cowork::load(&cfg, opts).unwrap();
    let all_local = observer.map_cowork(&inputs, 16, &local_only).unwrap();
    assert_eq!(all_local.report.cluster_items, 0);
    assert_eq!(all_local.report.local_items, inputs.len());
    assert!(all_local.results == all_cluster, "all-local ≠ all-cluster");

    // Co-worked twice: first probing the cluster, then with the estimates
    // the first run measured.
    for run in 0..2 {
        let r = client.map_cowork(&inputs, 16, &cowork).unwrap();
        let rep = &r.report;
        eprintln!("run {run}: {rep:?}; N_L = {:?}", rep.break_even());
        assert!(rep.cluster_error.is_none(), "{rep:?}");
        assert_eq!(rep.local_items + rep.cluster_items, inputs.len());
        assert!(r.results == all_cluster, "run {run}: cowork ≠ all-cluster");
        if run == 0 {
            // Unmeasured, the cluster is probed with a third of the work
            // while the local threads start at once: both compute some.
            assert!(rep.cluster_items > 0 && rep.local_items > 0, "{rep:?}");
            assert!(rep.measured.x_a.is_some() && rep.measured.x_c.is_some());
        }
    }

    // A client that asks for the nodes but leaves configuring to the
    // co-working calls (Algorithm 2 lines 7–12): its first call starts the
    // configuration and computes locally meanwhile; once the server has
    // answered, a call uses the cluster too.
    drop(client);
    let asking = connect(&users, 2);
    let opts = CoworkOptions {
        threads: 2,
        configure: true,
        ..CoworkOptions::default()
    };
    let cowork = Cowork::load(&cfg, opts).unwrap();
    let mut joined = None;
    for run in 0..200 {
        let r = asking.map_cowork(&inputs, 16, &cowork).unwrap();
        assert!(r.results == all_cluster, "run {run}: cowork ≠ all-cluster");
        assert!(r.report.cluster_error.is_none(), "{:?}", r.report);
        if r.report.cluster_items > 0 {
            joined = Some(run);
            break;
        }
    }
    eprintln!("the cluster joined at call {joined:?}");
    assert!(
        joined.is_some(),
        "the cluster never joined the co-working calls"
    );
    assert_eq!(asking.configuration().as_ref(), Some(&cfg));
}
