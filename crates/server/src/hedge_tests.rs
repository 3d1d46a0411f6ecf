//! Hung nodes against a server in this process on a paused clock: fake
//! nodes over loopback answer only when the test says, so when a copy of a
//! late message goes out is read off the clock. Waiting is on frames; the
//! paused clock jumps to the server's next timer while everyone waits.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use corefarm_smp::codec::{write_frame, FrameReader};
use corefarm_smp::{
    hello::features, BenchmarkConfig, Configuration, ConfigurationResponse, Data, Frame, Hello,
    MsgType, OutFrame,
};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::hostile_tests::{opts, Peer};
use crate::{Server, ServerOptions, Sharing};

struct Running {
    users: SocketAddr,
    metrics: Arc<crate::metrics::Metrics>,
    status: crate::StatusHandle,
    /// The two fake nodes' writers; what they receive comes on `frames`.
    nodes: [OwnedWriteHalf; 2],
    frames: mpsc::UnboundedReceiver<(usize, Frame)>,
    _stop: DropGuard,
}

/// A server with two fake nodes connected (fixed credit window of 4).
async fn start(sharing: Sharing) -> Running {
    let server = Server::bind(ServerOptions {
        sharing,
        credit_adaptive: false,
        credit: 4,
        ..opts()
    })
    .await
    .expect("bind on loopback");
    let (users, at, metrics) = (
        server.users_addr(),
        server.nodes_addr(),
        server.shared.metrics.clone(),
    );
    let status = server.status_handle();
    let stop = CancellationToken::new();
    tokio::spawn(server.run(stop.clone()));
    let (tx, frames) = mpsc::unbounded_channel();
    let mut writers = Vec::new();
    for i in 0..2 {
        let s = TcpStream::connect(at).await.unwrap();
        // Small frames back to back: Nagle would hold one for an ACK in
        // real time, which the paused clock does not wait for.
        s.set_nodelay(true).unwrap();
        let (rd, mut w) = s.into_split();
        let mut r = FrameReader::new(rd, u32::MAX);
        let mut h = Hello::new("node");
        h.name = Some(format!("n{i}"));
        h.features = vec![features::ERROR.into()];
        write_frame(&mut w, h.to_frame()).await.unwrap();
        assert_eq!(r.read_frame().await.unwrap().unwrap().ty, MsgType::Hello);
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Ok(Some(f)) = r.read_frame().await {
                if tx.send((i, f)).is_err() {
                    break;
                }
            }
        });
        writers.push(w);
    }
    while status.get().nodes.len() < 2 {
        // A poll interval, not a synchronisation: the condition is.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Running {
        users,
        metrics,
        status,
        nodes: writers.try_into().map_err(|_| ()).unwrap(),
        frames,
        _stop: stop.drop_guard(),
    }
}

impl Running {
    /// The next frame a node received, and which node.
    async fn next(&mut self) -> (usize, Frame) {
        self.frames.recv().await.expect("the server is running")
    }

    /// The next data message a node received.
    async fn data(&mut self) -> (usize, Data) {
        let (i, f) = self.next().await;
        assert_eq!(f.ty, MsgType::Data, "node {i} got a {}", f.ty.name());
        (i, Data::parse(f.payload).unwrap())
    }

    async fn answer(&mut self, node: usize, d: &Data) {
        let f = OutFrame::data(d.id, d.data.clone()).unwrap();
        write_frame(&mut self.nodes[node], f).await.unwrap();
    }

    /// A user configured with `cfg`, both nodes saying yes.
    async fn user(&mut self, sharing: Sharing, cfg: &Configuration) -> Peer {
        let s = TcpStream::connect(self.users).await.unwrap();
        s.set_nodelay(true).unwrap();
        let (rd, w) = s.into_split();
        let mut u = Peer {
            r: FrameReader::new(rd, u32::MAX),
            w,
        };
        let mut h = Hello::new("user");
        h.features = vec![features::ERROR.into()];
        h.nodes = (sharing == Sharing::Exclusive).then_some(2);
        u.send(h.to_frame()).await;
        assert_eq!(u.recv().await.unwrap().ty, MsgType::Hello);
        u.send(cfg.to_frame().unwrap()).await;
        for _ in 0..2 {
            let (i, f) = self.next().await;
            assert_eq!(f.ty, MsgType::Configuration);
            let ok = ConfigurationResponse {
                status: ConfigurationResponse::OK,
            };
            write_frame(&mut self.nodes[i], ok.to_frame())
                .await
                .unwrap();
        }
        let f = u.recv().await.expect("a configuration response");
        assert_eq!(f.ty, MsgType::ConfigurationResponse);
        assert_eq!(f.payload[0], ConfigurationResponse::OK);
        u
    }

