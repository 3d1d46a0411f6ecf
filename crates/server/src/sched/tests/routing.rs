//! Routing: replicas shared by users of one payload, fairness between
//! users, re-dispatch of a lost replica's work, departed users, result
//! lengths, and dispatch beside replicas still loading.

use super::*;

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
    assert_eq!(
        why,
        crate::sched::NodeBreach::WrongLength {
            len: 3,
            count: 1,
            expect: 8
        }
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

#[test]
fn max_nodes_keeps_a_tenants_work_on_that_many_nodes_at_once() {
    // Three nodes hold "a". Bob (max_nodes = 1) has two sessions on it:
    // however many jobs they queue, they run on one node at a time; carol,
    // without a limit, takes the others meanwhile.
    let mut s = fair_sched_with_a(3);
    s.take_actions();
    for user in [10, 11] {
        s.set_tenant(user, Some("bob"), 1);
        s.set_max_nodes(user, Some(1));
        s.configure(user, payload("a"), 8, 8, ms(2));
    }
    s.take_actions();
    for id in 0..6 {
        s.submit(job(10, id), ms(3));
        s.submit(job(11, 100 + id), ms(3));
    }
    let sent = sends(&s.take_actions());
    let bobs: std::collections::BTreeSet<u64> = sent.iter().map(|&(n, _)| n).collect();
    assert_eq!(bobs.len(), 1, "bob's work on {bobs:?}: {sent:?}");
    s.set_tenant(12, Some("carol"), 1);
    s.configure(12, payload("a"), 8, 8, ms(4));
    s.take_actions();
    for id in 0..6 {
        s.submit(job(12, 200 + id), ms(4));
    }
    let carol: std::collections::BTreeSet<u64> =
        sends(&s.take_actions()).iter().map(|&(n, _)| n).collect();
    assert_eq!(carol.len(), 2, "carol's work on {carol:?}");
    assert!(carol.is_disjoint(&bobs));
    // As bob's node answers, bob's next jobs follow on it, and only there.
    let a = answer(&mut s, &sent, ms(5));
    let next: Vec<(u64, u32)> = sends(&a);
    assert!(
        !next.is_empty() && next.iter().all(|(n, _)| bobs.contains(n)),
        "{next:?}"
    );
}
