//! Results routed by id (one client, many threads), `Pending` handles, the
//! misuse errors and the status request, against in-test fake servers.

use std::sync::mpsc;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::Duration;

use bytes::Bytes;
use corefarm_smp::{ClusterStatus, Data, ErrorCode, ErrorMsg, MsgType, OutFrame};

use crate::tests::{bench, fake, legacy, wait_state, Peer};
use crate::{Client, ClientError, ClientOptions, Output, Pending};

/// A node that echoes every data message, answering whatever has arrived
/// in reverse order (so results come back out of order whenever several
/// are in flight) and granting one credit per answer.
fn reordering_echo(p: Peer, credit: u32, total: usize) {
    let Peer { mut r, mut w } = p;
    let (tx, rx) = mpsc::channel::<Data>();
    let reader = thread::spawn(move || {
        for _ in 0..total {
            let f = r.read_frame().expect("read").expect("frame");
            assert_eq!(f.ty, MsgType::Data);
            tx.send(Data::parse(f.payload).unwrap()).unwrap();
        }
        r
    });
    let send = |w: &mut std::net::TcpStream, f: OutFrame| {
        corefarm_smp::blocking::write_frame(w, f).expect("write")
    };
    send(&mut w, corefarm_smp::Credit { messages: credit }.to_frame());
    let mut answered = 0;
    while answered < total {
        let mut batch = vec![rx.recv().expect("data")];
        batch.extend(rx.try_iter());
        for d in batch.into_iter().rev() {
            send(&mut w, OutFrame::data(d.id, d.data).unwrap());
            send(&mut w, corefarm_smp::Credit { messages: 1 }.to_frame());
            answered += 1;
        }
    }
    reader.join().unwrap();
}

fn tagged(thread: u8, k: u32) -> Bytes {
    let mut v = vec![thread; 16];
    v[..4].copy_from_slice(&k.to_le_bytes());
    Bytes::from(v)
}

#[test]
fn four_threads_map_on_one_client_while_a_fifth_uses_recv() {
    const PER_THREAD: u32 = 300;
    const MAPPERS: u8 = 4;
    let total = (MAPPERS as usize + 1) * PER_THREAD as usize;
    let (addr, srv) = fake(move |mut p| {
        p.hello(&["error", "credit"], 1);
        p.configured(0);
        reordering_echo(p, 8, total);
    });
    let c = Arc::new(Client::connect(&addr, ClientOptions::default()).unwrap());
    c.configure(&bench(16, 16)).unwrap();
    let mut threads = Vec::new();
    for t in 0..MAPPERS {
        let c = c.clone();
        threads.push(thread::spawn(move || {
            let inputs = (0..PER_THREAD).map(|k| tagged(t, k));
            let out: Vec<Bytes> = c.map(inputs, 4).collect::<Result<_, _>>().unwrap();
            assert_eq!(out.len(), PER_THREAD as usize);
            for (k, b) in out.iter().enumerate() {
                assert_eq!(b, &tagged(t, k as u32), "thread {t} result {k}");
            }
        }));
    }
    // A plain submit + recv loop alongside: it gets its own results only.
    let plain = {
        let c = c.clone();
        thread::spawn(move || {
            for k in 0..PER_THREAD {
                let id = c.submit(tagged(0xEE, k)).unwrap();
                let o = c.recv(None).unwrap();
                assert_eq!((o.id, o.data), (id, tagged(0xEE, k)));
            }
        })
    };
    for t in threads {
        t.join().unwrap();
    }
    plain.join().unwrap();
    srv.join().unwrap();
}

#[test]
fn recv_with_only_pending_results_in_flight_is_a_clear_error() {
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (addr, srv) = fake(move |mut p| {
        p.configured(0);
        let d = p.data();
        go_rx.recv().unwrap();
        p.send(OutFrame::data(d.id, d.data).unwrap());
        let d = p.data();
        p.send(OutFrame::data(d.id, d.data).unwrap());
    });
    let c = Client::connect(&addr, legacy()).unwrap();
    c.configure(&bench(16, 16)).unwrap();
    let pending = c.submit_pending(Bytes::from_static(&[7; 16])).unwrap();
    let e = c.recv(None).unwrap_err();
    assert!(matches!(e, ClientError::Usage(_)), "{e:?}");
    assert!(e.to_string().contains("map()"), "{e}");
    // A caller-chosen id that a Pending waits for is refused.
    let e = c
        .submit_with_id(pending.id(), Bytes::from_static(&[0; 16]))
        .unwrap_err();
    assert!(matches!(e, ClientError::Usage(_)), "{e:?}");
    go_tx.send(()).unwrap();
    assert_eq!(pending.wait(None).unwrap().data[..], [7; 16]);
    // Taken once; asking again is a misuse, not a hang.
    assert!(matches!(pending.wait(None), Err(ClientError::Usage(_))));
    // With nothing in flight recv waits (another thread may submit).
    let id = c.submit(Bytes::from_static(&[8; 16])).unwrap();
    assert_eq!(c.recv(None).unwrap().id, id);
    srv.join().unwrap();
}

