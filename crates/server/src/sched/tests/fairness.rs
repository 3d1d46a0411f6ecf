//! Weights: backlogged users share node time in the ratio of their
//! tenants' weights, within one function's queue and across functions.

use super::*;

/// A fake cluster: every job takes `service` on its node, every
/// programming 1 ms; every user keeps `BACKLOG` jobs queued; node time
/// is credited to a job's user when its result comes.
struct Sim {
    s: Sched,
    now: Duration,
    service: Duration,
    /// (when, node, internal id of a job, or `None` for a programming).
    due: Vec<(Duration, u64, Option<u32>)>,
    /// Node time by user, and since when each user is measured.
    took: HashMap<u64, Duration>,
    next_id: u32,
}

const BACKLOG: usize = 16;

impl Sim {
    fn new(nodes: u64, service: Duration) -> Sim {
        let mut s = fair_sched();
        for n in 1..=nodes {
            s.add_node(n, ms(0));
        }
        let mut sim = Sim {
            s,
            now: ms(0),
            service,
            due: Vec::new(),
            took: HashMap::new(),
            next_id: 0,
        };
        sim.absorb();
        sim
    }

    /// A user of `weight` joins, configures `function` and fills its backlog.
    fn join(&mut self, user: u64, weight: u32, function: &str) {
        self.join_as(user, None, weight, function);
    }

    /// [`Sim::join`] for a session `user` of the tenant `tenant`.
    fn join_as(&mut self, user: u64, tenant: Option<&str>, weight: u32, function: &str) {
        self.s.user_joined(user);
        self.s.set_tenant(user, tenant, weight);
        self.s.configure(user, payload(function), 8, 8, self.now);
        for _ in 0..BACKLOG {
            self.submit(user);
        }
        self.absorb();
    }

    fn submit(&mut self, user: u64) {
        self.next_id += 1;
        self.s.submit(job(user, self.next_id), self.now);
    }

    /// Acts on what the scheduler decided: sends finish after `service`,
    /// programmings after 1 ms; a result credits its user and is replaced
    /// by a new job.
    fn absorb(&mut self) {
        loop {
            let actions = self.s.take_actions();
            if actions.is_empty() {
                return;
            }
            for a in actions {
                match a {
                    Action::Send { node, internal, .. } => {
                        self.due
                            .push((self.now + self.service, node, Some(internal)))
                    }
                    Action::Configure { node, .. } => self.due.push((self.now + ms(1), node, None)),
                    Action::Result { user, .. } => {
                        *self.took.entry(user).or_default() += self.service;
                        self.submit(user);
                    }
                    _ => {}
                }
            }
        }
    }

    /// Runs until `until`, ticking every millisecond.
    fn run(&mut self, until: Duration) {
        while self.now < until {
            let next_tick = self.now + ms(1);
            self.due.sort();
            while let Some(&(t, node, what)) = self.due.first() {
                if t > next_tick {
                    break;
                }
                self.due.remove(0);
                self.now = t;
                match what {
                    Some(internal) => {
                        let data = Bytes::from_static(&[1; 8]);
                        self.s.on_result(node, internal, data, false, t).unwrap();
                    }
                    None => self.s.on_config_response(node, true, t).unwrap(),
                }
                self.absorb();
                self.due.sort();
            }
            self.now = next_tick;
            self.s.tick(self.now);
            self.absorb();
        }
    }

    fn took(&self, user: u64) -> f64 {
        self.took
            .get(&user)
            .copied()
            .unwrap_or_default()
            .as_secs_f64()
    }
}

/// Within ±10 % of `want`.
fn near(got: f64, want: f64) -> bool {
    (got - want).abs() <= 0.1 * want
}

