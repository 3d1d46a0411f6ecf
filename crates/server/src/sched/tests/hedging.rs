//! Hung nodes: a late job gets one copy on another replica, the first
//! answer wins and the late one is dropped and counted; a node without
//! progress takes no new work until it answers; copies stay within their
//! budget; work that is not safe to run twice is never copied.

use super::*;
use crate::dispatch::progress::Hedge;

/// [`sched`] with the default hedge rule (4 × service, 50 ms floor),
/// `credit` messages per node, one function "a" on nodes 1..=`nodes`
/// (loaded by 1 ms), user 1 configured for it.
fn hedging(nodes: u64, credit: u32) -> Sched {
    let mut s = Sched::new(Params {
        credit,
        fair_share: true,
        hedge: Hedge::new(4.0, ms(50)),
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

/// Measures the function: one job answered 2 ms after it was sent at 10 ms.
fn measure(s: &mut Sched, id: u32, took: Duration) {
    s.submit(job(1, id), ms(10));
    let sent = sends(&s.take_actions());
    assert_eq!(sent.len(), 1);
    answer(s, &sent, ms(10) + took);
}

fn hedged(a: &[Action]) -> Vec<(u64, u64)> {
    a.iter()
        .filter_map(|a| match a {
            Action::Hedged { from, to } => Some((*from, *to)),
            _ => None,
        })
        .collect()
}

fn duplicates(a: &[Action]) -> usize {
    a.iter()
        .filter(|a| matches!(a, Action::Duplicate { .. }))
        .count()
}

fn stalls(a: &[Action]) -> Vec<(u64, bool)> {
    a.iter()
        .filter_map(|a| match a {
            Action::Stalled { node, stalled } => Some((*node, *stalled)),
            _ => None,
        })
        .collect()
}

/// The other of nodes 1 and 2.
fn other(n: u64) -> u64 {
    3 - n
}

#[test]
fn a_late_job_is_copied_at_the_bound_and_the_first_answer_wins() {
    let mut s = hedging(2, 2);
    measure(&mut s, 100, ms(2));
    s.submit(job(1, 101), ms(20));
    let sent = sends(&s.take_actions());
    let (hung, internal) = sent[0];
    let ok = other(hung);
    // 2 ms of service: the bound is the 50 ms floor, from the send, and
    // the copy goes two services (4 ms) before it.
    s.check_progress(ms(21));
    assert!(sends(&s.take_actions()).is_empty());
    assert_eq!(s.next_progress_check(), Some(ms(66)));
    s.check_progress(ms(65));
    assert!(sends(&s.take_actions()).is_empty(), "not late before 66 ms");
    s.check_progress(ms(66));
    let a = s.take_actions();
    assert_eq!(hedged(&a), [(hung, ok)]);
    let copy = sends(&a);
    assert_eq!(copy.len(), 1);
    assert_eq!(copy[0].0, ok);
    // The copy answers first: its result goes to the user, once.
    let a = answer(&mut s, &copy, ms(73));
    assert_eq!(results(&a), [(1, 101)]);
    // The hung node's answer comes later: dropped and counted, no breach.
    let a = answer(&mut s, &[(hung, internal)], ms(400));
    assert!(results(&a).is_empty(), "{a:?}");
    assert_eq!(duplicates(&a), 1);
    assert!(hedged(&a).is_empty());
}

#[test]
fn a_stalled_node_takes_no_new_work_until_it_answers() {
    let mut s = hedging(2, 2);
    measure(&mut s, 100, ms(2));
    s.submit(job(1, 101), ms(20));
    let (hung, internal) = sends(&s.take_actions())[0];
    let ok = other(hung);
    s.check_progress(ms(70));
    let copy = sends(&s.take_actions());
    answer(&mut s, &copy, ms(72));
    // Stalled at 20 ms + max(2 × 50 ms, 200 ms).
    s.check_progress(ms(219));
    assert!(stalls(&s.take_actions()).is_empty());
    s.check_progress(ms(220));
    assert_eq!(stalls(&s.take_actions()), [(hung, true)]);
    // Its window has room (one of two), yet both new jobs go to the other.
    s.submit(job(1, 102), ms(230));
    s.submit(job(1, 103), ms(230));
    let sent = sends(&s.take_actions());
    assert_eq!(sent.iter().map(|x| x.0).collect::<Vec<_>>(), [ok, ok]);
    answer(&mut s, &sent, ms(232));
    // It answers (the duplicate): it takes work again, with its window.
    let a = answer(&mut s, &[(hung, internal)], ms(300));
    assert_eq!(stalls(&a), [(hung, false)]);
    s.submit(job(1, 104), ms(301));
    s.submit(job(1, 105), ms(301));
    let sent = sends(&s.take_actions());
    assert!(sent.iter().any(|x| x.0 == hung), "{sent:?}");
}

#[test]
fn no_copy_below_the_bound_nor_before_a_measure() {
    // Never measured: nothing to compare with, nothing is copied.
    let mut s = hedging(2, 2);
    s.submit(job(1, 1), ms(10));
    s.take_actions();
    s.check_progress(ms(10_000));
    assert!(sends(&s.take_actions()).is_empty());

    // 20 ms per input: the bound is 80 ms (4 ×, above the 50 ms floor),
    // so late after 40 ms (the bound less two services), not 30 ms.
    let mut s = hedging(2, 2);
    measure(&mut s, 100, ms(20));
    s.submit(job(1, 101), ms(40));
    s.take_actions();
    let at = s.next_progress_check().expect("armed");
    s.check_progress(at);
    assert!(sends(&s.take_actions()).is_empty(), "{at:?}");
    assert_eq!(s.next_progress_check(), Some(ms(80)));
    s.check_progress(ms(79));
    assert!(sends(&s.take_actions()).is_empty());
    s.check_progress(ms(80));
    assert_eq!(hedged(&s.take_actions()).len(), 1);
}

#[test]
fn copies_in_flight_stay_within_one_nodes_window() {
    let mut s = hedging(4, 2);
    measure(&mut s, 100, ms(2));
    for id in 0..8 {
        s.submit(job(1, id), ms(20));
    }
    let sent = sends(&s.take_actions());
    assert_eq!(sent.len(), 8);
    // Two nodes answer theirs; the other two hang with two jobs each.
    let mut nodes: Vec<u64> = sent.iter().map(|x| x.0).collect();
    nodes.sort_unstable();
    nodes.dedup();
    let (healthy, hung) = nodes.split_at(2);
    let done: Vec<(u64, u32)> = sent
        .iter()
        .copied()
        .filter(|x| healthy.contains(&x.0))
        .collect();
    answer(&mut s, &done, ms(22));
    // Four jobs late, room for four: the budget (a window, 2) sends two.
    s.check_progress(ms(70));
    let a = s.take_actions();
    let h = hedged(&a);
    assert_eq!(h.len(), 2, "{h:?}");
    assert!(h
        .iter()
        .all(|(f, t)| hung.contains(f) && healthy.contains(t)));
    // No job gets a third copy, however long it waits.
    s.check_progress(ms(1000));
    assert!(hedged(&s.take_actions()).is_empty());
    // One copy answered: the pair leaves the budget, the next copy goes.
    let copies = sends(&a);
    let a = answer(&mut s, &copies[..1], ms(1001));
    assert_eq!(hedged(&a).len(), 1, "{a:?}");
}

#[test]
fn a_lost_node_s_hedged_job_is_not_sent_a_third_time() {
    let mut s = hedging(2, 2);
    measure(&mut s, 100, ms(2));
    s.submit(job(1, 101), ms(20));
    let (hung, _) = sends(&s.take_actions())[0];
    s.check_progress(ms(70));
    let copy = sends(&s.take_actions());
    // --node-timeout closes the hung node: its job is not queued again,
    // the copy on the other node carries it.
    s.remove_node(hung, ms(80));
    assert!(sends(&s.take_actions()).is_empty());
    assert_eq!(results(&answer(&mut s, &copy, ms(81))), [(1, 101)]);
}

#[test]
fn handler_work_is_not_copied_and_nodes_promised_to_groups_take_no_copy() {
    // An image with streaming handler sets: its node may stall, its work
    // is not run twice.
    let manifest = br#"{"name":"h","handler_sets":[{"name":"sum"}]}"#;
    let mut image = b"CFIMAGE\0".to_vec();
    image.extend_from_slice(&1u32.to_le_bytes());
    image.extend_from_slice(&(manifest.len() as u32).to_le_bytes());
    image.extend_from_slice(manifest);
    let cfg = corefarm_smp::Configuration {
        input_size: 8,
        output_size: 8,
        cores: vec![],
        bitstream: Bytes::from(image),
    };
    let mut s = Sched::new(Params {
        credit: 2,
        hedge: Hedge::new(4.0, ms(50)),
        ..sched().p
    });
    s.add_node(1, ms(0));
    s.add_node(2, ms(0));
    s.configure(1, Bytes::from(cfg.encode_payload()), 8, 8, ms(0));
    let c = configures(&s.take_actions());
    assert_eq!(c.len(), 1);
    s.on_config_response(c[0].0, true, ms(1)).unwrap();
    s.take_actions();
    s.submit(job(1, 1), ms(2));
    s.take_actions();
    // A second replica: where a copy could go.
    s.tick(ms(10));
    for (n, _) in configures(&s.take_actions()) {
        s.on_config_response(n, true, ms(11)).unwrap();
    }
    s.take_actions();
    s.submit(job(1, 2), ms(12));
    let sent = sends(&s.take_actions());
    answer(&mut s, &sent, ms(14));
    s.check_progress(ms(5000));
    let a = s.take_actions();
    assert!(hedged(&a).is_empty(), "{a:?}");
    assert_eq!(stalls(&a), [(c[0].0, true)]);

    // A hedgeable function, its only other node promised to a group.
    let mut s = hedging(2, 2);
    measure(&mut s, 100, ms(2));
    s.submit(job(1, 101), ms(20));
    let (hung, _) = sends(&s.take_actions())[0];
    assert!(s.lend(&[other(hung)], 1, ms(21)));
    s.take_actions();
    s.check_progress(ms(70));
    let a = s.take_actions();
    assert!(hedged(&a).is_empty() && sends(&a).is_empty(), "{a:?}");
}