    /// The function's service time is measured: one message answered
    /// after `took`.
    async fn measure(&mut self, u: &mut Peer, took: Duration) {
        u.send(OutFrame::data(1, input(1)).unwrap()).await;
        let (i, d) = self.data().await;
        tokio::time::sleep(took).await;
        self.answer(i, &d).await;
        assert_eq!(result(u).await.id, 1);
    }
}

fn input(id: u32) -> Bytes {
    Bytes::from(vec![id as u8; 16])
}

async fn result(u: &mut Peer) -> Data {
    let f = u.recv().await.expect("a result");
    assert_eq!(f.ty, MsgType::Data, "got a {}", f.ty.name());
    Data::parse(f.payload).unwrap()
}

fn bench() -> Configuration {
    BenchmarkConfig {
        input_size: 16,
        output_size: 16,
        delay_us: 0,
    }
    .to_configuration()
}

const MODES: [Sharing; 2] = [Sharing::Exclusive, Sharing::Shared];

/// A node that stops answering: its message is sent to the other node
/// once it is its bound, max(4 × service, 50 ms), less two service times old
/// (so the copy's answer lands within the bound), not before; the first result is
/// the user's, once; the hung node's late answer is dropped and counted.
/// Meanwhile the hung node, silent for max(2 × that, 200 ms), gets no new
/// work even with room in its window; once it answers it gets work again.
#[tokio::test(start_paused = true)]
async fn a_hung_nodes_message_goes_to_the_other_node_within_the_bound() {
    for sharing in MODES {
        for (service, copied, bound) in [(0, 50, 50), (20, 40, 80)] {
            hung_node(sharing, ms(service), ms(copied), ms(bound)).await;
        }
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

async fn hung_node(sharing: Sharing, service: Duration, copied: Duration, bound: Duration) {
    let how = format!("{sharing:?}, service {service:?}");
    let mut srv = start(sharing).await;
    let mut u = srv.user(sharing, &bench()).await;
    srv.measure(&mut u, service).await;

    u.send(OutFrame::data(2, input(2)).unwrap()).await;
    let t0 = Instant::now();
    let (hung, original) = srv.data().await;
    let (ok, copy) = srv.data().await;
    let waited = t0.elapsed();
    assert_ne!(ok, hung, "{how}");
    assert_eq!(copy.data, original.data, "{how}");
    assert!(
        waited >= copied && waited < copied + ms(5),
        "{how}: copied after {waited:?}, not {copied:?}"
    );
    srv.answer(ok, &copy).await;
    assert_eq!(result(&mut u).await.id, 2, "{how}");
    assert_eq!(srv.metrics.hedges(), (1, 0), "{how}");

    // Silent past the stall bound: new work goes to the other node only.
    tokio::time::sleep_until(t0 + (bound * 2).max(ms(200)) + ms(10)).await;
    for id in 3..7 {
        u.send(OutFrame::data(id, input(id)).unwrap()).await;
    }
    for _ in 3..7 {
        let (i, d) = srv.data().await;
        assert_eq!(i, ok, "{how}: a stalled node got message {}", d.id);
        srv.answer(i, &d).await;
        result(&mut u).await;
    }

    // The hung node answers at last: dropped, counted, and it takes work.
    srv.answer(hung, &original).await;
    while srv.metrics.hedges() != (1, 1) {
        // A poll interval, not a synchronisation: the condition is.
        tokio::time::sleep(ms(1)).await;
    }
    for id in [7, 8] {
        u.send(OutFrame::data(id, input(id)).unwrap()).await;
    }
    let mut got = Vec::new();
    for _ in 0..2 {
        let (i, d) = srv.data().await;
        got.push(i);
        srv.answer(i, &d).await;
    }
    got.sort_unstable();
    assert_eq!(got, [0, 1], "{how}: both nodes take work again");
    let mut ids = vec![result(&mut u).await.id, result(&mut u).await.id];
    ids.sort_unstable();
    assert_eq!(ids, [7, 8], "{how}: no second result for message 2");
}

/// A configuration with streaming handler sets is never copied (its
/// handlers' memory outlives a message), however long the node hangs;
/// the node is still set aside after the stall bound.
#[tokio::test(start_paused = true)]
async fn handler_work_is_not_copied() {
    let manifest = br#"{"name":"h","handler_sets":[{"name":"sum"}]}"#;
    let mut image = b"CFIMAGE\0".to_vec();
    image.extend_from_slice(&1u32.to_le_bytes());
    image.extend_from_slice(&(manifest.len() as u32).to_le_bytes());
    image.extend_from_slice(manifest);
    let cfg = Configuration {
        input_size: 16,
        output_size: 16,
        cores: vec![],
        bitstream: Bytes::from(image),
    };
    for sharing in MODES {
        let mut srv = start(sharing).await;
        let mut u = srv.user(sharing, &cfg).await;
        srv.measure(&mut u, ms(0)).await;
        u.send(OutFrame::data(2, input(2)).unwrap()).await;
        let (hung, _) = srv.data().await;
        let quiet = tokio::time::timeout(Duration::from_secs(1), srv.next()).await;
        assert!(quiet.is_err(), "{sharing:?}: a copy went out: {quiet:?}");
        u.send(OutFrame::data(3, input(3)).unwrap()).await;
        let (i, _) = srv.data().await;
        assert_ne!(i, hung, "{sharing:?}: the stalled node got new work");
        assert_eq!(srv.metrics.hedges(), (0, 0));
    }
}

/// The hung node is closed (`--node-timeout`, or it dies) after its
/// message was copied and before the copy answered: the message is not
/// sent a third time, and its one result comes from the copy.
#[tokio::test(start_paused = true)]
async fn a_lost_nodes_copied_message_is_not_sent_again() {
    use tokio::io::AsyncWriteExt;
    for sharing in MODES {
        let mut srv = start(sharing).await;
        let mut u = srv.user(sharing, &bench()).await;
        srv.measure(&mut u, ms(0)).await;
        u.send(OutFrame::data(2, input(2)).unwrap()).await;
        let (hung, _) = srv.data().await;
        let (ok, copy) = srv.data().await;
        srv.nodes[hung].shutdown().await.unwrap();
        while srv.status.get().nodes.len() > 1 {
            // A poll interval, not a synchronisation: the condition is.
            tokio::time::sleep(ms(1)).await;
        }
        let quiet = tokio::time::timeout(Duration::from_secs(1), srv.next()).await;
        assert!(quiet.is_err(), "{sharing:?}: sent again: {quiet:?}");
        srv.answer(ok, &copy).await;
        assert_eq!(result(&mut u).await.id, 2, "{sharing:?}");
        u.send(OutFrame::data(3, input(3)).unwrap()).await;
        let (i, d) = srv.data().await;
        assert_eq!((i, &d.data), (ok, &input(3)), "{sharing:?}");
        srv.answer(i, &d).await;
        assert_eq!(
            result(&mut u).await.id,
            3,
            "{sharing:?}: no second result for 2"
        );
    }
}

/// A node slower than the other by design (an RTL simulation beside a
/// native core) is judged by its own pace: its work is not copied though it
/// takes many times the function's pace on the fast node.
#[tokio::test(start_paused = true)]
async fn a_slow_node_is_judged_by_its_own_pace() {
    for sharing in MODES {
        slow_node(sharing).await;
    }
}

async fn slow_node(sharing: Sharing) {
    let mut srv = start(sharing).await;
    let mut u = srv.user(sharing, &bench()).await;
    // The first message measures its node at 100 ms: that is the slow one.
    u.send(OutFrame::data(1, input(1)).unwrap()).await;
    let (slow, d) = srv.data().await;
    tokio::time::sleep(ms(100)).await;
    srv.answer(slow, &d).await;
    assert_eq!(result(&mut u).await.id, 1);
    // Four rounds: the slow node holds what it gets for 100 ms while the
    // fast one answers six messages at once, one after another, so the
    // function's pace falls to a few ms. The slow node's messages are not
    // copied.
    let mut id = 2;
    for round in 0..4 {
        let (mut held, mut fast_answers) = (Vec::new(), 0);
        let t0 = Instant::now();
        // Two at once: one on each node (an idle node is preferred).
        for _ in 0..2 {
            u.send(OutFrame::data(id, input(id)).unwrap()).await;
            id += 1;
        }
        let mut sent = 2;
        while fast_answers < 6 {
            if sent == 0 {
                u.send(OutFrame::data(id, input(id)).unwrap()).await;
                id += 1;
                sent = 1;
            }
            sent -= 1;
            let (i, d) = srv.data().await;
            if i == slow {
                held.push(d);
            } else {
                srv.answer(i, &d).await;
                fast_answers += 1;
            }
            assert!(id < 100, "{sharing:?}: the fast node got no work");
        }
        assert!(!held.is_empty(), "{sharing:?}: the slow node got no work");
        let quiet = tokio::time::timeout_at(t0 + ms(100), srv.next()).await;
        assert!(
            quiet.is_err(),
            "{sharing:?}, round {round}: copied though on its own pace: {quiet:?}"
        );
        for d in &held {
            srv.answer(slow, d).await;
        }
        for _ in 0..fast_answers + held.len() {
            result(&mut u).await;
        }
    }
    assert_eq!(srv.metrics.hedges(), (0, 0), "{sharing:?}");
}
