//! Resuming a session after its server was lost, against fake servers that
//! accept several connections in turn (a restart on the same address) or
//! stand at different addresses of a list.

use std::net::TcpListener;
use std::sync::mpsc;
use std::thread::JoinHandle;

use bytes::Bytes;
use corefarm_smp::blocking::FrameReader;
use corefarm_smp::{ConfigurationResponse, Data, ErrorCode, ErrorMsg, MsgType, OutFrame};

use super::tests::{bench, wait_state, Peer};
use super::*;

type Script = Box<dyn FnOnce(Peer) + Send>;

/// A fake server that runs `scripts[k]` on its k-th connection, then stops
/// listening (connections are refused from then on).
fn fake_restarting(scripts: Vec<Script>) -> (String, JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let h = std::thread::spawn(move || {
        for script in scripts {
            let (s, _) = l.accept().unwrap();
            s.set_nodelay(true).unwrap();
            let r = FrameReader::new(s.try_clone().unwrap(), 1 << 24);
            script(Peer { r, w: s });
        }
    });
    (addr, h)
}

fn resuming(timeout: Duration) -> ClientOptions {
    ClientOptions {
        reconnect_timeout: Some(timeout),
        ..Default::default()
    }
}

/// Input `k`: 16 bytes that say which input they are.
fn input(k: u64) -> Bytes {
    let mut v = vec![0u8; 16];
    v[..8].copy_from_slice(&k.to_le_bytes());
    v[8..].copy_from_slice(&(!k).to_le_bytes());
    Bytes::from(v)
}

fn answer(p: &mut Peer, d: &Data) {
    p.send(OutFrame::data(d.id, d.data.clone()).unwrap());
}

/// The first connection takes 8 inputs, answers 2 and breaks; the second
/// gets the configuration again, then the 6 unanswered inputs under their
/// ids before anything new, and answers everything (some twice).
#[test]
fn a_map_survives_a_server_restart_with_every_result_once_and_in_order() {
    let (ids_tx, ids_rx) = mpsc::channel::<Vec<u32>>();
    let (cfg_tx, cfg_rx) = mpsc::channel::<Vec<Configuration>>();
    let (cfg_tx2, ids_tx2) = (cfg_tx.clone(), ids_tx.clone());
    let first: Script = Box::new(move |mut p| {
        p.hello(&["error", "credit"], 1);
        let c = p.configured(0);
        cfg_tx.send(vec![c]).unwrap();
        p.credit(8);
        let got: Vec<Data> = (0..8).map(|_| p.data()).collect();
        ids_tx.send(got.iter().map(|d| d.id).collect()).unwrap();
        answer(&mut p, &got[0]);
        answer(&mut p, &got[1]);
        // Dropped here: the server is gone mid-stream.
    });
    let second: Script = Box::new(move |mut p| {
        p.hello(&["error", "credit"], 1);
        let c = p.configured(0);
        cfg_tx2.send(vec![c]).unwrap();
        p.credit(100);
        let got: Vec<Data> = (0..8).map(|_| p.data()).collect();
        ids_tx2.send(got.iter().map(|d| d.id).collect()).unwrap();
        for d in &got {
            answer(&mut p, d);
        }
        // Late duplicates: one answered here, one answered before the loss.
        answer(&mut p, &got[0]);
        p.send(OutFrame::data(0, input(0)).unwrap());
        assert!(p.at_eof());
    });
    let (addr, srv) = fake_restarting(vec![first, second]);
    let c = Client::connect(&addr, resuming(Duration::from_secs(20))).unwrap();
    c.configure(&bench(16, 16)).unwrap();
    let inputs: Vec<Bytes> = (0..10).map(input).collect();
    let out: Vec<Bytes> = c
        .map(inputs.clone(), 8)
        .collect::<Result<_>>()
        .expect("the map survives the lost server");
    assert_eq!(out, inputs, "every result once, in input order");

    let before = ids_rx.recv().unwrap();
    let after = ids_rx.recv().unwrap();
    assert_eq!(before, (0..8).collect::<Vec<u32>>());
    // The unanswered ones first, under their own ids, then the new ones.
    assert_eq!(after, (2..10).collect::<Vec<u32>>());
    let (c1, c2) = (cfg_rx.recv().unwrap(), cfg_rx.recv().unwrap());
    assert_eq!(c1, c2, "the configuration in force is sent again");
    assert_eq!(c.resumes(), 1);
    // The two late answers came before the client closed (after its last
    // result); they were dropped, not delivered.
    wait_state(&c, "both duplicates are counted", |st| st.duplicates == 2);
    drop(c);
    srv.join().unwrap();
}

