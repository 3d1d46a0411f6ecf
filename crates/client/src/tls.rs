//! TLS for the blocking client (`ClientOptions::tls`).
//!
//! The client reads on its reader thread and writes on the callers'
//! threads, both blocking on the socket, but a rustls connection is one
//! state machine. So the connection is shared behind a mutex while each side
//! has its own clone of the socket, and no socket I/O ever happens under
//! that mutex:
//!
//! - the reader thread reads ciphertext from its socket without the lock,
//!   then locks only to feed it (`read_tls`, `process_new_packets`) and to
//!   take the plaintext;
//! - a writer locks only to encrypt into its own buffer, then writes that
//!   buffer to the socket after unlocking. Writers are serialised by a
//!   second lock (`order`), so records reach the socket in the order they
//!   were encrypted (their sequence numbers demand it).
//!
//! Holding the connection lock across a blocking write would deadlock: a
//! writer stalled on a full socket would keep the reader from taking the
//! results the server must send before it reads more from us.
//!
//! Records the reader must answer (a TLS 1.3 key update) are written by
//! whoever holds `order`: the reader if it is free, else the writer holding
//! it, which looks again after letting go (`pending`).

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use corefarm_smp::tls::rustls::ClientConnection;
use corefarm_smp::tls::ClientTls;

/// Ciphertext read per `read` call on the socket.
const RAW_BUFFER: usize = 64 << 10;
/// Plaintext encrypted per lock: large messages take a few rounds.
const SEND_CHUNK: usize = 256 << 10;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct Link {
    conn: Mutex<ClientConnection>,
    order: Mutex<()>,
    /// The reader left records to send while a writer held `order`.
    pending: AtomicBool,
}

impl Link {
    /// Encrypted records waiting in the connection, taken under its lock.
    fn take_records(&self, buf: &mut Vec<u8>) -> io::Result<()> {
        let mut c = lock(&self.conn);
        while c.wants_write() {
            c.write_tls(buf)?;
        }
        Ok(())
    }

    /// Sends what the reader queued, if nobody else holds `order`.
    fn send_pending(&self, sock: &TcpStream) -> io::Result<()> {
        self.pending.store(true, Ordering::SeqCst);
        loop {
            let Ok(_order) = self.order.try_lock() else {
                // The holder checks `pending` after letting go.
                return Ok(());
            };
            if !self.pending.swap(false, Ordering::SeqCst) {
                return Ok(());
            }
            let mut buf = Vec::new();
            self.take_records(&mut buf)?;
            (&*sock).write_all(&buf)?;
        }
    }
}

/// Why a connection's TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// No name to check the server's certificate against.
    #[error(transparent)]
    Name(#[from] corefarm_smp::tls::TlsError),
    #[error("{0}")]
    Rustls(corefarm_smp::tls::rustls::Error),
    #[error("{0}")]
    Socket(io::Error),
    #[error(
        "TLS handshake not done within {0:?} (is the server's port plain TCP? \
         then connect without a TLS CA)"
    )]
    TimedOut(Duration),
    /// The handshake failed; the text says what to fix
    /// ([`corefarm_smp::tls::explain`]).
    #[error("{}", corefarm_smp::tls::explain(.0))]
    Failed(io::Error),
}

/// The two halves of a connection: plain TCP without `tls`, else TLS over
/// `tcp` (connected to `addr`) once the handshake, bounded by `timeout`, is
/// done. For programs that speak SMP themselves (the benchmarking user).
pub fn split(
    tls: Option<&ClientTls>,
    addr: &str,
    tcp: TcpStream,
    timeout: Option<Duration>,
) -> Result<(SendHalf, RecvHalf), HandshakeError> {
    match tls {
        None => {
            let rd = tcp.try_clone().map_err(HandshakeError::Socket)?;
            Ok((SendHalf::Plain(tcp), RecvHalf::Plain(rd)))
        }
        Some(t) => handshake(t, addr, tcp, timeout),
    }
}

/// Connects TLS over `tcp` (connected to `addr`), within `timeout`.
pub(crate) fn handshake(
    tls: &ClientTls,
    addr: &str,
    mut tcp: TcpStream,
    timeout: Option<Duration>,
) -> Result<(SendHalf, RecvHalf), HandshakeError> {
    let name = tls.server_name(addr)?;
    let mut conn = ClientConnection::new(tls.config(), name).map_err(HandshakeError::Rustls)?;
    conn.set_buffer_limit(Some(SEND_CHUNK));
    let deadline = |tcp: &TcpStream, t: Option<Duration>| {
        tcp.set_read_timeout(t)
            .and_then(|_| tcp.set_write_timeout(t))
            .map_err(HandshakeError::Socket)
    };
    deadline(&tcp, timeout)?;
    while conn.is_handshaking() {
        if let Err(e) = conn.complete_io(&mut tcp) {
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) {
                return Err(HandshakeError::TimedOut(timeout.unwrap_or_default()));
            }
            return Err(HandshakeError::Failed(e));
        }
    }
    deadline(&tcp, None)?;
    let link = Arc::new(Link {
        conn: Mutex::new(conn),
        order: Mutex::new(()),
        pending: AtomicBool::new(false),
    });
    let rd = tcp.try_clone().map_err(HandshakeError::Socket)?;
    Ok((
        SendHalf::Tls(TlsSend {
            sock: tcp,
            link: link.clone(),
            buf: Vec::new(),
        }),
        RecvHalf::Tls(TlsRecv {
            sock: rd,
            link,
            raw: vec![0; RAW_BUFFER].into_boxed_slice(),
            start: 0,
            end: 0,
            eof: false,
        }),
    ))
}

