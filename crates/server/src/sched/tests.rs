//! The scheduler against a fake clock: every event carries its time, so
//! these tests decide exactly when periods end and how long nodes take.

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// P = 10 ms, one message in flight per node (fixed window): dispatch
/// order is then fully determined by the queue. One node per new function
/// (no fair share), so the tests place functions node by node.
fn sched() -> Sched {
    Sched::new(Params {
        credit: 1,
        credit_adaptive: false,
        fair_share: false,
        ..Params::new(ms(10))
    })
}

/// [`sched`] with fair shares: functions take their users' share of the
/// nodes at once.
fn fair_sched() -> Sched {
    Sched::new(Params {
        fair_share: true,
        ..sched().p
    })
}

/// [`fair_sched`] with nodes 1..=`nodes`, user 1 configured for "a",
/// which every node loaded by 1 ms.
fn fair_sched_with_a(nodes: u64) -> Sched {
    let mut s = fair_sched();
    for n in 1..=nodes {
        s.add_node(n, ms(0));
    }
    s.configure(1, payload("a"), 8, 8, ms(0));
    for (n, _) in configures(&s.take_actions()) {
        s.on_config_response(n, true, ms(1)).unwrap();
    }
    s
}

fn payload(name: &str) -> Bytes {
    Bytes::from(format!("configuration {name}"))
}

fn job(user: u64, id: u32) -> Job {
    Job::new(user, id, Bytes::from_static(&[0; 8]), 1)
}

/// Configure actions: (node, payload).
fn configures(a: &[Action]) -> Vec<(u64, Bytes)> {
    a.iter()
        .filter_map(|a| match a {
            Action::Configure { node, payload, .. } => Some((*node, payload.clone())),
            _ => None,
        })
        .collect()
}

/// Send actions: (node, internal id).
fn sends(a: &[Action]) -> Vec<(u64, u32)> {
    a.iter()
        .filter_map(|a| match a {
            Action::Send { node, internal, .. } => Some((*node, *internal)),
            _ => None,
        })
        .collect()
}

fn answers(a: &[Action]) -> Vec<(u64, bool)> {
    a.iter()
        .filter_map(|a| match a {
            Action::Configured { user, ok, .. } => Some((*user, *ok)),
            _ => None,
        })
        .collect()
}

fn results(a: &[Action]) -> Vec<(u64, u32)> {
    a.iter()
        .filter_map(|a| match a {
            Action::Result { user, id, .. } => Some((*user, *id)),
            _ => None,
        })
        .collect()
}

/// Configures `user` for `name` and lets whichever node is asked answer
/// after `took`. Returns the node that loaded it (if one was asked).
fn configure(s: &mut Sched, user: u64, name: &str, now: Duration, took: Duration) -> Option<u64> {
    s.configure(user, payload(name), 8, 8, now);
    let a = s.take_actions();
    let node = configures(&a).first().map(|c| c.0);
    if let Some(n) = node {
        s.on_config_response(n, true, now + took).unwrap();
    }
    node
}

/// Answers the Send actions with results, at `now`.
fn answer(s: &mut Sched, sent: &[(u64, u32)], now: Duration) -> Vec<Action> {
    let mut out = Vec::new();
    for &(node, internal) in sent {
        s.on_result(node, internal, Bytes::from_static(&[1; 8]), false, now)
            .unwrap();
        out.extend(s.take_actions());
    }
    out
}

#[test]
fn users_of_one_payload_share_its_replica() {
    let mut s = sched();
    s.add_node(1, ms(0));
    s.add_node(2, ms(0));
    s.configure(10, payload("a"), 8, 8, ms(0));
    let a = s.take_actions();
    assert_eq!(configures(&a).len(), 1, "one node loads the new function");
    assert!(
        answers(&a).is_empty(),
        "no positive response before a replica exists"
    );
    let node = configures(&a)[0].0;
    s.on_config_response(node, true, ms(3)).unwrap();
    assert_eq!(answers(&s.take_actions()), [(10, true)]);
    // The second user configures the same bytes: same function, answered at once.
    let f = s.configure(11, payload("a"), 8, 8, ms(4));
    let a = s.take_actions();
    assert!(configures(&a).is_empty());
    assert_eq!(answers(&a), [(11, true)]);
    assert_eq!(s.replicas(f), 1);
    // Each gets its own results.
    s.submit(job(10, 7), ms(5));
    s.submit(job(11, 7), ms(5));
    let sent = sends(&s.take_actions());
    assert_eq!(sent.len(), 1, "window of one");
    let a = answer(&mut s, &sent, ms(6));
    let mut got = results(&a);
    got.extend(results(&answer(&mut s, &sends(&a), ms(7))));
    got.sort();
    assert_eq!(got, [(10, 7), (11, 7)]);
    let v = s.view();
    assert_eq!(v.functions.len(), 1);
    assert_eq!(v.functions[0].users, [10, 11]);
}

