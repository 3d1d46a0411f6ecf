//! The node's pool of handler workers (`--handler-workers`) through a real
//! node (`corefarm local`, one node), with the handler set of
//! `tests/fixtures/spin/meet.c`: a "waiter" message's head waits (bounded)
//! for a "partner" message's head to raise a flag in the set's shared
//! memory, so it succeeds only if the node runs the two at the same time.
//!
//! With two workers: a waiter and a partner sent together both succeed; a
//! handler crash next to a waiter fails only the crashing message; the
//! set's counter and shared memory add up every message, whichever worker
//! ran it. With one worker (today's behaviour): the waiter cannot meet the
//! partner queued behind it and fails with its handler's code; the partner
//! then succeeds. Each result and error comes once, under its message's id.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use corefarm_client::{Client, ClientError, ClientOptions};
use corefarm_cores::image;
use tools::Tool;

use crate::support;
use crate::tools;

const ECHO: &str = include_str!("../../../tests/fixtures/spin/echo.cpp");
const MEET: &str = include_str!("../../../tests/fixtures/spin/meet.c");

/// Word 0 = 0x4d (77) selects `meet`.
const SETS: &str = r#"[{"name":"meet","ruleset":{"mode":"and","rules":[{"index":0,"mask":4294967295,"start":77,"end":77}]},"budgets":{"scratch":64,"shared":16,"counters":1,"per_call_ms":60000}}]"#;

const WAITER: u32 = 1;
const PARTNER: u32 = 2;
const CRASH: u32 = 3;
const REPORT: u32 = 4;

fn build_image(dir: &Path) -> Bytes {
    let meet = dir.join("meet.c");
    std::fs::write(&meet, MEET).unwrap();
    support::handler_image(dir, "meet", ECHO, SETS, &[meet])
}

fn msg(role: u32, wait_ms: u32, len: usize) -> Vec<u8> {
    let mut m: Vec<u8> = [77, role, wait_ms, 0]
        .iter()
        .flat_map(|w: &u32| w.to_le_bytes())
        .collect();
    m.resize(len.max(16), 0xab);
    m
}

fn cluster(dir: &Path, workers: &str) -> (support::Proc, Client) {
    let image = build_image(dir);
    let (local, users) = support::local_cluster(1, &["--handler-workers", workers]);
    let client = Client::connect(
        &users,
        ClientOptions {
            nodes: Some(1),
            io_timeout: Some(Duration::from_secs(120)),
            ..ClientOptions::default()
        },
    )
    .unwrap();
    client
        .configure(&image::configuration(image).unwrap())
        .unwrap();
    (local, client)
}

/// Sends `msgs` (id, bytes) all at once; every id's result or error
/// reason, each received exactly once.
fn together(client: &Client, msgs: &[(u32, Vec<u8>)]) -> HashMap<u32, Result<Vec<u8>, String>> {
    for (id, m) in msgs {
        client.submit_slice_with_id(*id, m).unwrap();
    }
    let mut got = HashMap::new();
    for _ in msgs {
        let (id, r) = match client.recv(Some(Duration::from_secs(120))) {
            Ok(o) => (o.id, Ok(o.data.to_vec())),
            Err(ClientError::Server(e)) => (e.id, Err(e.reason)),
            Err(e) => panic!("{e}"),
        };
        assert!(got.insert(id, r).is_none(), "id {id} answered twice");
    }
    got
}

fn own_length(m: &[u8]) -> Result<Vec<u8>, String> {
    Ok((m.len() as u64).to_le_bytes().to_vec())
}

#[test]
fn a_pool_of_two_runs_two_messages_at_once_on_a_real_node() {
    if !tools::available(&[Tool::Cxx], "this test compiles handlers and a core") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_local, client) = cluster(dir.path(), "2");

    // The waiter holds one worker until the partner runs in the other.
    let (waiter, partner) = (msg(WAITER, 50_000, 64), msg(PARTNER, 0, 4096));
    let got = together(&client, &[(10, waiter.clone()), (11, partner.clone())]);
    assert_eq!(got[&10], own_length(&waiter));
    assert_eq!(got[&11], own_length(&partner));

    // A crash next to a running waiter fails only the crashing message.
    let (waiter2, crash) = (msg(WAITER, 50_000, 160), msg(CRASH, 0, 32));
    let got = together(&client, &[(20, waiter2.clone()), (21, crash)]);
    assert_eq!(got[&20], own_length(&waiter2));
    let why = got[&21].as_ref().unwrap_err();
    assert!(
        why.contains("handler set meet: the payload handler crashed") && why.contains("SIGSEGV"),
        "{why}"
    );

    // Many messages over both workers: one counter and one byte total.
    let many: Vec<(u32, Vec<u8>)> = (0..16u32)
        .map(|i| (100 + i, msg(PARTNER, 0, 16 * (1 + i as usize * 5))))
        .collect();
    let got = together(&client, &many);
    for (id, m) in &many {
        assert_eq!(got[id], own_length(m), "id {id}");
    }
    let report = msg(REPORT, 0, 16);
    let got = together(&client, &[(200, report.clone())]);
    let r = got[&200].as_ref().unwrap();
    assert_eq!(r.len(), 16);
    let count = u64::from_le_bytes(r[..8].try_into().unwrap());
    let total = u64::from_le_bytes(r[8..].try_into().unwrap());
    // Heads: 2 + 2 (the crash's head ran) + 16 + the report.
    assert_eq!(count, 2 + 2 + many.len() as u64 + 1);
    // Payload bytes of every message but the crashed one.
    let want: usize = [&waiter, &partner, &waiter2, &report]
        .iter()
        .map(|m| m.len())
        .chain(many.iter().map(|(_, m)| m.len()))
        .sum();
    assert_eq!(total, want as u64);
}

#[test]
fn one_handler_worker_runs_one_message_at_a_time_on_a_real_node() {
    if !tools::available(&[Tool::Cxx], "this test compiles handlers and a core") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_local, client) = cluster(dir.path(), "1");
    let (waiter, partner) = (msg(WAITER, 300, 64), msg(PARTNER, 0, 48));
    let got = together(&client, &[(1, waiter), (2, partner.clone())]);
    let why = got[&1].as_ref().unwrap_err();
    assert!(
        why.contains("handler set meet: Head handler failed: returned 7"),
        "{why}"
    );
    assert_eq!(got[&2], own_length(&partner));
}
