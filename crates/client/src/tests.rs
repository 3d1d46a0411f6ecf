//! Client tests against an in-test fake server: a thread that accepts one
//! connection on 127.0.0.1:0 and runs a script of SMP reads and writes.

use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Instant;

use bytes::Bytes;
use corefarm_smp::blocking::{write_frame, FrameReader};
use corefarm_smp::{
    Configuration, ConfigurationResponse, Credit, Data, ErrorCode, ErrorMsg, Frame, Hello, MsgType,
    OutFrame,
};

use super::*;
use crate::reader::State;

/// Blocks until the client's state satisfies `cond` (an explicit signal:
/// every change the tests wait for notifies the state condvar).
pub(crate) fn wait_state(c: &Client, what: &str, cond: impl Fn(&State) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut st = c.inner.shared.lock();
    while !cond(&st) {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "timed out waiting until {what}");
        st = c
            .inner
            .shared
            .cond
            .wait_timeout(st, left)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

pub(crate) struct Peer {
    pub r: FrameReader<TcpStream>,
    pub w: TcpStream,
}

impl Peer {
    pub fn read(&mut self) -> Frame {
        self.r.read_frame().expect("read").expect("frame, not EOF")
    }
    pub fn expect(&mut self, ty: MsgType) -> Frame {
        let f = self.read();
        assert_eq!(f.ty, ty, "fake server expected {ty:?}");
        f
    }
    pub fn send(&mut self, f: OutFrame) {
        write_frame(&mut self.w, f).expect("write");
    }
    /// Answers a user hello with the given features.
    pub fn hello(&mut self, features: &[&str], nodes: u32) -> Hello {
        let h = Hello::decode(&self.expect(MsgType::Hello).payload).unwrap();
        let mut reply = Hello::new("server");
        reply.features = features.iter().map(|s| s.to_string()).collect();
        reply.nodes = Some(nodes);
        reply.max_message = Some(1 << 20);
        self.send(reply.to_frame());
        h
    }
    pub fn configured(&mut self, status: u8) -> Configuration {
        let c = Configuration::parse(self.expect(MsgType::Configuration).payload).unwrap();
        self.send(ConfigurationResponse { status }.to_frame());
        c
    }
    pub fn data(&mut self) -> Data {
        Data::parse(self.expect(MsgType::Data).payload).unwrap()
    }
    pub fn credit(&mut self, n: u32) {
        self.send(Credit { messages: n }.to_frame());
    }
    /// True if the client closed its side (read returns end of stream).
    pub fn at_eof(&mut self) -> bool {
        matches!(self.r.read_frame(), Ok(None) | Err(_))
    }
}

/// Starts a fake server running `script` on the first connection; returns
/// its address and the thread (join it to see the script's assertions).
pub(crate) fn fake<F>(script: F) -> (String, JoinHandle<()>)
where
    F: FnOnce(Peer) + Send + 'static,
{
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let h = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        // Small frames answered one by one: no Nagle delays.
        s.set_nodelay(true).unwrap();
        let r = FrameReader::new(s.try_clone().unwrap(), 1 << 24);
        script(Peer { r, w: s });
    });
    (addr, h)
}

pub(crate) fn legacy() -> ClientOptions {
    ClientOptions {
        legacy: true,
        ..Default::default()
    }
}

pub(crate) fn bench(input: u32, output: u32) -> Configuration {
    BenchmarkConfig {
        input_size: input,
        output_size: output,
        delay_us: 0,
    }
    .to_configuration()
}

/// Echo loop of a benchmarking node: output = first `out` bytes per input.
pub(crate) fn echo(p: &mut Peer, n: usize, input: usize, out: usize) {
    for _ in 0..n {
        let d = p.data();
        let mut v = Vec::new();
        for chunk in d.data.chunks(input) {
            v.extend_from_slice(&chunk[..out]);
        }
        p.send(OutFrame::data(d.id, Bytes::from(v)).unwrap());
    }
}

#[test]
fn legacy_session_is_seed_bytes_only() {
    let (addr, srv) = fake(|mut p| {
        // The very first message must be the configuration: no hello.
        let c = p.configured(0);
        assert_eq!(c.benchmark().unwrap().input_size, 32);
        echo(&mut p, 3, 32, 16);
        assert!(p.at_eof());
    });
    let c = Client::connect(&addr, legacy()).unwrap();
    assert_eq!(c.nodes(), None);
    assert!(!c.credit_mode());
    c.configure(&bench(32, 16)).unwrap();
    let mut ids = Vec::new();
    for k in 1..=3u8 {
        ids.push(c.submit(Bytes::from(vec![k; 32 * k as usize])).unwrap());
    }
    assert_eq!(ids, [0, 1, 2]);
    for k in 1..=3u32 {
        let o = c.recv(None).unwrap();
        assert_eq!(o.id, k - 1);
        assert_eq!(o.count, k);
        assert_eq!(o.data.len(), 16 * k as usize);
        assert!(o.data.iter().all(|&b| b == k as u8));
    }
    drop(c);
    srv.join().unwrap();
}

