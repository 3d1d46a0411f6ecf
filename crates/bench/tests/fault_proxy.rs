//! The soak's fault proxy with real loopback sockets: a peer on one side,
//! an echoing server on the other, the proxy's faults in between. Every
//! wait is on a socket or a channel, never a fixed sleep.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use corefarm_bench::soak::proxy::{LinkFault, Proxy};

/// What the upstream saw: bytes received over all connections, and for
/// each connection how its reading ended.
struct Echo {
    addr: SocketAddr,
    received: Arc<AtomicU64>,
    accepted: Arc<AtomicU64>,
    /// One message per connection: the bytes it read, and how it ended
    /// (`None`: a clean end of stream).
    ended: mpsc::Receiver<(u64, Option<ErrorKind>)>,
}

/// A server that echoes every byte back (when `echo`) or only reads.
fn upstream(echo: bool) -> Echo {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let received = Arc::new(AtomicU64::new(0));
    let accepted = Arc::new(AtomicU64::new(0));
    let (tx, ended) = mpsc::channel();
    let (r, a) = (received.clone(), accepted.clone());
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            a.fetch_add(1, Ordering::SeqCst);
            let (r, tx) = (r.clone(), tx.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                let mut total = 0u64;
                let end = loop {
                    match s.read(&mut buf) {
                        Ok(0) => break None,
                        Ok(n) => {
                            total += n as u64;
                            r.fetch_add(n as u64, Ordering::SeqCst);
                            if echo && s.write_all(&buf[..n]).is_err() {
                                break Some(ErrorKind::BrokenPipe);
                            }
                        }
                        Err(e) => break Some(e.kind()),
                    }
                };
                let _ = tx.send((total, end));
            });
        }
    });
    Echo {
        addr,
        received,
        accepted,
        ended,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

fn connect(p: &Proxy) -> TcpStream {
    let s = TcpStream::connect(p.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

fn frame(size: u32) -> Vec<u8> {
    let mut f = vec![3, 0, 0, 0];
    f.extend_from_slice(&size.to_le_bytes());
    f.extend((0..size).map(|i| i as u8));
    f
}

/// Bytes the kernel still holds in `s`'s send queue.
fn unsent(s: &TcpStream) -> usize {
    use std::os::fd::AsRawFd;
    let mut n: libc::c_int = 0;
    // SAFETY: TIOCOUTQ writes one int through the pointer given.
    let r = unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut n) };
    assert_eq!(r, 0);
    n as usize
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "waited 20 s for {what}");
        std::thread::yield_now();
    }
}

#[test]
fn passes_bytes_both_ways_intact() {
    let rt = runtime();
    let up = upstream(true);
    let p = Proxy::start(rt.handle(), up.addr).unwrap();
    let mut s = connect(&p);
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7) as u8).collect();
    let mut w = s.try_clone().unwrap();
    let sent = data.clone();
    let writer = std::thread::spawn(move || w.write_all(&sent).unwrap());
    let mut back = vec![0u8; data.len()];
    s.read_exact(&mut back).unwrap();
    writer.join().unwrap();
    assert!(back == data, "the echo differs from what was sent");
    // A half-close passes through: the server sees the end of stream.
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(up.ended.recv().unwrap(), (1 << 20, None));
    assert_eq!(s.read(&mut [0u8; 1]).unwrap(), 0);
    assert_eq!(p.stats().bytes.load(Ordering::Relaxed), 2 << 20);
}

#[test]
fn delay_holds_each_direction_back() {
    let rt = runtime();
    let up = upstream(true);
    let p = Proxy::start(rt.handle(), up.addr).unwrap();
    let mut s = connect(&p);
    p.set(LinkFault::Delay(Duration::from_millis(150)));
    let t = Instant::now();
    s.write_all(b"ping").unwrap();
    let mut b = [0u8; 4];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"ping");
    // Once to the server, once back.
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    p.set(LinkFault::Pass);
    s.write_all(b"pong").unwrap();
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"pong");
}

#[test]
fn blackhole_delivers_nothing_and_closes_nothing_until_it_ends() {
    let rt = runtime();
    let up = upstream(true);
    let p = Proxy::start(rt.handle(), up.addr).unwrap();
    let mut s = connect(&p);
    s.write_all(b"warm").unwrap();
    let mut b = [0u8; 4];
    s.read_exact(&mut b).unwrap();
    p.set(LinkFault::Blackhole);
    s.write_all(b"lost").unwrap();
    // The bytes left the peer (the link took them) ...
    wait_for("the send queue to drain", || unsent(&s) == 0);
    // ... a new connection is accepted too, but not passed on ...
    let mut late = connect(&p);
    late.write_all(b"late").unwrap();
    wait_for("the late send queue to drain", || unsent(&late) == 0);
    assert_eq!(up.received.load(Ordering::SeqCst), 4);
    assert_eq!(up.accepted.load(Ordering::SeqCst), 1);
    // ... and when the link comes back, both carry on where they were.
    p.set(LinkFault::Pass);
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"lost");
    late.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"late");
}

#[test]
fn reset_falls_inside_a_frame_on_both_sides() {
    let rt = runtime();
    let up = upstream(false);
    let p = Proxy::start(rt.handle(), up.addr).unwrap();
    let mut s = connect(&p);
    s.write_all(&frame(16)).unwrap();
    wait_for("the first frame", || {
        up.received.load(Ordering::SeqCst) == 24
    });
    p.set(LinkFault::ResetMidFrame);
    s.write_all(&frame(1000)).unwrap();
    let (got, end) = up.ended.recv().unwrap();
    // The server read the whole first frame and part of the second, then
    // the connection was reset under it.
    assert!(got > 24 && got < 24 + 1008, "{got}");
    assert_eq!(end, Some(ErrorKind::ConnectionReset));
    let e = s.read(&mut [0u8; 16]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset);
    assert_eq!(p.stats().resets.load(Ordering::Relaxed), 1);
}

#[test]
fn half_open_closes_the_server_side_and_leaves_the_peer_unanswered() {
    let rt = runtime();
    let up = upstream(true);
    let p = Proxy::start(rt.handle(), up.addr).unwrap();
    let mut s = connect(&p);
    s.write_all(b"warm").unwrap();
    let mut b = [0u8; 4];
    s.read_exact(&mut b).unwrap();
    p.set(LinkFault::HalfOpen);
    // The server sees its peer go.
    let (got, _) = up.ended.recv().unwrap();
    assert_eq!(got, 4);
    // The peer's bytes are still taken, and never answered ...
    s.write_all(b"anyone there?").unwrap();
    wait_for("the bytes to be dropped", || {
        p.stats().dropped.load(Ordering::Relaxed) == 13
    });
    assert_eq!(up.received.load(Ordering::SeqCst), 4);
    // ... until the fault ends and the peer's connection is reset, with
    // not one byte of answer before it.
    p.set(LinkFault::Pass);
    let e = s.read(&mut b).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset);
    assert_eq!(p.stats().half_opened.load(Ordering::Relaxed), 1);
    // A new connection goes through again.
    let mut s = connect(&p);
    s.write_all(b"back").unwrap();
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"back");
}

#[test]
fn a_server_that_is_down_resets_the_peer() {
    let rt = runtime();
    let gone = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = gone.local_addr().unwrap();
    drop(gone);
    let p = Proxy::start(rt.handle(), addr).unwrap();
    let mut s = connect(&p);
    let r = s.read(&mut [0u8; 1]);
    assert!(
        matches!(&r, Err(e) if e.kind() == ErrorKind::ConnectionReset),
        "{r:?}"
    );
}