#[test]
fn a_burst_does_not_starve_another_users_single_message() {
    let mut s = sched();
    s.add_node(1, ms(0));
    configure(&mut s, 10, "a", ms(0), ms(1));
    configure(&mut s, 11, "a", ms(1), ms(0));
    s.take_actions();
    for id in 0..20 {
        s.submit(job(10, id), ms(2));
    }
    s.submit(job(11, 0), ms(2));
    let mut order = Vec::new();
    let mut now = 3;
    let mut sent = sends(&s.take_actions());
    while !sent.is_empty() {
        let a = answer(&mut s, &sent, ms(now));
        order.extend(results(&a));
        sent = sends(&a);
        now += 1;
    }
    assert_eq!(order.len(), 21, "exactly one result per input");
    let pos = order.iter().position(|&(u, _)| u == 11).unwrap();
    assert!(pos <= 2, "user 11's message came out at {pos}: {order:?}");
}

#[test]
fn a_lost_replica_has_its_work_redispatched_exactly_once() {
    let mut s = sched();
    s.add_node(1, ms(0));
    s.add_node(2, ms(0));
    let f = {
        configure(&mut s, 10, "a", ms(0), ms(1));
        FnId::of(&payload("a"))
    };
    // A second replica: the backlog goes onto the spare node at once,
    // without waiting for the period.
    for id in 0..50 {
        s.submit(job(10, id), ms(2));
    }
    let a = s.take_actions();
    let c = configures(&a);
    assert_eq!(c.len(), 1, "the backlog asks for a replica: {a:?}");
    assert_eq!(c[0].0, 2);
    s.on_config_response(c[0].0, true, ms(11)).unwrap();
    let sent = sends(&s.take_actions());
    assert_eq!(s.replicas(f), 2);
    assert!(
        sent.iter().any(|x| x.0 == 2),
        "the new replica takes work: {sent:?}"
    );
    // Node 1 dies with a message in flight: it goes to node 2, once.
    s.remove_node(1, ms(12));
    let mut seen = std::collections::HashSet::new();
    let mut now = 13;
    let mut pending: Vec<(u64, u32)> = s.nodes[&2].in_flight.keys().map(|&k| (2, k)).collect();
    pending.extend(sends(&s.take_actions()));
    while !pending.is_empty() {
        let a = answer(&mut s, &pending, ms(now));
        for r in results(&a) {
            assert!(seen.insert(r), "result {r:?} twice");
        }
        pending = sends(&a);
        now += 1;
    }
    assert_eq!(seen.len(), 50);
    // The last replica dies with work queued: it waits for a new node.
    s.submit(job(10, 100), ms(now));
    let a = s.take_actions();
    let lost = sends(&a);
    s.remove_node(2, ms(now));
    assert!(results(&s.take_actions()).is_empty());
    s.add_node(3, ms(now + 1));
    let c = configures(&s.take_actions());
    assert_eq!(c.len(), 1, "the function is loaded on the new node");
    s.on_config_response(3, true, ms(now + 2)).unwrap();
    let sent = sends(&s.take_actions());
    assert_eq!(sent.len(), lost.len().max(1));
    assert_eq!(results(&answer(&mut s, &sent, ms(now + 3))), [(10, 100)]);
}

/// Two functions, one replica each on two nodes; the user of `hot` sends a
/// backlog while the other user idles. Returns the reconfigurations the
/// next period decides.
fn replication_after_backlog(reconfig: Duration) -> usize {
    let mut s = sched();
    s.add_node(1, ms(0));
    s.add_node(2, ms(0));
    configure(&mut s, 10, "hot", ms(0), reconfig);
    configure(&mut s, 11, "cold", ms(0), reconfig);
    let t = reconfig.as_millis() as u64 + 1;
    // Measure a service time of 1 ms per input.
    s.submit(job(10, 0), ms(t));
    let sent = sends(&s.take_actions());
    answer(&mut s, &sent, ms(t + 1));
    for id in 1..200 {
        s.submit(job(10, id), ms(t + 1));
    }
    s.take_actions();
    s.tick(ms(t + 11));
    configures(&s.take_actions()).len()
}