#[test]
fn weights_one_and_three_on_one_function_get_node_time_one_to_three() {
    let mut sim = Sim::new(2, ms(1));
    sim.join(1, 1, "a");
    sim.join(2, 3, "a");
    sim.run(Duration::from_secs(60));
    let (a, b) = (sim.took(1), sim.took(2));
    assert!(a + b > 100.0, "the two nodes worked {} s of 120", a + b);
    assert!(near(b / a, 3.0), "node time {a:.2} s : {b:.2} s");

    // A third user (weight 1) arrives: within a few monitoring periods
    // (10 ms each here) it gets its share, 1 of 1 + 3 + 1.
    sim.join(3, 1, "a");
    sim.run(sim.now + ms(30));
    let before: Vec<f64> = (1..=3).map(|u| sim.took(u)).collect();
    sim.run(sim.now + Duration::from_secs(10));
    let got: Vec<f64> = (1..=3)
        .map(|u| sim.took(u) - before[u as usize - 1])
        .collect();
    let all: f64 = got.iter().sum();
    for (u, w) in [(1, 1.0), (2, 3.0), (3, 1.0)] {
        let share = got[u - 1] / all;
        assert!(
            near(share, w / 5.0),
            "user {u}: {share:.3} of the node time, {got:?}"
        );
    }
}

#[test]
fn weights_divide_the_nodes_among_users_of_different_functions() {
    // Four nodes; user 1 (weight 1) computes "a", user 2 (weight 3) "b":
    // both backlogged, "b" holds three nodes' worth of time for each of "a"'s.
    let mut sim = Sim::new(4, ms(1));
    sim.join(1, 1, "a");
    sim.join(2, 3, "b");
    sim.run(Duration::from_secs(60));
    let (a, b) = (sim.took(1), sim.took(2));
    assert!(a + b > 200.0, "the four nodes worked {} s of 240", a + b);
    assert!(near(b / a, 3.0), "node time {a:.2} s : {b:.2} s");
}

#[test]
fn a_users_two_sessions_share_its_weight_within_a_queue() {
    // Sessions 1 and 2 are alice's, 3 is bob's, all on "a", all weight 1:
    // alice's two together get what bob's one gets.
    let mut sim = Sim::new(2, ms(1));
    sim.join_as(1, Some("alice"), 1, "a");
    sim.join_as(2, Some("alice"), 1, "a");
    sim.join_as(3, Some("bob"), 1, "a");
    sim.run(Duration::from_secs(10));
    let (alice, bob) = (sim.took(1) + sim.took(2), sim.took(3));
    assert!(
        near(alice / bob, 1.0),
        "node time {alice:.2} s : {bob:.2} s"
    );
    assert!(near(sim.took(1) / sim.took(2), 1.0));
}

#[test]
fn a_users_sessions_on_two_functions_share_its_weight_across_functions() {
    // Four nodes: alice (weight 1) computes "a" and "b" in two sessions,
    // bob (weight 1) "c": "c" is worth two nodes, "a" and "b" one each.
    let mut sim = Sim::new(4, ms(1));
    sim.join_as(1, Some("alice"), 1, "a");
    sim.join_as(2, Some("alice"), 1, "b");
    sim.join_as(3, Some("bob"), 1, "c");
    sim.run(Duration::from_secs(10));
    let (alice, bob) = (sim.took(1) + sim.took(2), sim.took(3));
    assert!(
        alice + bob > 30.0,
        "the four nodes worked {} s of 40",
        alice + bob
    );
    assert!(
        near(alice / bob, 1.0),
        "node time {alice:.2} s : {bob:.2} s"
    );
}

/// Four nodes programmed in `took`; users 1 ("a") and 2 ("b") configured
/// at 0 ms, two nodes each (their fair shares); each runs one job, answered
/// at 5 ms after the programming. Returns the scheduler and the time.
fn two_users_after_one_call(took: Duration) -> (Sched, Duration) {
    let mut s = fair_sched();
    for n in 1..=4 {
        s.add_node(n, ms(0));
    }
    for user in [1, 2] {
        s.user_joined(user);
        s.set_tenant(user, None, 1);
    }
    for (user, name) in [(1, "a"), (2, "b")] {
        s.configure(user, payload(name), 8, 8, ms(0));
    }
    let loading = configures(&s.take_actions());
    assert_eq!(loading.len(), 4, "two nodes each: {loading:?}");
    for (n, _) in loading {
        s.on_config_response(n, true, took).unwrap();
    }
    s.take_actions();
    s.submit(job(1, 0), took);
    s.submit(job(2, 0), took);
    let sent = sends(&s.take_actions());
    assert_eq!(sent.len(), 2);
    let now = took + ms(5);
    answer(&mut s, &sent, now);
    (s, now)
}

