//! Opening the connection: name resolution, TCP connect, TLS if asked for
//! (`ClientOptions::tls`) and the hello exchange that negotiates the extensions.

use std::io;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use corefarm_smp::auth::{AuthChallenge, AuthResponse, SECRET_ENV, SECRET_FILE_ENV};
use corefarm_smp::blocking::{write_frame, FrameReader};
use corefarm_smp::codec::ReadError;
use corefarm_smp::hello::features;
use corefarm_smp::{ErrorMsg, Hello, MsgType};

use crate::tls::{RecvHalf, SendHalf};
use crate::{ClientError, ClientOptions, Result};

/// Resolves `addr` and connects to the first address that accepts.
pub(crate) fn open(addr: &str, timeout: Option<Duration>) -> Result<TcpStream> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|cause| ClientError::Resolve {
            addr: addr.to_string(),
            cause,
        })?
        .collect();
    let mut last = io::Error::new(io::ErrorKind::NotFound, "the name resolved to no address");
    for a in addrs {
        let r = match timeout {
            Some(t) => TcpStream::connect_timeout(&a, t),
            None => TcpStream::connect(a),
        };
        match r {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(ClientError::Connect {
        addr: addr.to_string(),
        cause: last,
    })
}

/// Connects to `addr` and sets the socket up; with `opts.tls`, runs the TLS
/// handshake within the connect timeout.
pub(crate) fn open_link(
    addr: &str,
    opts: &ClientOptions,
) -> Result<(SendHalf, FrameReader<RecvHalf>)> {
    let stream = open(addr, opts.connect_timeout)?;
    let io = |during| move |source| ClientError::Io { during, source };
    stream
        .set_nodelay(true)
        .map_err(io("configuring the socket"))?;
    let (writer, reader) = match &opts.tls {
        None => {
            let read_half = stream.try_clone().map_err(io("configuring the socket"))?;
            (SendHalf::Plain(stream), RecvHalf::Plain(read_half))
        }
        Some(tls) => {
            crate::tls::handshake(tls, addr, stream, opts.connect_timeout).map_err(|cause| {
                ClientError::Tls {
                    addr: addr.to_string(),
                    cause: Box::new(cause),
                }
            })?
        }
    };
    writer
        .tcp()
        .set_write_timeout(opts.io_timeout)
        .map_err(io("configuring the socket"))?;
    Ok((writer, FrameReader::new(reader, opts.max_message)))
}

/// `moves_on`: the client has other addresses to resume on, so a server
/// without nodes may refuse its first configuration at once.
pub(crate) fn handshake(
    addr: &str,
    opts: &ClientOptions,
    moves_on: bool,
    writer: &mut SendHalf,
    reader: &mut FrameReader<RecvHalf>,
) -> Result<Hello> {
    let fail = |detail: String| ClientError::Handshake {
        addr: addr.to_string(),
        detail,
    };
    let mut hello = Hello::new("user");
    hello.name = opts.name.clone();
    hello.user = opts.user.clone();
    // `any-length`: a streaming handler's result comes as emitted (Output::count);
    // `spin-notify`: its notifications come too (recv_notification).
    hello.features = [
        features::ERROR,
        features::CREDIT,
        features::STATUS,
        features::ANY_LENGTH,
        features::SPIN_NOTIFY,
    ]
    .map(String::from)
    .to_vec();
    hello.nodes = opts.nodes;
    // What this client's reader takes: a result beyond it fails by id at
    // the server instead of breaking the connection here.
    hello.max_message = Some(opts.max_message);
    if opts.secret.is_some() {
        hello.features.push(features::AUTH.into());
    }
    if moves_on {
        hello.features.push(features::MOVES_ON.into());
    }
    if opts.chunks {
        hello.features.push(features::CHUNKS.into());
        hello.chunk_size = opts.chunk_size;
    }
    // Kept as sent: an answer to a challenge covers these exact bytes.
    let hello_bytes = hello.encode();
    write_frame(writer, hello.to_frame()).map_err(|e| fail(format!("sending hello: {e}")))?;

    // The read timeout is per socket, so it also bounds the reader's clone;
    // it is lifted again before the reader thread takes over.
    reader
        .get_ref()
        .tcp()
        .set_read_timeout(opts.connect_timeout)
        .map_err(|e| fail(e.to_string()))?;
    let mut frame = read_reply(reader, opts, &fail)?;
    if frame.ty == MsgType::AuthChallenge {
        let challenge = AuthChallenge::parse(&frame.payload).map_err(|e| fail(e.to_string()))?;
        let Some(secret) = &opts.secret else {
            return Err(fail(format!(
                "the server requires authentication: give the user secret ({SECRET_ENV}, \
                 {SECRET_FILE_ENV} or --secret-file)"
            )));
        };
        let answer = AuthResponse::answer(secret, &challenge, "user", &hello_bytes);
        write_frame(writer, answer.to_frame())
            .map_err(|e| fail(format!("sending the authentication answer: {e}")))?;
        frame = read_reply(reader, opts, &fail)?;
    }
    reader
        .get_ref()
        .tcp()
        .set_read_timeout(None)
        .map_err(|e| fail(e.to_string()))?;
    match frame.ty {
        MsgType::Hello => {
            let h = Hello::decode(&frame.payload).map_err(|e| fail(e.to_string()))?;
            if h.role != "server" {
                return Err(fail(format!(
                    "the peer says it is a {:?}, not a server",
                    h.role
                )));
            }
            Ok(h)
        }
        // E.g. "no nodes available": the server's own words are the best message.
        MsgType::Error => match ErrorMsg::parse(&frame.payload) {
            Ok(e) => Err(ClientError::Server(e)),
            Err(e) => Err(fail(e.to_string())),
        },
        other => Err(fail(format!(
            "expected a hello reply, got a {} message",
            other.name()
        ))),
    }
}

/// One frame of the hello exchange, within the connect timeout.
fn read_reply(
    reader: &mut FrameReader<RecvHalf>,
    opts: &ClientOptions,
    fail: &dyn Fn(String) -> ClientError,
) -> Result<corefarm_smp::Frame> {
    match reader.read_frame() {
        Ok(Some(f)) => Ok(f),
        Ok(None) => Err(fail(
            "the server closed the connection (a seed-only server? try legacy mode)".into(),
        )),
        Err(ReadError::Io(e))
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            Err(fail(format!(
                "no hello reply within {:?}",
                opts.connect_timeout.unwrap_or_default()
            )))
        }
        Err(e) => Err(fail(e.to_string())),
    }
}
