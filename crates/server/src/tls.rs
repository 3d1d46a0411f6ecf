//! Optional TLS on the server's ports (`--tls-cert`, `--tls-key`,
//! `--tls-ports`).
//!
//! A connection is a `Stream`: plain TCP or TLS over TCP. Its halves are
//! enums rather than boxed trait objects so that the plain-TCP hot path
//! stays what it was (the `OwnedReadHalf`/`OwnedWriteHalf` of the socket,
//! one match per call, no extra copy or lock); a TLS connection is split
//! with `tokio::io::split` (a lock per call, uncontended: one reader task,
//! one writer task) and written only by the connection's writer task
//! (see `sink.rs`). Each TLS half keeps a duplicate of the socket's
//! descriptor for socket options and for sending FIN without the lock.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use corefarm_smp::{hello::features, ErrorCode, ErrorMsg, Header, Hello, MsgType, HEADER_LEN};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::limits::Port;

/// Which ports speak TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsPorts {
    Users,
    Nodes,
    Both,
}

/// A `--tls-ports` value other than users, nodes or both.
#[derive(Debug, thiserror::Error)]
#[error("{0:?}: expected users, nodes or both")]
pub struct UnknownTlsPorts(pub String);

impl std::str::FromStr for TlsPorts {
    type Err = UnknownTlsPorts;
    fn from_str(s: &str) -> Result<Self, UnknownTlsPorts> {
        match s {
            "users" => Ok(TlsPorts::Users),
            "nodes" => Ok(TlsPorts::Nodes),
            "both" => Ok(TlsPorts::Both),
            other => Err(UnknownTlsPorts(other.to_string())),
        }
    }
}

impl std::fmt::Display for TlsPorts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TlsPorts::Users => "users",
            TlsPorts::Nodes => "nodes",
            TlsPorts::Both => "both",
        })
    }
}

/// The server's certificate, and the ports it is used on.
#[derive(Clone)]
pub struct ServerTls {
    acceptor: TlsAcceptor,
    pub ports: TlsPorts,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ServerTls({})", self.ports)
    }
}

impl ServerTls {
    pub fn load(
        cert: &Path,
        key: &Path,
        ports: TlsPorts,
    ) -> Result<Self, corefarm_smp::tls::TlsError> {
        let cfg = corefarm_smp::tls::server_config(cert, key)?;
        Ok(ServerTls {
            acceptor: TlsAcceptor::from(cfg),
            ports,
        })
    }

    pub(crate) fn covers(&self, port: Port) -> bool {
        matches!(
            (self.ports, port),
            (TlsPorts::Both, _) | (TlsPorts::Users, Port::Users) | (TlsPorts::Nodes, Port::Nodes)
        )
    }
}

/// A peer's connection: plain TCP or TLS.
pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Stream {
    pub fn into_split(self) -> (ReadHalf, WriteHalf) {
        match self {
            Stream::Plain(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Plain(r), WriteHalf::Plain(w))
            }
            Stream::Tls(s) => {
                // A duplicate descriptor of the same socket: options and
                // shutdown apply to the socket, whoever holds the stream.
                let sock = socket2::SockRef::from(s.get_ref().0)
                    .try_clone()
                    .map(Arc::new);
                let (r, w) = tokio::io::split(*s);
                match sock {
                    Ok(sock) => (
                        ReadHalf::Tls(r, sock.clone()),
                        WriteHalf::Tls(w, Some(sock)),
                    ),
                    // Out of descriptors: the connection works without them.
                    Err(_) => (ReadHalf::TlsNoSock(r), WriteHalf::Tls(w, None)),
                }
            }
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => eof_is_end(Pin::new(&mut **s).poll_read(cx, buf)),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}

type TlsRead = tokio::io::ReadHalf<TlsStream<TcpStream>>;
type TlsWrite = tokio::io::WriteHalf<TlsStream<TcpStream>>;

/// The reading half of a [`Stream`].
pub(crate) enum ReadHalf {
    Plain(OwnedReadHalf),
    Tls(TlsRead, Arc<socket2::Socket>),
    TlsNoSock(TlsRead),
}

impl From<OwnedReadHalf> for ReadHalf {
    fn from(r: OwnedReadHalf) -> Self {
        ReadHalf::Plain(r)
    }
}

impl ReadHalf {
    /// The socket, for options such as `SO_RCVBUF`.
    pub fn sock(&self) -> Option<socket2::SockRef<'_>> {
        match self {
            ReadHalf::Plain(r) => Some(socket2::SockRef::from(r.as_ref())),
            ReadHalf::Tls(_, s) => Some(socket2::SockRef::from(&**s)),
            ReadHalf::TlsNoSock(_) => None,
        }
    }
}

/// A TLS peer that closes without `close_notify` has ended the stream as
/// far as SMP is concerned: frames carry their length, so a truncated frame
/// is still reported as one by the frame reader.
fn eof_is_end(r: Poll<io::Result<()>>) -> Poll<io::Result<()>> {
    match r {
        Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => Poll::Ready(Ok(())),
        other => other,
    }
}

