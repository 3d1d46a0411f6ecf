//! Integration tests of the server and node managers as real processes on
//! 127.0.0.1 with OS-assigned ports: normal sessions, reconfiguration,
//! concurrent users, node failures and a node joining mid-session. Tests
//! wait on the server's own account of itself (the status
//! extension, asked by an observer that takes no node), never on sleeps or
//! log text. The hostile cases are in `hostile.rs`.

use std::collections::HashMap;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use corefarm_smp::blocking::{write_frame, FrameReader};
use corefarm_smp::{
    hello::features, ConfigurationResponse, Data, ErrorCode, MsgType, NodeState, OutFrame,
};

use crate::cluster_harness;
use crate::support;
use cluster_harness::*;
use support::{Proc, BIN};

#[test]
fn user_and_nodes_across_a_reconfiguration() {
    let srv = server(&[]);
    let _n = nodes(&srv, 3);
    let (mut u, reply) = User::hello(srv.users, Some(3));
    assert_eq!(reply.nodes, Some(3));
    assert!(reply.has(features::CREDIT));
    assert_eq!(u.configure(&bench(64, 32, 0)), 0);
    let seen = stream(&mut u, 0..300, 2, 64, 32);
    assert_exactly_once(&seen, 0..300);
    // New configuration with different sizes: old results all arrived, new ones use the new sizes.
    assert_eq!(u.configure(&bench(16, 48, 10)), 0);
    let seen = stream(&mut u, 1000..1100, 3, 16, 48);
    assert_exactly_once(&seen, 1000..1100);
}

#[test]
fn seed_format_user_without_hello() {
    let srv = server(&[]);
    let _n = nodes(&srv, 2);
    let mut u = User::connect(srv.users);
    assert_eq!(u.configure(&bench(32, 32, 0)), 0);
    // No credit without hello: the user just writes; TCP paces it.
    let mut w = u.w.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        for id in 0..200u32 {
            write_frame(&mut w, OutFrame::data(id, payload(id, 1, 32)).unwrap()).unwrap();
        }
    });
    let mut seen = HashMap::new();
    for _ in 0..200 {
        let f = u.recv().unwrap();
        assert_eq!(
            f.ty,
            MsgType::Data,
            "a seed user only ever receives data after configuring"
        );
        let d = Data::parse(f.payload).unwrap();
        check_result(&d, 1, 32, None);
        *seen.entry(d.id).or_insert(0) += 1;
    }
    sender.join().unwrap();
    assert_exactly_once(&seen, 0..200);
}

#[test]
fn two_users_at_once_share_the_pool() {
    let srv = server(&[]);
    let _n = nodes(&srv, 4);
    let (mut a, ra) = User::hello(srv.users, Some(2));
    let (mut b, rb) = User::hello(srv.users, Some(2));
    assert_eq!((ra.nodes, rb.nodes), (Some(2), Some(2)));
    assert_eq!(a.configure(&bench(32, 16, 50)), 0);
    assert_eq!(b.configure(&bench(48, 64, 0)), 0);
    let ta = std::thread::spawn(move || stream(&mut a, 0..200, 1, 32, 16));
    let tb = std::thread::spawn(move || stream(&mut b, 0..400, 2, 48, 64));
    assert_exactly_once(&ta.join().unwrap(), 0..200);
    assert_exactly_once(&tb.join().unwrap(), 0..400);
}

#[test]
fn nodes_return_to_the_pool_when_a_user_leaves() {
    let srv = server(&[]);
    let _n = nodes(&srv, 2);
    Observer::new(&srv).wait_free(2);
    {
        let (mut a, ra) = User::hello(srv.users, Some(2));
        assert_eq!(ra.nodes, Some(2));
        assert_eq!(a.configure(&bench(16, 16, 0)), 0);
        assert_exactly_once(&stream(&mut a, 0..10, 1, 16, 16), 0..10);
    }
    // The departed user's nodes go back to the pool; the server says when.
    Observer::new(&srv).wait_free(2);
    let (mut b, rb) = User::hello(srv.users, None);
    assert_eq!(
        rb.nodes,
        Some(2),
        "both nodes are free again after the first user left"
    );
    assert_eq!(b.configure(&bench(16, 16, 0)), 0);
    assert_exactly_once(&stream(&mut b, 0..10, 1, 16, 16), 0..10);
}

