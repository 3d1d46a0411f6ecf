//! The benchmarking user against a minimal fake server that behaves like a
//! corefarm server with benchmarking nodes (echoing the first 16 bytes of
//! every input), and against faulty variants of it.

use std::net::{TcpListener, TcpStream};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use bytes::Bytes;
use corefarm_bench::cpu::CpuTarget;
use corefarm_bench::user::{run, UserBenchOptions};
use corefarm_smp::blocking::{write_frame, FrameReader};
use corefarm_smp::hello::features;
use corefarm_smp::{Configuration, ConfigurationResponse, Credit, Data, Hello, MsgType, OutFrame};

#[derive(Clone, Copy, PartialEq)]
enum Fault {
    None,
    /// Never answers message 5.
    Drop,
    /// Answers message 3 with a damaged timestamp.
    Corrupt,
    /// Reads 10 messages, answers the first 4 of them, and hangs up (a
    /// server that dies mid-stream).
    Hangup,
}

/// Serves one user connection; returns its address and the thread.
fn fake_server(fault: Fault, credit: bool, nodes: u32) -> (String, JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let h = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let _ = serve(s, fault, credit, nodes);
    });
    (addr, h)
}

/// Serves one connection per fault in turn on one address (a server that
/// restarts in place), then stops listening.
fn restarting_server(faults: Vec<Fault>) -> (String, JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let h = thread::spawn(move || {
        for fault in faults {
            let (s, _) = l.accept().unwrap();
            let _ = serve(s, fault, true, 2);
        }
    });
    (addr, h)
}

fn serve(s: TcpStream, fault: Fault, credit: bool, nodes: u32) -> anyhow::Result<()> {
    let mut r = FrameReader::new(s.try_clone()?, 1 << 28);
    let mut w = s;
    let mut f = r.read_frame()?.unwrap();
    let mut hello = false;
    if f.ty == MsgType::Hello {
        hello = true;
        let mut h = Hello::new("server");
        h.features = vec![features::ERROR.into()];
        if credit {
            h.features.push(features::CREDIT.into());
        }
        h.nodes = Some(nodes);
        write_frame(&mut w, h.to_frame())?;
        // The user hangs up here when it got fewer nodes than it asked for.
        let Some(next) = r.read_frame()? else {
            return Ok(());
        };
        f = next;
    }
    assert_eq!(f.ty, MsgType::Configuration);
    let cfg = Configuration::parse(f.payload)?;
    let b = cfg.benchmark().expect("the benchmarking configuration");
    write_frame(&mut w, ConfigurationResponse { status: 0 }.to_frame())?;
    if hello && credit {
        write_frame(&mut w, Credit { messages: 8 }.to_frame())?;
    }
    let mut seen = 0;
    while let Some(f) = r.read_frame()? {
        seen += 1;
        if fault == Fault::Hangup && seen > 10 {
            return Ok(());
        }
        let d = Data::parse(f.payload)?;
        let n = cfg.count_inputs(d.data.len())? as usize;
        let mut out = vec![0u8; n * b.output_size as usize];
        for (i, o) in out.chunks_exact_mut(b.output_size as usize).enumerate() {
            let inp = &d.data[i * b.input_size as usize..];
            o[..16].copy_from_slice(&inp[..16]);
        }
        if fault == Fault::Corrupt && d.id == 3 {
            out[2] ^= 0x40;
        }
        if !(fault == Fault::Drop && d.id == 5 || fault == Fault::Hangup && seen > 4) {
            write_frame(&mut w, OutFrame::data(d.id, Bytes::from(out)).unwrap())?;
        }
        if hello && credit {
            write_frame(&mut w, Credit { messages: 1 }.to_frame())?;
        }
    }
    Ok(())
}

fn opts(addr: String) -> UserBenchOptions {
    UserBenchOptions {
        server: addr,
        input_size: 64,
        output_size: 32,
        count: 3,
        duration: Duration::from_millis(400),
        warmup: Duration::from_millis(100),
        drain_timeout: Duration::from_millis(500),
        connect_timeout: Duration::from_secs(5),
        nodes: Some(2),
        ..Default::default()
    }
}

#[test]
fn clean_run_with_credit() {
    let (addr, h) = fake_server(Fault::None, true, 2);
    let rep = run(&opts(addr)).unwrap();
    h.join().unwrap();
    assert!(rep.ok, "{:?}", rep.errors);
    assert!(rep.session.hello && rep.session.credit);
    assert_eq!(rep.session.nodes, Some(2));
    let c = &rep.counts;
    assert!(c.window_messages > 0);
    assert_eq!(c.sent_messages, c.received_messages);
    assert_eq!(c.received_outputs, 3 * c.received_messages);
    assert_eq!((c.missing, c.corrupted, c.failed), (0, 0, 0));
    // 3 inputs of 64 B come back as 3 outputs of 32 B: half the bits.
    let t = &rep.throughput;
    assert!((t.output_bps * 2.0 - t.input_bps).abs() < 1e-6 * t.input_bps);
    assert!(rep.latency.samples > 0 && rep.latency.min_ms <= rep.latency.max_ms);
    assert_eq!(rep.config.message_bytes, 192);
}

