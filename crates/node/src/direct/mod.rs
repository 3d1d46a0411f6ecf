//! The direct data path of a group (docs/collectives.md): a group's user streams data
//! messages straight to a member's peer port, past the server, which keeps
//! only the control plane. The user opens the connection with a peer hello
//! from [`DIRECT_USER`] to the member's rank whose name is the group's
//! token (hex) from `opened`; the member answers with its own hello. Then
//! the user sends data messages (type 3, whole inputs of the group's
//! configuration, each at most the peer port's frame limit) and gets a data
//! message with the outputs, or an error message, for each id. Data runs on
//! the member's group cores one message at a time, between commands.
//!
//! Priority classes: a user that offers chunks in its hello
//! (`name\0chunks=N`, as on node links) and gets the member's offer back
//! may send its messages as chunks (type 0x1D) carrying their class; they
//! wait in [`queue`] by class. Results go back whole (docs/collectives.md
//! says why).

pub(crate) mod queue;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use bytes::Bytes;
use corefarm_smp::codec::{write_frame, FrameReader, Read};
use corefarm_smp::group::DIRECT_USER;
use corefarm_smp::stream::{Reassembler, CLASSES, DEFAULT_CLASS};
use corefarm_smp::{Data, ErrorCode, ErrorMsg, MsgType, OutFrame, DATA_ID_LEN};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use crate::metrics::NodeStats;
use crate::peer::{link, Incoming, PortStats, Refusal};
pub(crate) use queue::Submit;

/// Largest data message on the direct path (its inputs; the client's
/// `MAX_DIRECT_MESSAGE`), whole or chunked.
pub(crate) const MAX_MESSAGE: u64 = 1 << 20;

/// Chunked messages a direct connection may have begun and not finished:
/// one per class, as on node links.
pub(crate) const MAX_OPEN: usize = CLASSES as usize;

/// Answers of one direct connection not yet written to it, at most: a user
/// that sends and never reads is no longer read (TCP back-pressure) instead
/// of having its results pile up in the node's memory.
pub(crate) const MAX_UNWRITTEN: usize = 2 * queue::QUEUE;

/// An answer for the connection's writer, and the place it holds among the
/// connection's [`MAX_UNWRITTEN`] until written.
pub(crate) type Reply = (OutFrame, Option<OwnedSemaphorePermit>);

/// One data message of a direct user, its class, and where its answer goes.
pub(crate) struct DirectJob {
    pub id: u32,
    pub class: u8,
    pub data: Bytes,
    pub reply: mpsc::UnboundedSender<Reply>,
    /// Its place among the connection's unwritten answers.
    pub slot: OwnedSemaphorePermit,
}

/// What a member's direct connections share: who it is, what it offers,
/// where their messages go.
#[derive(Clone)]
pub(crate) struct Member {
    pub group: u32,
    pub rank: u32,
    pub token: u64,
    /// The chunk size this member offers (0: none).
    pub offer: u32,
    /// Its peer port's frame limit.
    pub max_frame: u32,
    pub jobs: Submit,
    pub stats: Option<std::sync::Arc<NodeStats>>,
    /// Its peer port's refusals.
    pub port: Arc<PortStats>,
}