#[test]
fn hello_negotiates_nodes_and_features() {
    let (addr, srv) = fake(|mut p| {
        let h = p.hello(&["error"], 3);
        assert_eq!(h.role, "user");
        assert_eq!(h.nodes, Some(2));
        assert_eq!(h.name.as_deref(), Some("unit-test"));
        assert!(h.has("credit") && h.has("error") && h.has("status"));
        p.configured(0);
        // No credit feature agreed: data may flow without credit.
        echo(&mut p, 1, 16, 16);
    });
    let opts = ClientOptions {
        nodes: Some(2),
        name: Some("unit-test".into()),
        ..Default::default()
    };
    let c = Client::connect(&addr, opts).unwrap();
    assert_eq!(c.nodes(), Some(3));
    assert!(!c.credit_mode());
    c.configure(&bench(16, 16)).unwrap();
    let id = c.submit_slice(&[9u8; 16]).unwrap();
    assert_eq!(c.recv(None).unwrap().id, id);
    srv.join().unwrap();
}

#[test]
fn submit_waits_for_credit() {
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (addr, srv) = fake(move |mut p| {
        p.hello(&["error", "credit"], 1);
        p.configured(0);
        p.credit(2);
        p.data();
        p.data();
        // The test saw the third submit blocked in its credit wait.
        go_rx.recv().unwrap();
        p.credit(1);
        assert_eq!(p.data().id, 2);
    });
    let c = Arc::new(Client::connect(&addr, ClientOptions::default()).unwrap());
    assert!(c.credit_mode());
    c.configure(&bench(16, 16)).unwrap();
    for _ in 0..2 {
        c.submit(Bytes::from_static(&[1; 16])).unwrap();
    }
    let c2 = c.clone();
    let third = std::thread::spawn(move || c2.submit(Bytes::from_static(&[1; 16])));
    wait_state(&c, "the third submit waits for credit", |st| {
        st.credit_waiters == 1 && st.credit == 0
    });
    assert!(!third.is_finished(), "third submit returned without credit");
    go_tx.send(()).unwrap();
    assert_eq!(third.join().unwrap().unwrap(), 2);
    srv.join().unwrap();
}

#[test]
fn credit_wait_times_out_with_a_clear_error() {
    let (addr, srv) = fake(|mut p| {
        p.hello(&["error", "credit"], 1);
        p.configured(0);
        assert!(p.at_eof());
    });
    let c = Client::connect(&addr, ClientOptions::default()).unwrap();
    c.configure(&bench(16, 16)).unwrap();
    // Short only for the wait that must run out: no credit ever comes.
    c.set_io_timeout(Some(Duration::from_millis(100))).unwrap();
    let e = c.submit(Bytes::from_static(&[0; 16])).unwrap_err();
    assert!(e.is_timeout(), "{e}");
    assert!(e.to_string().contains("credit"), "{e}");
    drop(c);
    srv.join().unwrap();
}

