//! The direct data path (issue 9 item 4): a group's user streams data
//! messages straight to a member's peer port, past the server, which keeps
//! only the control plane. The user opens the connection with a peer hello
//! from [`DIRECT_USER`] to the member's rank whose name is the group's
//! token (hex) from `opened`; the member answers with its own hello. Then
//! the user sends data messages (type 3, whole inputs of the group's
//! configuration, each at most the peer port's frame limit) and gets a data
//! message with the outputs, or an error message, for each id. Data runs on
//! the member's group cores one message at a time, between commands.

use bytes::Bytes;
use corefarm_smp::codec::{write_frame, FrameReader};
use corefarm_smp::group::DIRECT_USER;
use corefarm_smp::{
    Data, ErrorCode, ErrorMsg, MsgType, OutFrame, PeerBody, PeerHeader, PeerKind, PeerMsg,
};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;

use crate::peer::Incoming;

/// One data message of a direct user, and where its answer goes.
pub(crate) struct DirectJob {
    pub id: u32,
    pub data: Bytes,
    pub reply: mpsc::UnboundedSender<OutFrame>,
}

/// Data messages of all direct connections waiting for a member's cores:
/// beyond this, their readers stop reading (TCP back-pressure).
pub(crate) const QUEUE: usize = 16;

/// Checks a direct user's hello, answers it, and serves the connection
/// until it ends; jobs go to `jobs`. A wrong hello closes the connection.
pub(crate) async fn accept(
    inc: Incoming,
    group: u32,
    rank: u32,
    token: u64,
    jobs: mpsc::Sender<DirectJob>,
) {
    let Incoming {
        hello,
        token: shown,
        reader,
        mut writer,
        ..
    } = inc;
    if hello.src != DIRECT_USER || hello.dst != rank || shown != token {
        tracing::warn!(
            group,
            rank,
            "refused a direct connection (rank {}, wrong token or source)",
            hello.dst
        );
        return;
    }
    let answer = PeerMsg {
        header: PeerHeader {
            kind: PeerKind::Hello,
            ttl: 0,
            group,
            src: rank,
            dst: DIRECT_USER,
            seq: 0,
        },
        body: PeerBody::Hello {
            token,
            name: format!("rank {rank}"),
        },
    };
    let Ok(f) = answer.to_frame() else { return };
    if writer.write_all(&f.to_vec()).await.is_err() {
        return;
    }
    // One task for both directions, so ending the member ends the connection.
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::join!(write_loop(writer, rx), read_loop(reader, tx, jobs));
}

async fn write_loop(mut w: OwnedWriteHalf, mut rx: mpsc::UnboundedReceiver<OutFrame>) {
    while let Some(f) = rx.recv().await {
        if write_frame(&mut w, f).await.is_err() {
            return;
        }
    }
}

async fn read_loop(
    mut r: FrameReader<OwnedReadHalf>,
    reply: mpsc::UnboundedSender<OutFrame>,
    jobs: mpsc::Sender<DirectJob>,
) {
    let bad = |reason: String| {
        let _ = reply.send(ErrorMsg::new(ErrorMsg::NO_ID, ErrorCode::Malformed, reason).to_frame());
    };
    loop {
        let f = match r.read_frame().await {
            Ok(Some(f)) => f,
            Ok(None) => return,
            Err(e) => return bad(e.to_string()),
        };
        if f.ty != MsgType::Data {
            return bad(format!("a {} message on a direct connection", f.ty.name()));
        }
        let d = match Data::parse(f.payload) {
            Ok(d) => d,
            Err(e) => return bad(e.to_string()),
        };
        let job = DirectJob {
            id: d.id,
            data: d.data,
            reply: reply.clone(),
        };
        if jobs.send(job).await.is_err() {
            return;
        }
    }
}
