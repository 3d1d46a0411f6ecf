//! In shared mode a user's first message chooses its session: a hello that
//! asks for a group goes to the group code (through a session with the
//! owned placement, whose group code borrows nodes from the scheduler),
//! anything else to a session placed on the scheduler. Every byte read
//! here is handed on, so either session sees exactly what the user sent
//! (over TCP or TLS alike).

use std::time::Duration;

use corefarm_smp::{hello::features, Header, Hello, MsgType, HEADER_LEN};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::time::Instant;

/// Largest first frame looked into (a hello is a few hundred bytes): a
/// larger one is left to the session, which has the real limits.
const MAX_HELLO: u32 = 64 * 1024;

/// Whether the first frame — already in `prefix` (read by the
/// authentication gate) or read now — is a hello asking for a group.
/// Returns the bytes read so far with the answer. A peer that is silent,
/// slow or malformed past `timeout` is "no": its session deals with it.
pub async fn wants_group<S: AsyncRead + Unpin>(
    s: &mut S,
    mut prefix: Vec<u8>,
    timeout: Duration,
) -> (Vec<u8>, bool) {
    let deadline = Instant::now() + timeout;
    if !fill(s, &mut prefix, HEADER_LEN, deadline).await {
        return (prefix, false);
    }
    let head: [u8; HEADER_LEN] = prefix[..HEADER_LEN].try_into().expect("filled");
    let Ok(h) = Header::decode(&head, MAX_HELLO) else {
        return (prefix, false);
    };
    if h.ty != MsgType::Hello {
        return (prefix, false);
    }
    let end = HEADER_LEN + h.size as usize;
    if !fill(s, &mut prefix, end, deadline).await {
        return (prefix, false);
    }
    let group = Hello::decode(&prefix[HEADER_LEN..end]).is_ok_and(|h| h.has(features::GROUP));
    (prefix, group)
}

/// Reads until `buf` holds `n` bytes; false at end of stream, error or deadline.
async fn fill<S: AsyncRead + Unpin>(
    s: &mut S,
    buf: &mut Vec<u8>,
    n: usize,
    deadline: Instant,
) -> bool {
    while buf.len() < n {
        let at = buf.len();
        buf.resize(n, 0);
        match tokio::time::timeout_at(deadline, s.read(&mut buf[at..])).await {
            Ok(Ok(k)) if k > 0 => buf.truncate(at + k),
            _ => {
                buf.truncate(at);
                return false;
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::{TcpListener, TcpStream};

    async fn first(bytes: Vec<u8>, prefix_len: usize) -> (Vec<u8>, bool) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (mut s, _) = l.accept().await.unwrap();
        c.write_all(&bytes[prefix_len..]).await.unwrap();
        c.shutdown().await.unwrap();
        wants_group(&mut s, bytes[..prefix_len].to_vec(), Duration::from_secs(5)).await
    }

    fn hello(group: bool) -> Vec<u8> {
        let mut h = Hello::new("user");
        if group {
            h.features.push(features::GROUP.into());
        }
        let p = h.encode();
        let mut v = Header::new(MsgType::Hello, p.len() as u32)
            .encode()
            .to_vec();
        v.extend(p);
        v
    }

    #[tokio::test]
    async fn a_group_hello_is_recognised_whole_or_read_ahead_and_every_byte_kept() {
        for group in [false, true] {
            let h = hello(group);
            for prefix in [0, 3, h.len()] {
                let (got, g) = first(h.clone(), prefix).await;
                assert_eq!((got, g), (h.clone(), group), "prefix {prefix}");
            }
        }
    }

    #[tokio::test]
    async fn anything_else_is_handed_on_as_read() {
        let data = Header::new(MsgType::Configuration, 100).encode().to_vec();
        assert_eq!(first(data.clone(), 0).await, (data, false));
        // Cut short: what arrived is kept for the session to report.
        let cut = hello(true)[..5].to_vec();
        assert_eq!(first(cut.clone(), 0).await, (cut, false));
        // Unknown type.
        let bad = vec![0xEE, 0, 0, 0, 1, 0, 0, 0];
        assert_eq!(first(bad.clone(), 0).await, (bad, false));
    }
}
