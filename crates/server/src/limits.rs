//! Connections beyond `--max-users` / `--max-nodes` are refused with a
//! reason the peer can read, then closed.
//!
//! The refusal itself must not become a resource a peer can hold: only a
//! bounded number of refusals are answered at once (the rest are closed
//! straight away), each within a short deadline, reading at most a header and
//! a small hello.
//!
//! A connection still in its TLS handshake or authentication holds a place
//! too, but at most a quarter of a port's places (64 at most) may be held
//! that way, and the way in must be complete within one `--read-timeout`:
//! peers without a secret can neither take every place nor keep one.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use corefarm_smp::{
    hello::features, ConfigurationResponse, ErrorCode, ErrorMsg, Header, Hello, MsgType, HEADER_LEN,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use crate::ServerState;

/// Refusals answered at the same time; more are just closed.
const CONCURRENT: usize = 64;
/// Largest hello a refused peer may send (a hello is a few hundred bytes).
const MAX_HELLO: u32 = 64 * 1024;
/// Upper bound on the time spent answering one refused peer.
const MAX_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Port {
    Users,
    Nodes,
}

pub(crate) struct Refusals {
    slots: Arc<Semaphore>,
    max_users: usize,
    max_nodes: usize,
    wait: Duration,
}

impl Refusals {
    pub fn new(shared: &ServerState) -> Self {
        Refusals {
            slots: Arc::new(Semaphore::new(CONCURRENT)),
            max_users: shared.opts.max_users,
            max_nodes: shared.opts.max_nodes,
            wait: shared.opts.read_timeout.min(MAX_WAIT),
        }
    }

    /// Refuses one connection; returns at once (the answer is a task).
    pub fn refuse(&self, port: Port, stream: TcpStream, addr: SocketAddr) {
        let reason = reason(port, self.max_users, self.max_nodes);
        self.refuse_because(port, stream, addr, reason);
    }

    /// Refused because `cap` connections of the port are still on their way
    /// in (TLS handshake, authentication).
    pub fn refuse_opening(&self, port: Port, stream: TcpStream, addr: SocketAddr, cap: usize) {
        let reason = format!(
            "the server has {cap} connection(s) of this port still in their TLS handshake \
             or authentication, its limit for those; try again later"
        );
        self.refuse_because(port, stream, addr, reason);
    }

    fn refuse_because(&self, port: Port, stream: TcpStream, addr: SocketAddr, reason: String) {
        tracing::warn!(peer = %addr, "connection refused: {reason}");
        let Ok(permit) = self.slots.clone().try_acquire_owned() else {
            return; // dropping the stream closes it
        };
        let wait = self.wait;
        tokio::spawn(async move {
            let _permit = permit;
            let _ = tokio::time::timeout(wait, answer(port, stream, reason)).await;
        });
    }
}

fn reason(port: Port, max_users: usize, max_nodes: usize) -> String {
    let (limit, what, flag) = match port {
        Port::Users => (max_users, "user", "--max-users"),
        Port::Nodes => (max_nodes, "node", "--max-nodes"),
    };
    format!("the server is at its limit of {limit} {what} connection(s) ({flag}); try again later")
}

/// Tells the peer why, in the only form it understands: an error for a
/// hello peer that announced the `error` feature, a negative configuration
/// response for a seed-format user whose first message is a configuration,
/// nothing otherwise. Then closes after draining what the peer sent, so the
/// close does not reset the connection before the answer is read.
async fn answer(port: Port, mut stream: TcpStream, reason: String) -> std::io::Result<()> {
    let mut hb = [0u8; HEADER_LEN];
    stream.read_exact(&mut hb).await?;
    let Ok(header) = Header::decode(&hb, u32::MAX) else {
        return Ok(());
    };
    let reply = match header.ty {
        MsgType::Hello if header.size <= MAX_HELLO => {
            let mut payload = vec![0u8; header.size as usize];
            stream.read_exact(&mut payload).await?;
            let role = match port {
                Port::Users => "user",
                Port::Nodes => "node",
            };
            match Hello::decode(&payload) {
                Ok(h) if h.role == role && h.has(features::ERROR) => {
                    Some(ErrorMsg::new(ErrorMsg::NO_ID, ErrorCode::Internal, reason).to_frame())
                }
                _ => None,
            }
        }
        MsgType::Configuration if port == Port::Users => Some(
            ConfigurationResponse {
                status: ConfigurationResponse::FAILED,
            }
            .to_frame(),
        ),
        _ => None,
    };
    if let Some(f) = reply {
        stream.write_all(&f.to_vec()).await?;
        stream.shutdown().await?;
        tokio::io::copy(&mut stream, &mut tokio::io::sink()).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_name_the_limit_and_the_flag() {
        let r = reason(Port::Users, 3, 9);
        assert!(
            r.contains("limit of 3 user") && r.contains("--max-users"),
            "{r}"
        );
        let r = reason(Port::Nodes, 3, 9);
        assert!(
            r.contains("limit of 9 node") && r.contains("--max-nodes"),
            "{r}"
        );
    }
}
