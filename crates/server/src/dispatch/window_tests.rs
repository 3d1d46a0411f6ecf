//! The window against simulated nodes: whatever the bottleneck, it must
//! deliver what the best fixed window delivers (within 5 %) at a median
//! latency no higher than that window's — and within 5 % of the latency of
//! the smallest fixed window that delivers as much (within 1 %), the one a
//! user who had measured them all would pick.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::*;

/// A node and its links as a chain of FIFO stages; times in µs.
#[derive(Debug, Clone, Copy)]
struct Path {
    /// Server → node transfer of one message.
    send: f64,
    /// The node's work on one message.
    work: f64,
    /// Node → server transfer of its result.
    reply: f64,
    /// Fixed delay of the round trip: wake-ups, the server's turnaround.
    turn: f64,
    /// A seed-style node reads, works and writes in turn: one stage holds
    /// all three. A pipelining node overlaps them.
    sequential: bool,
    /// Each stage's time varies by up to this share.
    jitter: f64,
    /// Chance that a round trip stalls, and for how long (a loaded
    /// machine's scheduler).
    stall_p: f64,
    stall: f64,
    /// The server handles the results that arrive within this span in one
    /// wake-up, then refills: results come in bursts.
    batch: f64,
    /// Other work on the machine comes and goes: in half the spans of
    /// `busy_span`, picked at random, every stage takes `1 + busy` times
    /// as long.
    busy: f64,
    busy_span: f64,
}

/// A small deterministic generator: the verdicts must not depend on luck.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Runs `w` against `path` for `secs` simulated seconds with a user that
/// always has a message waiting; returns the second half's delivered rate
/// (messages per second), median round trip (µs) and the windows held.
fn run(path: Path, w: Window, secs: f64, seed: u64) -> (f64, f64, Vec<u32>) {
    run_from(path, w, secs, secs / 2.0, seed)
}

/// As [`run`], measuring from `from` simulated seconds on.
fn run_from(path: Path, w: Window, secs: f64, from: f64, seed: u64) -> (f64, f64, Vec<u32>) {
    run_capped(path, w, secs, from, seed, MAX_WINDOW)
}