#[test]
fn replication_weighs_the_cost_of_reprogramming() {
    // Cheap reprogramming: the idle node of "cold" replicates "hot".
    assert_eq!(replication_after_backlog(ms(1)), 1);
    // Reprogramming takes 400 ms against a 1 s horizon: losing "cold"'s
    // only replica costs two reprogrammings (away and back), more than a
    // second replica of "hot" would gain. No thrashing.
    assert_eq!(replication_after_backlog(ms(400)), 0);
}

#[test]
fn two_alternating_functions_do_not_thrash_when_programming_is_slow() {
    for (reconfig, expect_thrash) in [(ms(400), false), (ms(1), true)] {
        let mut s = sched();
        s.add_node(1, ms(0));
        s.add_node(2, ms(0));
        let r = reconfig.as_millis() as u64;
        configure(&mut s, 10, "a", ms(0), reconfig);
        configure(&mut s, 11, "b", ms(0), reconfig);
        let mut now = r + 1;
        let mut loads = 0;
        // Ten phases; in each one user has a backlog of 100 inputs (1 ms each).
        for phase in 0..10u32 {
            let user = 10 + (phase % 2) as u64;
            for id in 0..100 {
                s.submit(job(user, phase * 1000 + id), ms(now));
            }
            let mut sent = sends(&s.take_actions());
            let mut answered = 0;
            while answered < 100 {
                now += 1;
                if now.is_multiple_of(10) {
                    s.tick(ms(now));
                }
                let a = s.take_actions();
                for (node, _) in configures(&a) {
                    loads += 1;
                    s.on_config_response(node, true, ms(now + r)).unwrap();
                }
                sent.extend(sends(&a));
                sent.extend(sends(&s.take_actions()));
                let batch = std::mem::take(&mut sent);
                let a = answer(&mut s, &batch, ms(now));
                answered += results(&a).len();
                sent.extend(sends(&a));
            }
        }
        if expect_thrash {
            assert!(
                loads >= 5,
                "cheap reprogramming follows the demand ({loads} loads)"
            );
        } else {
            assert_eq!(loads, 0, "slow reprogramming: replicas stay where they are");
        }
    }
}

#[test]
fn a_function_without_replica_takes_a_node_from_one_with_two() {
    let mut s = sched();
    s.add_node(1, ms(0));
    s.add_node(2, ms(0));
    configure(&mut s, 10, "a", ms(0), ms(1));
    // Cheaply replicate "a" on the second node under a backlog.
    for id in 0..300 {
        s.submit(job(10, id), ms(2));
    }
    let a = s.take_actions();
    let mut loads = configures(&a);
    let mut sent = sends(&a);
    sent = sends(&answer(&mut s, &sent, ms(3)));
    s.tick(ms(10));
    loads.extend(configures(&s.take_actions()));
    assert_eq!(loads.len(), 1, "the spare node replicates \"a\"");
    for (n, _) in loads {
        s.on_config_response(n, true, ms(11)).unwrap();
    }
    sent.extend(sends(&s.take_actions()));
    assert_eq!(s.replicas(FnId::of(&payload("a"))), 2);
    // A new user of "b": no idle node, but "a" has two replicas.
    s.configure(11, payload("b"), 8, 8, ms(12));
    assert!(answers(&s.take_actions()).is_empty());
    s.tick(ms(20));
    s.take_actions();
    // The drained node finishes its message, then loads "b".
    let a = answer(&mut s, &sent, ms(21));
    let c = configures(&a);
    assert_eq!(c.len(), 1, "{a:?}");
    assert_eq!(c[0].1, payload("b"));
    s.on_config_response(c[0].0, true, ms(22)).unwrap();
    assert_eq!(answers(&s.take_actions()), [(11, true)]);
}

