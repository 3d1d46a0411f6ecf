//! Hostile and impossible input against real processes on 127.0.0.1:
//! bad user messages, garbage on the node port, data beyond credit, sizes
//! no node can hold, users that stop reading or go idle: each must cost the
//! server one connection at most, never the process or other users. The
//! harness is shared with `cluster.rs`.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use corefarm_smp::blocking::write_frame;
use corefarm_smp::{
    Configuration, ConfigurationResponse, Data, ErrorCode, ErrorMsg, MsgType, OutFrame,
};

use crate::cluster_harness;
use crate::support;
use cluster_harness::*;
use support::{Proc, BIN};

#[test]
fn configuration_with_no_free_node_is_refused() {
    let srv = server(&["--node-wait", "0.2"]);
    let (mut u, _) = User::hello(srv.users, None);
    assert_ne!(u.configure(&bench(16, 16, 0)), 0);
    // Seed user: same answer, as a negative response.
    let mut legacy = User::connect(srv.users);
    assert_ne!(legacy.configure(&bench(16, 16, 0)), 0);
}

/// Bad input from a user: a clear error and a closed connection; the server
/// keeps serving everyone else.
#[test]
fn bad_user_input_is_refused_with_a_reason() {
    let srv = server(&["--max-message", "4096"]);
    let _n = nodes(&srv, 1);
    let cases: Vec<(&str, Vec<u8>, ErrorCode)> = vec![
        (
            "unknown type",
            vec![9, 0, 0, 0, 0, 0, 0, 0],
            ErrorCode::Malformed,
        ),
        (
            "oversize",
            {
                let mut v = vec![3, 0, 0, 0];
                v.extend_from_slice(&(1u32 << 31).to_le_bytes());
                v
            },
            ErrorCode::TooLarge,
        ),
        (
            "data before configuration",
            OutFrame::data(1, Bytes::from_static(&[0; 16]))
                .unwrap()
                .to_vec(),
            ErrorCode::NotConfigured,
        ),
        (
            "core table longer than payload",
            {
                let mut p = Vec::new();
                for x in [16u32, 16, 5, 0] {
                    p.extend_from_slice(&x.to_le_bytes());
                }
                OutFrame::new(MsgType::Configuration, Bytes::from(p))
                    .unwrap()
                    .to_vec()
            },
            ErrorCode::Malformed,
        ),
    ];
    for (name, bytes, code) in cases {
        let (mut u, _) = User::hello(srv.users, Some(1));
        u.w.write_all(&bytes).unwrap();
        let e = u
            .expect_error()
            .unwrap_or_else(|| panic!("{name}: no error message"));
        assert_eq!(e.code(), Some(code), "{name}: {e}");
    }
    // Data not a whole number of inputs, after a good configuration.
    let (mut u, _) = User::hello(srv.users, Some(1));
    assert_eq!(u.configure(&bench(16, 16, 0)), 0);
    u.wait_credit();
    u.send(OutFrame::data(7, Bytes::from(vec![0u8; 17])).unwrap());
    let e = u.expect_error().unwrap();
    assert_eq!((e.code(), e.id), (Some(ErrorCode::BadDataSize), 7), "{e}");
    // A truncated message followed by a close: the server just drops that session.
    let mut t = TcpStream::connect(srv.users).unwrap();
    t.write_all(&[3, 0, 0, 0, 100, 0, 0, 0, 1, 2, 3]).unwrap();
    drop(t);
    // Everyone else still gets served.
    let (mut ok, _) = User::hello(srv.users, Some(1));
    assert_eq!(ok.configure(&bench(16, 16, 0)), 0);
    assert_exactly_once(&stream(&mut ok, 0..50, 1, 16, 16), 0..50);
}

