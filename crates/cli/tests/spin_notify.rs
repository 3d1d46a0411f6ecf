//! Handler notifications through a real node (`corefarm local`, one node):
//! a test handler set calls `ops->notify` at the head (with the message's
//! second word) and at the tail (with its byte count); the Rust client
//! receives both, with the id it submitted the message under, before the
//! message's result. With and without chunks on the server↔node link.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use corefarm_client::{Client, ClientOptions};
use corefarm_cores::image;
use tools::Tool;

#[allow(dead_code)]
mod tools;

mod support;

/// One input of 16 bytes, one output of 64 (the handlers answer instead).
const ECHO: &str = r#"
#include "corefarm/hls.h"
hls_avalon_agent_component
component void echo(hls_avalon_agent_memory_argument(16) uint8_t *in,
                     hls_avalon_agent_memory_argument(64) uint8_t *out) {
    for (int i = 0; i < 64; i++) out[i] = i < 16 ? in[i] : 0xEE;
}
"#;

/// `tally`: notifies "head" + the message's word 1 at its head, its byte
/// count (u64) at its tail, and emits that count as its result.
const TALLY: &str = r#"
#include <corefarm/spin.h>
#include <string.h>

int tally_head(const cf_spin_args *a, const cf_spin_ops *ops) {
    uint8_t note[8] = {'h', 'e', 'a', 'd'};
    if (a->len < 8) return 1;
    memcpy(note + 4, a->data + 4, 4);
    return ops->notify(ops->ctx, note, sizeof note);
}

int tally_payload(const cf_spin_args *a, const cf_spin_ops *ops) {
    (void)ops;
    __atomic_fetch_add((uint64_t *)a->scratch, a->len, __ATOMIC_RELAXED);
    return 0;
}

int tally_tail(const cf_spin_args *a, const cf_spin_ops *ops) {
    uint64_t n = __atomic_load_n((uint64_t *)a->scratch, __ATOMIC_ACQUIRE);
    if (ops->notify(ops->ctx, (const uint8_t *)&n, sizeof n) != 0) return 2;
    return ops->emit(ops->ctx, (const uint8_t *)&n, sizeof n);
}
"#;

/// Word 0 = 8 selects `tally`.
const SETS: &str = r#"[{"name":"tally","ruleset":{"mode":"and","rules":[{"index":0,"mask":4294967295,"start":8,"end":8}]}}]"#;

fn build_image(dir: &Path) -> Bytes {
    let write = |name: &str, text: &str| -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let (echo, sets, tally) = (
        write("echo.cpp", ECHO),
        write("sets.json", SETS),
        write("tally.c", TALLY),
    );
    let out = dir.join("tally.cfimg");
    let st = Command::new(support::BIN)
        .args(["image", "build", "--hls"])
        .arg(&echo)
        .args(["--entry", "echo", "--name", "tally", "--handlers"])
        .arg(&sets)
        .arg("--handler-source")
        .arg(&tally)
        .arg("-o")
        .arg(&out)
        .status()
        .expect("run corefarm image build");
    assert!(st.success(), "corefarm image build failed");
    Bytes::from(std::fs::read(out).unwrap())
}

#[test]
fn notifications_reach_the_client_before_the_result() {
    run(&[]);
}

#[test]
fn notifications_reach_the_client_before_the_result_with_chunks_on_the_wire() {
    run(&["--node-chunk-size", "1024"]);
}

fn run(extra: &[&str]) {
    if !tools::available(&[Tool::Cxx], "this test compiles handlers and a core") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = build_image(dir.path());
    let (_local, users) = support::local_cluster(1, extra);
    // The node's hello first (as in spin.rs): a configuration must not
    // reach the node before the server's answer.
    let observer = Client::connect(
        &users,
        ClientOptions {
            nodes: Some(0),
            ..ClientOptions::default()
        },
    )
    .unwrap();
    support::poll_until(
        "the node's hello",
        Duration::from_secs(30),
        || observer.status().unwrap(),
        |s| s.nodes.iter().any(|n| !n.targets.is_empty()),
    );
    drop(observer);
    let client = Client::connect(
        &users,
        ClientOptions {
            nodes: Some(1),
            io_timeout: Some(Duration::from_secs(60)),
            ..ClientOptions::default()
        },
    )
    .unwrap();
    assert!(client
        .server_hello()
        .unwrap()
        .has(corefarm_smp::hello::features::SPIN_NOTIFY));
    client
        .configure(&image::configuration(image).unwrap())
        .unwrap();

    // Several in flight at once, of several sizes (16 to 8 KiB: chunked on
    // the node link when it is), under ids the node never sees.
    let sizes = [16usize, 4096, 160, 8192, 48];
    let pending: Vec<_> = sizes
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let id = 1000 + 7 * i as u32;
            let mut msg = vec![0u8; len];
            msg[..4].copy_from_slice(&8u32.to_le_bytes());
            msg[4..8].copy_from_slice(&(0xA0 + i as u32).to_le_bytes());
            client.submit_slice_with_id(id, &msg).unwrap();
            (id, len, i as u32)
        })
        .collect();
    let mut seen = Vec::new();
    for _ in &pending {
        let out = client.recv(Some(Duration::from_secs(60))).unwrap();
        let &(id, len, i) = pending.iter().find(|p| p.0 == out.id).unwrap();
        assert_eq!(&out.data[..8], &(len as u64).to_le_bytes(), "id {id}");
        // Its notifications came first, so they are queued already.
        let mut notes = Vec::new();
        while let Some(n) = client.try_recv_notification() {
            notes.push(n);
        }
        let mine: Vec<_> = seen
            .iter()
            .chain(&notes)
            .filter(|n: &&corefarm_client::Notification| n.id == id)
            .collect();
        let mut head = b"head".to_vec();
        head.extend_from_slice(&(0xA0 + i).to_le_bytes());
        assert_eq!(mine.len(), 2, "id {id}: {mine:?}");
        assert_eq!(&mine[0].data[..], &head[..], "id {id}");
        assert_eq!(&mine[1].data[..], &(len as u64).to_le_bytes(), "id {id}");
        assert!(mine.iter().all(|n| n.set == 0));
        seen.extend(notes);
    }
    assert_eq!(seen.len(), 2 * sizes.len());
    assert_eq!(client.notifications_dropped(), 0);
    assert!(client
        .recv_notification(Some(Duration::from_millis(1)))
        .is_none());
}
