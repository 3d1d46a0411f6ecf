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

/// Dials `peer` until it answers our hello with its own, or `deadline`.
/// The peer may not have joined the group yet (it then closes): retry.
pub(crate) async fn dial(
    addr: SocketAddr,
    me: &PeerMsg,
    max_frame: u32,
    deadline: Instant,
) -> Result<Opened, LinkError> {
    let mut backoff = Duration::from_millis(5);
    let mut last = LinkError::NoAttempt;
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
        match tokio::time::timeout_at(deadline, attempt).await {
            Ok(Ok(link)) => return Ok(link),
            Ok(Err(e)) => last = e,
            Err(_) => return Err(last),
        }
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