/// Plain submissions and `recv` across a lost server: each result once,
/// a result the lost server had sent still arrives, nothing is lost.
#[test]
fn recv_sees_each_result_once_across_a_resume() {
    let first: Script = Box::new(|mut p| {
        p.hello(&["error", "credit"], 1);
        p.configured(0);
        p.credit(4);
        let got: Vec<Data> = (0..3).map(|_| p.data()).collect();
        answer(&mut p, &got[1]);
    });
    let second: Script = Box::new(|mut p| {
        p.hello(&["error", "credit"], 1);
        p.configured(0);
        p.credit(4);
        let got: Vec<Data> = (0..2).map(|_| p.data()).collect();
        assert_eq!(got.iter().map(|d| d.id).collect::<Vec<_>>(), [0, 2]);
        for d in &got {
            answer(&mut p, d);
        }
        assert!(p.at_eof());
    });
    let (addr, srv) = fake_restarting(vec![first, second]);
    let c = Client::connect(&addr, resuming(Duration::from_secs(20))).unwrap();
    c.configure(&bench(16, 16)).unwrap();
    for k in 0..3 {
        assert_eq!(c.submit(input(k)).unwrap(), k as u32);
    }
    let mut ids: Vec<u32> = (0..3)
        .map(|_| {
            let o = c.recv(None).unwrap();
            assert_eq!(o.data, input(u64::from(o.id)));
            o.id
        })
        .collect();
    ids.sort();
    assert_eq!(ids, [0, 1, 2]);
    let e = c.recv(Some(Duration::from_millis(1))).unwrap_err();
    assert!(e.is_timeout(), "nothing more: {e:?}");
    drop(c);
    srv.join().unwrap();
}

/// A server that never comes back: after `reconnect_timeout` every waiter
/// fails with the typed error, which counts the unanswered messages.
#[test]
fn giving_up_says_how_many_messages_were_unanswered() {
    let only: Script = Box::new(|mut p| {
        p.hello(&["error", "credit"], 1);
        p.configured(0);
        p.credit(8);
        let got: Vec<Data> = (0..3).map(|_| p.data()).collect();
        answer(&mut p, &got[0]);
    });
    let (addr, srv) = fake_restarting(vec![only]);
    let c = Client::connect(&addr, resuming(Duration::from_millis(300))).unwrap();
    c.configure(&bench(16, 16)).unwrap();
    let pending: Vec<Pending> = (0..3)
        .map(|k| c.submit_pending(input(k)).unwrap())
        .collect();
    assert_eq!(pending[0].wait(None).unwrap().data, input(0));
    for p in &pending[1..] {
        match p.wait(None).unwrap_err() {
            ClientError::ServerLost {
                unanswered, waited, ..
            } => {
                assert_eq!(unanswered, 2);
                assert!(waited >= Duration::from_millis(300), "{waited:?}");
            }
            e => panic!("expected ServerLost, got {e:?}"),
        }
    }
    let e = c.submit(input(9)).unwrap_err();
    assert!(
        matches!(e, ClientError::ServerLost { unanswered: 2, .. }),
        "{e:?}"
    );
    assert!(!e.retryable());
    assert!(
        e.to_string()
            .contains("2 data message(s) never got their result"),
        "{e}"
    );
    srv.join().unwrap();
}

/// Resuming off: a lost server fails the session at once, as it always did.
#[test]
fn without_resuming_a_lost_server_fails_at_once() {
    let only: Script = Box::new(|mut p| {
        p.hello(&["error", "credit"], 1);
        p.configured(0);
        p.credit(8);
        p.data();
    });
    let (addr, srv) = fake_restarting(vec![only]);
    let opts = ClientOptions {
        reconnect_timeout: None,
        ..Default::default()
    };
    let c = Client::connect(&addr, opts).unwrap();
    c.configure(&bench(16, 16)).unwrap();
    let p = c.submit_pending(input(0)).unwrap();
    let e = p.wait(None).unwrap_err();
    assert!(matches!(e, ClientError::Closed { .. }), "{e:?}");
    assert!(e.retryable());
    srv.join().unwrap();
}