/// Ticks every millisecond from `from` to `to` (the driver ticks every
/// period; finer here so the test does not depend on where ticks fall).
fn tick_until(s: &mut Sched, from: Duration, to: Duration) {
    let mut t = from;
    while t < to {
        t += ms(1);
        s.tick(t);
    }
    s.take_actions();
}

/// A backlog of "a" (user 1): twenty 10-input jobs.
fn backlog(s: &mut Sched, now: Duration) -> Vec<(u64, Bytes)> {
    for id in 1..=20 {
        s.submit(Job::new(1, id, Bytes::from_static(&[0; 8]), 10), now);
    }
    configures(&s.take_actions())
}

/// Replicas of `name`, loaded or loading.
fn promised(s: &Sched, name: &str) -> usize {
    s.replicas_or_loading(FnId::of(&payload(name)))
}

/// The fair shares divide the nodes among the users with work: a user
/// idle for longer than its window (one monitoring period, 10 ms here,
/// where nodes program in 1 ms) counts no more, so a backlog of another
/// user's takes its idle nodes at once, down to the one replica an idle
/// function keeps; the idle user's next work takes its share back.
#[test]
fn an_idle_users_nodes_go_to_a_user_with_work() {
    let (mut s, now) = two_users_after_one_call(ms(1));
    tick_until(&mut s, now, now + ms(30));
    let now = now + ms(30);
    let moved = backlog(&mut s, now);
    assert_eq!(moved.len(), 1, "one of \"b\"'s two nodes: {moved:?}");
    assert_eq!(moved[0].1, payload("a"));
    assert_eq!((promised(&s, "a"), promised(&s, "b")), (3, 1));
    // "b"'s user is back: its function's share is two nodes again.
    s.on_config_response(moved[0].0, true, now + ms(1)).unwrap();
    s.take_actions();
    for id in 1..=20 {
        s.submit(
            Job::new(2, id, Bytes::from_static(&[0; 8]), 10),
            now + ms(2),
        );
    }
    s.take_actions();
    assert_eq!(promised(&s, "b"), 2, "a node of \"a\" drained for \"b\"");
}

/// A user that pauses for less than a node's programming time keeps its
/// share: moving its nodes away and back would cost two programmings. Its
/// window is the nodes' measured programming time (50 ms here), not the
/// period (10 ms).
#[test]
fn a_user_pausing_for_less_than_a_programming_keeps_its_share() {
    // (user 2's pause, "b"'s nodes that go to "a"'s backlog)
    for (pause, moved) in [(30, 0), (60, 1)] {
        let (mut s, now) = two_users_after_one_call(ms(50));
        tick_until(&mut s, now, now + ms(pause));
        let c = backlog(&mut s, now + ms(pause));
        assert_eq!(c.len(), moved, "user 2 paused {pause} ms: {c:?}");
        assert_eq!(promised(&s, "b"), 2 - moved);
    }
}

/// Algorithm 1 ranks functions by their active users' weights: an idle
/// weight-3 user's function gets no claim from its weight.
#[test]
fn a_function_of_idle_users_weighs_nothing_in_the_shares() {
    let (mut s, now) = two_users_after_one_call(ms(1));
    s.set_tenant(2, None, 3);
    let b = FnId::of(&payload("b"));
    let w = |s: &Sched| route::share_weight(s, &s.fns[&b]);
    assert_eq!(w(&s), 3 * u128::from(queue::WEIGHT_UNIT), "active");
    tick_until(&mut s, now, now + ms(30));
    assert_eq!(w(&s), 0, "idle past its window");
    s.submit(job(2, 7), now + ms(30));
    assert_eq!(w(&s), 3 * u128::from(queue::WEIGHT_UNIT), "active again");
}