#[test]
fn time_slicing_when_functions_outnumber_nodes() {
    let mut s = sched();
    s.add_node(1, ms(0));
    configure(&mut s, 10, "a", ms(0), ms(1));
    for id in 0..10_000 {
        s.submit(job(10, id), ms(2));
    }
    let mut sent = sends(&s.take_actions());
    s.configure(11, payload("b"), 8, 8, ms(3));
    let mut now: u64 = 3;
    let mut loaded_at = None;
    while loaded_at.is_none() && now < 2000 {
        now += 1;
        if now.is_multiple_of(10) {
            s.tick(ms(now));
        }
        let a = answer(&mut s, &sent, ms(now));
        sent = sends(&a);
        if !configures(&a).is_empty() {
            loaded_at = Some(now);
        }
    }
    // max_wait = 50 periods = 500 ms (the node reprograms in 1 ms).
    let t = loaded_at.expect("the waiting function gets the node eventually");
    assert!((500..600).contains(&t), "loaded at {t} ms");
}

#[test]
fn refusals_and_missing_nodes_give_a_negative_response() {
    let mut s = sched();
    s.add_node(1, ms(0));
    s.configure(10, payload("x"), 8, 8, ms(0));
    s.take_actions();
    s.on_node_error(
        1,
        corefarm_smp::ErrorMsg::NO_ID,
        ErrorCode::ConfigurationFailed as u32,
        "no artifact for native",
        ms(1),
    );
    s.on_config_response(1, false, ms(1)).unwrap();
    let a = s.take_actions();
    let errors: Vec<&String> = a
        .iter()
        .filter_map(|a| match a {
            Action::Configured {
                ok: false, errors, ..
            } => Some(errors),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(answers(&a), [(10, false)]);
    assert!(
        errors.iter().any(|e| e.contains("no artifact")),
        "{errors:?}"
    );
    assert!(
        s.view().functions.is_empty(),
        "an unwanted function is forgotten"
    );

    let mut s = sched();
    s.configure(10, payload("x"), 8, 8, ms(0));
    s.tick(ms(1000));
    assert!(
        answers(&s.take_actions()).is_empty(),
        "waits --node-wait for a node"
    );
    s.tick(ms(5000));
    assert_eq!(answers(&s.take_actions()), [(10, false)]);
}

#[test]
fn a_departed_users_work_is_dropped_and_its_results_discarded() {
    let mut s = sched();
    s.add_node(1, ms(0));
    configure(&mut s, 10, "a", ms(0), ms(1));
    s.take_actions();
    s.submit(job(10, 1), ms(2));
    s.submit(job(10, 2), ms(2));
    let sent = sends(&s.take_actions());
    s.user_gone(10, ms(3));
    assert!(results(&answer(&mut s, &sent, ms(4))).is_empty());
    assert!(
        sends(&s.take_actions()).is_empty(),
        "its queued message is gone"
    );
    let v = s.view();
    assert_eq!(v.functions.len(), 1, "the node still holds the function");
    assert_eq!(v.functions[0].queued, 0);
}

#[test]
fn queued_work_takes_spare_nodes_at_once_but_never_a_wanted_one() {
    let mut s = sched();
    s.add_node(1, ms(0));
    s.add_node(2, ms(0));
    configure(&mut s, 10, "a", ms(0), ms(1));
    configure(&mut s, 11, "b", ms(1), ms(1));
    s.take_actions();
    for id in 0..20 {
        s.submit(job(10, id), ms(3));
    }
    let a = s.take_actions();
    assert!(
        configures(&a).is_empty(),
        "node 2 holds \"b\", which user 11 still uses"
    );
    assert_eq!(sends(&a).len(), 1, "one replica, window of one");
    // User 11 leaves: its node is spare and takes the queued work without
    // waiting for the period.
    s.user_gone(11, ms(4));
    let c = configures(&s.take_actions());
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].1, payload("a"));
}

#[test]
fn a_configuration_that_loses_every_node_it_loads_on_is_given_up() {
    let mut s = sched();
    s.add_node(1, ms(0));
    s.configure(10, payload("crash"), 8, 8, ms(0));
    for node in 1..=route::MAX_LOST_LOADS as u64 {
        let c = configures(&s.take_actions());
        assert_eq!(c.len(), 1, "loading on node {node}");
        // The node dies (or times out) before answering; another connects.
        s.remove_node(node, ms(node));
        s.add_node(node + 1, ms(node));
    }
    let a = s.take_actions();
    assert_eq!(answers(&a), [(10, false)], "{a:?}");
    assert!(configures(&a).is_empty(), "no further node is sacrificed");
}

fn lents(a: &[Action]) -> Vec<u64> {
    let mut v: Vec<u64> = a
        .iter()
        .filter_map(|a| match a {
            Action::Lent { node } => Some(*node),
            _ => None,
        })
        .collect();
    v.sort_unstable();
    v
}