#[test]
fn seed_user_with_invalid_first_message_gets_a_negative_response() {
    let srv = server(&[]);
    let _n = nodes(&srv, 1);
    let mut u = User::connect(srv.users);
    u.send(OutFrame::data(1, Bytes::from_static(&[0; 16])).unwrap());
    let f = u.recv().expect("a response before the close");
    assert_eq!(f.ty, MsgType::ConfigurationResponse);
    assert_ne!(ConfigurationResponse::parse(&f.payload).unwrap().status, 0);
    assert!(u.recv().is_none(), "connection closed");
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn user_that_stops_reading_gets_everything_intact_with_bounded_memory() {
    let srv = server(&[]);
    let _n = nodes(&srv, 4);
    // A seed-format user (no credit) that writes 64 MiB of inputs while not
    // reading: back-pressure must hold the server's memory down.
    const SIZE: usize = 64 * 1024;
    let total = 1024u32;
    let mut u = User::connect(srv.users);
    assert_eq!(u.configure(&bench(SIZE as u32, SIZE as u32, 0)), 0);
    let rss_before = rss_kib(srv.proc_.0.id());
    let written = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let mut w = u.w.try_clone().unwrap();
    let progress = written.clone();
    let sender = std::thread::spawn(move || {
        for id in 0..total {
            if write_frame(&mut w, OutFrame::data(id, payload(id, 1, SIZE)).unwrap()).is_err() {
                return false;
            }
            progress.store(id + 1, std::sync::atomic::Ordering::Release);
        }
        true
    });
    // The signal: the writer is blocked because nothing downstream takes
    // more. Its count stops moving well before the stream is done (64 MiB do
    // not fit the socket buffers on the way).
    let mut last = (0, Instant::now());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = written.load(std::sync::atomic::Ordering::Acquire);
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() > Duration::from_millis(500) {
            break;
        }
        assert!(Instant::now() < deadline, "the writer never stalled");
        assert!(now < total, "64 MiB went in while the user read nothing");
        std::thread::sleep(Duration::from_millis(20));
    }
    let stalled_at = last.0 as u64 * SIZE as u64;
    let grown = rss_kib(srv.proc_.0.id()).saturating_sub(rss_before) * 1024;
    let mut seen = HashMap::new();
    for _ in 0..total {
        let f = u.recv().expect("result");
        let d = Data::parse(f.payload).unwrap();
        check_result(&d, 1, SIZE, None);
        *seen.entry(d.id).or_insert(0) += 1;
    }
    assert!(sender.join().unwrap());
    assert_exactly_once(&seen, 0..total);
    // Relative, not absolute: what the server holds is bounded by its
    // windows (messages in flight per node, kept for re-dispatch) and its
    // allocator's granularity, not by the stream: a quarter of it at most.
    let stream = total as u64 * SIZE as u64;
    assert!(
        grown < stream / 4,
        "server memory grew by {grown} B while the user pushed a {stream} B stream \
         ({stalled_at} B written when it stalled) and read nothing"
    );
}

#[test]
fn node_port_rejects_garbage_and_keeps_serving() {
    let srv = server(&[]);
    let mut g = TcpStream::connect(srv.nodes).unwrap();
    g.write_all(&[0xFF; 32]).unwrap();
    let mut buf = [0u8; 8];
    g.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(g.read(&mut buf).unwrap_or(0), 0, "connection closed");
    let _n = nodes(&srv, 1);
    let (mut u, reply) = User::hello(srv.users, Some(1));
    assert_eq!(reply.nodes, Some(1));
    assert_eq!(u.configure(&bench(16, 16, 0)), 0);
    assert_exactly_once(&stream(&mut u, 0..10, 1, 16, 16), 0..10);
}

#[test]
fn data_beyond_the_granted_credit_is_refused() {
    // One credit for the user, room for four messages on the node: the
    // second message arrives while the first is still being processed.
    let srv = server(&["--user-window", "1"]);
    let _n = nodes(&srv, 1);
    let (mut u, _) = User::hello(srv.users, Some(1));
    assert_eq!(u.configure(&bench(16, 16, 500_000)), 0);
    u.wait_credit();
    u.send(OutFrame::data(0, payload(0, 1, 16)).unwrap());
    u.send(OutFrame::data(1, payload(1, 1, 16)).unwrap());
    let e = u.expect_error().expect("an error before the close");
    assert_eq!(e.code(), Some(ErrorCode::UnexpectedMessage), "{e}");
    assert!(e.reason.contains("credit"), "{e}");
}

