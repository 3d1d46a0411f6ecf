//! Shared nodes (`--sharing shared`) in process: a real server,
//! simulated nodes with a per-input run time and a programming time, and
//! fake users. Every wait is on a frame or a status condition.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use corefarm_server::{ServerOptions, Sharing};
use corefarm_smp::codec::{write_frame, FrameReader};
use corefarm_smp::{
    BenchmarkConfig, ClusterStatus, Configuration, ConfigurationResponse, Data, ErrorCode, Hello,
    MsgType, OutFrame,
};
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

fn shared() -> ServerOptions {
    ServerOptions {
        sharing: Sharing::Shared,
        monitor_period: Duration::from_millis(10),
        ..opts()
    }
}

/// A function: the benchmarking configuration with its own input size (the
/// digest differs, so each size is a distinct function).
fn func(input: u32) -> Configuration {
    BenchmarkConfig {
        input_size: input,
        output_size: 16,
        delay_us: 0,
    }
    .to_configuration()
}

/// A simulated board: programming takes `program`, each input `per_input`
/// (the emulated hardware's time, not a synchronisation). With `die_after`
/// it drops the connection on receiving that many data messages.
fn sim_node(
    addr: std::net::SocketAddr,
    tag: u8,
    program: Duration,
    per_input: Duration,
    die_after: Option<usize>,
) -> JoinHandle<()> {
    sim_node_gated(addr, tag, program, per_input, die_after, None)
}

/// A simulated board whose every data message waits for a permit of
/// `gate` (the test decides when each is computed).
fn gated_node(server: &TestServer, gate: &Arc<Semaphore>) -> JoinHandle<()> {
    let gate = Some(gate.clone());
    sim_node_gated(server.nodes, 1, Duration::ZERO, Duration::ZERO, None, gate)
}

fn sim_node_gated(
    addr: std::net::SocketAddr,
    tag: u8,
    program: Duration,
    per_input: Duration,
    die_after: Option<usize>,
    gate: Option<Arc<Semaphore>>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let s = TcpStream::connect(addr).await.expect("node port");
        let (rd, mut w) = s.into_split();
        let mut hello = Hello::new("node");
        hello.name = Some(format!("sim-{tag}"));
        write_frame(&mut w, hello.to_frame()).await.unwrap();
        let mut r = FrameReader::new(rd, 1 << 30);
        let (mut input, mut output, mut seen) = (1u32, 0u32, 0usize);
        while let Ok(Some(f)) = r.read_frame().await {
            match f.ty {
                MsgType::Configuration => {
                    let c = Configuration::parse(f.payload).unwrap();
                    (input, output) = (c.input_size, c.output_size);
                    tokio::time::sleep(program).await;
                    let ok = ConfigurationResponse {
                        status: ConfigurationResponse::OK,
                    };
                    write_frame(&mut w, ok.to_frame()).await.unwrap();
                }
                MsgType::Data => {
                    seen += 1;
                    if die_after == Some(seen) {
                        return;
                    }
                    if let Some(g) = &gate {
                        g.acquire().await.unwrap().forget();
                    }
                    let d = Data::parse(f.payload).unwrap();
                    let count = d.data.len() as u32 / input;
                    tokio::time::sleep(per_input * count).await;
                    let mut out = vec![0u8; (output * count) as usize];
                    out[0] = tag;
                    let frame = OutFrame::data(d.id, Bytes::from(out)).unwrap();
                    if write_frame(&mut w, frame).await.is_err() {
                        return;
                    }
                }
                _ => {}
            }
        }
    })
}

async fn nodes(server: &TestServer, n: usize, program: Duration, per_input: Duration) {
    for i in 0..n {
        sim_node(server.nodes, i as u8 + 1, program, per_input, None);
    }
    server.wait_status("nodes", |s| s.nodes.len() == n).await;
}

fn function<'a>(
    s: &'a ClusterStatus,
    cfg: &Configuration,
) -> Option<&'a corefarm_smp::FunctionStatus> {
    let id = corefarm_server::sched::FnId::of(&cfg.to_frame().unwrap().to_vec()[8..]);
    s.function(&id.short())
}

