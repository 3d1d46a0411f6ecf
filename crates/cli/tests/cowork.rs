//! CPU/cluster co-working against real processes: the matrix-multiplier
//! image is built with `corefarm image build`, a `corefarm local` cluster
//! (server + two simulated native nodes) runs it, and the client runs the
//! same image's native artifact itself. Co-worked results must be the same
//! bytes, in the same order, as the all-cluster and all-local runs.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use corefarm_client::{Client, ClientOptions, Cowork, CoworkOptions};
use corefarm_cores::image;
use rand::{Rng, SeedableRng};
use tools::Tool;

#[allow(dead_code)] // this test needs only the C++ compiler
mod tools;

const BIN: &str = env!("CARGO_BIN_EXE_corefarm");
const N: usize = 64;
const INPUT: usize = 2 * N * N * 4;
const OUTPUT: usize = N * N * 4;

/// A child process killed and reaped when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn build_image(dir: &Path) -> Bytes {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../cores/matmul/matmul.cpp");
    let out = dir.join("matmul.cfimg");
    let st = Command::new(BIN)
        .args(["image", "build", "--hls"])
        .arg(&src)
        .args(["--entry", "mat_mul_64x64", "--cores", "2"])
        .args(["--input-size", &INPUT.to_string()])
        .args(["--output-size", &OUTPUT.to_string()])
        .arg("-o")
        .arg(&out)
        .status()
        .expect("run corefarm image build");
    assert!(st.success(), "corefarm image build failed");
    Bytes::from(std::fs::read(out).unwrap())
}

/// `corefarm local --nodes 2` on OS-assigned ports; returns the user address.
fn local_cluster() -> (Proc, String) {
    let mut child = Command::new(BIN)
        .args(["local", "--nodes", "2"])
        .args([
            "--nodes-listen",
            "127.0.0.1:0",
            "--users-listen",
            "127.0.0.1:0",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start corefarm local");
    let stdout = child.stdout.take().unwrap();
    let proc = Proc(child);
    let mut lines = BufReader::new(stdout).lines();
    let users = loop {
        let line = lines
            .next()
            .expect("corefarm local exited without a 'listening' line")
            .unwrap();
        if let Some(u) = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("users="))
        {
            break u.to_string();
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    (proc, users)
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
    let (_cluster, users) = local_cluster();
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
}