/// Three addresses: the first breaks; the second has no node for the
/// function (its configuration answer says so) and is left; the third
/// takes the session.
#[test]
fn a_server_without_nodes_is_passed_over_for_the_next_address() {
    let a: Script = Box::new(|mut p| {
        p.hello(&["error", "credit"], 1);
        p.configured(0);
        p.credit(8);
        p.data();
        p.data();
    });
    let (b_tx, b_rx) = mpsc::channel::<()>();
    let b: Script = Box::new(move |mut p| {
        p.hello(&["error", "credit"], 0);
        p.expect(MsgType::Configuration);
        p.send(
            ErrorMsg::new(
                ErrorMsg::NO_ID,
                ErrorCode::ConfigurationFailed,
                "no node for this user: no node is connected to the server",
            )
            .to_frame(),
        );
        p.send(
            ConfigurationResponse {
                status: ConfigurationResponse::FAILED,
            }
            .to_frame(),
        );
        assert!(p.at_eof(), "the client leaves a server without nodes");
        b_tx.send(()).unwrap();
    });
    let c_srv: Script = Box::new(|mut p| {
        p.hello(&["error", "credit"], 1);
        p.configured(0);
        p.credit(8);
        let got: Vec<Data> = (0..2).map(|_| p.data()).collect();
        assert_eq!(got.iter().map(|d| d.id).collect::<Vec<_>>(), [0, 1]);
        for d in &got {
            answer(&mut p, d);
        }
        assert!(p.at_eof());
    });
    let (addr_a, srv_a) = fake_restarting(vec![a]);
    let (addr_b, srv_b) = fake_restarting(vec![b]);
    let (addr_c, srv_c) = fake_restarting(vec![c_srv]);
    let list = format!("{addr_a}, {addr_b},{addr_c}");
    let c = Client::connect(&list, resuming(Duration::from_secs(20))).unwrap();
    c.configure(&bench(16, 16)).unwrap();
    let out: Vec<Bytes> = c.map((0..2).map(input), 4).collect::<Result<_>>().unwrap();
    assert_eq!(out, [input(0), input(1)]);
    b_rx.recv().unwrap();
    assert_eq!(c.server_addr(), addr_c);
    assert_eq!(c.addr(), list);
    assert_eq!(c.resumes(), 1);
    drop(c);
    for s in [srv_a, srv_b, srv_c] {
        s.join().unwrap();
    }
}

/// A server without nodes refuses a first configuration at once
/// (no-nodes) to a client that said it can go elsewhere (`moves-on`, sent
/// only with several addresses): the client configures on its next
/// address instead of failing, and the second round through both servers
/// finds the nodes the first missed.
/// A server without nodes answering a configuration at once (`moves-on`).
fn refuse_for_want_of_nodes(p: &mut Peer) {
    p.expect(MsgType::Configuration);
    p.send(ErrorMsg::new(ErrorMsg::NO_ID, ErrorCode::NoNodes, "no node").to_frame());
    p.send(
        ConfigurationResponse {
            status: ConfigurationResponse::FAILED,
        }
        .to_frame(),
    );
}

#[test]
fn a_first_configuration_refused_for_want_of_nodes_moves_on() {
    let no_nodes = |tx: mpsc::Sender<Hello>| -> Script {
        Box::new(move |mut p| {
            let h = p.hello(&["error", "credit", "moves-on"], 0);
            refuse_for_want_of_nodes(&mut p);
            assert!(p.at_eof(), "the client leaves a server without nodes");
            tx.send(h).unwrap();
        })
    };
    let (tx, rx) = mpsc::channel();
    let serves: Script = Box::new(|mut p| {
        p.hello(&["error", "credit", "moves-on"], 1);
        p.configured(0);
        p.credit(8);
        let d = p.data();
        answer(&mut p, &d);
        assert!(p.at_eof());
    });
    // A refuses, B refuses, then A (its nodes back) serves.
    let (addr_a, srv_a) = fake_restarting(vec![no_nodes(tx.clone()), serves]);
    let (addr_b, srv_b) = fake_restarting(vec![no_nodes(tx)]);
    let c = Client::connect(
        &format!("{addr_a},{addr_b}"),
        resuming(Duration::from_secs(20)),
    )
    .unwrap();
    c.configure(&bench(16, 16)).unwrap();
    for h in [rx.recv().unwrap(), rx.recv().unwrap()] {
        assert!(h.has("moves-on"), "{:?}", h.features);
    }
    let out: Vec<Bytes> = c.map([input(7)], 4).collect::<Result<_>>().unwrap();
    assert_eq!(out, [input(7)]);
    assert_eq!(c.server_addr(), addr_a);
    drop(c);
    for s in [srv_a, srv_b] {
        s.join().unwrap();
    }
}

/// With one address the client has nowhere else to go: it does not say
/// `moves-on`, and a failed configuration is the caller's error.
#[test]
fn one_address_does_not_move_on() {
    let only: Script = Box::new(|mut p| {
        let h = p.hello(&["error", "credit"], 0);
        assert!(!h.has("moves-on"), "{:?}", h.features);
        refuse_for_want_of_nodes(&mut p);
    });
    let (addr, srv) = fake_restarting(vec![only]);
    let c = Client::connect(&addr, resuming(Duration::from_secs(20))).unwrap();
    let e = c.configure(&bench(16, 16)).unwrap_err();
    assert!(matches!(e, ClientError::Configuration { .. }), "{e:?}");
    drop(c);
    srv.join().unwrap();
}

