//! Nodes lent to groups: idle ones at once, busy ones once their work is
//! done.

use super::*;

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