#[test]
fn node_killed_mid_stream_every_result_arrives_once() {
    let srv = server(&[]);
    let _a = nodes(&srv, 1);
    let _b = nodes(&srv, 1);
    let mut victim = nodes(&srv, 1);
    let (mut u, reply) = User::hello(srv.users, Some(3));
    assert_eq!(reply.nodes, Some(3));
    assert_eq!(u.configure(&bench(64, 64, 2000)), 0);
    let mut seen = HashMap::new();
    let mut got = 0;
    let total = 300u32;
    for id in 0..total {
        if id == 60 {
            victim.0.kill().unwrap();
        }
        u.wait_credit_or_results(&mut seen, &mut got, 1, 64);
        u.send(OutFrame::data(id, payload(id, 1, 64)).unwrap());
    }
    while got < total as usize {
        let f = u.recv().expect("result after node loss");
        u.take_result(f, &mut seen, &mut got, 1, 64);
    }
    assert_exactly_once(&seen, 0..total);
}

/// A node written against the byte format that misbehaves in a chosen way
/// after configuring. Runs in a thread; returns when the server closes it.
fn fake_node(addr: SocketAddr, behaviour: &'static str) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let s = TcpStream::connect(addr).unwrap();
        let mut w = s.try_clone().unwrap();
        let mut r = FrameReader::new(s, 1 << 30);
        while let Ok(Some(f)) = r.read_frame() {
            match f.ty {
                MsgType::Configuration if behaviour == "silent" => {}
                MsgType::Configuration => {
                    write_frame(&mut w, ConfigurationResponse { status: 0 }.to_frame()).unwrap();
                }
                MsgType::Data => {
                    let d = Data::parse(f.payload).unwrap();
                    let r = match behaviour {
                        "short" => write_frame(
                            &mut w,
                            OutFrame::data(d.id, Bytes::from(vec![0u8; 3])).unwrap(),
                        ),
                        "garbage" => w.write_all(&[0x77; 64]),
                        "wrong-id" => write_frame(
                            &mut w,
                            OutFrame::data(d.id ^ 0x5555, Bytes::from(vec![0u8; 64])).unwrap(),
                        ),
                        _ => Ok(()),
                    };
                    if r.is_err() {
                        return;
                    }
                }
                _ => {}
            }
        }
    })
}

#[test]
fn misbehaving_nodes_are_dropped_and_their_work_redispatched() {
    for behaviour in ["short", "garbage", "wrong-id"] {
        let srv = server(&[]);
        let bad = fake_node(srv.nodes, behaviour);
        let _good = nodes(&srv, 1);
        let (mut u, reply) = User::hello(srv.users, Some(2));
        assert_eq!(reply.nodes, Some(2), "{behaviour}");
        assert_eq!(u.configure(&bench(64, 64, 0)), 0);
        let seen = stream(&mut u, 0..100, 1, 64, 64);
        assert_exactly_once(&seen, 0..100);
        bad.join().unwrap();
    }
}

#[test]
fn node_without_configuration_response_times_out_and_is_dropped() {
    let srv = server(&["--config-timeout", "1"]);
    let silent = fake_node(srv.nodes, "silent");
    let _good = nodes(&srv, 1);
    let (mut u, reply) = User::hello(srv.users, Some(2));
    assert_eq!(reply.nodes, Some(2));
    let t = Instant::now();
    assert_eq!(
        u.configure(&bench(16, 16, 0)),
        0,
        "one node configured is enough"
    );
    assert!(
        t.elapsed() >= Duration::from_millis(900),
        "the server waited for the silent node"
    );
    assert_exactly_once(&stream(&mut u, 0..20, 1, 16, 16), 0..20);
    drop(u);
    silent.join().unwrap();
}