/// The server (here: this process, where the fake server runs) is watched
/// over the measurement window only; without `cpu_watch` no CPU is reported.
#[test]
fn server_cpu_is_sampled_over_the_window() {
    let (addr, h) = fake_server(Fault::None, true, 2);
    let mut o = opts(addr);
    o.cpu_watch = vec![CpuTarget {
        label: "server".into(),
        pid: std::process::id(),
    }];
    let rep = run(&o).unwrap();
    h.join().unwrap();
    assert!(rep.ok, "{:?}", rep.errors);
    assert_eq!(rep.cpu.len(), 1, "{:?}", rep.cpu);
    let c = &rep.cpu[0];
    assert_eq!((c.label.as_str(), c.pid), ("server", std::process::id()));
    assert!(c.wall_s > 0.0 && c.processes >= 1, "{c:?}");
    assert!((c.cpu_s - c.user_s - c.sys_s).abs() < 1e-9);
    let json = serde_json::to_value(&rep).unwrap();
    assert_eq!(json["cpu"][0]["label"], "server");

    let (addr, h) = fake_server(Fault::None, true, 2);
    let rep = run(&opts(addr)).unwrap();
    h.join().unwrap();
    assert!(rep.cpu.is_empty());
    assert!(serde_json::to_value(&rep).unwrap().get("cpu").is_none());
}

#[test]
fn legacy_paced_run() {
    let (addr, h) = fake_server(Fault::None, false, 1);
    let mut o = opts(addr);
    o.legacy = true;
    o.rate_hz = Some(200.0);
    let rep = run(&o).unwrap();
    h.join().unwrap();
    assert!(rep.ok, "{:?}", rep.errors);
    assert!(!rep.session.hello);
    // 0.5 s at 200 Hz: 100 messages, paced by absolute deadlines.
    assert!(
        (95..=101).contains(&rep.counts.sent_messages),
        "{}",
        rep.counts.sent_messages
    );
}

#[test]
fn missing_result_fails_the_run_without_hanging() {
    let (addr, h) = fake_server(Fault::Drop, true, 2);
    let rep = run(&opts(addr)).unwrap();
    h.join().unwrap();
    assert!(!rep.ok);
    assert_eq!(rep.counts.missing, 1);
    assert!(
        rep.errors.iter().any(|e| e.contains("missing")),
        "{:?}",
        rep.errors
    );
}

#[test]
fn corrupted_timestamp_fails_the_run() {
    let (addr, h) = fake_server(Fault::Corrupt, false, 2);
    let rep = run(&opts(addr)).unwrap();
    h.join().unwrap();
    assert!(!rep.ok);
    assert_eq!(rep.counts.corrupted, 1);
    assert!(rep.errors[0].contains("timestamp"), "{:?}", rep.errors);
}

#[test]
fn too_few_nodes_is_an_error() {
    let (addr, h) = fake_server(Fault::None, true, 1);
    let e = run(&opts(addr)).unwrap_err();
    h.join().unwrap();
    assert!(e.to_string().contains("assigned 1 of the 2"), "{e}");
}

/// The server dies mid-stream and comes back on its address: the run
/// resumes, sends the unanswered messages again, and every result arrives
/// once; the drain does not fail for the outage, and the report counts it.
#[test]
fn a_run_resumes_after_the_server_restarts() {
    let (addr, srv) = restarting_server(vec![Fault::Hangup, Fault::None]);
    let rep = run(&UserBenchOptions {
        reconnect_timeout: Some(Duration::from_secs(10)),
        ..opts(addr)
    })
    .unwrap();
    assert!(rep.ok, "{:?}", rep.errors);
    assert_eq!(rep.counts.resumes, 1);
    assert_eq!(rep.counts.missing, 0);
    assert_eq!(rep.counts.corrupted, 0);
    assert_eq!(rep.counts.received_messages, rep.counts.sent_messages);
    assert!(rep.summary().contains("resumes 1"), "{}", rep.summary());
    srv.join().unwrap();
}

/// Without resuming, the same outage ends the run with the lost server.
#[test]
fn without_resuming_a_lost_server_fails_the_run() {
    let (addr, srv) = restarting_server(vec![Fault::Hangup]);
    let rep = run(&UserBenchOptions {
        reconnect_timeout: None,
        ..opts(addr)
    })
    .unwrap();
    assert!(!rep.ok);
    assert_eq!(rep.counts.resumes, 0);
    // The fake server hangs up with the client's next messages unread, so
    // the client hears a close or, when they arrived first, a reset: both
    // are the lost server.
    assert!(
        rep.errors.iter().any(|e| {
            e.contains("server closed the connection") || e.contains("Connection reset by peer")
        }),
        "{:?}",
        rep.errors
    );
    srv.join().unwrap();
}
