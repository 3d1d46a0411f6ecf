//! The fault proxy: a TCP relay on 127.0.0.1 (an OS-assigned port) placed
//! between a peer and a server, which the campaign turns from a plain relay
//! into a bad network and back. Real sockets throughout, so the peers meet
//! the failures a real network gives them:
//!
//! - [`LinkFault::Pass`]: bytes relayed as they come.
//! - [`LinkFault::Delay`]: each chunk delivered that much later (latency,
//!   not a throughput cap: chunks read meanwhile queue behind it).
//! - [`LinkFault::Blackhole`]: nothing is read or delivered either way and
//!   nothing is closed (the kernels' buffers take what fits, as on a link
//!   that stopped delivering); a new connection is accepted and held. When
//!   the fault ends, relaying resumes where it stopped.
//! - [`LinkFault::ResetMidFrame`]: the next chunk of each connection is
//!   forwarded up to a point inside an SMP frame, then both sides are reset
//!   (RST, by `SO_LINGER` 0).
//! - [`LinkFault::HalfOpen`]: the server's side is closed while the peer's
//!   side stays open, its bytes accepted and dropped, never answered: the
//!   server saw the peer leave, the peer sees nothing. When the fault ends
//!   the peer's side is reset, so it learns at last.
//!
//! The proxy runs on a tokio runtime it is given; [`Proxy`] dropped closes
//! its listener and every connection.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use corefarm_smp::header::HEADER_LEN;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What the link does to the bytes it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkFault {
    Pass,
    Delay(Duration),
    Blackhole,
    ResetMidFrame,
    HalfOpen,
}

/// Counts of what the proxy did, for the campaign's report.
#[derive(Debug, Default)]
pub struct ProxyStats {
    pub connections: AtomicU64,
    /// Bytes delivered, both ways.
    pub bytes: AtomicU64,
    /// Connections reset in the middle of a frame.
    pub resets: AtomicU64,
    /// Connections whose server side was closed while the peer's was held.
    pub half_opened: AtomicU64,
    /// Bytes a half-open connection accepted from its peer and dropped.
    pub dropped: AtomicU64,
}

/// A running relay to one upstream address.
pub struct Proxy {
    addr: SocketAddr,
    fault: watch::Sender<LinkFault>,
    stats: Arc<ProxyStats>,
    end: CancellationToken,
}

/// Bytes read from a socket at a time, and the most a direction queues
/// (under a delay) before it stops reading.
const READ_SIZE: usize = 64 * 1024;
const MAX_QUEUED: usize = 64;

impl Proxy {
    /// Listens on 127.0.0.1 (an OS-assigned port) and relays every
    /// connection to `upstream`, on the runtime of `rt`.
    pub fn start(rt: &tokio::runtime::Handle, upstream: SocketAddr) -> std::io::Result<Proxy> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let listener = {
            let _in = rt.enter();
            TcpListener::from_std(listener)?
        };
        let (fault, _) = watch::channel(LinkFault::Pass);
        let stats = Arc::new(ProxyStats::default());
        let end = CancellationToken::new();
        let (tx, st, e) = (fault.clone(), stats.clone(), end.clone());
        rt.spawn(async move {
            loop {
                let down = tokio::select! {
                    _ = e.cancelled() => return,
                    a = listener.accept() => match a {
                        Ok((s, _)) => s,
                        // Out of fds or the like: the peer sees a refusal.
                        Err(_) => continue,
                    },
                };
                st.connections.fetch_add(1, Ordering::Relaxed);
                let conn = Conn {
                    fault: tx.subscribe(),
                    stats: st.clone(),
                    end: e.child_token(),
                };
                tokio::spawn(conn.serve(down, upstream));
            }
        });
        Ok(Proxy {
            addr,
            fault,
            stats,
            end,
        })
    }

    /// The address peers connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// From now on the link does `f` (to open connections and new ones).
    pub fn set(&self, f: LinkFault) {
        self.fault.send_replace(f);
    }

    pub fn stats(&self) -> &ProxyStats {
        &self.stats
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.end.cancel();
    }
}

struct Conn {
    fault: watch::Receiver<LinkFault>,
    stats: Arc<ProxyStats>,
    end: CancellationToken,
}

/// How a direction's pump stopped.
enum Outcome {
    /// Its source closed and everything was delivered (FIN passed on).
    Eof,
    /// A reset was asked for and the partial frame delivered.
    Reset,
    /// The link went half-open.
    HalfOpen,
    /// The proxy or the connection ended, or a write failed.
    Ended,
}

type Halves = (OwnedReadHalf, OwnedWriteHalf);