#[test]
fn no_node_left_gives_the_user_an_error_not_a_hang() {
    let srv = server(&[]);
    let bad = fake_node(srv.nodes, "short");
    let (mut u, reply) = User::hello(srv.users, Some(1));
    assert_eq!(reply.nodes, Some(1));
    assert_eq!(u.configure(&bench(16, 16, 0)), 0);
    u.wait_credit();
    u.send(OutFrame::data(5, payload(5, 1, 16)).unwrap());
    let e = u.expect_error().expect("an error message before the close");
    assert_eq!(e.code(), Some(ErrorCode::NoNodes), "{e}");
    assert_eq!(e.id, 5, "the pending input is named");
    bad.join().unwrap();
}

#[test]
fn a_node_joining_mid_session_is_configured_and_takes_over() {
    let srv = server(&[]);
    let mut first = nodes(&srv, 1);
    Observer::new(&srv).wait_free(1);
    let (mut u, reply) = User::hello(srv.users, None);
    assert_eq!(reply.nodes, Some(1));
    assert_eq!(u.configure(&bench(32, 32, 100)), 0);
    assert_exactly_once(&stream(&mut u, 0..20, 1, 32, 32), 0..20);
    // A second node connects while the user is routing: the server configures
    // it with the user's configuration and adds it to the rotation.
    let _second = nodes(&srv, 1);
    Observer::new(&srv).wait("the newcomer configured", |s| {
        s.count_nodes(NodeState::Ready) == 2
    });
    // With the first node gone, only the newcomer can produce these results.
    first.0.kill().unwrap();
    let _ = first.0.wait();
    assert_exactly_once(&stream(&mut u, 100..160, 2, 32, 32), 100..160);
}

#[test]
fn a_tight_memory_guard_slows_the_node_but_loses_nothing() {
    let srv = server(&[]);
    // 100 KB of budget for 64 KiB inputs + 64 KiB outputs: at most one job at
    // a time fits (an oversize job takes the whole budget and runs alone).
    let _n = Proc(
        Command::new(BIN)
            .args([
                "node",
                "--server",
                &srv.nodes.to_string(),
                "--memory-limit",
                "100000",
            ])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let (mut u, _) = User::hello(srv.users, Some(1));
    assert_eq!(u.configure(&bench(64 * 1024, 64 * 1024, 0)), 0);
    assert_exactly_once(&stream(&mut u, 0..200, 1, 64 * 1024, 64 * 1024), 0..200);
}

/// A server with chunks on its node link (1 KiB) serving a node
/// that negotiates them and a seed-format node (`--no-hello`) at once:
/// messages and results of 4 KiB and 8 KiB travel as chunks to and from the
/// first, whole to and from the second, and every result is correct, once.
#[test]
fn chunking_and_seed_format_nodes_side_by_side() {
    let srv = server(&["--node-chunk-size", "1024"]);
    let spawn = |extra: &[&str]| {
        Proc(
            Command::new(BIN)
                .args(["node", "--server", &srv.nodes.to_string()])
                .args(extra)
                .stderr(Stdio::null())
                .spawn()
                .expect("start corefarm node"),
        )
    };
    let _chunky = spawn(&["--name", "chunky"]);
    let _seed = spawn(&["--no-hello"]);
    let mut obs = Observer::new(&srv);
    obs.wait_free(2);
    let (mut u, reply) = User::hello(srv.users, Some(2));
    assert_eq!(reply.nodes, Some(2));
    assert_eq!(u.configure(&bench(1024, 2048, 200)), 0);
    let seen = stream(&mut u, 0..200, 4, 1024, 2048);
    assert_exactly_once(&seen, 0..200);
    let s = obs.get();
    assert_eq!(s.nodes.len(), 2);
    for n in &s.nodes {
        assert!(n.results > 0, "node {:?} served nothing: {s:?}", n.name);
    }
}
