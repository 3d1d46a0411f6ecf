//! One link to a neighbour: opening it (hello both ways, agreeing on
//! chunks), then a reader task (reassemble chunks; deliver, forward, or
//! report the link lost) and a writer task ([`PeerOutbox`]: classes, the
//! link's scheduler within a class, chunks).
//!
//! Chunks are offered in the hello's name field, after a NUL:
//! `name\0chunks=131072`. A node that predates them takes the suffix as
//! part of the name (it only logs it) and offers none, so its links carry
//! whole messages as before.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use corefarm_smp::codec::{FrameReader, Read, ReadError};
use corefarm_smp::stream::{Chunk, Reassembler, CHUNK_HEADER_LEN, CLASSES};
use corefarm_smp::{MsgType, PeerBody, PeerHeader, PeerKind, PeerMsg};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::fabric::FabricState;
use super::outq::PeerOutbox;
use super::sched::{Queued, SchedulerFactory};
use super::{read_hello, LinkError};

/// Read timeout of a begun frame on an open link.
pub(crate) const LINK_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The chunk size a node offers on links whose frames it reads up to
/// `max_frame` bytes: a chunk and its header must fit one frame.
pub(crate) fn offer(chunk_size: u32, max_frame: u32) -> u32 {
    chunk_size.min(max_frame.saturating_sub(CHUNK_HEADER_LEN as u32))
}

/// The chunk size of a link: both ends offered chunks, the smaller wins.
pub(crate) fn agree(ours: u32, theirs: u32) -> u32 {
    corefarm_smp::peer::agree_chunks(ours, theirs)
}

/// A hello's name field split into the name and the chunk size it offers
/// (0: none, or an option this node cannot read).
pub(crate) fn split_name(raw: &str) -> (String, u32) {
    let (name, chunks) = corefarm_smp::peer::split_hello_name(raw);
    (name.to_string(), chunks)
}

pub(crate) fn hello(
    group: u32,
    src: u32,
    dst: u32,
    token: u64,
    name: &str,
    chunk_size: u32,
) -> PeerMsg {
    let name = corefarm_smp::peer::hello_name(name, chunk_size);
    PeerMsg {
        header: PeerHeader {
            kind: PeerKind::Hello,
            ttl: 0,
            group,
            src,
            dst,
            seq: 0,
        },
        body: PeerBody::Hello { token, name },
    }
}

pub(crate) async fn send_hello(w: &mut OwnedWriteHalf, m: &PeerMsg) -> std::io::Result<()> {
    let mut f = m
        .to_frame()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    w.write_all_buf(&mut f).await
}

/// A link whose hellos have been exchanged: its halves and the chunk size
/// the other end offered.
pub(crate) type Opened = (FrameReader<OwnedReadHalf>, OwnedWriteHalf, u32);

/// How long the first attempt of a dial waits for the answer to its hello;
/// each later one waits twice as long as the one before. A member answers
/// within a round trip, unless its port is flooded or it is starved of
/// CPU: an attempt that hangs (its connection lost to a flood, or held in
/// a kernel backlog) gives way to a new one instead of using up the whole
/// join deadline.
pub(crate) const FIRST_ATTEMPT: Duration = Duration::from_secs(2);

/// Dials `peer` until it answers our hello with its own, or `deadline`.
/// The peer may not have joined the group yet (it then closes), or its
/// port may be busy with strangers (it then drops or ignores ours): retry.
pub(crate) async fn dial(
    addr: SocketAddr,
    me: &PeerMsg,
    max_frame: u32,
    deadline: Instant,
) -> Result<Opened, LinkError> {
    dial_with(addr, me, max_frame, deadline, FIRST_ATTEMPT).await
}

pub(crate) async fn dial_with(
    addr: SocketAddr,
    me: &PeerMsg,
    max_frame: u32,
    deadline: Instant,
    first_attempt: Duration,
) -> Result<Opened, LinkError> {
    let mut backoff = Duration::from_millis(5);
    let mut patience = first_attempt;
    loop {
        let attempt = async {
            let s = TcpStream::connect(addr)
                .await
                .map_err(|e| LinkError::Connect(Arc::new(e)))?;
            s.set_nodelay(true)
                .map_err(|e| LinkError::Connect(Arc::new(e)))?;
            let (rd, mut wr) = s.into_split();
            send_hello(&mut wr, me)
                .await
                .map_err(|e| LinkError::Connect(Arc::new(e)))?;
            let mut reader = FrameReader::new(rd, max_frame).with_read_timeout(LINK_READ_TIMEOUT);
            let (h, token, name) = read_hello(&mut reader).await?;
            if Some(token) != me.token() {
                return Err(LinkError::NoToken);
            }
            let want = (me.header.group, me.header.dst, me.header.src);
            if (h.group, h.src, h.dst) != want {
                return Err(LinkError::WrongEnd {
                    src: h.src,
                    group: h.group,
                    dst: h.dst,
                    want_src: want.1,
                    want_group: want.0,
                    want_dst: want.2,
                });
            }
            Ok((reader, wr, split_name(&name).1))
        };
        let began = Instant::now();
        let until = deadline.min(began + patience);
        let last = match tokio::time::timeout_at(until, attempt).await {
            Ok(Ok(link)) => return Ok(link),
            Ok(Err(e)) => e,
            Err(_) => {
                patience *= 2;
                LinkError::NoAnswer(until - began)
            }
        };
        if Instant::now() + backoff >= deadline {
            return Err(last);
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_millis(200));
    }
}