#[test]
fn groups_borrow_idle_nodes_at_once_and_busy_ones_once_their_work_is_done() {
    let mut s = sched();
    for n in 1..=3 {
        s.add_node(n, ms(0));
    }
    let x = configure(&mut s, 1, "a", ms(1), ms(1)).expect("a node loads it");
    s.take_actions();
    s.submit(job(1, 7), ms(3));
    let sent = sends(&s.take_actions());
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0, x);

    // Two idle nodes: lent at once, the replica keeps working.
    let all = [1, 2, 3];
    assert!(s.lend(&all, 2, ms(4)));
    let idle: Vec<u64> = all.iter().copied().filter(|&n| n != x).collect();
    assert_eq!(lents(&s.take_actions()), idle);

    // The busy replica is promised, takes no new work, and leaves once its
    // job's result is delivered (exactly once, to its user).
    assert!(s.lend(&[x], 1, ms(5)));
    assert!(lents(&s.take_actions()).is_empty());
    assert_eq!(s.lending(), 1);
    s.submit(job(1, 8), ms(6));
    assert!(
        sends(&s.take_actions()).is_empty(),
        "no new work on a promised node"
    );
    let a = answer(&mut s, &sent, ms(7));
    assert_eq!(results(&a), [(1, 7)]);
    assert_eq!(lents(&a), [x]);
    assert_eq!(s.lending(), 0);

    // Nothing left to lend; a node that comes back loads the function and
    // runs the job that waited.
    assert!(!s.lend(&all, 1, ms(8)));
    s.add_node(4, ms(9));
    let a = s.take_actions();
    assert_eq!(configures(&a).first().map(|c| c.0), Some(4));
    s.on_config_response(4, true, ms(10)).unwrap();
    assert_eq!(sends(&s.take_actions()).first().map(|c| c.0), Some(4));
}

/// A new function is loaded on a fair share of the spare nodes together
/// with its first replica, so its queued jobs do not wait for a second
/// round of programming (as exclusive mode programs all of a user's nodes
/// at once).
#[test]
fn a_new_function_takes_a_fair_share_of_the_spare_nodes_at_once() {
    let mut s = fair_sched();
    for n in 1..=4 {
        s.add_node(n, ms(0));
    }
    // The only function in use: all four nodes at once.
    s.configure(1, payload("a"), 8, 8, ms(0));
    let a = s.take_actions();
    let loading: Vec<u64> = configures(&a).iter().map(|c| c.0).collect();
    assert_eq!(loading.len(), 4, "{a:?}");
    for &n in &loading {
        s.on_config_response(n, true, ms(10)).unwrap();
    }
    assert_eq!(answers(&s.take_actions()), vec![(1, true)]);
    // Four jobs start on four replicas at once: none waits for programming.
    for id in 0..4 {
        s.submit(job(1, id), ms(10));
    }
    let sent = sends(&s.take_actions());
    assert_eq!(sent.len(), 4, "{sent:?}");
    // A second function while the first is used: none is spare (all hold
    // a wanted function) and all are busy, so a node of "a", which holds
    // more than its half, is drained for it: it loads "b" as soon as its
    // job is done, without waiting for Algorithm 1's period.
    s.configure(2, payload("b"), 8, 8, ms(11));
    assert!(configures(&s.take_actions()).is_empty());
    let a = answer(&mut s, &sent, ms(12));
    assert_eq!(configures(&a), [(1, payload("b"))]);
}

/// Users that have connected but not configured yet count in the fair
/// shares: the first of two to configure loads half the spare nodes, and
/// the second finds the other half spare at once instead of draining.
#[test]
fn a_user_still_to_configure_keeps_its_share_of_the_spare_nodes() {
    let mut s = fair_sched();
    for n in 1..=8 {
        s.add_node(n, ms(0));
    }
    s.user_joined(1);
    s.user_joined(2);
    s.configure(1, payload("a"), 8, 8, ms(0));
    assert_eq!(configures(&s.take_actions()).len(), 4);
    s.configure(2, payload("b"), 8, 8, ms(1));
    let b = configures(&s.take_actions());
    assert_eq!(b.len(), 4, "{b:?}");
    assert!(b.iter().all(|c| c.1 == payload("b")));
    // A user that joined and left counts no more.
    let mut s = fair_sched();
    for n in 1..=8 {
        s.add_node(n, ms(0));
    }
    s.user_joined(3);
    s.user_gone(3, ms(0));
    s.configure(1, payload("a"), 8, 8, ms(1));
    assert_eq!(configures(&s.take_actions()).len(), 8);
}

