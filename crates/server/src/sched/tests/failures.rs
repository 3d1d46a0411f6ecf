//! Functions no node can load: negative responses, loads given up, queued
//! work failed with the reasons.

use super::*;

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

#[test]
fn a_user_with_other_servers_is_released_at_once_when_the_last_node_leaves() {
    // Users 10 and 11 share node 1; only 10 agreed `moves-on`. Node 1 is
    // lost with work of both in flight and queued: 10's fails at once with
    // `no-nodes` (it resumes on a server that has nodes), 11's waits
    // `node_wait` for a node as before.
    let mut s = sched();
    s.add_node(1, ms(0));
    s.set_moves_on(10, true);
    configure(&mut s, 10, "x", ms(0), ms(1));
    configure(&mut s, 11, "x", ms(1), ms(1));
    for i in 0..20 {
        s.submit(job(10, i), ms(2));
        s.submit(job(11, i), ms(2));
    }
    assert!(!sends(&s.take_actions()).is_empty());
    s.remove_node(1, ms(3));
    let a = s.take_actions();
    let failed = failures(&a);
    assert_eq!(
        failed.iter().map(|f| (f.0, f.1)).collect::<Vec<_>>(),
        (0..20).map(|i| (10, i)).collect::<Vec<_>>(),
        "every job of the mover, in flight or queued, fails once: {a:?}"
    );
    let codes: Vec<_> = a
        .iter()
        .filter_map(|a| match a {
            Action::Failed { code, .. } => Some(*code),
            _ => None,
        })
        .collect();
    assert!(codes.iter().all(|&c| c == ErrorCode::NoNodes), "{codes:?}");
    // Its next message, sent before it learnt, fails the same way.
    s.submit(job(10, 20), ms(4));
    assert_eq!(failures(&s.take_actions()).len(), 1);
    // The other user's work is still there for a node that connects.
    s.tick(ms(1000));
    assert!(failures(&s.take_actions()).is_empty());
    s.add_node(2, ms(1001));
    let a = s.take_actions();
    let n = configures(&a)
        .first()
        .map(|c| c.0)
        .expect("node 2 loads it");
    s.on_config_response(n, true, ms(1002)).unwrap();
    let sent = sends(&s.take_actions());
    let done = results(&answer(&mut s, &sent, ms(1003)));
    assert!(
        !done.is_empty() && done.iter().all(|r| r.0 == 11),
        "{done:?}"
    );
}

#[test]
fn a_configuration_loading_on_the_last_node_waits_for_another_even_for_a_mover() {
    // Both users' configurations wait for node 1 to load their function;
    // node 1 dies first. Neither is refused before `node_wait`: a refused
    // first configuration fails the session (a client moves on from a
    // `no-nodes` answer only), and a killed node is usually back sooner.
    let mut s = sched();
    s.add_node(1, ms(0));
    s.set_moves_on(10, true);
    s.configure(10, payload("x"), 8, 8, ms(0));
    s.configure(11, payload("x"), 8, 8, ms(0));
    assert_eq!(configures(&s.take_actions()).len(), 1);
    s.remove_node(1, ms(1));
    s.tick(ms(1000));
    assert!(answers(&s.take_actions()).is_empty());
    // A node that comes back within the wait loads it for both.
    s.add_node(2, ms(1001));
    let n = configures(&s.take_actions()).first().map(|c| c.0);
    assert_eq!(n, Some(2));
    s.on_config_response(2, true, ms(1002)).unwrap();
    let mut a = answers(&s.take_actions());
    a.sort_unstable();
    assert_eq!(a, [(10, true), (11, true)]);
}