/// The fake server of the two tests below: two data messages (a dropped
/// `Pending`'s, then a plain one), answered in order once `go` says so.
fn abandoned_then_plain(mut p: Peer, go: mpsc::Receiver<()>) {
    p.configured(0);
    let abandoned = p.data();
    let plain = p.data();
    go.recv().unwrap();
    p.send(OutFrame::data(abandoned.id, abandoned.data).unwrap());
    p.send(OutFrame::data(plain.id, plain.data).unwrap());
}

#[test]
fn a_dropped_pending_result_is_discarded_not_given_to_recv() {
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (addr, srv) = fake(move |p| abandoned_then_plain(p, go_rx));
    let c = Client::connect(&addr, legacy()).unwrap();
    c.configure(&bench(16, 16)).unwrap();
    drop(c.submit_pending(Bytes::from_static(&[1; 16])).unwrap());
    let id = c.submit(Bytes::from_static(&[2; 16])).unwrap();
    go_tx.send(()).unwrap();
    let o = c.recv(None).unwrap();
    assert_eq!((o.id, &o.data[..]), (id, &[2u8; 16][..]));
    srv.join().unwrap();
}

#[test]
fn recv_waits_for_another_thread_when_only_abandoned_results_are_in_flight() {
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (addr, srv) = fake(move |p| abandoned_then_plain(p, go_rx));
    let c = Arc::new(Client::connect(&addr, legacy()).unwrap());
    c.configure(&bench(16, 16)).unwrap();
    // Its result is still in flight, but nobody waits for it any more: a
    // receiver started before its sender must wait, not be told that the
    // messages in flight belong to a Pending.
    drop(c.submit_pending(Bytes::from_static(&[1; 16])).unwrap());
    let rc = c.clone();
    let receiver = thread::spawn(move || rc.recv(None));
    assert!(
        c.wait_for_blocked_receivers(1, Duration::from_secs(20)),
        "recv did not wait: {:?}",
        receiver.is_finished().then(|| receiver.join().unwrap())
    );
    let id = c.submit(Bytes::from_static(&[2; 16])).unwrap();
    go_tx.send(()).unwrap();
    let o = receiver.join().unwrap().unwrap();
    assert_eq!((o.id, &o.data[..]), (id, &[2u8; 16][..]));
    srv.join().unwrap();
}

/// Polls a future on this thread, parking between wake-ups.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    struct Unpark(thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        thread::park();
    }
}

#[test]
fn pending_is_a_future_a_callback_and_gets_its_server_error() {
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (addr, srv) = fake(move |mut p| {
        p.hello(&["error", "credit"], 1);
        p.configured(0);
        p.credit(3);
        let a = p.data();
        let b = p.data();
        let bad = p.data();
        go_rx.recv().unwrap();
        p.send(ErrorMsg::new(bad.id, ErrorCode::CoreFailure, "core 0 stuck").to_frame());
        p.send(OutFrame::data(b.id, b.data).unwrap());
        p.send(OutFrame::data(a.id, a.data).unwrap());
    });
    let c = Client::connect(&addr, ClientOptions::default()).unwrap();
    c.configure(&bench(16, 16)).unwrap();
    let a = c.submit_pending(Bytes::from_static(&[1; 16])).unwrap();
    let b = c.submit_pending(Bytes::from_static(&[2; 16])).unwrap();
    let bad = c.submit_pending(Bytes::from_static(&[3; 16])).unwrap();
    assert!(!a.is_ready() && a.try_take().is_none());
    let (cb_tx, cb_rx) = mpsc::channel();
    b.on_ready(move || cb_tx.send(()).unwrap());
    go_tx.send(()).unwrap();
    let e = bad.wait(Some(Duration::from_secs(20))).unwrap_err();
    assert_eq!(e.server_error().unwrap().reason, "core 0 stuck");
    cb_rx.recv().unwrap();
    assert_eq!(b.try_take().unwrap().unwrap().data[..], [2; 16]);
    let out: Output = block_on(a).unwrap();
    assert_eq!(out.data[..], [1; 16]);
    srv.join().unwrap();
}