/// Plain TCP reads chunk runs with one syscall; TLS reads its records.
impl corefarm_smp::codec::ReadVectored for ReadHalf {
    fn tcp(&self) -> Option<&TcpStream> {
        match self {
            ReadHalf::Plain(r) => Some(r.as_ref()),
            ReadHalf::Tls(..) | ReadHalf::TlsNoSock(_) => None,
        }
    }
}

impl AsyncRead for ReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReadHalf::Plain(r) => Pin::new(r).poll_read(cx, buf),
            ReadHalf::Tls(r, _) | ReadHalf::TlsNoSock(r) => {
                eof_is_end(Pin::new(r).poll_read(cx, buf))
            }
        }
    }
}

/// The writing half of a [`Stream`].
pub(crate) enum WriteHalf {
    Plain(OwnedWriteHalf),
    Tls(TlsWrite, Option<Arc<socket2::Socket>>),
}

impl From<OwnedWriteHalf> for WriteHalf {
    fn from(w: OwnedWriteHalf) -> Self {
        WriteHalf::Plain(w)
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WriteHalf::Plain(w) => Pin::new(w).poll_write(cx, buf),
            WriteHalf::Tls(w, _) => Pin::new(w).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WriteHalf::Plain(w) => Pin::new(w).poll_write_vectored(cx, bufs),
            WriteHalf::Tls(w, _) => Pin::new(w).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Plain(w) => Pin::new(w).poll_flush(cx),
            WriteHalf::Tls(w, _) => Pin::new(w).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Plain(w) => Pin::new(w).poll_shutdown(cx),
            WriteHalf::Tls(w, _) => Pin::new(w).poll_shutdown(cx),
        }
    }
}

/// First byte of a TLS record carrying a handshake (the ClientHello).
const TLS_HANDSHAKE: u8 = 0x16;

/// Runs the server side of the handshake within `timeout`. `None` when it
/// failed: the reason is logged, and a plain SMP peer that announced the
/// error feature is told in SMP that the port wants TLS.
pub(crate) async fn accept(
    tls: &ServerTls,
    tcp: TcpStream,
    addr: SocketAddr,
    port: Port,
    timeout: Duration,
) -> Option<Stream> {
    let what = match port {
        Port::Users => "user",
        Port::Nodes => "node",
    };
    let mut first = [0u8; 1];
    match tokio::time::timeout(timeout, tcp.peek(&mut first)).await {
        Ok(Ok(1)) if first[0] == TLS_HANDSHAKE => {}
        Ok(Ok(1)) => {
            tracing::warn!(peer = %addr, "{what} connection refused: plain SMP on a TLS port (the peer needs --tls-ca)");
            let _ = tokio::time::timeout(timeout, tell_plain_peer(tcp, what)).await;
            return None;
        }
        Ok(Ok(_)) => return None, // closed before saying anything
        Ok(Err(e)) => {
            tracing::warn!(peer = %addr, "{what} connection failed before the TLS handshake: {e}");
            return None;
        }
        Err(_) => {
            tracing::warn!(peer = %addr, "{what} connection refused: no TLS handshake within {timeout:?}");
            return None;
        }
    }
    match tokio::time::timeout(timeout, tls.acceptor.accept(tcp)).await {
        Ok(Ok(s)) => Some(Stream::Tls(Box::new(s))),
        Ok(Err(e)) => {
            tracing::warn!(peer = %addr, "{what} connection refused: TLS handshake failed: {e}");
            None
        }
        Err(_) => {
            tracing::warn!(peer = %addr, "{what} connection refused: TLS handshake not done within {timeout:?}");
            None
        }
    }
}

/// Largest hello read from a plain peer on a TLS port.
const MAX_HELLO: u32 = 64 * 1024;

/// A plain hello peer that takes errors learns why it is refused.
async fn tell_plain_peer(mut tcp: TcpStream, role: &str) -> io::Result<()> {
    let mut hb = [0u8; HEADER_LEN];
    tcp.read_exact(&mut hb).await?;
    let Ok(header) = Header::decode(&hb, MAX_HELLO) else {
        return Ok(());
    };
    if header.ty != MsgType::Hello {
        return Ok(());
    }
    let mut payload = vec![0u8; header.size as usize];
    tcp.read_exact(&mut payload).await?;
    match Hello::decode(&payload) {
        Ok(h) if h.role == role && h.has(features::ERROR) => {
            let reason = "this server port requires TLS: connect with --tls-ca \
                          (tls_ca= in Python) naming the CA of the server's certificate";
            let f = ErrorMsg::new(ErrorMsg::NO_ID, ErrorCode::Unauthorized, reason).to_frame();
            tcp.write_all(&f.to_vec()).await?;
            tcp.shutdown().await?;
            // Drain so the close does not reset the connection before the peer reads.
            tokio::io::copy(&mut tcp, &mut tokio::io::sink()).await?;
        }
        _ => {}
    }
    Ok(())
}
