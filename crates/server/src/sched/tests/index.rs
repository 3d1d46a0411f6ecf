//! The indexes that spare the scheduler a scan of every node per event
//! stay equal to a scan after any sequence of events: nodes joining,
//! loading, refusing, answering, erring, stalling, being lent and leaving;
//! users configuring, submitting and leaving; periods passing.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::dispatch::progress::Hedge;

/// Drives `s` with `steps` random events drawn from `seed`, checking the
/// indexes after each.
fn run(seed: u64, steps: usize, p: Params) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut s = Sched::new(p);
    let mut now = ms(0);
    let mut next_node = 1u64;
    let mut configuring: Vec<u64> = Vec::new();
    let mut sent: Vec<(u64, u32)> = Vec::new();
    let names = ["a", "b", "c", "d"];
    // User ids are never reused (as the server's sessions' are not).
    let mut users: Vec<u64> = Vec::new();
    let mut next_user = 1u64;
    for step in 0..steps {
        now += Duration::from_micros(rng.gen_range(0..3000));
        let nodes: Vec<u64> = s.nodes.keys().copied().collect();
        let any_node = |rng: &mut StdRng| nodes.get(rng.gen_range(0..nodes.len().max(1))).copied();
        match rng.gen_range(0..100) {
            0..=9 => {
                s.add_node(next_node, now);
                next_node += 1;
            }
            10..=12 => {
                if let Some(n) = any_node(&mut rng) {
                    s.remove_node(n, now);
                }
            }
            13..=19 => {
                let user = match users.len() < 6 && rng.gen() {
                    true => {
                        next_user += 1;
                        users.push(next_user);
                        s.user_joined(next_user);
                        // Every third session is limited, some as one tenant.
                        if next_user.is_multiple_of(3) {
                            let tenant = next_user.is_multiple_of(2).then_some("t");
                            s.set_tenant(next_user, tenant, 1);
                            s.set_max_nodes(next_user, Some(1 + next_user as u32 % 2));
                        }
                        next_user
                    }
                    false if users.is_empty() => continue,
                    false => users[rng.gen_range(0..users.len())],
                };
                let name = names[rng.gen_range(0..names.len())];
                s.configure(user, payload(name), 8, 8, now);
            }
            20..=21 if !users.is_empty() => {
                let user = users.swap_remove(rng.gen_range(0..users.len()));
                s.user_gone(user, now);
            }
            22..=49 => {
                for _ in 0..rng.gen_range(1..4) {
                    let Some(&user) = users.get(rng.gen_range(0..users.len().max(1))) else {
                        break;
                    };
                    s.submit(job(user, rng.gen()), now);
                }
            }
            50..=64 => {
                if !configuring.is_empty() {
                    let n = configuring.swap_remove(rng.gen_range(0..configuring.len()));
                    let _ = s.on_config_response(n, rng.gen_range(0..8) > 0, now);
                }
            }
            65..=84 => {
                if !sent.is_empty() {
                    let (n, i) = sent.swap_remove(rng.gen_range(0..sent.len()));
                    match rng.gen_range(0..10) {
                        0 => s.on_node_error(n, i, 1, "bad input", now),
                        _ => {
                            let _ = s.on_result(n, i, Bytes::from_static(&[1; 8]), false, now);
                        }
                    }
                }
            }
            85..=89 => {
                if let Some(n) = any_node(&mut rng) {
                    s.on_written(n, rng.gen_range(1..3), now);
                }
            }
            90..=94 => {
                now += ms(rng.gen_range(0..20));
                s.tick(now);
                s.check_progress(now);
            }
            _ => {
                let candidates: Vec<u64> = nodes.iter().copied().filter(|_| rng.gen()).collect();
                let n = rng.gen_range(0..=candidates.len().min(2));
                s.lend(&candidates, n, now);
            }
        }
        for a in s.take_actions() {
            match a {
                Action::Configure { node, .. } => configuring.push(node),
                Action::Send { node, internal, .. } => sent.push((node, internal)),
                Action::Close { node, .. } | Action::Lent { node } => {
                    configuring.retain(|&n| n != node);
                    sent.retain(|&(n, _)| n != node);
                }
                _ => {}
            }
        }
        // Nodes that left take their unanswered work with them.
        configuring.retain(|n| s.nodes.contains_key(n));
        sent.retain(|(n, _)| s.nodes.contains_key(n));
        let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            s.check_index();
            s.check_limits();
        }));
        assert!(checked.is_ok(), "seed {seed}, step {step}");
    }
}

#[test]
fn indexes_match_a_scan_after_random_events() {
    for seed in 0..4 {
        run(seed, 1000, fair_sched().p);
    }
}

#[test]
fn indexes_match_a_scan_with_hedging_and_adaptive_credit() {
    for (seed, policy) in [
        (10, crate::dispatch::Policy::Credit),
        (11, crate::dispatch::Policy::Queue),
        (12, crate::dispatch::Policy::Stack),
    ] {
        let p = Params {
            credit: 2,
            credit_adaptive: true,
            fair_share: true,
            hedge: Hedge::new(4.0, ms(5)),
            policy,
            ..sched().p
        };
        run(seed, 1000, p);
    }
}