/// A function's fair share is what exclusive mode would give its users:
/// the nodes split over the users of the wanted functions. A new function
/// takes a node from one holding more than its share at once, and its
/// backlog grows it to its share, not beyond.
#[test]
fn a_function_takes_its_users_share_from_one_holding_more_at_once() {
    let mut s = fair_sched_with_a(6);
    s.configure(2, payload("a"), 8, 8, ms(2));
    s.take_actions();
    // Two of the three users use "a": its share is 4 of the 6 nodes.
    s.configure(3, payload("b"), 8, 8, ms(3));
    let c = configures(&s.take_actions());
    assert_eq!(c.len(), 1, "an idle node of \"a\" loads \"b\" at once");
    assert_eq!(c[0].1, payload("b"));
    s.on_config_response(c[0].0, true, ms(4)).unwrap();
    assert_eq!(answers(&s.take_actions()), [(3, true)]);
    // A backlog of "b" (jobs longer than a reprogramming) takes one more.
    for id in 0..10 {
        s.submit(Job::new(3, id, Bytes::from_static(&[0; 8]), 50), ms(5));
    }
    let c = configures(&s.take_actions());
    assert_eq!(c.len(), 1, "{c:?}");
    s.on_config_response(c[0].0, true, ms(6)).unwrap();
    assert!(configures(&s.take_actions()).is_empty(), "its share is 2");
    assert_eq!(s.replicas(FnId::of(&payload("b"))), 2);
    assert_eq!(s.replicas(FnId::of(&payload("a"))), 4);
}

/// A backlog that the replicas finish sooner than a node is programmed is
/// not spread onto spare nodes.
#[test]
fn a_short_backlog_is_not_spread() {
    let mut s = fair_sched();
    s.add_node(1, ms(0));
    s.add_node(2, ms(0));
    configure(&mut s, 10, "a", ms(0), ms(1));
    // Node 2 takes 20 ms to program.
    configure(&mut s, 11, "b", ms(0), ms(20));
    s.take_actions();
    s.user_gone(11, ms(21));
    s.take_actions();
    // Three queued inputs of the 1 ms prior: 3 ms of work, under 20 ms.
    for id in 0..4 {
        s.submit(job(10, id), ms(22));
    }
    assert!(configures(&s.take_actions()).is_empty());
    // Twenty-three are worth the spare node.
    for id in 4..24 {
        s.submit(job(10, id), ms(22));
    }
    assert_eq!(configures(&s.take_actions()).len(), 1);
}

/// Algorithm 1 lends the only replica of a function someone uses only once
/// it has been idle a whole period (its user may be between two calls).
#[test]
fn the_only_replica_of_a_used_function_is_lent_after_an_idle_period() {
    let mut s = sched();
    s.add_node(1, ms(0));
    s.add_node(2, ms(0));
    configure(&mut s, 10, "hot", ms(0), ms(1));
    configure(&mut s, 11, "cold", ms(0), ms(1));
    s.submit(job(10, 0), ms(2));
    s.submit(job(11, 0), ms(2));
    let sent = sends(&s.take_actions());
    answer(&mut s, &sent, ms(3));
    for id in 1..200 {
        s.submit(job(10, id), ms(3));
    }
    s.take_actions();
    s.tick(ms(10));
    assert!(
        configures(&s.take_actions()).is_empty(),
        "\"cold\" was busy 7 ms ago"
    );
    s.tick(ms(20));
    let c = configures(&s.take_actions());
    assert_eq!(c.len(), 1, "idle for a period: it replicates \"hot\"");
    assert_eq!(c[0].1, payload("hot"));
}

#[test]
fn a_result_of_another_length_is_taken_only_from_a_node_that_agreed_any_length() {
    let mut s = sched();
    s.add_node(1, ms(0));
    configure(&mut s, 10, "a", ms(0), ms(1));
    s.take_actions();
    s.submit(job(10, 7), ms(2));
    let sent = sends(&s.take_actions());
    let (node, internal) = sent[0];
    // Without the feature: a breach, and the job stays in flight (it is
    // re-dispatched when the node's close is reported).
    let why = s
        .on_result(node, internal, Bytes::from_static(b"abc"), false, ms(3))
        .unwrap_err();
    assert!(
        why.contains("result of 3 bytes") && why.contains("expected 8"),
        "{why}"
    );
    assert!(results(&s.take_actions()).is_empty());
    // With it: the bytes go to the user as they are, with the job's count.
    s.on_result(node, internal, Bytes::from_static(b"abc"), true, ms(4))
        .unwrap();
    let a = s.take_actions();
    let got: Vec<_> = a
        .iter()
        .filter_map(|a| match a {
            Action::Result {
                user,
                id,
                data,
                count,
                ..
            } => Some((*user, *id, data.clone(), *count)),
            _ => None,
        })
        .collect();
    assert_eq!(got, [(10, 7, Bytes::from_static(b"abc"), 1)]);
}

