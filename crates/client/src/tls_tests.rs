//! The split TLS connection under concurrency: several writers (clones of
//! the send half) and the reader thread at once, against an echoing rustls
//! server, so that records out of order, a lost record or a deadlock between
//! a blocked writer and the reader would show.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use corefarm_smp::tls::rustls::{ServerConfig, ServerConnection, StreamOwned};
use corefarm_smp::tls::ClientTls;
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};

const WRITERS: u32 = 4;
const FRAMES: u32 = 150;
/// Below the encrypt chunk, so each frame is one `write` call and frames
/// of different writers cannot interleave.
const FRAME: usize = 10 << 10;

/// A CA (`ca.pem`) and a server certificate it signed for 127.0.0.1.
pub(crate) fn pki(dir: &std::path::Path) -> Arc<ServerConfig> {
    let ca_key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = p.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".into()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.join("s.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("s.key"), key.serialize_pem()).unwrap();
    corefarm_smp::tls::server_config(&dir.join("s.pem"), &dir.join("s.key")).unwrap()
}

fn frame(writer: u32, seq: u32) -> Vec<u8> {
    let mut f = vec![(writer * 31 + seq) as u8; FRAME];
    f[..4].copy_from_slice(&writer.to_le_bytes());
    f[4..8].copy_from_slice(&seq.to_le_bytes());
    f
}

#[test]
fn concurrent_writers_and_the_reader_share_one_tls_connection() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = pki(dir.path());
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let echo = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut tls = StreamOwned::new(ServerConnection::new(cfg).unwrap(), s);
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match tls.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => tls.write_all(&buf[..n]).unwrap(),
            }
        }
    });
    let ca = ClientTls::from_ca_file(&dir.path().join("ca.pem"), None).unwrap();
    let tcp = TcpStream::connect(&addr).unwrap();
    let (send, mut recv) =
        super::split(Some(&ca), &addr, tcp, Some(Duration::from_secs(30))).unwrap();
    recv.tcp()
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();

    // The reader runs while the writers write: the echo server blocks on
    // its writes unless we keep reading.
    let reader = std::thread::spawn(move || {
        let mut next = [0u32; WRITERS as usize];
        let mut f = vec![0u8; FRAME];
        for _ in 0..WRITERS * FRAMES {
            recv.read_exact(&mut f).expect("an echoed frame");
            let w = u32::from_le_bytes(f[..4].try_into().unwrap());
            let seq = u32::from_le_bytes(f[4..8].try_into().unwrap());
            assert!(w < WRITERS, "garbled frame header");
            assert_eq!(seq, next[w as usize], "writer {w}'s frames out of order");
            assert_eq!(f, frame(w, seq), "frame {seq} of writer {w} corrupted");
            next[w as usize] += 1;
        }
    });
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let mut s = send.try_clone().unwrap();
            std::thread::spawn(move || {
                for seq in 0..FRAMES {
                    s.write_all(&frame(w, seq)).unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    reader.join().unwrap();
    send.shutdown(std::net::Shutdown::Both).unwrap();
    echo.join().unwrap();
}