impl Conn {
    async fn serve(mut self, down: TcpStream, upstream: SocketAddr) {
        // A new connection waits out a blackhole (held, nothing read) and
        // meets a half-open link without an upstream at all.
        loop {
            let f = *self.fault.borrow_and_update();
            match f {
                LinkFault::Blackhole => {
                    tokio::select! {
                        _ = self.end.cancelled() => return,
                        r = self.fault.changed() => if r.is_err() { return },
                    }
                }
                LinkFault::HalfOpen => {
                    self.stats.half_opened.fetch_add(1, Ordering::Relaxed);
                    return self.hold_half_open(down).await;
                }
                _ => break,
            }
        }
        let Ok(up) = TcpStream::connect(upstream).await else {
            // The server is down: the peer sees its connection reset, as
            // it would connecting to the server itself.
            reset(down);
            return;
        };
        let _ = up.set_nodelay(true);
        let _ = down.set_nodelay(true);
        let (dr, dw) = down.into_split();
        let (ur, uw) = up.into_split();
        let stop = self.end.child_token();
        let a = tokio::spawn(pump(
            (dr, uw),
            self.fault.clone(),
            stop.clone(),
            self.stats.clone(),
        ));
        let b = tokio::spawn(pump(
            (ur, dw),
            self.fault.clone(),
            stop.clone(),
            self.stats.clone(),
        ));
        let (mut a, mut b) = (Some(a), Some(b));
        let (mut to_up, mut to_down) = (None, None);
        let mut outcome = Outcome::Eof;
        // The first pump to stop for a reset or a half-open link stops the
        // other; a pump that merely saw its end of stream lets the other
        // direction carry on (a half-close).
        while a.is_some() || b.is_some() {
            let (which, r) = tokio::select! {
                r = async { a.as_mut().expect("guarded").await }, if a.is_some() => (0, r),
                r = async { b.as_mut().expect("guarded").await }, if b.is_some() => (1, r),
            };
            if which == 0 {
                a = None;
            } else {
                b = None;
            }
            let Ok((halves, o)) = r else {
                return;
            };
            if which == 0 {
                to_up = Some(halves);
            } else {
                to_down = Some(halves);
            }
            if !matches!(o, Outcome::Eof) {
                stop.cancel();
                if !matches!(outcome, Outcome::Reset | Outcome::HalfOpen) {
                    outcome = o;
                }
            }
        }
        let (Some((dr, uw)), Some((ur, dw))) = (to_up, to_down) else {
            return;
        };
        let (Ok(down), Ok(up)) = (dr.reunite(dw), ur.reunite(uw)) else {
            return;
        };
        match outcome {
            Outcome::Reset => {
                self.stats.resets.fetch_add(1, Ordering::Relaxed);
                reset(down);
                reset(up);
            }
            Outcome::HalfOpen => {
                self.stats.half_opened.fetch_add(1, Ordering::Relaxed);
                drop(up);
                self.hold_half_open(down).await;
            }
            Outcome::Eof | Outcome::Ended => {}
        }
    }

    /// Reads and drops what the peer sends, answers nothing, closes
    /// nothing, until the link is no longer half-open; then resets the
    /// peer's connection.
    async fn hold_half_open(mut self, down: TcpStream) {
        let (mut rd, wr) = down.into_split();
        let mut buf = vec![0u8; READ_SIZE];
        let mut open = true;
        loop {
            if *self.fault.borrow_and_update() != LinkFault::HalfOpen {
                break;
            }
            tokio::select! {
                _ = self.end.cancelled() => break,
                r = self.fault.changed() => if r.is_err() { break },
                n = rd.read(&mut buf), if open => match n {
                    Ok(0) | Err(_) => open = false,
                    Ok(n) => {
                        self.stats.dropped.fetch_add(n as u64, Ordering::Relaxed);
                    }
                },
            }
        }
        if let Ok(down) = rd.reunite(wr) {
            reset(down);
        }
    }
}

/// Closes `s` with an RST rather than a FIN.
fn reset(s: TcpStream) {
    let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
    drop(s);
}