/// A function below its fair share takes a busy node of one above it only
/// when that node, drained and programmed, would come before the queue is
/// done anyway: a short backlog leaves the other function's node at work.
#[test]
fn a_busy_node_is_drained_for_a_backlog_only_if_it_would_come_in_time() {
    // (jobs of "b", inputs per job, nodes "b" takes from "a")
    // Answers "a"'s jobs (10 inputs of 8 bytes out each).
    let answer_a = |s: &mut Sched, sent: &[(u64, u32)], now: Duration| {
        let mut out = Vec::new();
        for &(node, internal) in sent {
            s.on_result(node, internal, Bytes::from(vec![1; 80]), false, now)
                .unwrap();
            out.extend(s.take_actions());
        }
        out
    };
    for (jobs, inputs, moved) in [(2, 2, 0), (4, 50, 1)] {
        let mut s = fair_sched_with_a(4);
        s.take_actions();
        // "a" keeps its four nodes busy with a backlog of its own: jobs
        // of 10 inputs, measured at 2 ms each.
        for id in 0..40 {
            s.submit(Job::new(1, id, Bytes::from_static(&[0; 8]), 10), ms(1));
        }
        let mut busy = sends(&s.take_actions());
        assert_eq!(busy.len(), 4);
        // "b" has no replica: the node idle first is drained for it.
        s.configure(2, payload("b"), 8, 8, ms(2));
        s.take_actions();
        let mut b_nodes = Vec::new();
        let mut now = 2;
        while b_nodes.is_empty() {
            now += 1;
            let a = answer_a(&mut s, &busy, ms(now));
            busy = sends(&a);
            for (n, _) in configures(&a) {
                s.on_config_response(n, true, ms(now)).unwrap();
                b_nodes.push(n);
            }
        }
        busy.extend(sends(&s.take_actions()));
        // Its backlog: one job at the node, the rest waiting (1 ms of
        // work per input before it is measured). Two inputs waiting take
        // longer than programming a node (1 ms) but not than draining one
        // of "a"'s first (2 ms): that node stays with "a".
        for id in 0..jobs {
            s.submit(
                Job::new(2, id, Bytes::from_static(&[0; 8]), inputs),
                ms(now),
            );
        }
        s.take_actions();
        let draining = s
            .nodes
            .values()
            .filter(|n| matches!(n.state, SlotState::Draining { .. }))
            .count();
        assert_eq!(draining, moved, "{jobs} jobs of {inputs} input(s)");
    }
}

#[test]
fn a_function_that_comes_back_keeps_counting_its_reconfigurations() {
    let mut s = sched();
    s.add_node(1, ms(0));
    let count = |s: &Sched, name: &str| {
        let id = FnId::of(&payload(name)).short();
        let v = s.view();
        v.functions
            .iter()
            .find(|f| f.id == id)
            .map(|f| f.reconfigurations)
    };
    configure(&mut s, 10, "a", ms(0), ms(1));
    assert_eq!(count(&s, "a"), Some(1));
    // The node goes to "b": "a" is neither wanted nor held, so forgotten.
    configure(&mut s, 10, "b", ms(2), ms(1));
    assert_eq!((count(&s, "a"), count(&s, "b")), (None, Some(1)));
    // Back to "a": its count goes on from where it was.
    configure(&mut s, 10, "a", ms(4), ms(1));
    assert_eq!(count(&s, "a"), Some(2));
}