#[test]
fn configuration_failure_carries_the_servers_reason() {
    let (addr, srv) = fake(|mut p| {
        p.hello(&["error", "credit"], 1);
        p.expect(MsgType::Configuration);
        p.send(
            ErrorMsg::new(
                ErrorMsg::NO_ID,
                ErrorCode::ConfigurationFailed,
                "bitstream rejected by every node",
            )
            .to_frame(),
        );
        p.send(ConfigurationResponse { status: 1 }.to_frame());
        // A second try succeeds; the connection stays usable.
        p.configured(0);
    });
    let c = Client::connect(&addr, ClientOptions::default()).unwrap();
    let e = c.configure(&bench(16, 16)).unwrap_err();
    match &e {
        ClientError::Configuration { status, reason } => {
            assert_eq!(*status, Some(1));
            assert!(reason.as_deref().unwrap().contains("bitstream rejected"));
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(
        e.to_string().contains("bitstream rejected by every node"),
        "{e}"
    );
    c.configure(&bench(16, 16)).unwrap();
    srv.join().unwrap();
}

#[test]
fn a_configuration_whose_wait_timed_out_does_not_answer_the_next() {
    // The answer to A comes only after B was sent (A's caller gave up):
    // B's caller gets B's answer, with B's reason, and the session goes on.
    let (addr, srv) = fake(|mut p| {
        p.hello(&["error", "credit"], 1);
        let a = p.expect(MsgType::Configuration);
        let b = p.expect(MsgType::Configuration);
        assert_ne!(a.payload, b.payload);
        p.send(
            ErrorMsg::new(ErrorMsg::NO_ID, ErrorCode::ConfigurationFailed, "about A").to_frame(),
        );
        p.send(ConfigurationResponse { status: 0 }.to_frame());
        p.send(
            ErrorMsg::new(ErrorMsg::NO_ID, ErrorCode::ConfigurationFailed, "about B").to_frame(),
        );
        p.send(ConfigurationResponse { status: 1 }.to_frame());
        p.configured(0);
    });
    let c = Client::connect(&addr, ClientOptions::default()).unwrap();
    // A's answer cannot come before B is sent: A's wait runs out however
    // fast the server is. The waits that must succeed get a bound no
    // scheduling delay reaches.
    c.set_io_timeout(Some(Duration::from_millis(50))).unwrap();
    let e = c.configure(&bench(16, 16)).unwrap_err();
    assert!(matches!(e, ClientError::Timeout { .. }), "{e:?}");
    c.set_io_timeout(Some(Duration::from_secs(20))).unwrap();
    match c.configure(&bench(32, 32)).unwrap_err() {
        ClientError::Configuration { status, reason } => {
            assert_eq!(status, Some(1));
            let reason = reason.unwrap();
            assert!(
                reason.contains("about B") && !reason.contains("about A"),
                "{reason}"
            );
        }
        other => panic!("unexpected {other:?}"),
    }
    c.configure(&bench(16, 16)).unwrap();
    srv.join().unwrap();
}

#[test]
fn automatic_ids_skip_the_ids_a_caller_chose_for_recv() {
    let (addr, srv) = fake(|mut p| {
        p.hello(&["error"], 1);
        p.configured(0);
        // Both messages are read before either is answered: the answer to
        // the caller's id 0 cannot come back (which frees the id again)
        // before the pending submission has picked its id.
        let first = p.data();
        let second = p.data();
        assert_eq!(first.id, 0);
        assert_ne!(second.id, 0);
        for d in [second, first] {
            p.send(OutFrame::data(d.id, d.data).unwrap());
        }
    });
    let c = Client::connect(&addr, ClientOptions::default()).unwrap();
    c.configure(&bench(16, 16)).unwrap();
    // The next automatic id would be 0: taken by a plain submission still
    // in flight.
    c.submit_with_id(0, Bytes::from(vec![1u8; 16])).unwrap();
    let p = c.submit_pending(Bytes::from(vec![2u8; 16])).unwrap();
    assert_ne!(p.id(), 0);
    let mine = p.wait(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(&mine.data[..], &[2u8; 16]);
    let plain = c.recv(Some(Duration::from_secs(10))).unwrap();
    assert_eq!((plain.id, &plain.data[..]), (0, &[1u8; 16][..]));
    srv.join().unwrap();
}

#[test]
fn legacy_configuration_failure_is_a_status() {
    let (addr, srv) = fake(|mut p| {
        p.configured(3);
    });
    let c = Client::connect(&addr, legacy()).unwrap();
    match c.configure(&bench(16, 16)).unwrap_err() {
        ClientError::Configuration { status, reason } => {
            assert_eq!(status, Some(3));
            assert_eq!(reason, None);
        }
        other => panic!("unexpected {other:?}"),
    }
    srv.join().unwrap();
}

#[test]
fn server_closing_during_configuration_is_reported() {
    let (addr, srv) = fake(|mut p| {
        p.expect(MsgType::Configuration);
    });
    let c = Client::connect(&addr, legacy()).unwrap();
    let e = c.configure(&bench(16, 16)).unwrap_err();
    assert!(matches!(e, ClientError::Closed { .. }), "{e:?}");
    assert!(
        e.to_string().contains("server closed the connection"),
        "{e}"
    );
    assert!(e.to_string().contains("configuration response"), "{e}");
    srv.join().unwrap();
}

#[test]
fn data_error_goes_to_recv_and_the_connection_continues() {
    let (addr, srv) = fake(|mut p| {
        p.hello(&["error", "credit"], 1);
        p.configured(0);
        p.credit(2);
        let d = p.data();
        p.send(ErrorMsg::new(d.id, ErrorCode::CoreFailure, "core 0 timed out").to_frame());
        p.credit(1);
        echo(&mut p, 1, 16, 16);
    });
    let c = Client::connect(&addr, ClientOptions::default()).unwrap();
    c.configure(&bench(16, 16)).unwrap();
    let bad = c.submit(Bytes::from_static(&[1; 16])).unwrap();
    let e = c.recv(None).unwrap_err();
    let se = e.server_error().expect("a server error");
    assert_eq!(se.id, bad);
    assert_eq!(se.code, ErrorCode::CoreFailure as u32);
    assert!(e.to_string().contains("core 0 timed out"), "{e}");
    let good = c.submit(Bytes::from_static(&[2; 16])).unwrap();
    assert_eq!(c.recv(None).unwrap().id, good);
    srv.join().unwrap();
}

#[test]
fn error_without_id_fails_a_blocked_submit_and_recv() {
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (addr, srv) = fake(move |mut p| {
        p.hello(&["error", "credit"], 1);
        p.configured(0);
        // No credit: the client blocks in submit until this error.
        go_rx.recv().unwrap();
        p.send(
            ErrorMsg::new(
                ErrorMsg::NO_ID,
                ErrorCode::NoNodes,
                "every node disconnected",
            )
            .to_frame(),
        );
        assert!(p.at_eof());
    });
    // Without resuming: a resuming client would take this no-nodes error
    // as its cue to move to another server (resume_tests).
    let opts = ClientOptions {
        reconnect_timeout: None,
        ..Default::default()
    };
    let c = Arc::new(Client::connect(&addr, opts).unwrap());
    c.configure(&bench(16, 16)).unwrap();
    let c2 = c.clone();
    let watcher = std::thread::spawn(move || {
        wait_state(&c2, "submit waits for credit", |st| st.credit_waiters == 1);
        go_tx.send(()).unwrap();
    });
    let e = c.submit(Bytes::from_static(&[0; 16])).unwrap_err();
    watcher.join().unwrap();
    assert_eq!(
        e.server_error().unwrap().code,
        ErrorCode::NoNodes as u32,
        "{e}"
    );
    assert!(e.to_string().contains("every node disconnected"), "{e}");
    // recv gets the error once, then keeps reporting it instead of hanging.
    assert!(c.recv(None).unwrap_err().server_error().is_some());
    assert!(c.recv(None).unwrap_err().server_error().is_some());
    drop(c);
    srv.join().unwrap();
}

#[test]
fn recv_reports_a_closed_server_and_timeouts() {
    let (tx, rx) = mpsc::channel::<()>();
    let (addr, srv) = fake(move |mut p| {
        p.configured(0);
        rx.recv().unwrap();
    });
    let c = Client::connect(&addr, legacy()).unwrap();
    c.configure(&bench(16, 16)).unwrap();
    let e = c.recv(Some(Duration::from_millis(20))).unwrap_err();
    assert!(e.is_timeout() && e.to_string().contains("timed out"), "{e}");
    tx.send(()).unwrap();
    srv.join().unwrap();
    let e = c.recv(None).unwrap_err();
    assert!(
        e.to_string().contains("server closed the connection"),
        "{e}"
    );
    let e = c.submit(Bytes::from_static(&[0; 16])).unwrap_err();
    assert!(
        e.to_string().contains("server closed the connection"),
        "{e}"
    );
}

#[test]
fn connection_refused_names_the_address() {
    // Bind then drop to get a port nobody listens on.
    let addr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let e = Client::connect(&addr, legacy()).unwrap_err();
    assert!(matches!(e, ClientError::Connect { .. }), "{e:?}");
    assert!(e.to_string().contains(&addr), "{e}");
}

#[test]
fn hello_refused_by_a_seed_only_server_suggests_legacy() {
    let (addr, srv) = fake(|mut p| {
        p.read(); // a seed server drops a connection that opens with a non-configuration
    });
    let e = Client::connect(&addr, ClientOptions::default()).unwrap_err();
    assert!(e.to_string().contains("legacy"), "{e}");
    srv.join().unwrap();
}

#[test]
fn local_validation_before_sending() {
    let (addr, srv) = fake(|mut p| {
        p.configured(0);
        assert!(p.at_eof(), "nothing but the configuration was sent");
    });
    let c = Client::connect(&addr, legacy()).unwrap();
    assert!(matches!(
        c.submit(Bytes::from_static(&[0; 16])),
        Err(ClientError::NotConfigured)
    ));
    c.configure(&bench(16, 32)).unwrap();
    assert_eq!(c.sizes(), Some((16, 32)));
    let e = c.submit(Bytes::from_static(&[0; 17])).unwrap_err();
    assert!(matches!(e, ClientError::InvalidInput(_)), "{e}");
    assert!(c.submit(Bytes::new()).is_err());
    // A priority other than the default needs chunks, which were not agreed.
    let e = c.submit_with(Bytes::from_static(&[0; 16]), 0).unwrap_err();
    assert!(matches!(e, ClientError::InvalidInput(_)), "{e}");
    assert!(e.to_string().contains("chunks"), "{e}");
    drop(c);
    srv.join().unwrap();
}

#[test]
fn split_halves_run_in_two_threads() {
    const N: u32 = 2000;
    let (addr, srv) = fake(|mut p| {
        p.hello(&["error", "credit"], 1);
        p.configured(0);
        p.credit(64);
        for _ in 0..N {
            let d = p.data();
            p.send(OutFrame::data(d.id, d.data).unwrap());
            p.credit(1);
        }
    });
    let c = Client::connect(&addr, ClientOptions::default()).unwrap();
    c.configure(&bench(16, 16)).unwrap();
    let (tx, rx) = c.split();
    let sender = std::thread::spawn(move || {
        for i in 0..N {
            let mut v = [0u8; 16];
            v[..4].copy_from_slice(&i.to_le_bytes());
            assert_eq!(tx.submit(Bytes::copy_from_slice(&v)).unwrap(), i);
        }
        tx
    });
    for i in 0..N {
        let o = rx.recv(None).unwrap();
        assert_eq!(o.id, i);
        assert_eq!(&o.data[..4], &i.to_le_bytes());
    }
    drop(sender.join().unwrap());
    drop(rx);
    srv.join().unwrap();
}

#[test]
fn map_yields_in_input_order_with_a_bounded_window() {
    const WINDOW: usize = 4;
    let (addr, srv) = fake(|mut p| {
        p.configured(0);
        // Answer each batch of WINDOW messages in reverse order, which only
        // works if the client really keeps WINDOW in flight and reorders.
        for _ in 0..5 {
            let batch: Vec<Data> = (0..WINDOW).map(|_| p.data()).collect();
            for d in batch.into_iter().rev() {
                p.send(OutFrame::data(d.id, d.data).unwrap());
            }
        }
    });
    let c = Client::connect(&addr, legacy()).unwrap();
    c.configure(&bench(16, 16)).unwrap();
    let inputs = (0..20u8).map(|k| Bytes::from(vec![k; 16]));
    let out: Vec<Bytes> = c.map(inputs, WINDOW).collect::<Result<_>>().unwrap();
    assert_eq!(out.len(), 20);
    for (k, b) in out.iter().enumerate() {
        assert!(b.iter().all(|&x| x == k as u8), "result {k} out of order");
    }
    srv.join().unwrap();
}

#[test]
fn close_wakes_a_blocked_receiver_and_drop_closes_the_socket() {
    let (addr, srv) = fake(|mut p| {
        p.configured(0);
        assert!(p.at_eof(), "client did not close its socket");
    });
    let c = Arc::new(Client::connect(&addr, legacy()).unwrap());
    c.configure(&bench(16, 16)).unwrap();
    let c2 = c.clone();
    let waiter = std::thread::spawn(move || c2.recv(None));
    assert!(c.wait_for_blocked_receivers(1, Duration::from_secs(20)));
    c.close();
    let e = waiter.join().unwrap().unwrap_err();
    assert!(matches!(e, ClientError::ClosedLocally), "{e:?}");
    drop(c);
    srv.join().unwrap();
}

#[test]
fn borrowed_slice_writes_are_byte_exact() {
    let mut out = Vec::new();
    corefarm_smp::blocking::write_data_borrowed(&mut out, 0x0102_0304, b"xy").unwrap();
    assert_eq!(
        out,
        OutFrame::data(0x0102_0304, Bytes::from_static(b"xy"))
            .unwrap()
            .to_vec()
    );
}

#[test]
fn auto_ids_skip_the_no_id_marker() {
    let (addr, srv) = fake(|mut p| {
        p.configured(0);
        for want in [u32::MAX - 1, 0] {
            assert_eq!(p.data().id, want);
        }
    });
    let c = Client::connect(&addr, legacy()).unwrap();
    c.configure(&bench(16, 16)).unwrap();
    c.inner.shared.lock().next_id = u32::MAX - 1;
    assert_eq!(
        c.submit(Bytes::from_static(&[0; 16])).unwrap(),
        u32::MAX - 1
    );
    assert_eq!(c.submit(Bytes::from_static(&[0; 16])).unwrap(), 0);
    srv.join().unwrap();
}

#[test]
fn default_core_table_is_the_protocol_crates() {
    // Re-exported, so existing users keep the name (layout tested in smp).
    let t = crate::default_core_table(2, 32768, 16384).unwrap();
    assert_eq!(
        t,
        corefarm_smp::default_core_table(2, 32768, 16384).unwrap()
    );
    assert_eq!(t[1].control, 0xC002_0000);
}

#[test]
fn error_before_a_successful_response_is_only_a_warning() {
    // The server reports nodes dropped during configuration this way when
    // at least one other node succeeded.
    let (addr, srv) = fake(|mut p| {
        p.hello(&["error", "credit"], 2);
        p.expect(MsgType::Configuration);
        p.send(
            ErrorMsg::new(
                ErrorMsg::NO_ID,
                ErrorCode::ConfigurationFailed,
                "node dropped: node-1 refused",
            )
            .to_frame(),
        );
        p.send(ConfigurationResponse { status: 0 }.to_frame());
        p.credit(1);
        echo(&mut p, 1, 16, 16);
    });
    let c = Client::connect(&addr, ClientOptions::default()).unwrap();
    c.configure(&bench(16, 16)).unwrap();
    assert_eq!(
        c.warnings(),
        vec!["node dropped: node-1 refused".to_string()]
    );
    let id = c.submit(Bytes::from_static(&[3; 16])).unwrap();
    assert_eq!(c.recv(None).unwrap().id, id);
    srv.join().unwrap();
}

#[test]
fn unused_credit_carries_over_a_reconfiguration() {
    let (addr, srv) = fake(|mut p| {
        p.hello(&["error", "credit"], 1);
        p.configured(0);
        p.credit(3);
        p.data();
        // The client still holds 2 credits; a grant racing the new
        // configuration on the wire counts as well.
        p.expect(MsgType::Configuration);
        p.credit(1);
        p.send(ConfigurationResponse { status: 0 }.to_frame());
        for _ in 0..3 {
            p.data();
        }
        // No fourth message: that would have been sent without credit.
        assert!(p.at_eof(), "data sent without credit");
    });
    let c = Client::connect(&addr, ClientOptions::default()).unwrap();
    c.configure(&bench(16, 16)).unwrap();
    c.submit(Bytes::from_static(&[0; 16])).unwrap();
    c.configure(&bench(32, 16)).unwrap();
    assert_eq!(c.inner.shared.lock().credit, 3);
    for _ in 0..3 {
        c.submit(Bytes::from_static(&[0; 32])).unwrap();
    }
    // Out of credit: a non-blocking submit sends nothing.
    assert!(c.try_submit_slice_pending(&[0; 32]).unwrap().is_none());
    drop(c);
    srv.join().unwrap();
}

#[test]
fn results_of_any_length_are_delivered_whole_with_the_whole_outputs_counted() {
    let (addr, srv) = fake(|mut p| {
        let h = p.hello(&["error", "any-length"], 1);
        assert!(h.has("any-length"), "the client asks for any-length");
        p.configured(0);
        // A sum (8 bytes), a drop (nothing), a filter that kept 2.5
        // outputs' worth: each answers one data message of one input.
        for len in [8usize, 0, 40] {
            let d = p.data();
            let out = Bytes::from((0..len).map(|i| i as u8).collect::<Vec<u8>>());
            p.send(OutFrame::data(d.id, out).unwrap());
        }
    });
    let c = Client::connect(&addr, ClientOptions::default()).unwrap();
    c.configure(&bench(16, 16)).unwrap();
    for (len, count) in [(8usize, 0u32), (0, 0), (40, 2)] {
        let id = c.submit_slice(&[1u8; 16]).unwrap();
        let o = c.recv(None).unwrap();
        assert_eq!(o.id, id);
        assert_eq!(o.data.len(), len, "delivered whole");
        assert_eq!(
            &o.data[..],
            &(0..len).map(|i| i as u8).collect::<Vec<u8>>()[..]
        );
        assert_eq!(o.count, count, "whole outputs of 16 bytes in {len} bytes");
    }
    srv.join().unwrap();
}

#[test]
fn notifications_queue_apart_from_results() {
    let (addr, srv) = fake(|mut p| {
        let h = p.hello(&["error", "spin-notify"], 1);
        assert!(h.has("spin-notify"), "the client asks for notifications");
        p.configured(0);
        let d = p.data();
        for (set, text) in [(0u8, &b"head"[..]), (2, b"tail")] {
            let n = corefarm_smp::Notification {
                id: d.id,
                set,
                data: Bytes::from_static(text),
            };
            p.send(n.to_frame().unwrap());
        }
        p.send(OutFrame::data(d.id, Bytes::from(vec![7u8; 16])).unwrap());
        // The client's recv_notification then sees the end of the connection.
        assert!(p.at_eof());
    });
    let c = Client::connect(&addr, ClientOptions::default()).unwrap();
    c.configure(&bench(16, 16)).unwrap();
    assert_eq!(c.try_recv_notification(), None);
    // The result goes to its waiter; the notifications to their queue, first.
    let p = c.submit_slice_pending(&[1; 16]).unwrap();
    let out = p.wait(Some(Duration::from_secs(20))).unwrap();
    assert_eq!(out.data, Bytes::from(vec![7u8; 16]));
    let head = c.try_recv_notification().expect("before the result");
    assert_eq!(
        (head.id, head.set, &head.data[..]),
        (out.id, 0, &b"head"[..])
    );
    let tail = c.recv_notification(Some(Duration::ZERO)).unwrap();
    assert_eq!(
        (tail.id, tail.set, &tail.data[..]),
        (out.id, 2, &b"tail"[..])
    );
    assert_eq!(c.notifications_dropped(), 0);
    c.close();
    // Closed and empty: no waiting for what cannot come.
    assert_eq!(c.recv_notification(None), None);
    srv.join().unwrap();
}

#[cfg(feature = "cowork")]
#[test]
fn dropping_a_client_closes_it_while_a_coworking_request_waits() {
    // The server takes the configuration a co-working call requested and
    // never answers; the call computes everything locally and returns.
    let (tx, rx) = mpsc::channel();
    let (addr, srv) = fake(move |mut p| {
        p.hello(&[], 1);
        p.expect(MsgType::Configuration);
        tx.send(()).unwrap();
        // Dropping the client must close the connection although the
        // configuring thread still waits for this answer.
        p.w.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        match p.r.read_frame() {
            Ok(None) => {}
            Err(e) if e.to_string().contains("reset") => {}
            other => panic!("the client did not close: {other:?}"),
        }
    });
    let c = Client::connect(&addr, ClientOptions::default()).unwrap();
    /// Copies its input, once the server has the configuration: a call
    /// with no work left requests none, so the local core must not finish
    /// the call before the request is out.
    struct Copy(Option<mpsc::Receiver<()>>);
    impl corefarm_cores::Core for Copy {
        fn process(
            &mut self,
            i: &[u8],
            o: &mut [u8],
        ) -> std::result::Result<(), corefarm_cores::CoreError> {
            if let Some(configured) = self.0.take() {
                configured
                    .recv_timeout(Duration::from_secs(20))
                    .expect("the co-working call requested its configuration");
            }
            o.copy_from_slice(&i[..o.len()]);
            Ok(())
        }
    }
    let cfg = bench(16, 16);
    let opts = crate::CoworkOptions {
        threads: 1,
        configure: true,
        ..Default::default()
    };
    let cw = crate::Cowork::with_cores(&cfg, vec![Box::new(Copy(Some(rx)))], opts).unwrap();
    let inputs: Vec<Bytes> = (0..8u8).map(|i| Bytes::from(vec![i; 16])).collect();
    let run = c.map_cowork(&inputs, 4, &cw).unwrap();
    assert_eq!(run.results, inputs);
    assert_eq!(run.report.local_items, 8);
    drop(c);
    srv.join().unwrap();
}

/// `wait_for_credit` and `try_submit_slice_with` let a caller wait for
/// credit in slices (a binding checking for Ctrl-C in between) instead of
/// blocking inside a submit.
#[test]
fn credit_can_be_waited_for_in_slices_and_taken_without_blocking() {
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (addr, srv) = fake(move |mut p| {
        p.hello(&["error", "credit"], 1);
        p.configured(0);
        // The test saw a slice run out without credit.
        go_rx.recv().unwrap();
        p.credit(1);
        assert_eq!(p.data().id, 0);
        // The test saw the second try find no credit: end the session.
        go_rx.recv().unwrap();
    });
    // Not resuming, so that the server going away ends the session at once.
    let opts = ClientOptions {
        reconnect_timeout: None,
        ..Default::default()
    };
    let c = Client::connect(&addr, opts).unwrap();
    c.configure(&bench(16, 16)).unwrap();
    assert_eq!(c.try_submit_slice_with(None, &[1; 16], 4).unwrap(), None);
    assert!(!c.wait_for_credit(4, Duration::from_millis(20)).unwrap());
    go_tx.send(()).unwrap();
    assert!(c.wait_for_credit(4, Duration::MAX).unwrap());
    assert_eq!(c.try_submit_slice_with(None, &[1; 16], 4).unwrap(), Some(0));
    assert_eq!(c.try_submit_slice_with(None, &[1; 16], 4).unwrap(), None);
    go_tx.send(()).unwrap();
    // The server went away: the wait ends with the reason, not a timeout.
    let e = c.wait_for_credit(4, Duration::MAX).unwrap_err();
    assert!(!e.is_timeout(), "{e}");
    srv.join().unwrap();
}

/// An input the client refuses before sending it (not a whole number of
/// inputs) is that input's result, as the server's error for one would be:
/// the results of the inputs around it still come, each in its place.
#[test]
fn map_yields_a_refused_input_in_its_place_and_goes_on() {
    let (addr, srv) = fake(|mut p| {
        p.configured(0);
        // Every input but the refused one, echoed in order.
        echo(&mut p, 7, 16, 16);
        assert!(p.at_eof(), "the refused input was sent");
    });
    let c = Client::connect(&addr, legacy()).unwrap();
    c.configure(&bench(16, 16)).unwrap();
    let inputs: Vec<Bytes> = (0..8u8)
        .map(|k| Bytes::from(vec![k; if k == 4 { 15 } else { 16 }]))
        .collect();
    let out: Vec<Result<Bytes>> = c.map(inputs.clone(), 3).collect();
    assert_eq!(out.len(), 8, "{out:?}");
    for (k, r) in out.iter().enumerate() {
        match r {
            Err(ClientError::InvalidInput(_)) if k == 4 => {}
            Ok(b) if k != 4 => assert_eq!(b, &inputs[k], "result {k}"),
            other => panic!("result {k}: {other:?}"),
        }
    }
    // A priority class that does not exist is no one input's fault: one
    // error, nothing sent.
    let out: Vec<Result<Bytes>> = c.map_with(inputs, 3, 9).collect();
    assert_eq!(out.len(), 1, "{out:?}");
    assert!(
        matches!(out[0], Err(ClientError::InvalidInput(_))),
        "{out:?}"
    );
    drop(c);
    srv.join().unwrap();
}

/// A submission that fails for the whole session (here: no credit within
/// `io_timeout`) ends the map after the results of the inputs already sent,
/// in their places, not in place of the first of them.
#[test]
fn map_yields_the_results_sent_before_a_failed_submission() {
    let (addr, srv) = fake(move |mut p| {
        p.hello(&["error", "credit"], 1);
        p.configured(0);
        // Credit for two messages, never more.
        p.credit(2);
        echo(&mut p, 2, 16, 16);
        assert!(p.at_eof());
    });
    let c = Client::connect(&addr, ClientOptions::default()).unwrap();
    c.configure(&bench(16, 16)).unwrap();
    // Both credits are in before the limit gets short: only the third
    // submission's wait can run out.
    wait_state(&c, "the credit for two messages arrived", |st| {
        st.credit == 2
    });
    c.set_io_timeout(Some(Duration::from_millis(50))).unwrap();
    let inputs: Vec<Bytes> = (0..4u8).map(|k| Bytes::from(vec![k; 16])).collect();
    let out: Vec<Result<Bytes>> = c.map(inputs.clone(), 4).collect();
    assert_eq!(out.len(), 3, "{out:?}");
    assert_eq!(out[0].as_ref().unwrap(), &inputs[0]);
    assert_eq!(out[1].as_ref().unwrap(), &inputs[1]);
    assert!(out[2].as_ref().unwrap_err().is_timeout(), "{out:?}");
    drop(c);
    srv.join().unwrap();
}

/// A configuration sent while a map runs (another thread's, here the same
/// thread's between two results) ends the map before its next input: the
/// inputs already sent were for the old function, the rest would have been
/// computed by the new one.
#[test]
fn a_map_stops_before_inputs_the_next_configuration_would_compute() {
    let (addr, srv) = fake(|mut p| {
        p.configured(0);
        echo(&mut p, 1, 16, 16);
        p.configured(0);
        assert!(p.at_eof(), "an input was sent under the new configuration");
    });
    let c = Client::connect(&addr, legacy()).unwrap();
    c.configure(&bench(16, 16)).unwrap();
    let inputs: Vec<Bytes> = (0..3u8).map(|k| Bytes::from(vec![k; 16])).collect();
    let mut map = c.map(inputs.clone(), 1);
    assert_eq!(map.next().unwrap().unwrap(), inputs[0]);
    c.configure(&bench(16, 16)).unwrap();
    match map.next() {
        Some(Err(ClientError::Usage(m))) => assert!(m.contains("configured again"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(map.next().is_none());
    drop(map);
    drop(c);
    srv.join().unwrap();
}

/// A timeout too long for the clock waits without one (as
/// `wait_for_credit` does) instead of panicking on the overflow.
#[test]
fn a_pending_waits_out_a_timeout_too_long_for_the_clock() {
    let (addr, srv) = fake(|mut p| {
        p.configured(0);
        echo(&mut p, 1, 16, 16);
    });
    let c = Client::connect(&addr, legacy()).unwrap();
    c.configure(&bench(16, 16)).unwrap();
    let p = c.submit_pending(Bytes::from_static(&[7; 16])).unwrap();
    let out = p.wait(Some(Duration::MAX)).unwrap();
    assert_eq!(out.data, Bytes::from_static(&[7; 16]));
    srv.join().unwrap();
}
