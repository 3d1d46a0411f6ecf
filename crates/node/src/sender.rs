//! The sending task: writes results and control frames to the server, in the
//! order they were queued, several per vectored write when they pile up.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use corefarm_smp::codec::write_batch;
use corefarm_smp::{ErrorMsg, OutFrame};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::guard::Reservation;
use crate::handlers::Outgoing;

/// Why the sending task stopped before its queue was closed.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("writing to the server failed: {0}")]
    Io(#[from] std::io::Error),
    /// A seed-format server cannot be told that an input failed; closing the
    /// connection makes it re-dispatch instead of waiting forever.
    #[error("{0}; closing the connection (the server did not negotiate error messages)")]
    Closed(String),
}

/// The frame for one queued item; its reservation moves to `held` until the
/// frame is written. `Err(reason)` when the only way to report it is to close.
fn to_wire(o: Outgoing, held: &mut Vec<Reservation>, negotiated: bool) -> Result<OutFrame, String> {
    let (id, code, reason) = match o {
        Outgoing::Frame(f) => return Ok(f),
        Outgoing::Result {
            id,
            data,
            reservation,
        } => {
            held.push(reservation);
            // Result sizes are bounded when data is accepted, so this is a
            // safety net: the input fails with a reason, the task goes on.
            match OutFrame::data(id, data) {
                Ok(f) => return Ok(f),
                Err(e) => (id, e.code(), format!("result cannot be sent: {e}")),
            }
        }
        Outgoing::Failed {
            id,
            code,
            reason,
            reservation,
        } => {
            held.extend(reservation);
            (id, code, reason)
        }
    };
    tracing::warn!("data id {id} failed: {reason}");
    if negotiated {
        Ok(ErrorMsg::new(id, code, reason).to_frame())
    } else {
        Err(format!("data id {id} failed: {reason}"))
    }
}

/// Runs until the queue is closed (`Ok(results written)`) or writing fails.
/// `negotiated` tells whether the server accepts error messages.
pub async fn send_loop<W: AsyncWrite + Unpin>(
    mut wr: W,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    negotiated: Arc<AtomicBool>,
    stats: Option<Arc<crate::metrics::NodeStats>>,
) -> Result<u64, SendError> {
    let mut results = 0u64;
    // Reservations are released only once their result is on the wire, so
    // the memory guard also counts results waiting for the socket.
    let mut held = Vec::new();
    while let Some(o) = rx.recv().await {
        let neg = negotiated.load(Ordering::Relaxed);
        let mut fatal = None;
        match to_wire(o, &mut held, neg) {
            Ok(first) => {
                let more = || match to_wire(rx.try_recv().ok()?, &mut held, neg) {
                    Ok(f) => Some(f),
                    Err(why) => {
                        fatal = Some(why);
                        None
                    }
                };
                write_batch(&mut wr, first, more).await?;
            }
            Err(why) => fatal = Some(why),
        }
        results += held.len() as u64;
        if let Some(s) = &stats {
            s.answered(held.len());
        }
        held.clear();
        if let Some(why) = fatal {
            let _ = wr.shutdown().await;
            return Err(SendError::Closed(why));
        }
    }
    let _ = wr.shutdown().await;
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::MemoryGuard;
    use bytes::Bytes;
    use corefarm_smp::codec::FrameReader;
    use corefarm_smp::{ErrorCode, MsgType};

    async fn failed(g: &MemoryGuard, id: u32) -> Outgoing {
        Outgoing::Failed {
            id,
            code: ErrorCode::CoreFailure,
            reason: "boom".into(),
            reservation: Some(g.reserve(1024).await),
        }
    }

    #[tokio::test]
    async fn failures_become_error_frames_for_a_negotiating_server() {
        let g = MemoryGuard::new(4096);
        let (tx, rx) = mpsc::unbounded_channel();
        let (a, b) = tokio::io::duplex(1 << 16);
        tx.send(Outgoing::Result {
            id: 1,
            data: Bytes::from_static(b"ok"),
            reservation: g.reserve(1024).await,
        })
        .unwrap();
        tx.send(failed(&g, 2).await).unwrap();
        drop(tx);
        let sent = send_loop(a, rx, Arc::new(AtomicBool::new(true)), None)
            .await
            .unwrap();
        assert_eq!(sent, 2);
        assert_eq!(
            g.available(),
            g.limit(),
            "reservations released once written"
        );
        let mut r = FrameReader::new(b, 1024);
        let f = r.read_frame().await.unwrap().unwrap();
        assert_eq!(
            (f.ty, &f.payload[..]),
            (MsgType::Data, &b"\x01\0\0\0ok"[..])
        );
        let f = r.read_frame().await.unwrap().unwrap();
        let e = ErrorMsg::parse(&f.payload).unwrap();
        assert_eq!(
            (e.id, e.code(), e.reason.as_str()),
            (2, Some(ErrorCode::CoreFailure), "boom")
        );
        assert!(r.read_frame().await.unwrap().is_none(), "then a clean end");
    }

    #[tokio::test]
    async fn a_seed_server_is_told_about_a_failure_by_closing() {
        let g = MemoryGuard::new(4096);
        let (tx, rx) = mpsc::unbounded_channel();
        let (a, b) = tokio::io::duplex(1 << 16);
        tx.send(Outgoing::Frame(
            corefarm_smp::ConfigurationResponse { status: 0 }.to_frame(),
        ))
        .unwrap();
        tx.send(failed(&g, 9).await).unwrap();
        let e = send_loop(a, rx, Arc::new(AtomicBool::new(false)), None)
            .await
            .unwrap_err();
        assert!(
            matches!(e, SendError::Closed(ref why) if why.contains("data id 9")),
            "{e}"
        );
        let mut r = FrameReader::new(b, 1024);
        let f = r.read_frame().await.unwrap().unwrap();
        assert_eq!(
            f.ty,
            MsgType::ConfigurationResponse,
            "frames before it are written"
        );
        assert!(r.read_frame().await.unwrap().is_none());
        assert_eq!(g.available(), g.limit());
        drop(tx);
    }

    #[tokio::test]
    async fn a_write_error_ends_the_task() {
        let (tx, rx) = mpsc::unbounded_channel();
        let (a, b) = tokio::io::duplex(64);
        drop(b);
        tx.send(Outgoing::Frame(
            corefarm_smp::ConfigurationResponse { status: 0 }.to_frame(),
        ))
        .unwrap();
        let e = send_loop(a, rx, Arc::new(AtomicBool::new(true)), None)
            .await
            .unwrap_err();
        assert!(matches!(e, SendError::Io(_)), "{e}");
    }
}
