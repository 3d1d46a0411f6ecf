//! Isolated cores in the real binary: `corefarm local` runs two node
//! managers whose image (cores/faulty/faulty.cpp) crashes on inputs whose
//! first byte is 0xFF and hangs on 0xF3. A user streams a mix: every good
//! input gets its correct result, every faulty one an error naming the
//! cause, and both nodes stay connected and keep serving.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use corefarm_client::{Client, ClientOptions};
use corefarm_smp::NodeState;
use tools::Tool;

use crate::support;
use crate::tools;

fn build_image(dir: &Path) -> Bytes {
    let args = [
        "--entry",
        "faulty",
        "--input-size",
        "64",
        "--output-size",
        "64",
    ];
    support::hls_image(
        dir,
        "faulty/faulty.cpp",
        &[&args[..], &["--cores", "2", "--name", "faulty"]].concat(),
    )
}

fn input(i: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..64).map(|k| (k * 7 + i) as u8).collect();
    v[0] = match i {
        _ if i % 9 == 4 => 0xFF, // null write: SIGSEGV
        37 => 0xF3,              // never returns: the core timeout
        _ => (i % 0x80) as u8,
    };
    v[1..9].fill(0);
    v
}

#[test]
fn a_crashing_core_fails_its_jobs_and_the_nodes_stay() {
    if !tools::available(&[Tool::Cxx], "this test builds a native core") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = build_image(dir.path());
    let (_local, users) = support::local_cluster(2, &["--core-timeout", "1"]);

    let client = Client::connect(
        &users,
        ClientOptions {
            nodes: Some(2),
            io_timeout: Some(Duration::from_secs(30)),
            ..ClientOptions::default()
        },
    )
    .unwrap();
    assert_eq!(client.nodes(), Some(2));
    let cfg = corefarm_cores::image::configuration(image).unwrap();
    client.configure(&cfg).unwrap();

    let n = 120;
    let inputs: Vec<Vec<u8>> = (0..n).map(input).collect();
    let results: Vec<_> = client
        .map(inputs.iter().map(|v| Bytes::from(v.clone())), 8)
        .collect();
    assert_eq!(results.len(), n);
    let (mut crashed, mut hung, mut good) = (0, 0, 0);
    for (i, (inp, r)) in inputs.iter().zip(&results).enumerate() {
        match (inp[0], r) {
            (0xFF, Err(e)) => {
                let e = e.to_string();
                assert!(
                    e.contains("(native faulty)") && e.contains("SIGSEGV"),
                    "job {i}: {e}"
                );
                crashed += 1;
            }
            (0xF3, Err(e)) => {
                assert!(
                    e.to_string().contains("no result within 1s"),
                    "job {i}: {e}"
                );
                hung += 1;
            }
            (_, Ok(out)) if inp[0] < 0x80 => {
                let want: Vec<u8> = inp.iter().map(|b| b ^ 0x5A).collect();
                assert_eq!(out[..], want[..], "job {i}");
                good += 1;
            }
            (first, r) => panic!("job {i} (first byte {first:#x}): unexpected {r:?}"),
        }
    }
    assert_eq!((crashed, hung, good), (13, 1, n - 14));

    // Both nodes are still there, configured for this user.
    let status = client.status().unwrap();
    assert_eq!(status.nodes.len(), 2, "{status:?}");
    assert!(
        status
            .nodes
            .iter()
            .all(|s| s.state == NodeState::Ready && s.user == status.you),
        "{status:?}"
    );
    // And their cores (restarted where they crashed) keep computing.
    let again: Vec<Vec<u8>> = (0..40).map(|i| input(i * 9)).collect();
    for (inp, r) in again
        .iter()
        .zip(client.map(again.iter().map(|v| Bytes::from(v.clone())), 8))
    {
        let want: Vec<u8> = inp.iter().map(|b| b ^ 0x5A).collect();
        assert_eq!(r.unwrap()[..], want[..]);
    }
}

#[test]
fn a_crash_inside_a_multi_input_message_fails_only_that_message() {
    if !tools::available(&[Tool::Cxx], "this test builds a native core") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = build_image(dir.path());
    let (_local, users) = support::local_cluster(1, &["--core-timeout", "5"]);
    let client = Client::connect(
        &users,
        ClientOptions {
            nodes: Some(1),
            io_timeout: Some(Duration::from_secs(30)),
            ..ClientOptions::default()
        },
    )
    .unwrap();
    let cfg = corefarm_cores::image::configuration(image).unwrap();
    client.configure(&cfg).unwrap();

    // 30 messages of 4 inputs each (one worker job per message); in every
    // fifth message the third input writes through a null pointer.
    let messages: Vec<Vec<Vec<u8>>> = (0..30)
        .map(|m| {
            (0..4)
                .map(|k| {
                    let mut v: Vec<u8> =
                        (0..64).map(|b| (b * 3 + m * 4 + k) as u8 & 0x7f).collect();
                    if m % 5 == 2 && k == 2 {
                        v[0] = 0xFF;
                        v[1..9].fill(0);
                    }
                    v
                })
                .collect()
        })
        .collect();
    let results: Vec<_> = client
        .map(messages.iter().map(|m| Bytes::from(m.concat())), 6)
        .collect();
    assert_eq!(results.len(), messages.len());
    for (m, (msg, r)) in messages.iter().zip(&results).enumerate() {
        if m % 5 == 2 {
            let e = r
                .as_ref()
                .expect_err("a message with a crashing input fails")
                .to_string();
            assert!(
                e.contains("input 2 of 4")
                    && e.contains("(native faulty)")
                    && e.contains("SIGSEGV"),
                "message {m}: {e}"
            );
        } else {
            let out = r.as_ref().unwrap_or_else(|e| panic!("message {m}: {e}"));
            let want: Vec<u8> = msg.concat().iter().map(|b| b ^ 0x5A).collect();
            assert_eq!(out[..], want[..], "message {m}");
        }
    }
}
