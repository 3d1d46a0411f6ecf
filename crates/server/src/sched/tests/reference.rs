//! The scheduler's shortcuts decide as the plain computations they
//! replace: two schedulers take the same random events, one with the
//! reference computation switched on, and their actions must be equal
//! after every event. Algorithm 1's ranked candidates against a scan of
//! every node per function; placement and the check for functions no node
//! can load skipped while nothing they depend on changed, against both
//! after every event.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

/// Fair shares, a short wait before a busy function's only replica may be
/// taken, and no replication (its ties between equal claims follow a
/// hash's order, which two schedulers need not share).
fn params() -> Params {
    Params {
        c_replicate: f64::INFINITY,
        max_wait: ms(30),
        node_wait: Duration::from_secs(3600),
        ..fair_sched().p
    }
}

/// Drives `reference` (changed by `knob`) and a plain scheduler with the
/// same `steps` random events from `seed`; returns the first step whose
/// actions differ, with both.
fn lockstep(
    seed: u64,
    steps: usize,
    p: Params,
    knob: fn(&mut Sched),
) -> Option<(usize, String, String)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut reference = Sched::new(p.clone());
    knob(&mut reference);
    let mut s = Sched::new(p);
    let mut now = ms(0);
    let mut next_node = 1u64;
    // Nodes asked to load a function, and whether it is one most refuse.
    let mut configuring: Vec<(u64, bool)> = Vec::new();
    let refused_mostly = [payload("i"), payload("j")];
    let mut sent: Vec<(u64, u32)> = Vec::new();
    let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"];
    let mut users: Vec<u64> = Vec::new();
    let mut next_user = 1u64;
    for step in 0..steps {
        now += Duration::from_micros(rng.gen_range(0..3000));
        let nodes: Vec<u64> = s.nodes.keys().copied().collect();
        let pick = |rng: &mut StdRng, v: &[u64]| v.get(rng.gen_range(0..v.len().max(1))).copied();
        let event = rng.gen_range(0..100);
        let mut both = |f: &mut dyn FnMut(&mut Sched)| {
            f(&mut reference);
            f(&mut s);
        };
        match event {
            0..=7 if nodes.len() < 12 => {
                let n = next_node;
                next_node += 1;
                both(&mut |x| x.add_node(n, now));
            }
            8..=9 => {
                if let Some(n) = pick(&mut rng, &nodes) {
                    both(&mut |x| x.remove_node(n, now));
                }
            }
            10..=19 => {
                let user = match users.len() < 12 && rng.gen() {
                    true => {
                        next_user += 1;
                        users.push(next_user);
                        let u = next_user;
                        both(&mut |x| x.user_joined(u));
                        u
                    }
                    false if users.is_empty() => continue,
                    false => users[rng.gen_range(0..users.len())],
                };
                let name = names[rng.gen_range(0..names.len())];
                both(&mut |x| {
                    x.configure(user, payload(name), 8, 8, now);
                });
            }
            20..=21 if !users.is_empty() => {
                let user = users.swap_remove(rng.gen_range(0..users.len()));
                both(&mut |x| x.user_gone(user, now));
            }
            22..=23 => {
                if let Some(u) = pick(&mut rng, &users) {
                    let w = rng.gen_range(1..4);
                    both(&mut |x| x.set_weight(u, w));
                }
            }
            24..=49 => {
                for _ in 0..rng.gen_range(1..6) {
                    let Some(user) = pick(&mut rng, &users) else {
                        break;
                    };
                    let (id, count) = (rng.gen(), rng.gen_range(1..4));
                    let j = || Job::new(user, id, Bytes::from_static(&[0; 8]), count);
                    both(&mut |x| x.submit(j(), now));
                }
            }
            50..=64 => {
                if !configuring.is_empty() {
                    let (n, bad) = configuring.swap_remove(rng.gen_range(0..configuring.len()));
                    let ok = rng.gen_range(0..6) > if bad { 4 } else { 0 };
                    let at = now + ms(rng.gen_range(0..30));
                    both(&mut |x| {
                        let _ = x.on_config_response(n, ok, at);
                    });
                }
            }
            65..=84 => {
                if !sent.is_empty() {
                    let (n, i) = sent.swap_remove(rng.gen_range(0..sent.len()));
                    let at = now + ms(rng.gen_range(0..5));
                    both(&mut |x| {
                        let _ = x.on_result(n, i, Bytes::from_static(&[1; 8]), true, at);
                    });
                }
            }
            85..=95 => {
                // Now and then a lull long enough for users without work
                // to leave the fair shares.
                now += match rng.gen_range(0..8) {
                    0 => ms(rng.gen_range(100..400)),
                    _ => ms(rng.gen_range(0..25)),
                };
                both(&mut |x| x.tick(now));
            }
            _ => {
                let candidates: Vec<u64> = nodes.iter().copied().filter(|_| rng.gen()).collect();
                let n = rng.gen_range(0..=candidates.len().min(2));
                both(&mut |x| {
                    x.lend(&candidates, n, now);
                });
            }
        }
        let (a, b) = (reference.take_actions(), s.take_actions());
        let (da, db) = (format!("{a:?}"), format!("{b:?}"));
        if da != db {
            return Some((step, da, db));
        }
        for a in b {
            match a {
                Action::Configure { node, payload, .. } => {
                    configuring.push((node, refused_mostly.contains(&payload)))
                }
                Action::Send { node, internal, .. } => sent.push((node, internal)),
                _ => {}
            }
        }
        configuring.retain(|(n, _)| s.nodes.contains_key(n));
        sent.retain(|(n, _)| s.nodes.contains_key(n));
    }
    None
}

fn check(knob: fn(&mut Sched)) {
    for seed in 0..12 {
        let p = Params {
            c_reconfig: [0.5, 0.05, 5.0][seed as usize % 3],
            ..params()
        };
        if let Some((step, a, b)) = lockstep(seed, 1500, p, knob) {
            panic!("seed {seed}, step {step}:\nreference {a}\nshortcut  {b}");
        }
    }
}

#[test]
fn algorithm1_ranked_candidates_pick_what_a_scan_of_every_node_picks() {
    check(|s| s.ix.scan_serve = true);
}

#[test]
fn placement_skipped_while_nothing_changed_decides_as_placing_after_every_event() {
    check(|s| s.ix.always_place = true);
}
