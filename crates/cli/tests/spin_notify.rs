//! Handler notifications through a real node (`corefarm local`, one node):
//! a test handler set calls `ops->notify` at the head (with the message's
//! second word) and at the tail (with its byte count); the Rust client
//! receives both, with the id it submitted the message under, before the
//! message's result. With and without chunks on the server↔node link.
//! And a real node (`corefarm node`) against a scripted server: the
//! notifications go out before the result when the server agreed
//! `spin-notify`, and not at all when it did not.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use std::net::TcpListener;
use std::process::Stdio;

use bytes::Bytes;
use corefarm_client::{Client, ClientOptions};
use corefarm_cores::image;
use corefarm_smp::blocking::{write_frame, FrameReader};
use corefarm_smp::hello::features;
use corefarm_smp::{ConfigurationResponse, Hello, MsgType, OutFrame};
use tools::Tool;

use crate::support;
use crate::tools;

/// One input of 16 bytes, one output of 64 (the handlers answer instead).
const ECHO: &str = include_str!("../../../tests/fixtures/spin/echo.cpp");

/// `tally`: notifies at head and tail, emits the byte count.
const TALLY: &str = include_str!("../../../tests/fixtures/spin/tally.c");

/// Word 0 = 8 selects `tally`.
const SETS: &str = r#"[{"name":"tally","ruleset":{"mode":"and","rules":[{"index":0,"mask":4294967295,"start":8,"end":8}]}}]"#;

fn build_image(dir: &Path) -> Bytes {
    let tally = dir.join("tally.c");
    std::fs::write(&tally, TALLY).unwrap();
    support::handler_image(dir, "tally", ECHO, SETS, &[tally])
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
    // The node has joined (its hello answered) once local prints its address.
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

/// A real node connected to a scripted server that agrees `spin-notify` or
/// not: what the node sends for one tally message, up to its result, and
/// then its notification metrics.
fn node_sends(image: &Bytes, agree: bool) -> (Vec<(MsgType, Vec<u8>)>, String) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut child = Command::new(support::BIN)
        .args(["node", "--server", &l.local_addr().unwrap().to_string()])
        .args(["--name", "notifier", "--metrics-listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start corefarm node");
    let stdout = child.stdout.take().unwrap();
    let _node = support::Proc(child);
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
    let metrics = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("metrics="))
        .unwrap_or_else(|| panic!("no metrics= in {line:?}"))
        .to_string();
    let (s, _) = l.accept().unwrap();
    // Bounds a broken node's silence; every wait below is on a frame.
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = FrameReader::new(s, 1 << 26);
    let mut next = || r.read_frame().unwrap().expect("a frame from the node");
    let f = next();
    assert_eq!(f.ty, MsgType::Hello);
    let h = Hello::decode(&f.payload).unwrap();
    assert!(h.has(features::SPIN_NOTIFY), "the node offers it: {h:?}");
    let mut reply = Hello::new("server");
    reply.features = vec![features::ERROR.into()];
    if agree {
        reply.features.push(features::SPIN_NOTIFY.into());
    }
    write_frame(&mut w, reply.to_frame()).unwrap();
    let cfg = image::configuration(image.clone()).unwrap();
    write_frame(&mut w, cfg.to_frame().unwrap()).unwrap();
    let f = next();
    assert_eq!(f.ty, MsgType::ConfigurationResponse, "{f:?}");
    assert!(ConfigurationResponse::parse(&f.payload).unwrap().ok());
    let mut msg = vec![0u8; 160];
    msg[..4].copy_from_slice(&8u32.to_le_bytes());
    msg[4..8].copy_from_slice(&0xB7u32.to_le_bytes());
    write_frame(&mut w, OutFrame::data(5, Bytes::from(msg)).unwrap()).unwrap();
    let mut sent = Vec::new();
    loop {
        let f = next();
        let done = f.ty != MsgType::Notification;
        sent.push((f.ty, f.payload.to_vec()));
        if done {
            break;
        }
    }
    // Counted before the result was queued, so already visible.
    let (code, text) = support::http_get(&metrics, "/metrics");
    assert_eq!(code, 200, "{text}");
    let counts = text
        .lines()
        .filter(|l| l.starts_with("corefarm_node_manager_notifications_total{"))
        .map(|l| l.rsplit_once('{').unwrap().1.to_string())
        .collect::<Vec<_>>()
        .join("; ");
    (sent, counts)
}

#[test]
fn a_node_sends_notifications_before_the_result_only_when_agreed() {
    if !tools::available(&[Tool::Cxx], "this test compiles handlers and a core") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = build_image(dir.path());
    let note = |id: u32, set: u8, data: &[u8]| {
        let mut p = id.to_le_bytes().to_vec();
        p.push(set);
        p.extend_from_slice(data);
        (MsgType::Notification, p)
    };
    let mut result = 5u32.to_le_bytes().to_vec();
    result.extend_from_slice(&160u64.to_le_bytes());
    result.resize(4 + 10 * 64, 0);
    let result = (MsgType::Data, result);
    let (sent, counts) = node_sends(&image, true);
    assert_eq!(
        sent,
        [
            note(5, 0, b"head\xb7\0\0\0"),
            note(5, 0, &160u64.to_le_bytes()),
            result.clone()
        ]
    );
    assert!(
        counts.contains(r#"outcome="sent"} 2"#) && counts.contains(r#"outcome="dropped"} 0"#),
        "{counts}"
    );
    let (sent, counts) = node_sends(&image, false);
    assert_eq!(sent, [result]);
    assert!(
        counts.contains(r#"outcome="sent"} 0"#) && counts.contains(r#"outcome="dropped"} 2"#),
        "{counts}"
    );
}