#[tokio::test]
async fn two_users_share_one_function() {
    let server = start(shared()).await;
    nodes(&server, 2, Duration::ZERO, Duration::ZERO).await;
    let cfg = func(16);
    // One hello user, one seed-format user (no hello): same bytes, same function.
    let (mut a, _) = FakeUser::hello(server.users, None).await;
    let mut b = FakeUser::connect(server.users).await;
    assert_eq!(a.configure(&cfg).await.0, ConfigurationResponse::OK);
    assert_eq!(b.configure(&cfg).await.0, ConfigurationResponse::OK);
    let s = server
        .wait_status("both users on the function, both nodes loaded", |s| {
            function(s, &cfg).is_some_and(|f| f.users.len() == 2 && f.replicas == 2)
        })
        .await;
    assert_eq!(s.sharing, "shared");
    let f = function(&s, &cfg).expect("the function is listed");
    // The only function in use takes both spare nodes at once (its fair
    // share), and the second user's configuration loads nothing more.
    assert_eq!(
        f.reconfigurations, 2,
        "configured once per node for both users"
    );
    let ta = tokio::spawn(async move { a.stream(0..40, 16, true).await });
    let tb = tokio::spawn(async move { b.stream(0..40, 16, false).await });
    // Each gets exactly its own 40 results (stream panics on duplicates).
    assert_eq!(ta.await.unwrap().len(), 40);
    assert_eq!(tb.await.unwrap().len(), 40);
}

/// Shared mode keeps the nodes' counters as exclusive mode does: results,
/// seconds with work in flight and configurations loaded (the status and
/// /metrics said 0 for all three).
#[tokio::test]
async fn nodes_count_their_results_and_busy_time() {
    let server = start(shared()).await;
    nodes(&server, 2, Duration::ZERO, Duration::from_millis(1)).await;
    let cfg = func(16);
    let (mut a, _) = FakeUser::hello(server.users, None).await;
    assert_eq!(a.configure(&cfg).await.0, ConfigurationResponse::OK);
    assert_eq!(a.stream(0..20, 16, true).await.len(), 20);
    let s = server
        .wait_status("20 results counted", |s| {
            s.nodes.iter().map(|n| n.results_total).sum::<u64>() == 20
        })
        .await;
    // A node serves one message at a time, each holding it for its 1 ms input.
    let busy: f64 = s.nodes.iter().map(|n| n.busy_seconds).sum();
    assert!(busy >= 0.020, "{busy} s busy for 20 messages of 1 ms");
    // Every node that loaded the function counted it.
    let loads = function(&s, &cfg).expect("listed").reconfigurations;
    assert!(loads >= 1);
    assert_eq!(
        s.nodes.iter().map(|n| n.reconfigurations).sum::<u64>(),
        loads
    );
}

