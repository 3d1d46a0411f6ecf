//! Flow control and failure of the sending side, over in-memory pipes so
//! that "the node stopped" is observable deterministically: with the clock
//! paused, a timeout fires only once every task is idle.

use crate::common;

use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use common::*;
use corefarm_node::{session, NodeError, NodeOptions};
use corefarm_smp::codec::{write_frame, FrameReader};
use corefarm_smp::OutFrame;
use std::sync::atomic::AtomicBool;
use tokio::io::{duplex, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio_util::sync::CancellationToken;

type PipeServer = FakeServer<DuplexStream, DuplexStream>;

/// Pipe capacity in each direction.
const PIPE: usize = 64 * 1024;

/// Runs `session::run_io` over two pipes, one per direction, so that each
/// side can close one direction; `wrap` may replace the node's writing end.
fn start_piped<W>(opts: NodeOptions, wrap: impl FnOnce(DuplexStream) -> W) -> (PipeServer, Node)
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (node_rd, srv_wr) = duplex(PIPE);
    let (srv_rd, node_wr) = duplex(PIPE);
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let stop = stop.clone();
        let wr = wrap(node_wr);
        async move { session::run_io(node_rd, wr, &opts, stop).await }
    });
    let srv = FakeServer {
        reader: FrameReader::new(srv_rd, 1 << 30),
        writer: srv_wr,
    };
    (srv, Node { task, stop })
}

#[tokio::test(start_paused = true)]
async fn an_exhausted_memory_guard_stops_the_reading() {
    const SIZE: usize = 64 * 1024;
    const N: u32 = 64;
    // Room for two jobs (input + output each).
    let (mut srv, node) = start_piped(
        NodeOptions {
            memory_limit: 4 * SIZE,
            ..options()
        },
        |w| w,
    );
    srv.handshake(None).await;
    srv.configure(&bench(SIZE as u32, SIZE as u32, 0)).await;

    // The server keeps sending and does not read results yet.
    let written = Arc::new(AtomicU32::new(0));
    let FakeServer { reader, writer } = srv;
    let mut feeder = tokio::spawn({
        let (written, mut writer) = (written.clone(), writer);
        async move {
            for id in 0..N {
                let f = OutFrame::data(id, inputs(id, 1, SIZE).into()).unwrap();
                write_frame(&mut writer, f).await.unwrap();
                written.fetch_add(1, Ordering::SeqCst);
            }
            writer
        }
    });
    // Everything goes idle with the feeder blocked: the node holds two
    // jobs' worth, a frame waiting for memory and what the pipes buffer.
    let idle = tokio::time::timeout(Duration::from_secs(3600), &mut feeder).await;
    assert!(idle.is_err(), "the node read all {N} messages");
    let k = written.load(Ordering::SeqCst);
    assert!(k <= 6, "{k} messages taken with room for two");

    // Reading the results frees memory; every message comes back in order.
    let mut srv = FakeServer {
        reader,
        writer: tokio::io::sink(),
    };
    for id in 0..N {
        let (got, out) = srv.expect_data().await;
        assert_eq!(got, id);
        check_echo(&inputs(id, 1, SIZE), &out, SIZE, SIZE);
    }
    let mut writer = within("the feeder to finish", feeder).await.unwrap();
    writer.shutdown().await.unwrap();
    node.ended().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_server_that_stops_reading_entirely_ends_the_session() {
    let (mut srv, node) = start_piped(options(), |w| w);
    srv.handshake(None).await;
    srv.configure(&bench(16, 16, 0)).await;
    // The server's reading side goes away; its writing side stays open.
    let FakeServer { reader, mut writer } = srv;
    drop(reader);
    let f = OutFrame::data(1, inputs(1, 1, 16).into()).unwrap();
    write_frame(&mut writer, f).await.unwrap();
    let e = node.ended().await.unwrap_err();
    assert!(matches!(e, NodeError::Io(_)), "{e}");
    // The node's reading end is gone too: the server sees the connection closed.
    let f = OutFrame::data(2, inputs(2, 1, 16).into()).unwrap();
    assert!(write_frame(&mut writer, f).await.is_err());
}

/// A writer that panics once armed (the sending task dies without an error
/// of its own).
struct PanicWhenArmed<W> {
    inner: W,
    armed: Arc<AtomicBool>,
}

impl<W: AsyncWrite + Unpin> AsyncWrite for PanicWhenArmed<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        assert!(
            !self.armed.load(Ordering::SeqCst),
            "scripted writer failure"
        );
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[tokio::test(start_paused = true)]
async fn a_dead_sending_task_ends_the_session_and_closes() {
    let armed = Arc::new(AtomicBool::new(false));
    let (mut srv, node) = start_piped(options(), |w| PanicWhenArmed {
        inner: w,
        armed: armed.clone(),
    });
    srv.handshake(None).await;
    srv.configure(&bench(16, 16, 0)).await;
    armed.store(true, Ordering::SeqCst);
    srv.data(1, inputs(1, 1, 16)).await;
    let e = node.ended().await.unwrap_err().to_string();
    assert!(e.contains("sending task"), "{e}");
    srv.closed().await;
    // The node's reading end is gone as well.
    let f = OutFrame::data(2, inputs(2, 1, 16).into()).unwrap();
    assert!(write_frame(&mut srv.writer, f).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn stop_ends_a_session_waiting_for_memory() {
    const SIZE: usize = 64 * 1024;
    let (mut srv, node) = start_piped(
        NodeOptions {
            memory_limit: 2 * SIZE,
            ..options()
        },
        |w| w,
    );
    srv.handshake(None).await;
    srv.configure(&bench(SIZE as u32, SIZE as u32, 0)).await;
    // Results are not read: the node blocks on memory for the later inputs.
    let FakeServer { reader, mut writer } = srv;
    let feeder = tokio::spawn(async move {
        for id in 0..8u32 {
            let f = OutFrame::data(id, inputs(id, 1, SIZE).into()).unwrap();
            if write_frame(&mut writer, f).await.is_err() {
                break;
            }
        }
    });
    let idle = tokio::time::timeout(Duration::from_secs(3600), std::future::pending::<()>()).await;
    assert!(idle.is_err());
    node.stop.cancel();
    assert!(node.ended().await.is_ok(), "a stopped session ends cleanly");
    drop(reader);
    within("the feeder to see the end", feeder).await.unwrap();
}