/// A server that loses its last node says so per message (no-nodes): a
/// resuming client takes that as its cue to move to the next address,
/// and the message is answered there, not failed.
#[test]
fn a_no_nodes_error_mid_session_moves_the_session_on() {
    let a: Script = Box::new(|mut p| {
        p.hello(&["error", "credit"], 1);
        p.configured(0);
        p.credit(8);
        let d = p.data();
        p.send(ErrorMsg::new(d.id, ErrorCode::NoNodes, "every node failed").to_frame());
        assert!(p.at_eof(), "the client leaves a server without nodes");
    });
    let b: Script = Box::new(|mut p| {
        p.hello(&["error", "credit"], 1);
        p.configured(0);
        p.credit(8);
        let d = p.data();
        assert_eq!(d.id, 0);
        answer(&mut p, &d);
        assert!(p.at_eof());
    });
    let (addr_a, srv_a) = fake_restarting(vec![a]);
    let (addr_b, srv_b) = fake_restarting(vec![b]);
    let c = Client::connect(
        &format!("{addr_a},{addr_b}"),
        resuming(Duration::from_secs(20)),
    )
    .unwrap();
    c.configure(&bench(16, 16)).unwrap();
    let p = c.submit_pending(input(0)).unwrap();
    assert_eq!(p.wait(None).unwrap().data, input(0));
    assert_eq!(c.server_addr(), addr_b);
    drop(c);
    srv_a.join().unwrap();
    srv_b.join().unwrap();
}

/// The first address of a list that does not answer is skipped at connect.
#[test]
fn connect_takes_the_first_address_that_answers() {
    let dead = TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_addr = dead.local_addr().unwrap().to_string();
    drop(dead);
    let b: Script = Box::new(|mut p| {
        p.hello(&["error", "credit"], 1);
        assert!(p.at_eof());
    });
    let (addr_b, srv_b) = fake_restarting(vec![b]);
    let c = Client::connect(&format!("{dead_addr},{addr_b}"), ClientOptions::default()).unwrap();
    assert_eq!(c.server_addr(), addr_b);
    drop(c);
    srv_b.join().unwrap();
    let e = Client::connect(" , ", ClientOptions::default()).unwrap_err();
    assert!(matches!(e, ClientError::InvalidInput(_)), "{e:?}");
}

/// A configuration on its way when the server is lost is sent again on the
/// resumed connection, after the one in force, and its caller gets the
/// new server's answer: the session goes on with the new function.
#[test]
fn a_configuration_under_way_is_sent_again_after_the_one_in_force() {
    let first: Script = Box::new(|mut p| {
        p.hello(&["error", "credit"], 1);
        p.configured(0);
        p.expect(MsgType::Configuration);
        // Lost before answering it.
    });
    let second: Script = Box::new(|mut p| {
        p.hello(&["error", "credit"], 1);
        assert_eq!(p.configured(0), bench(16, 16), "the one in force first");
        assert_eq!(p.configured(0), bench(32, 32), "then the one under way");
        p.credit(1);
        let d = p.data();
        assert_eq!(d.data.len(), 32);
        answer(&mut p, &d);
        assert!(p.at_eof());
    });
    let (addr, srv) = fake_restarting(vec![first, second]);
    let c = Client::connect(&addr, resuming(Duration::from_secs(20))).unwrap();
    c.configure(&bench(16, 16)).unwrap();
    c.configure(&bench(32, 32)).unwrap();
    assert_eq!(c.sizes(), Some((32, 32)));
    let data = Bytes::from(vec![7u8; 32]);
    assert_eq!(
        c.submit_pending(data.clone())
            .unwrap()
            .wait(None)
            .unwrap()
            .data,
        data
    );
    assert_eq!(c.resumes(), 1);
    drop(c);
    srv.join().unwrap();
}

/// A status request lost with its server fails at once, retryably (an
/// observer asks again instead of being held); asked again once the
/// session is resumed, it is answered by the new server.
#[test]
fn a_status_request_lost_with_the_server_fails_retryably() {
    let first: Script = Box::new(|mut p| {
        p.hello(&["error", "credit", "status"], 0);
        p.expect(MsgType::StatusRequest);
    });
    let second: Script = Box::new(|mut p| {
        p.hello(&["error", "credit", "status"], 0);
        p.expect(MsgType::StatusRequest);
        p.send(
            corefarm_smp::ClusterStatus {
                policy: "after".into(),
                ..Default::default()
            }
            .to_frame(),
        );
        assert!(p.at_eof());
    });
    let (addr, srv) = fake_restarting(vec![first, second]);
    let c = Client::connect(&addr, resuming(Duration::from_secs(20))).unwrap();
    let e = c.status().unwrap_err();
    assert!(
        matches!(e, ClientError::Closed { .. }) && e.retryable(),
        "{e:?}"
    );
    wait_state(&c, "the session is resumed", |st| {
        !st.resuming && st.link == 1
    });
    assert_eq!(c.status().unwrap().policy, "after");
    drop(c);
    srv.join().unwrap();
}
