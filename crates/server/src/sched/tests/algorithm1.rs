//! Algorithm 1: replication weighed against the cost of reprogramming, no
//! thrashing, functions without a replica, time slicing, lending the only
//! replica.

use super::*;

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

#[test]
fn under_contention_a_heavier_users_function_gets_more_replicas() {
    // Four nodes, no fair share: Algorithm 1 alone moves replicas. "c"
    // (user 12) was spread over all four and is done; then user 10
    // (weight 1) asks for "a" and user 11 (weight 3) for "b", with the
    // same backlog. At the period's end each takes one of "c"'s idle
    // nodes (functions without a replica first), and "c"'s last two go to
    // "b", whose claim (ρ × weight) is the heavier before and after one
    // replica more. Without weights they would split two and two.
    let mut s = sched();
    for n in 1..=4 {
        s.add_node(n, ms(0));
    }
    s.set_weight(10, 1);
    s.set_weight(11, 3);
    configure(&mut s, 12, "c", ms(0), ms(1));
    for id in 0..40 {
        s.submit(job(12, id), ms(2));
    }
    // Each millisecond: programmings asked for the millisecond before are
    // done, every job sent takes 1 ms, and periods end every 10 ms.
    let step = |s: &mut Sched, now: u64, sent: &mut Vec<(u64, u32)>, loading: &mut Vec<u64>| {
        let a = s.take_actions();
        sent.extend(sends(&a));
        for n in loading.drain(..) {
            s.on_config_response(n, true, ms(now)).unwrap();
            sent.extend(sends(&s.take_actions()));
        }
        loading.extend(configures(&a).into_iter().map(|c| c.0));
        let batch = std::mem::take(sent);
        let a = answer(s, &batch, ms(now));
        sent.extend(sends(&a));
        loading.extend(configures(&a).into_iter().map(|c| c.0));
        if now.is_multiple_of(10) {
            s.tick(ms(now));
        }
    };
    let (mut sent, mut loading) = (Vec::new(), Vec::new());
    for now in 3..=40 {
        step(&mut s, now, &mut sent, &mut loading);
    }
    let c = FnId::of(&payload("c"));
    assert_eq!(s.replicas(c), 4);
    s.configure(10, payload("a"), 8, 8, ms(40));
    s.configure(11, payload("b"), 8, 8, ms(40));
    for id in 0..400 {
        s.submit(job(10, id), ms(40));
        s.submit(job(11, id), ms(40));
    }
    for now in 41..=60 {
        step(&mut s, now, &mut sent, &mut loading);
    }
    let (a, b) = (FnId::of(&payload("a")), FnId::of(&payload("b")));
    assert_eq!((s.replicas(a), s.replicas(b), s.replicas(c)), (1, 3, 0));
}
