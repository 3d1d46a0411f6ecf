//! Priority classes on a group's direct path (classes through a group), end to
//! end in one process: the real server, a real node manager (peer port on
//! loopback), the blocking group client. An urgent message from one
//! direct connection runs before bulk ones already queued from another,
//! a client that offers no chunks is served as before, and messages of
//! several chunks come back whole.

use crate::common;

use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::{opts, start, TestServer, LIMIT};
use corefarm_client::group::{Group, GroupOptions};
use corefarm_cores::{Core, CoreError, Loaded};
use corefarm_node::metrics::NodeTelemetry;
use corefarm_node::{CoreLoader, NodeOptions};
use corefarm_smp::{default_core_table, Configuration};
use tokio_util::sync::{CancellationToken, DropGuard};

/// The first call's hold: it reports that it started, then waits.
type Hold = Arc<Mutex<Option<(std_mpsc::Sender<()>, std_mpsc::Receiver<()>)>>>;

/// Echoes a 4-byte tag and logs the order tags ran in; the first call
/// reports that it started and holds its core until released.
struct Tagged {
    log: Arc<Mutex<Vec<u32>>>,
    hold: Hold,
}

impl Core for Tagged {
    fn process(&mut self, input: &[u8], output: &mut [u8]) -> Result<(), CoreError> {
        if let Some((started, release)) = self.hold.lock().unwrap().take() {
            let _ = started.send(());
            let _ = release.recv_timeout(LIMIT);
        }
        let tag = u32::from_le_bytes(input.try_into().unwrap());
        self.log.lock().unwrap().push(tag);
        output.copy_from_slice(input);
        Ok(())
    }
}

/// One node manager with one core, counting its direct messages in `t`.
async fn node(
    s: &TestServer,
    log: Arc<Mutex<Vec<u32>>>,
    hold: Hold,
    t: Arc<NodeTelemetry>,
) -> DropGuard {
    let o = NodeOptions {
        server: s.nodes.to_string(),
        name: "n0".into(),
        memory_limit: 8 << 20,
        loader: CoreLoader::new(move |cfg, _| {
            Ok(Loaded {
                cores: (0..cfg.cores.len())
                    .map(|_| {
                        Box::new(Tagged {
                            log: log.clone(),
                            hold: hold.clone(),
                        }) as Box<dyn Core>
                    })
                    .collect(),
                description: "tagged".into(),
            })
        }),
        telemetry: Some(t),
        ..NodeOptions::default()
    };
    let stop = CancellationToken::new();
    tokio::spawn(corefarm_node::run(o, stop.clone()));
    s.wait_status("a free node with a hello", |st| {
        st.nodes
            .iter()
            .any(|x| x.name.is_some() && x.user.is_none())
    })
    .await;
    stop.drop_guard()
}

fn cfg() -> Configuration {
    Configuration {
        input_size: 4,
        output_size: 4,
        cores: default_core_table(1, 4, 4).unwrap(),
        bitstream: Bytes::from_static(b"tagged"),
    }
}

fn tags(t: impl IntoIterator<Item = u32>) -> Vec<Bytes> {
    t.into_iter()
        .map(|t| Bytes::copy_from_slice(&t.to_le_bytes()))
        .collect()
}

/// Waits (on the node's own counter, not a clock) until `n` direct
/// messages have been queued at it.
async fn queued(t: &NodeTelemetry, n: u64) {
    tokio::time::timeout(LIMIT, async {
        while t.status().iter().map(|s| s.direct).sum::<u64>() < n {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the direct messages were queued");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_urgent_direct_message_runs_before_queued_bulk_ones() {
    let s = start(opts()).await;
    let log = Arc::new(Mutex::new(Vec::new()));
    let (started_tx, started) = std_mpsc::channel();
    let (release, release_rx) = std_mpsc::channel();
    let hold = Arc::new(Mutex::new(Some((started_tx, release_rx))));
    let t = Arc::new(NodeTelemetry::default());
    let _node = node(&s, log.clone(), hold, t.clone()).await;
    let users = s.users.to_string();
    let (g, mut bulk, mut urgent) = tokio::task::spawn_blocking(move || {
        let mut g = Group::open(&users, GroupOptions::new(1)).unwrap();
        g.configure(&cfg()).unwrap();
        let (bulk, urgent) = (g.direct(8).unwrap(), g.direct(1).unwrap());
        assert_eq!((bulk.chunked(), urgent.chunked()), (1, 1), "chunks agreed");
        (g, bulk, urgent)
    })
    .await
    .unwrap();
    // Six bulk messages: the first holds the core, five wait.
    let bulk = tokio::task::spawn_blocking(move || bulk.map_with(&tags(0..6), 7));
    tokio::task::spawn_blocking(move || started.recv_timeout(LIMIT).unwrap())
        .await
        .unwrap();
    queued(&t, 6).await;
    let urgent = tokio::task::spawn_blocking(move || {
        let e = urgent.map_with(&tags([9]), 8).unwrap_err();
        assert!(e.to_string().contains("class 8"), "{e}");
        urgent.map_with(&tags([100]), 0)
    });
    queued(&t, 7).await;
    release.send(()).unwrap();
    let (bulk, urgent) = tokio::time::timeout(LIMIT, async { (bulk.await, urgent.await) })
        .await
        .unwrap();
    assert_eq!(bulk.unwrap().unwrap(), tags(0..6));
    assert_eq!(urgent.unwrap().unwrap(), tags([100]));
    assert_eq!(*log.lock().unwrap(), [0, 100, 1, 2, 3, 4, 5]);
    drop(g);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_chunks_is_served_in_order_and_chunked_messages_whole() {
    let s = start(opts()).await;
    let log = Arc::new(Mutex::new(Vec::new()));
    let t = Arc::new(NodeTelemetry::default());
    let _node = node(&s, log.clone(), Arc::new(Mutex::new(None)), t.clone()).await;
    let users = s.users.to_string();
    tokio::time::timeout(
        LIMIT,
        tokio::task::spawn_blocking(move || {
            let mut g = Group::open(&users, GroupOptions::new(1)).unwrap();
            g.configure(&cfg()).unwrap();
            let mut d = g.direct_with_chunks(4, 0).unwrap();
            assert_eq!(d.chunked(), 0, "whole frames");
            // The class cannot travel; the member runs them as they came.
            assert_eq!(d.map_with(&tags(0..20), 0).unwrap(), tags(0..20));
            assert_eq!(d.map(&tags(20..40)).unwrap(), tags(20..40));
            // Messages of three inputs over 8-byte chunks: reassembled whole.
            let mut c = g.direct_with_chunks(4, 8).unwrap();
            assert_eq!(c.chunked(), 1);
            let three: Vec<Bytes> = (0..10u32)
                .map(|m| tags(40 + 3 * m..43 + 3 * m).concat().into())
                .collect();
            assert_eq!(c.map(&three).unwrap(), three);
        }),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(*log.lock().unwrap(), (0..70).collect::<Vec<u32>>());
    assert_eq!(t.status()[0].direct, 50);
}