/// Relays one direction under the link's faults until it ends; returns its
/// halves (so the connection can reset or half-close them) and why.
async fn pump(
    (mut src, mut dst): Halves,
    mut fault: watch::Receiver<LinkFault>,
    stop: CancellationToken,
    stats: Arc<ProxyStats>,
) -> (Halves, Outcome) {
    let mut frames = Frames::default();
    let mut queue: VecDeque<(Instant, Bytes)> = VecDeque::new();
    let mut buf = BytesMut::with_capacity(READ_SIZE);
    let (mut eof, mut reset_after) = (false, false);
    let outcome = loop {
        let f = *fault.borrow_and_update();
        if f == LinkFault::HalfOpen {
            break Outcome::HalfOpen;
        }
        if queue.is_empty() && (eof || reset_after) {
            if reset_after {
                break Outcome::Reset;
            }
            let _ = dst.shutdown().await;
            break Outcome::Eof;
        }
        let flowing = f != LinkFault::Blackhole;
        let can_read = flowing && !eof && !reset_after && queue.len() < MAX_QUEUED;
        let due = queue.front().filter(|_| flowing).map(|(at, _)| *at);
        tokio::select! {
            _ = stop.cancelled() => break Outcome::Ended,
            r = fault.changed() => if r.is_err() { break Outcome::Ended },
            r = src.read_buf(&mut buf), if can_read => match r {
                Ok(0) | Err(_) => eof = true,
                Ok(_) => {
                    // The link as it is now, not as it was when the read began.
                    let chunk = buf.split().freeze();
                    buf.reserve(READ_SIZE);
                    match *fault.borrow() {
                        LinkFault::ResetMidFrame => {
                            let cut = frames.cut(&chunk);
                            queue.push_back((Instant::now(), chunk.slice(..cut)));
                            reset_after = true;
                        }
                        LinkFault::Delay(d) => {
                            frames.advance(&chunk);
                            queue.push_back((Instant::now() + d, chunk));
                        }
                        _ => {
                            frames.advance(&chunk);
                            queue.push_back((Instant::now(), chunk));
                        }
                    }
                }
            },
            _ = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                let (_, bytes) = queue.pop_front().expect("due");
                let n = bytes.len() as u64;
                tokio::select! {
                    _ = stop.cancelled() => break Outcome::Ended,
                    w = dst.write_all(&bytes) => if w.is_err() { break Outcome::Ended },
                }
                stats.bytes.fetch_add(n, Ordering::Relaxed);
            }
        }
    };
    ((src, dst), outcome)
}

/// Where a byte stream is among SMP frames (8-byte header, then the size
/// the header gives), so a reset can fall inside one.
#[derive(Debug, Default)]
struct Frames {
    head: [u8; HEADER_LEN],
    /// Header bytes seen of the frame being read (0 at a boundary).
    have: usize,
    /// Payload bytes still to come of the current frame.
    left: u64,
}

impl Frames {
    fn at_boundary(&self) -> bool {
        self.have == 0 && self.left == 0
    }

    fn advance(&mut self, mut b: &[u8]) {
        while !b.is_empty() {
            if self.left > 0 {
                let k = (self.left as usize).min(b.len());
                self.left -= k as u64;
                b = &b[k..];
            } else {
                let k = (HEADER_LEN - self.have).min(b.len());
                self.head[self.have..self.have + k].copy_from_slice(&b[..k]);
                self.have += k;
                b = &b[k..];
                if self.have == HEADER_LEN {
                    self.have = 0;
                    let s = &self.head[4..8];
                    self.left = u64::from(u32::from_le_bytes([s[0], s[1], s[2], s[3]]));
                }
            }
        }
    }

    /// How many bytes of `b` (the next bytes of the stream, not empty) to
    /// forward so the stream stops strictly inside a frame: the header and
    /// half of what `b` holds of the payload of the frame it begins with,
    /// or half of what it holds of the frame it continues.
    fn cut(&mut self, b: &[u8]) -> usize {
        let cut = if self.have > 0 {
            0
        } else if self.left > 0 {
            (self.left as usize).min(b.len()) / 2
        } else if b.len() < HEADER_LEN {
            b.len().div_ceil(2)
        } else {
            let size = u32::from_le_bytes([b[4], b[5], b[6], b[7]]) as usize;
            let avail = (HEADER_LEN + size).min(b.len());
            if avail > HEADER_LEN {
                HEADER_LEN + (avail - HEADER_LEN) / 2
            } else {
                HEADER_LEN / 2
            }
        };
        self.advance(&b[..cut]);
        debug_assert!(!self.at_boundary());
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::Frames;

    fn frame(size: u32) -> Vec<u8> {
        let mut f = vec![3, 0, 0, 0];
        f.extend_from_slice(&size.to_le_bytes());
        f.resize(8 + size as usize, 0xA5);
        f
    }

    /// Wherever the stream stands, the cut leaves it inside a frame.
    #[test]
    fn cuts_fall_inside_a_frame() {
        let whole = [frame(100), frame(0), frame(7)].concat();
        for start in 0..whole.len() {
            for len in 1..=(whole.len() - start) {
                let mut f = Frames::default();
                f.advance(&whole[..start]);
                let cut = f.cut(&whole[start..start + len]);
                assert!(cut <= len, "start {start} len {len}");
                assert!(!f.at_boundary(), "start {start} len {len} cut {cut}");
            }
        }
    }

    #[test]
    fn a_whole_frame_is_cut_after_its_header() {
        let mut f = Frames::default();
        let cut = f.cut(&frame(1000));
        assert_eq!(cut, 8 + 500);
        assert_eq!(f.left, 500);
    }
}