/// The first replica of a function being loaded on several nodes answers
/// its users first: it must not queue a job that a replica still loading
/// would start sooner (exclusive mode answers once all are loaded, and its
/// jobs start side by side), unless the queue is longer than they take.
#[test]
fn a_busy_replica_leaves_a_short_queue_to_replicas_about_to_load() {
    let long = |id| Job::new(1, id, Bytes::from_static(&[0; 80]), 10); // 10 ms each
    for (jobs, first_takes) in [(3, 1), (5, 2)] {
        // Two messages in flight per replica.
        let mut s = Sched::new(Params {
            credit: 2,
            ..fair_sched().p
        });
        for n in 1..=3 {
            s.add_node(n, ms(0));
        }
        s.configure(1, payload("a"), 8, 8, ms(0));
        let loading: Vec<u64> = configures(&s.take_actions()).iter().map(|c| c.0).collect();
        assert_eq!(loading.len(), 3);
        // One replica is ready early; the others are due at 10 ms (one
        // period, unmeasured), before its first job is done (15 ms).
        s.on_config_response(loading[0], true, ms(5)).unwrap();
        assert_eq!(answers(&s.take_actions()), vec![(1, true)]);
        for id in 0..jobs {
            s.submit(long(id), ms(5));
        }
        let sent = sends(&s.take_actions());
        assert_eq!(sent.len(), first_takes, "{jobs} jobs: {sent:?}");
        assert!(sent.iter().all(|&(n, _)| n == loading[0]));
        // The others load and take what waits.
        let mut later = Vec::new();
        for &n in &loading[1..] {
            s.on_config_response(n, true, ms(10)).unwrap();
            later.extend(sends(&s.take_actions()));
        }
        let nodes: std::collections::BTreeSet<u64> = later.iter().map(|s| s.0).collect();
        assert_eq!(later.len() as u32, jobs - first_takes as u32, "{later:?}");
        assert_eq!(nodes.len(), 2, "{later:?}");
    }
}

/// Jobs failed with their reasons: (user, id, reason).
fn failures(a: &[Action]) -> Vec<(u64, u32, String)> {
    a.iter()
        .filter_map(|a| match a {
            Action::Failed {
                user, id, reason, ..
            } => Some((*user, *id, reason.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn queued_work_fails_once_no_connected_node_can_load_its_function() {
    // Node 1 holds the function; node 2 refuses it. Node 1 is lost with
    // work queued: that work fails with the refusal instead of waiting.
    let mut s = sched();
    s.add_node(1, ms(0));
    s.configure(10, payload("x"), 8, 8, ms(0));
    for (n, _) in configures(&s.take_actions()) {
        s.on_config_response(n, true, ms(1)).unwrap();
    }
    s.add_node(2, ms(1));
    // A backlog worth a second replica.
    for i in 0..50 {
        s.submit(job(10, i), ms(2));
    }
    let a = s.take_actions();
    assert_eq!(configures(&a).iter().map(|c| c.0).collect::<Vec<_>>(), [2]);
    s.on_config_response(2, false, ms(3)).unwrap();
    s.take_actions();
    s.remove_node(1, ms(4));
    let a = s.take_actions();
    let failed = failures(&a);
    assert_eq!(
        failed.iter().map(|f| f.1).collect::<Vec<_>>(),
        (0..50).collect::<Vec<_>>(),
        "every job, in flight or queued, fails once"
    );
    assert!(failed[0].2.contains("refused"), "{}", failed[0].2);
    assert!(configures(&a).is_empty());
    // Later data of the same user fails the same way, at once.
    s.submit(job(10, 9), ms(5));
    assert_eq!(failures(&s.take_actions()).len(), 1);
}

#[test]
fn a_function_that_loses_every_node_loading_it_is_not_loaded_again() {
    let mut s = sched();
    s.add_node(1, ms(0));
    s.configure(10, payload("x"), 8, 8, ms(0));
    for (n, _) in configures(&s.take_actions()) {
        s.on_config_response(n, true, ms(1)).unwrap();
    }
    for i in 0..5 {
        s.submit(job(10, i), ms(2));
    }
    s.take_actions();
    s.remove_node(1, ms(3));
    s.take_actions();
    let (mut loads, mut failed) = (0, 0);
    for k in 0..10u64 {
        let node = 100 + k;
        s.add_node(node, ms(10 + k * 10));
        loads += configures(&s.take_actions()).len();
        // The node dies while loading it.
        s.remove_node(node, ms(15 + k * 10));
        failed += failures(&s.take_actions()).len();
        s.tick(ms(19 + k * 10));
        failed += failures(&s.take_actions()).len();
    }
    assert_eq!(loads, route::MAX_LOST_LOADS as usize);
    assert_eq!(failed, 5, "the queued jobs fail once it is given up");
}