/// A configuration whose results cannot travel (a benchmarking output of
/// 0xFFFFFFF0 bytes) is refused with a reason before any node sees it; the
/// session stays usable and every node serves the next user normally.
#[test]
fn impossible_sizes_are_refused_and_every_node_serves_the_next_user() {
    let srv = server(&[]);
    let _n = nodes(&srv, 2);
    let mut obs = Observer::new(&srv);
    obs.wait_free(2);
    {
        let (mut a, reply) = User::hello(srv.users, None);
        assert_eq!(reply.nodes, Some(2));
        a.send(bench(32, 0xFFFF_FFF0, 0).to_frame().unwrap());
        let e = a.recv().expect("an error with the reason");
        assert_eq!(e.ty, MsgType::Error);
        let e = ErrorMsg::parse(&e.payload).unwrap();
        assert_eq!(e.code(), Some(ErrorCode::TooLarge), "{e}");
        assert!(e.reason.contains("output size"), "{e}");
        let r = a.recv().expect("a negative response");
        assert_eq!(r.ty, MsgType::ConfigurationResponse);
        assert_ne!(ConfigurationResponse::parse(&r.payload).unwrap().status, 0);
        // A core configuration without output is refused too.
        let zero_out = Configuration {
            input_size: 16,
            output_size: 0,
            cores: corefarm_smp::default_core_table(1, 16, 16).unwrap(),
            bitstream: Bytes::from_static(b"not a bitstream"),
        };
        assert_ne!(a.configure(&zero_out), 0);
        // Neither reached a node: both are still connected and usable.
        let s = obs.get();
        assert_eq!(s.nodes.len(), 2, "no node was dropped: {s:#?}");
        // The same connection works with a sane configuration.
        assert_eq!(a.configure(&bench(16, 16, 0)), 0);
        assert_exactly_once(&stream(&mut a, 0..20, 1, 16, 16), 0..20);
    }
    obs.wait_free(2);
    let (mut b, reply) = User::hello(srv.users, None);
    assert_eq!(reply.nodes, Some(2));
    assert_eq!(b.configure(&bench(16, 16, 200)), 0);
    assert_exactly_once(&stream(&mut b, 0..200, 1, 16, 16), 0..200);
    let s = obs.get();
    assert_eq!(s.nodes.len(), 2);
    assert!(
        s.nodes.iter().all(|n| n.results > 0),
        "every node served the second user: {s:#?}"
    );
}

/// A user that configures and then goes silent gives its nodes back once
/// another user waits for them (--user-idle-timeout).
#[test]
fn an_idle_user_gives_its_nodes_to_a_waiting_one() {
    let srv = server(&["--user-idle-timeout", "1", "--node-wait", "30"]);
    let _n = nodes(&srv, 2);
    Observer::new(&srv).wait_free(2);
    let (mut idle, reply) = User::hello(srv.users, None);
    assert_eq!(reply.nodes, Some(2));
    assert_eq!(idle.configure(&bench(16, 16, 0)), 0);
    // The second user's hello waits (--node-wait) until the idle one is ended.
    let (mut b, reply) = User::hello(srv.users, None);
    // It is served as soon as the first node comes back; the other follows.
    assert!(
        reply.nodes.is_some_and(|n| n >= 1),
        "nodes came back from the idle user: {reply:?}"
    );
    let e = idle.expect_error().expect("the idle user is told why");
    assert_eq!(e.code(), Some(ErrorCode::Timeout), "{e}");
    assert_eq!(b.configure(&bench(16, 16, 0)), 0);
    assert_exactly_once(&stream(&mut b, 0..20, 1, 16, 16), 0..20);
}

/// The node checks sizes against its own limit too: a configuration the
/// server could carry but the node cannot is refused by the node with the
/// reason, and the user's session stays usable.
#[test]
fn a_node_refuses_sizes_beyond_its_own_limit() {
    let srv = server(&[]);
    let _n = Proc(
        Command::new(BIN)
            .args(["node", "--server", &srv.nodes.to_string()])
            .args(["--name", "small", "--node-max-message", "65536"])
            .stderr(Stdio::null())
            .spawn()
            .expect("start corefarm node"),
    );
    Observer::new(&srv).wait("the named node", |s| {
        s.nodes.iter().any(|n| n.name.as_deref() == Some("small"))
    });
    let (mut u, reply) = User::hello(srv.users, None);
    assert_eq!(reply.nodes, Some(1));
    u.send(bench(16, 100_000, 0).to_frame().unwrap());
    let mut reasons = Vec::new();
    let status = loop {
        let f = u.recv().expect("a response");
        match f.ty {
            MsgType::Error => reasons.push(ErrorMsg::parse(&f.payload).unwrap().reason),
            MsgType::ConfigurationResponse => {
                break ConfigurationResponse::parse(&f.payload).unwrap().status
            }
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_ne!(status, 0);
    let all = reasons.join("; ");
    assert!(
        all.contains("small") && all.contains("output size"),
        "{all}"
    );
    assert_eq!(u.configure(&bench(16, 16, 0)), 0);
    assert_exactly_once(&stream(&mut u, 0..10, 1, 16, 16), 0..10);
}