#[test]
fn a_lost_connection_fails_every_pending_result() {
    let (addr, srv) = fake(|mut p| {
        p.configured(0);
        p.data();
        p.data();
    });
    let c = Client::connect(&addr, legacy()).unwrap();
    c.configure(&bench(16, 16)).unwrap();
    let ps: Vec<Pending> = (0..2)
        .map(|_| c.submit_pending(Bytes::from_static(&[0; 16])).unwrap())
        .collect();
    srv.join().unwrap();
    for p in ps {
        let e = p.wait(None).unwrap_err();
        assert!(
            e.to_string().contains("server closed the connection"),
            "{e}"
        );
    }
    // Now (the connection is gone) a map fails at once instead of hanging.
    let mut m = c.map([Bytes::from_static(&[0; 16])], 1);
    assert!(m.next().unwrap().is_err());
    assert!(m.next().is_none());
}

fn status_named(policy: &str) -> ClusterStatus {
    ClusterStatus {
        you: Some(1),
        policy: policy.into(),
        ..Default::default()
    }
}

#[test]
fn status_is_asked_for_and_a_late_answer_is_not_taken_for_the_next() {
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (addr, srv) = fake(move |mut p| {
        p.hello(&["error", "credit", "status"], 1);
        p.expect(MsgType::StatusRequest);
        p.send(status_named("first").to_frame());
        p.expect(MsgType::StatusRequest);
        // The client gives up on this one before it is answered.
        go_rx.recv().unwrap();
        p.expect(MsgType::StatusRequest);
        p.send(status_named("late").to_frame());
        p.send(status_named("third").to_frame());
        // An answer nobody asked for breaks the protocol.
        p.send(status_named("unasked").to_frame());
        assert!(p.at_eof());
    });
    let c = Client::connect(&addr, ClientOptions::default()).unwrap();
    assert!(c.has_status());
    let s = c.status().unwrap();
    assert_eq!((s.you, s.policy.as_str()), (Some(1), "first"));
    // Short only for the request the server holds back.
    c.set_io_timeout(Some(Duration::from_millis(200))).unwrap();
    assert!(c.status().unwrap_err().is_timeout());
    c.set_io_timeout(Some(Duration::from_secs(20))).unwrap();
    go_tx.send(()).unwrap();
    assert_eq!(c.status().unwrap().policy, "third");
    let e = c.recv(None).unwrap_err();
    assert!(e.to_string().contains("did not ask for"), "{e}");
    drop(c);
    srv.join().unwrap();
}

#[test]
fn status_needs_the_negotiated_feature() {
    let (addr, srv) = fake(|mut p| {
        p.hello(&["error", "credit"], 1);
        assert!(p.at_eof(), "no status request may be sent");
    });
    let c = Client::connect(&addr, ClientOptions::default()).unwrap();
    assert!(!c.has_status());
    let e = c.status().unwrap_err();
    assert!(matches!(e, ClientError::Unsupported(_)), "{e:?}");
    assert!(e.to_string().contains("status"), "{e}");
    drop(c);
    srv.join().unwrap();

    let (addr, srv) = fake(|mut p| {
        p.configured(0);
    });
    let c = Client::connect(&addr, legacy()).unwrap();
    assert!(matches!(c.status(), Err(ClientError::Unsupported(_))));
    c.configure(&bench(16, 16)).unwrap();
    srv.join().unwrap();
}

#[test]
fn a_blocked_submit_is_visible_to_waiting_tests() {
    // The signal the other tests rely on: a credit wait is observable.
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (addr, srv) = fake(move |mut p| {
        p.hello(&["error", "credit"], 1);
        p.configured(0);
        go_rx.recv().unwrap();
        p.credit(1);
        p.data();
    });
    let c = Arc::new(Client::connect(&addr, ClientOptions::default()).unwrap());
    c.configure(&bench(16, 16)).unwrap();
    let c2 = c.clone();
    let t = thread::spawn(move || {
        c2.submit_pending(Bytes::from_static(&[0; 16]))
            .map(|p| p.id())
    });
    wait_state(&c, "the submit waits for credit", |st| {
        st.credit_waiters == 1
    });
    go_tx.send(()).unwrap();
    assert_eq!(t.join().unwrap().unwrap(), 0);
    srv.join().unwrap();
}