/// A burst on a new function while the other users are off takes the
/// function's whole share at configure time: the spare nodes and the idle
/// nodes of functions holding more than their share, as exclusive mode
/// programs all of a user's nodes at once. Taking the spare nodes only
/// (or one drained node) left the rest to the queued work, so each call of
/// the burst waited for a second programming. With the other users active,
/// their functions hold their shares and keep them.
#[test]
fn a_new_function_takes_its_share_at_once_from_idle_functions() {
    // (others idle, nodes "e" is loaded on, nodes "b", "c", "d" keep)
    for (idle, took, kept) in [(true, 5, 1), (false, 2, 2)] {
        let mut s = fair_sched();
        for n in 1..=8 {
            s.add_node(n, ms(0));
        }
        for user in 1..=4 {
            s.user_joined(user);
            s.set_tenant(user, None, 1);
        }
        for (user, name) in [(1, "a"), (2, "b"), (3, "c"), (4, "d")] {
            s.configure(user, payload(name), 8, 8, ms(0));
        }
        let loading = configures(&s.take_actions());
        assert_eq!(loading.len(), 8, "two nodes each: {loading:?}");
        for (n, _) in loading {
            s.on_config_response(n, true, ms(1)).unwrap();
        }
        s.take_actions();
        let mut now = ms(1);
        if idle {
            tick_until(&mut s, now, now + ms(30));
            now += ms(30);
        }
        s.configure(1, payload("e"), 8, 8, now);
        let c = configures(&s.take_actions());
        assert_eq!(c.len(), took, "others idle: {idle}: {c:?}");
        assert!(c.iter().all(|(_, p)| *p == payload("e")));
        for name in ["b", "c", "d"] {
            assert_eq!(promised(&s, name), kept, "{name}, others idle: {idle}");
        }
    }
}

/// Seed 002's equal, always-busy users: a function at its fair share with
/// a backlog does not borrow the spare nodes another active function's
/// share is owed. Borrowed, they were drained back as soon as that
/// function's users sent work: two programmings per node where exclusive
/// mode makes one, for no gain.
#[test]
fn a_backlog_at_its_share_leaves_spare_nodes_owed_to_another_share() {
    let mut s = fair_sched();
    for n in 1..=6 {
        s.add_node(n, ms(0));
    }
    for user in 1..=3 {
        s.user_joined(user);
        s.set_tenant(user, None, 1);
    }
    for (user, name) in [(1, "a"), (2, "b"), (3, "c")] {
        s.configure(user, payload(name), 8, 8, ms(0));
    }
    let loading = configures(&s.take_actions());
    assert_eq!(loading.len(), 6, "two nodes each: {loading:?}");
    for (n, _) in loading {
        s.on_config_response(n, true, ms(1)).unwrap();
    }
    s.take_actions();
    // User 3 joins "b": "c"'s two nodes are spare, "b"'s share is four.
    s.configure(3, payload("b"), 8, 8, ms(2));
    assert_eq!(configures(&s.take_actions()), vec![], "no work yet");
    let mut programmed = backlog(&mut s, ms(2));
    assert_eq!(
        promised(&s, "a"),
        2,
        "\"a\" keeps its share: {programmed:?}"
    );
    for id in 1..=20 {
        s.submit(Job::new(3, id, Bytes::from_static(&[0; 8]), 10), ms(3));
    }
    programmed.extend(configures(&s.take_actions()));
    assert_eq!((promised(&s, "a"), promised(&s, "b")), (2, 4));
    assert_eq!(
        programmed.len(),
        2,
        "one programming per node moved: {programmed:?}"
    );
}
