//! What the metrics hooks cost per data message, measured in isolation:
//! every counter one message touches on its way through the server (bytes
//! in and out on both links, the node's busy time and results, the user's
//! results and latency histogram), in the worst case where the node goes
//! busy and idle again for every message.
//!
//! Run: `cargo run --release -p corefarm-server --example metrics_cost`.
//! The second figure splits the hooks over two threads as the server does
//! (the user handler and the node connection's reader run as separate
//! tasks).

use std::sync::Arc;
use std::time::{Duration, Instant};

use corefarm_server::metrics::{Metrics, NodeMetrics, UserMetrics};

const N: u64 = 5_000_000;

// Each counter has one writer, as in the server: the bytes a user sends
// are counted by one side, the rest of the session's counters by the other.
fn user_side(user: &UserMetrics, node: &NodeMetrics, now: Instant) {
    user.link.received(76);
    node.dispatched(true, now);
    node.link.sent(76);
}

fn node_side(m: &Metrics, node: &NodeMetrics, user: &UserMetrics, rtt: Duration, now: Instant) {
    node.link.received(76);
    node.answered(true, false, now);
    user.result(m, || "bench".into(), rtt);
    user.link.sent(76);
}

fn main() {
    let (m, node, user) = (
        Arc::new(Metrics::default()),
        Arc::new(NodeMetrics::default()),
        Arc::new(UserMetrics::default()),
    );
    let rtt = Duration::from_micros(300);
    // The server already holds the time of each event; so does this loop.
    let now = Instant::now();
    let t = Instant::now();
    for _ in 0..N {
        user_side(&user, &node, std::hint::black_box(now));
        node_side(&m, &node, &user, std::hint::black_box(rtt), now);
    }
    let one = t.elapsed().as_nanos() as f64 / N as f64;
    println!("one thread:  {one:.1} ns per message");

    let t = Instant::now();
    let a = {
        let (user, node) = (user.clone(), node.clone());
        std::thread::spawn(move || {
            for _ in 0..N {
                user_side(&user, &node, std::hint::black_box(now));
            }
        })
    };
    for _ in 0..N {
        node_side(&m, &node, &user, std::hint::black_box(rtt), now);
    }
    a.join().unwrap();
    let two = t.elapsed().as_nanos() as f64 / N as f64;
    println!(
        "two threads: {two:.1} ns per message (wall time per message, both sides concurrently)"
    );
}