/// As [`run_from`], with the byte budget allowing at most `cap` messages.
fn run_capped(
    path: Path,
    mut w: Window,
    secs: f64,
    from: f64,
    seed: u64,
    cap: u32,
) -> (f64, f64, Vec<u32>) {
    let us = |t: f64| Duration::from_nanos((t * 1000.0) as u64);
    let mut rng = Rng(seed.max(1));
    let mut vary = |t: f64, now: f64| {
        let busy = if path.busy_span > 0.0 {
            let mut span =
                Rng(((now / path.busy_span) as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            span.next();
            if span.next() < 0.5 {
                path.busy
            } else {
                0.0
            }
        } else {
            0.0
        };
        t * (1.0 + path.jitter * rng.next()) * (1.0 + busy)
    };
    let (mut send_free, mut work_free, mut reply_free) = (0.0f64, 0.0f64, 0.0f64);
    // (arrival at the server, dispatch), both in ns for ordering.
    let mut flight: BinaryHeap<Reverse<(u64, u64)>> = BinaryHeap::new();
    let mut stalls = Rng(seed.wrapping_mul(31).max(1));
    let mut dispatch = |now: f64, flight: &mut BinaryHeap<Reverse<(u64, u64)>>| {
        let arrive = if path.sequential {
            let start = now.max(work_free);
            work_free = start + vary(path.send + path.work + path.reply, now);
            work_free
        } else {
            send_free = now.max(send_free) + vary(path.send, now);
            work_free = send_free.max(work_free) + vary(path.work, now);
            reply_free = work_free.max(reply_free) + vary(path.reply, now);
            reply_free
        };
        let mut turn = path.turn;
        if stalls.next() < path.stall_p {
            turn += path.stall;
        }
        let back = arrive + turn;
        flight.push(Reverse(((back * 1000.0) as u64, (now * 1000.0) as u64)));
    };
    let end = secs * 1e6;
    let half = from * 1e6;
    let (mut done, mut rtts, mut held) = (0u64, Vec::new(), Vec::new());
    for _ in 0..w.get() {
        dispatch(0.0, &mut flight);
    }
    while let Some(Reverse((first, _))) = flight.peek().copied() {
        let mut now = first as f64 / 1000.0;
        if now > end {
            break;
        }
        let wake = first + (path.batch * 1000.0) as u64;
        while let Some(Reverse((back, sent))) = flight.peek().copied() {
            if back > wake {
                break;
            }
            flight.pop();
            now = back as f64 / 1000.0;
            w.on_result(Answer {
                at: us(now),
                left: flight.len(),
                user_blocked: false,
                cap,
                nodes: 1,
            });
            if now > half {
                done += 1;
                rtts.push(back - sent);
                held.push(w.get());
            }
        }
        while flight.len() < w.get() as usize {
            dispatch(now, &mut flight);
        }
    }
    rtts.sort_unstable();
    let p50 = rtts.get(rtts.len() / 2).copied().unwrap_or(0) as f64 / 1000.0;
    (done as f64 / (secs - from), p50, held)
}

/// The fixed windows a benchmark would try.
const GRID: [u32; 12] = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64];

/// Checks the adaptive window against the best fixed one on `path`; returns
/// the adaptive window's median window for the caller's own checks.
fn holds_its_own(name: &str, path: Path) -> u32 {
    let secs = 20.0;
    for seed in [1u64, 7, 42] {
        let (best_w, (best_rate, best_p50, _)) = GRID
            .iter()
            .map(|&n| (n, run(path, Window::new(n, false), secs, seed)))
            .max_by(|a, b| a.1 .0.total_cmp(&b.1 .0))
            .expect("a grid");
        // The window a user who measured every one would pick: the
        // smallest within 1 % of the best.
        let (knee_w, (_, knee_p50, _)) = GRID
            .iter()
            .map(|&n| (n, run(path, Window::new(n, false), secs, seed)))
            .find(|f| f.1 .0 >= 0.99 * best_rate)
            .expect("the best is in the grid");
        let (rate, p50, mut held) = run(path, Window::new(4, true), secs, seed);
        held.sort_unstable();
        let typical = held[held.len() / 2];
        assert!(
            rate >= 0.95 * best_rate,
            "{name} (seed {seed}): adaptive delivers {rate:.0}/s at window ~{typical}, \
             the fixed window {best_w} {best_rate:.0}/s"
        );
        assert!(
            p50 <= best_p50,
            "{name} (seed {seed}): adaptive median {p50:.0} µs at window ~{typical}, \
             the fixed window {best_w} {best_p50:.0} µs"
        );
        assert!(
            p50 <= 1.05 * knee_p50,
            "{name} (seed {seed}): adaptive median {p50:.0} µs at window ~{typical}, \
             the knee's fixed window {knee_w} {knee_p50:.0} µs"
        );
    }
    let (_, _, mut held) = run(path, Window::new(4, true), secs, 1);
    held.sort_unstable();
    held[held.len() / 2]
}

const QUIET: Path = Path {
    send: 0.0,
    work: 0.0,
    reply: 0.0,
    turn: 0.0,
    sequential: false,
    jitter: 0.1,
    stall_p: 0.0,
    stall: 0.0,
    batch: 0.0,
    busy: 0.0,
    busy_span: 0.0,
};

#[test]
fn the_node_as_bottleneck_keeps_one_in_service_and_one_ready() {
    // The headline's shape: 919 µs a message, a quick round trip.
    let w = holds_its_own(
        "node-bound",
        Path {
            send: 10.0,
            work: 919.0,
            reply: 5.0,
            turn: 60.0,
            ..QUIET
        },
    );
    assert_eq!(w, MIN_WINDOW);
}

#[test]
fn a_sequential_seed_node_behind_a_long_round_trip_gets_the_window_it_needs() {
    // A seed node: read, work, write in turn, 30 µs a message, while the
    // round trip through the server takes ten times that. The old window
    // (grow only on a result that finds the node idle) sat at two here.
    let w = holds_its_own(
        "seed node",
        Path {
            send: 12.0,
            work: 8.0,
            reply: 10.0,
            turn: 300.0,
            sequential: true,
            stall_p: 0.01,
            stall: 500.0,
            // The server reads a few results per wake-up.
            batch: 100.0,
            ..QUIET
        },
    );
    assert!(w >= 8, "window {w}");
}

#[test]
fn links_as_bottleneck_fill_the_pipe() {
    holds_its_own(
        "link-bound",
        Path {
            send: 40.0,
            work: 2.0,
            reply: 20.0,
            turn: 150.0,
            jitter: 0.3,
            stall_p: 0.02,
            stall: 400.0,
            ..QUIET
        },
    );
}

#[test]
fn a_slow_node_behind_a_slow_round_trip() {
    holds_its_own(
        "long round trip",
        Path {
            send: 20.0,
            work: 1000.0,
            reply: 20.0,
            turn: 4000.0,
            ..QUIET
        },
    );
}

#[test]
fn a_noisy_machine_does_not_walk_the_window_away() {
    // Large scheduling noise on a node-bound path: the window must stay
    // near its floor, not drift up on lucky epochs.
    let w = holds_its_own(
        "noisy node-bound",
        Path {
            send: 10.0,
            work: 500.0,
            reply: 5.0,
            turn: 80.0,
            jitter: 0.5,
            stall_p: 0.05,
            stall: 800.0,
            ..QUIET
        },
    );
    assert!(w <= 3, "window {w}");
}

/// Large messages on a loaded machine: a result every few milliseconds,
/// a round trip of about seventeen of them.
const LARGE: Path = Path {
    send: 2000.0,
    work: 50.0,
    reply: 1000.0,
    turn: 30_000.0,
    jitter: 0.5,
    stall_p: 0.05,
    stall: 20_000.0,
    ..QUIET
};

#[test]
fn a_window_far_below_its_knee_gets_there_within_a_short_session() {
    // Large messages: a result every few milliseconds, so an epoch takes
    // a tenth of a second, and a round trip holds about seventeen of them
    // where the window starts at four. A session measured from its first
    // second on must see the knee's throughput; climbing by bracketed
    // trials, three epochs each, the window was still below it.
    let path = LARGE;
    for seed in [1u64, 7, 42] {
        let best = GRID
            .iter()
            .map(|&n| run_from(path, Window::new(n, false), 2.0, 1.0, seed).0)
            .fold(0.0, f64::max);
        let (rate, _, held) = run_from(path, Window::new(4, true), 2.0, 1.0, seed);
        assert!(
            rate >= 0.9 * best,
            "seed {seed}: {rate:.0}/s against the best fixed window's {best:.0}/s, \
             windows {:?}..{:?}",
            held.first(),
            held.last()
        );
    }
}

/// The adaptive window from 4 on the [`LARGE`] path with a byte budget of
/// `cap` messages, against the fixed window `cap`, three seeds: it must
/// hold the cap for at least `held_share` of its results and deliver at
/// least `rate_share` of the fixed window's rate.
fn holds_the_cap(cap: u32, held_share: f64, rate_share: f64) {
    for seed in [1u64, 7, 42] {
        let (fixed, _, _) = run_capped(LARGE, Window::new(cap, false), 3.0, 1.0, seed, cap);
        let (rate, _, held) = run_capped(LARGE, Window::new(4, true), 3.0, 1.0, seed, cap);
        let at_cap = held.iter().filter(|&&w| w == cap).count();
        assert!(
            at_cap as f64 >= held_share * held.len() as f64,
            "seed {seed}: {held:?}"
        );
        assert!(
            rate >= rate_share * fixed,
            "seed {seed}: {rate:.0}/s against the fixed window {cap}'s {fixed:.0}/s"
        );
    }
}

#[test]
fn a_start_up_stopped_by_the_byte_budget_stays_at_the_cap() {
    // The large messages above, with a budget of 16 of them below their
    // knee: the window doubles 4, 8, 16 and must hold 16 — each doubling
    // doubled the rate, so a smaller window only loses. Trials downward
    // from the cap at once held it below for a third of this session.
    // At the cap for 0.72-0.78 of results here (0.69 with trials at
    // once), 0.985 of the fixed window's rate: a trial comes only after
    // the longest wait, and spends half of its four pairs of epochs one
    // step below.
    holds_the_cap(16, 0.7, 0.98);
}

#[test]
fn a_window_that_starts_at_the_byte_budget_stays_there() {
    // Messages so large that the budget allows only the window it starts
    // at (8 MiB ones: four), far below their knee. Nothing smaller has
    // been measured, and a trial downward begun at once spent a short
    // session below the cap, its epochs taking most of a second each.
    // At the cap for 0.91 of results, 0.965-0.978 of the fixed window's
    // rate (trials at once: 0.75-0.80 and 0.926-0.947).
    holds_the_cap(4, 0.85, 0.955);
}

#[test]
fn the_cap_bounds_the_window_and_a_fixed_window_stays_fixed() {
    let path = Path {
        send: 12.0,
        work: 8.0,
        reply: 10.0,
        turn: 300.0,
        sequential: true,
        ..QUIET
    };
    let mut w = Window::new(4, true);
    let mut at = Duration::ZERO;
    for i in 0..20_000u64 {
        at += Duration::from_micros(30 + (i % 7));
        w.on_result(Answer {
            at,
            left: w.get() as usize - 1,
            user_blocked: false,
            cap: 3,
            nodes: 1,
        });
        assert!(w.get() <= 3);
    }
    let (_, _, held) = run(path, Window::new(5, false), 2.0, 3);
    assert!(held.iter().all(|&n| n == 5));
}

#[test]
fn a_user_that_does_not_keep_the_node_busy_moves_nothing() {
    // Results always leave the node with room: the window did not limit.
    let mut w = Window::new(6, true);
    let mut at = Duration::ZERO;
    for _ in 0..20_000 {
        at += Duration::from_micros(100);
        w.on_result(Answer {
            at,
            left: 1,
            user_blocked: false,
            cap: MAX_WINDOW,
            nodes: 1,
        });
    }
    assert_eq!(w.get(), 6);
}

#[test]
fn a_noisy_machine_does_not_walk_a_seed_nodes_window_up_the_plateau() {
    // Past the knee every window delivers the same; on a loaded machine
    // one epoch's rate still swings by tens of percent. Read as gains,
    // those swings walked the window to its cap, and the latency with it.
    holds_its_own(
        "noisy seed node",
        Path {
            send: 12.0,
            work: 8.0,
            reply: 10.0,
            turn: 300.0,
            sequential: true,
            jitter: 0.6,
            stall_p: 0.05,
            stall: 2000.0,
            batch: 100.0,
            // Compilers on the other core: a third slower in half the
            // moments, each some tens of milliseconds.
            busy: 0.35,
            busy_span: 30_000.0,
        },
    );
}

/// `nodes` pipelining nodes behind one stage they share (the user's link,
/// the server's CPU: `send` per message, in dispatch order), each with its
/// own `work`, for `secs` simulated seconds; `windows` holds one window for
/// all (`shared`) or one per node. Returns the second half's total rate
/// (messages per second), median round trip (µs) and the windows held.
fn run_nodes(
    nodes: usize,
    send: f64,
    work: f64,
    mut windows: Vec<Window>,
    secs: f64,
    seed: u64,
) -> (f64, f64, Vec<u32>) {
    let shared = windows.len() == 1;
    let us = |t: f64| Duration::from_nanos((t * 1000.0) as u64);
    let mut rng = Rng(seed.max(1));
    let mut send_free = 0.0f64;
    let mut work_free = vec![0.0f64; nodes];
    // (back at the server in ns, sent in ns, node)
    let mut flight: BinaryHeap<Reverse<(u64, u64, usize)>> = BinaryHeap::new();
    let mut held_by = vec![0usize; nodes];
    let mut dispatch = |now: f64, node: usize, flight: &mut BinaryHeap<_>| {
        send_free = now.max(send_free) + send * (1.0 + 0.5 * rng.next());
        work_free[node] = send_free.max(work_free[node]) + work * (1.0 + 0.5 * rng.next());
        let back = work_free[node] + 50.0;
        flight.push(Reverse((
            (back * 1000.0) as u64,
            (now * 1000.0) as u64,
            node,
        )));
    };
    let window = |windows: &Vec<Window>, n: usize| windows[if shared { 0 } else { n }].get();
    let (end, half) = (secs * 1e6, secs * 0.5e6);
    let (mut done, mut rtts, mut held) = (0u64, Vec::new(), Vec::new());
    // The user always has a message waiting; nodes refill in turn.
    let mut refill = |now: f64, windows: &Vec<Window>, held_by: &mut Vec<usize>, flight: &mut _| loop {
        let open = (0..nodes).find(|&n| held_by[n] < window(windows, n) as usize);
        let Some(n) = open else { break };
        held_by[n] += 1;
        dispatch(now, n, flight);
    };
    refill(0.0, &windows, &mut held_by, &mut flight);
    while let Some(Reverse((back, sent, node))) = flight.pop() {
        let now = back as f64 / 1000.0;
        if now > end {
            break;
        }
        held_by[node] -= 1;
        let i = if shared { 0 } else { node };
        windows[i].on_result(Answer {
            at: us(now),
            left: held_by[node],
            user_blocked: false,
            cap: MAX_WINDOW,
            nodes: if shared { nodes as u32 } else { 1 },
        });
        if now > half {
            done += 1;
            rtts.push(back - sent);
            held.extend(windows.iter().map(Window::get));
        }
        refill(now, &windows, &mut held_by, &mut flight);
    }
    rtts.sort_unstable();
    let p50 = rtts.get(rtts.len() / 2).copied().unwrap_or(0) as f64 / 1000.0;
    (done as f64 / (secs - secs / 2.0), p50, held)
}

#[test]
fn nodes_behind_a_stage_they_share_hold_one_window_at_its_knee() {
    // Four nodes that could each do 2,000 messages a second behind a link
    // that carries 5,000: the link is the bottleneck, and any window
    // delivers what it carries. Windows of their own competed for it: one
    // that grew took its neighbours' share of the link, its own rate rose,
    // and the windows climbed to the cap (median round trip 0.2 s against
    // the knee's 2 ms) for no throughput.
    let (nodes, send, work) = (4, 200.0, 500.0);
    for seed in [1u64, 7, 42] {
        let fixed: Vec<_> = GRID
            .iter()
            .map(|&n| {
                let w = vec![Window::new(n, false)];
                let (rate, p50, _) = run_nodes(nodes, send, work, w, 20.0, seed);
                (n, rate, p50)
            })
            .collect();
        let best = fixed.iter().map(|f| f.1).fold(0.0, f64::max);
        let &(knee_w, _, knee_p50) = fixed
            .iter()
            .find(|f| f.1 >= 0.99 * best)
            .expect("the best is in the grid");
        let w = vec![Window::new(4, true)];
        let (rate, p50, mut held) = run_nodes(nodes, send, work, w, 20.0, seed);
        held.sort_unstable();
        let typical = held[held.len() / 2];
        assert!(
            rate >= 0.95 * best,
            "seed {seed}: {rate:.0}/s at window ~{typical}, the best fixed window {best:.0}/s"
        );
        assert!(
            p50 <= 1.05 * knee_p50,
            "seed {seed}: median {p50:.0} µs at window ~{typical}, \
             the knee's fixed window {knee_w} {knee_p50:.0} µs"
        );
    }
}
