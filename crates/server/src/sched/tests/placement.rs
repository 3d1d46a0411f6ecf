//! Placement outside the period: spare nodes, fair shares, spreading a
//! backlog, draining a busy node only when it would come in time.

use super::*;

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
/// takes its share at once from the idle nodes of one holding more than
/// its share, and its backlog does not grow it beyond.
#[test]
fn a_function_takes_its_users_share_from_one_holding_more_at_once() {
    let mut s = fair_sched_with_a(6);
    s.configure(2, payload("a"), 8, 8, ms(2));
    s.take_actions();
    // Two of the three users use "a": its share is 4 of the 6 nodes.
    s.configure(3, payload("b"), 8, 8, ms(3));
    let c = configures(&s.take_actions());
    assert_eq!(c.len(), 2, "two idle nodes of \"a\" load \"b\" at once");
    assert!(c.iter().all(|c| c.1 == payload("b")));
    for (n, _) in &c {
        s.on_config_response(*n, true, ms(4)).unwrap();
    }
    assert_eq!(answers(&s.take_actions()), [(3, true)]);
    // A backlog of "b" (jobs longer than a reprogramming) takes no more.
    for id in 0..10 {
        s.submit(Job::new(3, id, Bytes::from_static(&[0; 8]), 50), ms(5));
    }
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

/// Two messages in flight per node (fixed), nodes 1..=`nodes` holding "a"
/// (user 1's), optionally with the default hedge rule.
fn limited(nodes: u64, hedge: Option<crate::dispatch::progress::Hedge>) -> Sched {
    let mut s = Sched::new(Params {
        credit: 2,
        fair_share: true,
        hedge,
        ..sched().p
    });
    for n in 1..=nodes {
        s.add_node(n, ms(0));
    }
    s.configure(1, payload("a"), 8, 8, ms(0));
    for (n, _) in configures(&s.take_actions()) {
        s.on_config_response(n, true, ms(1)).unwrap();
    }
    s.take_actions();
    s
}

/// A tenant at its `max_nodes` is served by a node it already uses when
/// that one has room, although the dispatch policy's pick (the least
/// loaded replica) is another: it does not wait for the next event.
#[test]
fn a_tenant_at_its_limit_is_served_by_a_node_it_already_uses() {
    let mut s = limited(2, None);
    s.set_max_nodes(2, Some(1));
    s.configure(2, payload("a"), 8, 8, ms(2));
    s.take_actions();
    s.submit(job(2, 0), ms(3));
    let first = sends(&s.take_actions());
    assert_eq!(first.len(), 1);
    let own = first[0].0;
    // The other node is idle, so the policy picks it; the job goes to
    // the tenant's own, which has room for a second.
    s.submit(job(2, 1), ms(3));
    let second = sends(&s.take_actions());
    assert_eq!(second.len(), 1, "the second job waited");
    assert_eq!(second[0].0, own);
    // A third finds its node full: it waits for it, not for the other.
    s.submit(job(2, 2), ms(3));
    assert!(sends(&s.take_actions()).is_empty());
    let next = sends(&answer(&mut s, &first, ms(4)));
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].0, own);
}

/// A late job's copy counts against its tenant's `max_nodes` as the job
/// does: it goes to a node the tenant already uses, never to a third.
#[test]
fn a_hedged_copy_stays_on_the_nodes_its_tenant_may_use() {
    let mut s = limited(3, crate::dispatch::progress::Hedge::new(4.0, ms(50)));
    // "a" measured at 2 ms per input.
    s.submit(job(1, 100), ms(10));
    let sent = sends(&s.take_actions());
    answer(&mut s, &sent, ms(12));
    s.set_max_nodes(2, Some(2));
    s.configure(2, payload("a"), 8, 8, ms(12));
    s.take_actions();
    s.submit(job(2, 0), ms(20));
    s.submit(job(2, 1), ms(20));
    let own: std::collections::BTreeSet<u64> =
        sends(&s.take_actions()).iter().map(|&(n, _)| n).collect();
    assert_eq!(own.len(), 2, "its two jobs on two nodes: {own:?}");
    // Both are late at the 50 ms floor; the third node is idle.
    s.check_progress(ms(80));
    let to: Vec<u64> = hedges(&s.take_actions());
    assert!(!to.is_empty(), "a late job is copied");
    assert!(
        to.iter().all(|n| own.contains(n)),
        "copies to {to:?}, own {own:?}"
    );
}

fn hedges(a: &[Action]) -> Vec<u64> {
    a.iter()
        .filter_map(|a| match a {
            Action::Hedged { to, .. } => Some(*to),
            _ => None,
        })
        .collect()
}