/// Reads a link until it ends, then reports it lost. `chunk_size` is what
/// the link agreed (0: a chunk is a protocol error).
pub(crate) async fn read_loop(
    shared: Arc<FabricState>,
    peer: u32,
    mut reader: FrameReader<OwnedReadHalf>,
    chunk_size: u32,
    max_frame: u32,
) {
    // The writer cuts one message per class at a time, so a well-behaved
    // peer never has more than `CLASSES` open or more than that many
    // frames' worth held. Chunks are read into place: reserved whole at
    // the first, within those bounds.
    let mut chunks = Reassembler::new(
        max_frame as u64,
        CLASSES as usize,
        CLASSES as u64 * max_frame as u64,
    )
    .reserve_whole()
    .chunk_limit(u64::from(chunk_size));
    let reason = loop {
        let placing = (chunk_size > 0).then_some(&mut chunks);
        let payload = match reader.read_with(placing).await {
            Ok(Some(Read::Frame(f))) => match f.ty {
                MsgType::Peer => f.payload,
                MsgType::Chunk if chunk_size > 0 => match push(&mut chunks, f.payload) {
                    Ok(Some(m)) => m.data,
                    Ok(None) => continue,
                    Err(e) => break format!("sent {e}"),
                },
                MsgType::Chunk => {
                    break "sent a chunk on a link that did not agree to chunks".into()
                }
                other => break format!("sent a {} message on a peer link", other.name()),
            },
            Ok(Some(Read::Placed { whole, .. })) => match whole {
                Some(m) => m.data,
                None => continue,
            },
            Ok(None) => break super::fabric::CLOSED.to_string(),
            Err(ReadError::Io(e)) => break format!("connection failed: {e}"),
            Err(ReadError::Protocol(e)) => break format!("sent an invalid message: {e}"),
        };
        let m = match PeerMsg::parse(payload) {
            Ok(m) => m,
            Err(e) => break format!("sent an invalid peer message: {e}"),
        };
        if let Err(e) = shared.incoming(m).await {
            break e.to_string();
        }
    };
    shared.link_lost(peer, reason).await;
}

/// One chunk frame's payload into `r` (which holds it to the chunk size
/// agreed): the whole message once its last chunk is in. Shared by peer
/// links and direct connections, for the chunks not read into place.
pub(crate) fn push(
    r: &mut Reassembler,
    payload: bytes::Bytes,
) -> Result<Option<corefarm_smp::stream::Message>, String> {
    let c = Chunk::parse(payload).map_err(|e| format!("an invalid chunk: {e}"))?;
    r.push(c).map_err(|e| format!("an invalid chunk: {e}"))
}

/// Writes what the outbox picks until the fabric closes the queue; a
/// message's permit (its bytes in the link's budget) is released once its
/// last byte is written.
pub(crate) async fn write_loop(
    mut rx: mpsc::UnboundedReceiver<Queued>,
    sched: SchedulerFactory,
    mut wr: OwnedWriteHalf,
    chunk_size: u32,
    max_passed: u64,
) {
    let mut out = PeerOutbox::new(sched, chunk_size as usize, max_passed);
    loop {
        while let Ok(q) = rx.try_recv() {
            out.push(q);
        }
        let (mut frame, permit) = match out.pop() {
            Some(next) => next,
            None => match rx.recv().await {
                Some(q) => {
                    out.push(q);
                    continue;
                }
                None => return,
            },
        };
        if let Err(e) = wr.write_all_buf(&mut frame).await {
            tracing::debug!("peer link write failed: {e}");
            return;
        }
        drop(permit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A peer port that takes the first connection and never answers it
    /// (as a port busy with strangers may), then answers every later one.
    /// Real sockets and time: asserts on the outcome and the attempts only.
    #[tokio::test]
    async fn an_attempt_that_gets_no_answer_is_given_up_and_dialled_again() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let peer = tokio::spawn(async move {
            let (held, _) = l.accept().await.unwrap();
            let mut attempts = 1;
            loop {
                let (s, _) = l.accept().await.unwrap();
                attempts += 1;
                let (rd, mut wr) = s.into_split();
                let mut r = FrameReader::new(rd, 1 << 16);
                let Ok((h, token, _)) = read_hello(&mut r).await else {
                    continue;
                };
                let answer = hello(h.group, h.dst, h.src, token, "b", 0);
                send_hello(&mut wr, &answer).await.unwrap();
                return (attempts, held, r, wr);
            }
        });
        let me = hello(4, 0, 1, 0xAB, "a", 0);
        let deadline = Instant::now() + Duration::from_secs(120);
        let linked = dial(addr, &me, 1 << 16, deadline).await;
        let (_, _, chunks) = linked.expect("linked on a later attempt");
        assert_eq!(chunks, 0);
        let (attempts, _held, _r, _w) = peer.await.unwrap();
        assert!(attempts >= 2, "{attempts}");
    }

    /// The reason a dial gives up with names the attempt that hung.
    #[tokio::test(start_paused = true)]
    async fn a_dial_cut_by_its_deadline_says_it_got_no_answer() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        // Accepted by the kernel, never read: no answer ever comes.
        let me = hello(4, 0, 1, 0xAB, "a", 0);
        let deadline = Instant::now() + Duration::from_millis(500);
        let e = dial(addr, &me, 1 << 16, deadline)
            .await
            .expect_err("no answer");
        assert!(matches!(e, LinkError::NoAnswer(_)), "{e}");
        drop(l);
    }
}