/// Checks a direct user's hello, answers it, and serves the connection
/// until it ends; jobs go to `m.jobs`. A wrong hello closes the connection.
pub(crate) async fn accept(inc: Incoming, m: Member) {
    let Member {
        group,
        rank,
        token,
        offer,
        max_frame,
        jobs,
        stats,
        port,
    } = m;
    let Incoming {
        from,
        hello,
        token: shown,
        chunk_size: theirs,
        reader,
        mut writer,
        ..
    } = inc;
    if shown != token {
        let why = format_args!("group {group}: refused a direct connection: wrong group token");
        return port.refuse(Refusal::WrongToken, from, &why);
    }
    if hello.src != DIRECT_USER || hello.dst != rank {
        let why = format_args!(
            "group {group}: refused a direct connection from rank {} to rank {} (this is rank {rank})",
            hello.src, hello.dst
        );
        return port.refuse(Refusal::WrongRank, from, &why);
    }
    // Offered back only to a user that offered: an old user's answer stays
    // what it always was.
    let chunk_size = link::agree(offer, theirs);
    let answer = link::hello(
        group,
        rank,
        DIRECT_USER,
        token,
        &format!("rank {rank}"),
        if theirs > 0 { offer } else { 0 },
    );
    let Ok(f) = answer.to_frame() else { return };
    if writer.write_all(&f.to_vec()).await.is_err() {
        return;
    }
    let max_message = MAX_MESSAGE.min(u64::from(max_frame).saturating_sub(DATA_ID_LEN as u64));
    // One task for both directions, so ending the member ends the connection.
    let (tx, rx) = mpsc::unbounded_channel::<Reply>();
    tokio::join!(
        write_loop(writer, rx),
        read_loop(reader, tx, jobs, chunk_size, max_message, stats)
    );
}

async fn write_loop(mut w: OwnedWriteHalf, mut rx: mpsc::UnboundedReceiver<Reply>) {
    // Each answer's place is given back once it is written.
    while let Some((f, _slot)) = rx.recv().await {
        if write_frame(&mut w, f).await.is_err() {
            return;
        }
    }
}

/// Reads data messages and chunks until the user closes or breaks a rule
/// (then it gets an error without an id and the connection ends).
async fn read_loop(
    mut r: FrameReader<OwnedReadHalf>,
    reply: mpsc::UnboundedSender<Reply>,
    jobs: Submit,
    chunk_size: u32,
    max_message: u64,
    stats: Option<std::sync::Arc<NodeStats>>,
) {
    let bad = |reason: String| {
        let e = ErrorMsg::new(ErrorMsg::NO_ID, ErrorCode::Malformed, reason);
        let _ = reply.send((e.to_frame(), None));
    };
    // Bounded by messages open (one per class) and bytes held: two
    // messages' worth, the client's own reassembly bound. Chunks are read
    // into place, reserved whole at the first.
    let unwritten = Arc::new(Semaphore::new(MAX_UNWRITTEN));
    let mut chunks = Reassembler::new(max_message, MAX_OPEN, 2 * max_message)
        .reserve_whole()
        .chunk_limit(u64::from(chunk_size));
    loop {
        let placing = (chunk_size > 0).then_some(&mut chunks);
        let (id, class, data) = match r.read_with(placing).await {
            Ok(Some(Read::Frame(f))) => match f.ty {
                MsgType::Data => match Data::parse(f.payload) {
                    Ok(d) => (d.id, DEFAULT_CLASS, d.data),
                    Err(e) => return bad(e.to_string()),
                },
                MsgType::Chunk if chunk_size > 0 => match link::push(&mut chunks, f.payload) {
                    Ok(Some(m)) => (m.id, m.class, m.data),
                    Ok(None) => continue,
                    Err(e) => return bad(e),
                },
                MsgType::Chunk => {
                    return bad(
                        "a chunk on a direct connection that did not agree to chunks".into(),
                    )
                }
                other => return bad(format!("a {} message on a direct connection", other.name())),
            },
            Ok(Some(Read::Placed { whole, .. })) => match whole {
                Some(m) => (m.id, m.class, m.data),
                None => continue,
            },
            Ok(None) => return,
            Err(e) => return bad(e.to_string()),
        };
        let Ok(slot) = unwritten.clone().acquire_owned().await else {
            return;
        };
        let job = DirectJob {
            id,
            class,
            data,
            reply: reply.clone(),
            slot,
        };
        if jobs.push(job).await.is_err() {
            return;
        }
        if let Some(s) = &stats {
            s.direct_queued();
        }
    }
}
