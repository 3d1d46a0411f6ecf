//! Strangers on a node's peer port: connections that never say hello, from
//! one address and from several, must not keep a group's members from
//! linking, and every one the port ends is counted. Real sockets on
//! loopback, so these assert outcomes and counts, never elapsed time.

use crate::common;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::within;
use corefarm_node::metrics::{NodeEndpoints, NodeTelemetry};
use corefarm_node::peer::{Fabric, GroupSpec, Member, PeerListener, PortStats, Refusal, Topology};
use corefarm_telemetry::Endpoints;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Loopback addresses the strangers come from (Linux answers all of 127/8).
fn sources() -> Vec<IpAddr> {
    (1..=4).map(|i| IpAddr::from([127, 0, 0, i])).collect()
}

/// A connection from `ip` to `to` that says nothing.
async fn silent(ip: IpAddr, to: SocketAddr) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(SocketAddr::new(ip, 0)).unwrap();
    s.connect(to).await.unwrap()
}

/// Waits until the port has closed each of `conns`.
async fn all_closed(conns: Vec<TcpStream>) {
    for mut s in conns {
        let mut b = [0u8; 1];
        // Closed (0) or reset: either way the port let it go.
        let n = within("a stranger to be dropped", s.read(&mut b)).await;
        assert!(!matches!(n, Ok(n) if n > 0), "the port answered a stranger");
    }
}

fn dropped(s: &PortStats) -> u64 {
    s.refused(Refusal::Evicted) + s.refused(Refusal::NoHello)
}

async fn listener() -> PeerListener {
    PeerListener::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

fn members(ls: &[&PeerListener]) -> Vec<Member> {
    ls.iter()
        .enumerate()
        .map(|(i, l)| Member {
            name: format!("n{i}"),
            addr: l.local_addr(),
        })
        .collect()
}

/// Hundreds of silent connections to both members' ports, and more opened
/// all along while the group forms, are fewer than the group needs to be
/// kept out: the members link, well within a join deadline shorter than
/// the old hello deadline a stranger could hold a place for.
#[tokio::test]
async fn silent_strangers_do_not_keep_a_group_from_forming() {
    const EACH: usize = 150;
    const MORE: usize = 300;
    let (a, b) = (listener().await, listener().await);
    let ports = [a.local_addr(), b.local_addr()];
    let ips = sources();
    let mut held: [Vec<TcpStream>; 2] = [Vec::new(), Vec::new()];
    for i in 0..2 * EACH {
        held[i % 2].push(silent(ips[i % ips.len()], ports[i % 2]).await);
    }
    // And a stranger who keeps connecting while the members link.
    let stop = Arc::new(AtomicBool::new(false));
    let flood = tokio::spawn({
        let (stop, ips) = (stop.clone(), ips.clone());
        async move {
            let mut more: [Vec<TcpStream>; 2] = [Vec::new(), Vec::new()];
            for i in 0..MORE {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                more[i % 2].push(silent(ips[i % ips.len()], ports[i % 2]).await);
            }
            more
        }
    });
    let members = members(&[&a, &b]);
    let spec = |r| {
        let mut s = GroupSpec::new(11, r, members.clone(), Topology::FullMesh).with_token(0x51);
        // Shorter than the 10 s a stranger's connection used to hold a place.
        s.connect_timeout = Duration::from_secs(5);
        s
    };
    let (zero, one) = tokio::join!(Fabric::join(&a, spec(0)), Fabric::join(&b, spec(1)));
    stop.store(true, Ordering::Relaxed);
    let (zero, one) = (zero.expect("rank 0 joined"), one.expect("rank 1 joined"));
    assert_eq!((zero.links(), one.links()), (vec![1], vec![0]));

    let more = flood.await.unwrap();
    let ports = held.into_iter().zip(more).zip([&a, &b]);
    for (k, ((mut conns, more), l)) in ports.enumerate() {
        conns.extend(more);
        let sent = conns.len() as u64;
        all_closed(conns).await;
        let s = l.stats();
        // Every stranger was ended and counted (with, at most, a member's
        // own attempt whose place a flood from its address took first).
        assert!(dropped(s) >= sent, "port {k}: {:?} for {sent}", s.all());
        assert!(s.refused(Refusal::Evicted) > 0, "port {k}: {:?}", s.all());
        assert_eq!(s.refused(Refusal::BadHello), 0, "port {k}");
        assert_eq!(s.refused(Refusal::WrongToken), 0, "port {k}");
    }
}

/// What a node's peer port refuses shows in its node manager's metrics,
/// by reason.
#[tokio::test]
async fn refusals_show_in_the_node_managers_metrics() {
    let telemetry = Arc::new(NodeTelemetry::default());
    let stats = telemetry.node("n-0").peer_port();
    let l = PeerListener::bind_counted(
        "127.0.0.1:0".parse().unwrap(),
        corefarm_node::peer::DEFAULT_MAX_FRAME,
        stats,
    )
    .await
    .unwrap();
    let mut s = TcpStream::connect(l.local_addr()).await.unwrap();
    let not_a_hello = corefarm_smp::OutFrame::data(1, Bytes::new()).unwrap();
    s.write_all(&not_a_hello.to_vec()).await.unwrap();
    all_closed(vec![s]).await;
    let text = NodeEndpoints(telemetry).metrics();
    let line = r#"corefarm_node_manager_peer_port_refused_total{node="n-0",reason="bad_hello"} 1"#;
    assert!(text.lines().any(|l| l == line), "{text}");
    let evicted = r#"corefarm_node_manager_peer_port_refused_total{node="n-0",reason="evicted"} 0"#;
    assert!(text.lines().any(|l| l == evicted), "{text}");
}