#[tokio::test]
async fn three_users_with_different_functions_on_two_nodes() {
    let server = start(shared()).await;
    nodes(&server, 2, Duration::ZERO, Duration::from_micros(200)).await;
    let mut tasks = Vec::new();
    for (i, size) in [16u32, 24, 32].into_iter().enumerate() {
        let addr = server.users;
        tasks.push(tokio::spawn(async move {
            let (mut u, _) = FakeUser::hello(addr, None).await;
            let (status, errors) = u.configure(&func(size)).await;
            assert_eq!(status, ConfigurationResponse::OK, "user {i}: {errors:?}");
            u.stream(0..60, size as usize, true).await.len()
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 60);
    }
    // Three functions were served on two nodes; once their users left, only
    // those the nodes still hold are remembered (at most one per node).
    let s = server
        .wait_status("the users gone", |s| s.users.is_empty())
        .await;
    assert!((1..=2).contains(&s.functions.len()), "{s:#?}");
}

#[tokio::test]
async fn an_idle_user_does_not_hold_a_node_others_need() {
    let server = start(shared()).await;
    nodes(&server, 2, Duration::ZERO, Duration::from_millis(2)).await;
    let (f1, f2) = (func(16), func(24));
    let (mut idle, _) = FakeUser::hello(server.users, None).await;
    assert_eq!(idle.configure(&f1).await.0, ConfigurationResponse::OK);
    let (mut busy, _) = FakeUser::hello(server.users, None).await;
    assert_eq!(busy.configure(&f2).await.0, ConfigurationResponse::OK);
    let worker = tokio::spawn(async move { busy.stream(0..400, 24, true).await.len() });
    // The idle user's node is taken over: the busy function gets both.
    server
        .wait_status("a second replica of the busy function", |s| {
            function(s, &f2).is_some_and(|f| f.replicas == 2)
        })
        .await;
    // The idle user comes back: its function is loaded again and it is served.
    let got = idle.stream(0..3, 16, true).await;
    assert_eq!(got.len(), 3);
    assert_eq!(worker.await.unwrap(), 400);
    let s = server.status.get();
    assert!(function(&s, &f1).unwrap().reconfigurations >= 2, "{s:#?}");
}

#[tokio::test]
async fn a_replica_killed_mid_stream_loses_and_duplicates_nothing() {
    let server = start(shared()).await;
    // The first node dies on its 10th message, in-flight work with it.
    sim_node(
        server.nodes,
        1,
        Duration::ZERO,
        Duration::from_micros(300),
        Some(10),
    );
    server.wait_status("node 1", |s| s.nodes.len() == 1).await;
    let (mut u, _) = FakeUser::hello(server.users, None).await;
    assert_eq!(u.configure(&func(16)).await.0, ConfigurationResponse::OK);
    // The second node is empty; it loads the function once the first dies.
    sim_node(server.nodes, 2, Duration::ZERO, Duration::ZERO, None);
    server.wait_status("node 2", |s| s.nodes.len() == 2).await;
    let got = u.stream(0..100, 16, true).await;
    assert_eq!(got.len(), 100);
    assert!(
        by_tag(&got).get(&2).is_some_and(|&n| n > 0),
        "node 2 took over"
    );
}

#[tokio::test]
async fn one_users_burst_does_not_starve_anothers_single_message() {
    let server = start(ServerOptions {
        credit: 1,
        credit_adaptive: false,
        ..shared()
    })
    .await;
    let gate = Arc::new(Semaphore::new(0));
    gated_node(&server, &gate);
    server.wait_status("the node", |s| s.nodes.len() == 1).await;
    let cfg = func(16);
    let mut burst = FakeUser::connect(server.users).await;
    let mut single = FakeUser::connect(server.users).await;
    assert_eq!(burst.configure(&cfg).await.0, ConfigurationResponse::OK);
    assert_eq!(single.configure(&cfg).await.0, ConfigurationResponse::OK);
    for id in 0..30u32 {
        burst
            .send(OutFrame::data(id, Bytes::from(vec![1; 16])).unwrap())
            .await;
    }
    let s = server
        .wait_status("the burst queued", |s| {
            function(s, &cfg).is_some_and(|f| f.queued >= 25)
        })
        .await;
    let burst_id = s
        .users
        .iter()
        .find(|u| u.queued >= 25)
        .expect("the burst user")
        .id;
    single
        .send(OutFrame::data(7, Bytes::from(vec![2; 16])).unwrap())
        .await;
    // The single message queued behind the burst, the node holding the
    // burst's first: then the node computes at will.
    server
        .wait_status("the single message queued", |s| {
            s.users.iter().any(|u| u.id != burst_id && u.queued == 1)
        })
        .await;
    // One message computed at a time: the burst's in service, then the
    // single one's turn comes within a message (fair by user, not by
    // message), not after the burst's 29 queued ones.
    let mut computed = 0;
    let served = loop {
        gate.add_permits(1);
        computed += 1;
        let s = server
            .wait_status("one more result", |s| {
                s.users.iter().map(|u| u.results).sum::<u64>() == computed
            })
            .await;
        if s.users.iter().any(|u| u.id != burst_id && u.results == 1) {
            break s.user(burst_id).unwrap().results;
        }
        assert!(computed < 30, "the single message was never served");
    };
    assert!(served <= 2, "the burst was served {served} messages first");
    gate.add_permits(1000);
    let f = single.recv().await.expect("the single message's result");
    assert_eq!(Data::parse(f.payload).unwrap().id, 7);
    drop(burst);
}

#[tokio::test]
async fn a_full_queue_answers_queue_full_to_a_user_that_asked() {
    let server = start(ServerOptions {
        queue_limit: 2,
        credit: 1,
        credit_adaptive: false,
        ..shared()
    })
    .await;
    // The node holds what it is given: one in service, two queued, the
    // rest refused.
    let gate = Arc::new(Semaphore::new(0));
    gated_node(&server, &gate);
    server.wait_status("the node", |s| s.nodes.len() == 1).await;
    let feats = ["error", "queue-full"];
    let (mut u, hello) = FakeUser::hello_with(server.users, "q", None, &feats).await;
    assert_eq!(hello.ty, MsgType::Hello);
    assert_eq!(u.configure(&func(16)).await.0, ConfigurationResponse::OK);
    for id in 0..8u32 {
        u.send(OutFrame::data(id, Bytes::from(vec![0; 16])).unwrap())
            .await;
    }
    let e = u.expect_error().await.expect("a queue-full error");
    assert_eq!(e.code, ErrorCode::QueueFull as u32, "{e}");
}

/// Shared mode, one message in flight per node, class 6 at most 2 deep.
async fn class_six_server() -> TestServer {
    let mut class_depths = vec![None; 8];
    class_depths[6] = Some(2);
    start(ServerOptions {
        queue_limit: 64,
        class_depths,
        credit: 1,
        credit_adaptive: false,
        ..shared()
    })
    .await
}

/// A 16-byte data message of `class` as chunk frames (how a class travels).
fn chunked_message(id: u32, class: u8) -> Vec<u8> {
    corefarm_smp::stream::Chunks::new(id, class, Bytes::from(vec![0; 16]), 1024)
        .unwrap()
        .map(|c| c.to_frame().unwrap().to_vec())
        .collect::<Vec<_>>()
        .concat()
}

#[tokio::test]
async fn a_full_class_refuses_its_own_messages_and_an_urgent_one_passes() {
    use corefarm_smp::stream::Chunk;
    let server = class_six_server().await;
    // The node holds each message until the test lets it go: message 0 in
    // service, the class-6 messages after it in the queue.
    let gate = Arc::new(Semaphore::new(0));
    gated_node(&server, &gate);
    server.wait_status("the node", |s| s.nodes.len() == 1).await;
    let feats = ["error", "queue-full", "chunks"];
    let (mut u, _) = FakeUser::hello_with(server.users, "classes", None, &feats).await;
    let cfg = func(16);
    assert_eq!(u.configure(&cfg).await.0, ConfigurationResponse::OK);
    let send = chunked_message;
    for id in 0..5u32 {
        u.send_raw(&send(id, 6)).await;
    }
    u.send_raw(&send(100, 0)).await;
    // 0 in service, 1 and 2 queued (the class's depth), 3 and 4 refused,
    // the urgent 100 queued.
    server
        .wait_status("three queued", |s| {
            function(s, &cfg).is_some_and(|f| f.queued == 3)
        })
        .await;
    gate.add_permits(100);
    let (mut results, mut refused) = (Vec::new(), Vec::new());
    while results.len() < 4 {
        let f = u.recv().await.expect("a frame");
        match f.ty {
            MsgType::Chunk => {
                let c = Chunk::parse(f.payload).unwrap();
                if c.head.last {
                    results.push(c.head.id);
                }
            }
            MsgType::Error => {
                let e = corefarm_smp::ErrorMsg::parse(&f.payload).unwrap();
                assert_eq!(e.code, ErrorCode::QueueFull as u32, "{e}");
                assert!(e.reason.contains("class 6"), "{e}");
                refused.push(e.id);
            }
            _ => {}
        }
    }
    refused.sort_unstable();
    assert_eq!(refused, [3, 4]);
    assert_eq!(
        results,
        [0, 100, 1, 2],
        "the urgent one before the queued ones"
    );
}

/// Without `queue-full`, a full class pushes back on the user's socket;
/// but a message of that class waiting for its place must not stop the
/// reads behind it: an urgent message sent after it is admitted at once and
/// is the next one served (with reads stopped it would wait for a place of
/// the full class first, and be served one message later).
#[tokio::test]
async fn a_message_waiting_for_its_full_class_does_not_hold_back_an_urgent_one() {
    use corefarm_smp::stream::Chunk;
    let server = class_six_server().await;
    let gate = Arc::new(Semaphore::new(0));
    gated_node(&server, &gate);
    server.wait_status("the node", |s| s.nodes.len() == 1).await;
    let (mut u, _) =
        FakeUser::hello_with(server.users, "classes", None, &["error", "chunks"]).await;
    let cfg = func(16);
    assert_eq!(u.configure(&cfg).await.0, ConfigurationResponse::OK);
    let send = chunked_message;
    // One in service, two queued (the class's depth), one waiting for a place.
    for id in 0..4u32 {
        u.send_raw(&send(id, 6)).await;
    }
    u.send_raw(&send(100, 0)).await;
    // The urgent one is admitted beside the two queued ones.
    server
        .wait_status("three queued", |s| {
            function(s, &cfg).is_some_and(|f| f.queued == 3)
        })
        .await;
    gate.add_permits(100);
    let mut results = Vec::new();
    while results.len() < 5 {
        let f = u.recv().await.expect("a frame");
        match f.ty {
            MsgType::Chunk => {
                let c = Chunk::parse(f.payload).unwrap();
                if c.head.last {
                    results.push(c.head.id);
                }
            }
            MsgType::Error => panic!("{}", corefarm_smp::ErrorMsg::parse(&f.payload).unwrap()),
            _ => {}
        }
    }
    assert_eq!(results[0], 0, "the one in service first: {results:?}");
    assert_eq!(results[1], 100, "then the urgent one: {results:?}");
    let mut rest = results[2..].to_vec();
    rest.sort_unstable();
    assert_eq!(rest, [1, 2, 3], "every message answered once");
}

/// Two users alternate bursts on two functions; returns the number of
/// node configurations the run took.
async fn alternate(program: Duration) -> u64 {
    let server = start(shared()).await;
    nodes(&server, 2, program, Duration::from_millis(2)).await;
    let (fa, fb) = (func(16), func(24));
    let (mut a, _) = FakeUser::hello(server.users, None).await;
    let (mut b, _) = FakeUser::hello(server.users, None).await;
    assert_eq!(a.configure(&fa).await.0, ConfigurationResponse::OK);
    assert_eq!(b.configure(&fb).await.0, ConfigurationResponse::OK);
    for round in 0..3u32 {
        assert_eq!(
            a.stream(round * 100..round * 100 + 100, 16, true)
                .await
                .len(),
            100
        );
        assert_eq!(
            b.stream(round * 100..round * 100 + 100, 24, true)
                .await
                .len(),
            100
        );
    }
    let s = server.status.get();
    s.functions.iter().map(|f| f.reconfigurations).sum()
}

#[tokio::test]
async fn alternating_functions_do_not_thrash_when_programming_is_slow() {
    // 500 ms to program against a 1 s horizon (100 periods of 10 ms):
    // trading a replica away and back costs more than it gains. Two
    // loads: both users connected before either configured, so each
    // function takes one spare node (its fair share), then no trading.
    assert_eq!(alternate(Duration::from_millis(500)).await, 2);
    // Free programming: the replicas follow the demand.
    assert!(alternate(Duration::ZERO).await > 2);
}

#[tokio::test]
async fn a_seed_users_new_configuration_waits_for_its_data_in_flight() {
    let server = start(shared()).await;
    nodes(&server, 1, Duration::ZERO, Duration::from_millis(20)).await;
    let (f1, f2) = (func(16), func(24));
    let mut u = FakeUser::connect(server.users).await;
    assert_eq!(u.configure(&f1).await.0, ConfigurationResponse::OK);
    for id in 0..5u32 {
        u.send(OutFrame::data(id, Bytes::from(vec![0; 16])).unwrap())
            .await;
    }
    u.send(f2.to_frame().unwrap()).await;
    // Every earlier result first, then the response to the new configuration.
    for id in 0..5u32 {
        let f = u.recv().await.expect("a result");
        assert_eq!(f.ty, MsgType::Data, "result {id} before the response");
    }
    let f = u.recv().await.expect("the configuration response");
    assert_eq!(f.ty, MsgType::ConfigurationResponse);
    assert!(ConfigurationResponse::parse(&f.payload).unwrap().ok());
    let got = u.stream(0..3, 24, false).await;
    assert_eq!(got.len(), 3);
    let s = server
        .wait_status("the user on its new function", |s| {
            let name = function(s, &f2).and_then(|f| f.name.clone());
            s.users
                .iter()
                .any(|u| u.function.is_some() && u.function == name)
        })
        .await;
    assert!(function(&s, &f2).is_some_and(|f| f.replicas == 1));
}

#[tokio::test]
async fn a_full_queue_stops_reading_from_the_user() {
    let server = start(ServerOptions {
        queue_limit: 2,
        credit: 1,
        credit_adaptive: false,
        ..shared()
    })
    .await;
    nodes(&server, 1, Duration::ZERO, Duration::from_millis(100)).await;
    let cfg = func(16);
    let mut u = FakeUser::connect(server.users).await;
    assert_eq!(u.configure(&cfg).await.0, ConfigurationResponse::OK);
    for id in 0..10u32 {
        u.send(OutFrame::data(id, Bytes::from(vec![3; 16])).unwrap())
            .await;
    }
    // One at the node, two queued, one read and waiting for a place; the
    // other six wait in the socket.
    let s = server
        .wait_status("a full queue", |s| {
            function(s, &cfg).is_some_and(|f| f.queued == 2 && f.in_flight == 1)
                && s.users.iter().any(|u| u.outstanding == 4)
        })
        .await;
    assert!(s.users.iter().all(|u| u.outstanding <= 4), "{s:#?}");
    let mut got = 0;
    while got < 10 {
        let f = u.recv().await.expect("every result in the end");
        assert_eq!(f.ty, MsgType::Data);
        got += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunks_user_that_does_not_read_stops_being_read() {
    // 16-byte inputs answered with 1 MiB each, to a user whose socket
    // takes almost nothing: the server must not hold its results without
    // bound (exclusive mode stops after a queue's worth; shared mode read
    // on and held every result).
    let server = start(shared()).await;
    let _node = FakeNode::spawn(server.nodes, "n", 1, Behaviour::Echo).await;
    server.wait_status("the node", |s| s.nodes.len() == 1).await;
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(1).unwrap();
    sock.connect(&server.users.into()).unwrap();
    sock.set_nonblocking(true).unwrap();
    let (rd, mut w) = TcpStream::from_std(sock.into()).unwrap().into_split();
    let mut r = FrameReader::new(rd, 1 << 30);
    let mut h = Hello::new("user");
    h.features = vec!["error".into(), "chunks".into()];
    h.chunk_size = Some(64 * 1024);
    h.nodes = Some(1);
    write_frame(&mut w, h.to_frame()).await.unwrap();
    let f = r.read_frame().await.unwrap().unwrap();
    assert!(
        Hello::decode(&f.payload).unwrap().has("chunks"),
        "chunks agreed"
    );
    write_frame(&mut w, bench(16, 1 << 20).to_frame().unwrap())
        .await
        .unwrap();
    let f = r.read_frame().await.unwrap().unwrap();
    assert_eq!(f.ty, MsgType::ConfigurationResponse);
    let sender = tokio::spawn(async move {
        for id in 0..400u32 {
            let f = OutFrame::data(id, Bytes::from(vec![7u8; 16])).unwrap();
            if write_frame(&mut w, f).await.is_err() {
                break;
            }
        }
    });
    // Results are made, then the reads stop: at most the 32 results a user
    // may leave unread beside its window (credit 4 × one node), and a few
    // in the sockets.
    let results = |s: &ClusterStatus| s.nodes.iter().map(|n| n.results_total).sum::<u64>();
    server.wait_status("results", |s| results(s) >= 20).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while tokio::time::Instant::now() < deadline {
        let made = results(&server.status.get());
        assert!(made <= 64, "{made} results made for a user that reads none");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sender.abort();
    drop(r);
}