/// The writing side of a connection.
pub enum SendHalf {
    Plain(TcpStream),
    Tls(TlsSend),
}

pub struct TlsSend {
    sock: TcpStream,
    link: Arc<Link>,
    buf: Vec<u8>,
}

impl std::fmt::Debug for SendHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendHalf::Plain(s) => write!(f, "Plain({s:?})"),
            SendHalf::Tls(t) => write!(f, "Tls({:?})", t.sock),
        }
    }
}

impl From<TcpStream> for SendHalf {
    fn from(s: TcpStream) -> Self {
        SendHalf::Plain(s)
    }
}

impl SendHalf {
    /// Another writer on the same connection. Over TLS, writes through any
    /// of them are serialised by the shared `order` lock, records intact.
    pub fn try_clone(&self) -> io::Result<SendHalf> {
        Ok(match self {
            SendHalf::Plain(s) => SendHalf::Plain(s.try_clone()?),
            SendHalf::Tls(t) => SendHalf::Tls(TlsSend {
                sock: t.sock.try_clone()?,
                link: t.link.clone(),
                buf: Vec::new(),
            }),
        })
    }

    /// The socket underneath, for socket options.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            SendHalf::Plain(s) => s,
            SendHalf::Tls(t) => &t.sock,
        }
    }

    /// Ends the connection. No `close_notify`: SMP frames carry their
    /// length, so the server tells a clean end from a truncated frame.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.tcp().shutdown(how)
    }
}

impl TlsSend {
    fn send(
        &mut self,
        encrypt: impl FnOnce(&mut ClientConnection) -> io::Result<usize>,
    ) -> io::Result<usize> {
        let order = lock(&self.link.order);
        self.buf.clear();
        let n = {
            let mut c = lock(&self.link.conn);
            let n = encrypt(&mut c)?;
            while c.wants_write() {
                c.write_tls(&mut self.buf)?;
            }
            n
        };
        self.sock.write_all(&self.buf)?;
        drop(order);
        if self.link.pending.load(Ordering::SeqCst) {
            self.link.send_pending(&self.sock)?;
        }
        Ok(n)
    }
}

impl Write for SendHalf {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        match self {
            SendHalf::Plain(s) => s.write(data),
            SendHalf::Tls(t) => t.send(|c| c.writer().write(data)),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            SendHalf::Plain(s) => s.write_vectored(bufs),
            SendHalf::Tls(t) => t.send(|c| c.writer().write_vectored(bufs)),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            SendHalf::Plain(s) => s.flush(),
            SendHalf::Tls(_) => Ok(()),
        }
    }
}

/// The reading side of a connection.
pub enum RecvHalf {
    Plain(TcpStream),
    Tls(TlsRecv),
}

pub struct TlsRecv {
    sock: TcpStream,
    link: Arc<Link>,
    /// Ciphertext read but not yet fed to the connection: `raw[start..end]`.
    raw: Box<[u8]>,
    start: usize,
    end: usize,
    eof: bool,
}

impl std::fmt::Debug for RecvHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecvHalf::Plain(s) => write!(f, "Plain({s:?})"),
            RecvHalf::Tls(t) => write!(f, "Tls({:?})", t.sock),
        }
    }
}

impl RecvHalf {
    /// The socket underneath, for socket options (read timeouts).
    pub fn tcp(&self) -> &TcpStream {
        match self {
            RecvHalf::Plain(s) => s,
            RecvHalf::Tls(t) => &t.sock,
        }
    }
}

impl Read for RecvHalf {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        match self {
            RecvHalf::Plain(s) => s.read(out),
            RecvHalf::Tls(t) => t.read(out),
        }
    }
}

impl TlsRecv {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            let (taken, answer) = {
                let mut c = lock(&self.link.conn);
                let mut stuck = None;
                while self.start < self.end {
                    let mut rest = &self.raw[self.start..self.end];
                    match c.read_tls(&mut rest) {
                        Ok(n) => self.start += n,
                        // Its plaintext buffer is full: take some out first.
                        Err(e) => {
                            stuck = Some(e);
                            break;
                        }
                    }
                    c.process_new_packets()
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                }
                if self.eof && self.start == self.end {
                    c.read_tls(&mut io::empty())?;
                    c.process_new_packets()
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                }
                let taken = match c.reader().read(out) {
                    Ok(n) => Some(n),
                    // Nothing to take out, so the connection refused the
                    // ciphertext for another reason: feeding it again would spin.
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock && stuck.is_some() => {
                        return Err(stuck.take().expect("checked"));
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
                    // No close_notify: an end like any other to SMP, whose
                    // frames carry their length (a cut frame is still caught).
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Some(0),
                    Err(e) => return Err(e),
                };
                (taken, c.wants_write())
            };
            if answer {
                self.link.send_pending(&self.sock)?;
            }
            if let Some(n) = taken {
                return Ok(n);
            }
            if self.eof {
                return Ok(0);
            }
            if self.start == self.end {
                // Blocking read without the lock (honours the read timeout).
                let n = self.sock.read(&mut self.raw)?;
                self.start = 0;
                self.end = n;
                self.eof = n == 0;
            }
        }
    }
}

#[cfg(test)]
#[path = "tls_tests.rs"]
pub(crate) mod tests;
