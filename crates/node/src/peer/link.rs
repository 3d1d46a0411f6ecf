//! One link to a neighbour: opening it (hello both ways), then a reader task
//! (deliver, forward, or report the link lost) and a writer task (the link's
//! scheduler picks the next message).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use corefarm_smp::codec::{FrameReader, ReadError};
use corefarm_smp::{MsgType, PeerBody, PeerHeader, PeerKind, PeerMsg};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::fabric::Shared;
use super::read_hello;
use super::sched::{LinkScheduler, Queued};

/// Read timeout of a begun frame on an open link.
pub(crate) const LINK_READ_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) fn hello(group: u32, src: u32, dst: u32, token: u64, name: &str) -> PeerMsg {
    PeerMsg {
        header: PeerHeader {
            kind: PeerKind::Hello,
            ttl: 0,
            group,
            src,
            dst,
            seq: 0,
        },
        body: PeerBody::Hello {
            token,
            name: name.into(),
        },
    }
}

pub(crate) async fn send_hello(w: &mut OwnedWriteHalf, m: &PeerMsg) -> std::io::Result<()> {
    let mut f = m
        .to_frame()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    w.write_all_buf(&mut f).await
}

/// Dials `peer` until it answers our hello with its own, or `deadline`.
/// The peer may not have joined the group yet (it then closes): retry.
pub(crate) async fn dial(
    addr: SocketAddr,
    me: &PeerMsg,
    max_frame: u32,
    deadline: Instant,
) -> Result<(FrameReader<OwnedReadHalf>, OwnedWriteHalf), String> {
    let mut backoff = Duration::from_millis(5);
    let mut last = String::from("no attempt");
    loop {
        let attempt = async {
            let s = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
            s.set_nodelay(true).map_err(|e| e.to_string())?;
            let (rd, mut wr) = s.into_split();
            send_hello(&mut wr, me).await.map_err(|e| e.to_string())?;
            let mut reader = FrameReader::new(rd, max_frame).with_read_timeout(LINK_READ_TIMEOUT);
            let (h, token, _name) = read_hello(&mut reader).await?;
            if Some(token) != me.token() {
                return Err("answered without the group's token".into());
            }
            let want = (me.header.group, me.header.dst, me.header.src);
            if (h.group, h.src, h.dst) != want {
                return Err(format!(
                    "answered as rank {} of group {} to rank {}, expected rank {} of group {} to rank {}",
                    h.src, h.group, h.dst, want.1, want.0, want.2
                ));
            }
            Ok((reader, wr))
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

/// Reads a link until it ends, then reports it lost.
pub(crate) async fn read_loop(
    shared: Arc<Shared>,
    peer: u32,
    mut reader: FrameReader<OwnedReadHalf>,
) {
    let reason = loop {
        let f = match reader.read_frame().await {
            Ok(Some(f)) => f,
            Ok(None) => break super::fabric::CLOSED.to_string(),
            Err(ReadError::Io(e)) => break format!("connection failed: {e}"),
            Err(ReadError::Protocol(e)) => break format!("sent an invalid message: {e}"),
        };
        if f.ty != MsgType::Peer {
            break format!("sent a {} message on a peer link", f.ty.name());
        }
        let m = match PeerMsg::parse(f.payload) {
            Ok(m) => m,
            Err(e) => break format!("sent an invalid peer message: {e}"),
        };
        if let Err(e) = shared.incoming(m).await {
            break e;
        }
    };
    shared.link_lost(peer, reason).await;
}

/// Writes what the scheduler picks until the fabric closes the queue.
pub(crate) async fn write_loop(
    mut rx: mpsc::UnboundedReceiver<Queued>,
    mut sched: Box<dyn LinkScheduler>,
    mut wr: OwnedWriteHalf,
) {
    loop {
        while let Ok(q) = rx.try_recv() {
            sched.push(q);
        }
        let mut q = match sched.pop() {
            Some(q) => q,
            None => match rx.recv().await {
                Some(q) => {
                    sched.push(q);
                    continue;
                }
                None => return,
            },
        };
        if let Err(e) = wr.write_all_buf(&mut q.frame).await {
            tracing::debug!("peer link write failed: {e}");
            return;
        }
    }
}
