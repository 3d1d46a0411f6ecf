"""bench/sharing_bound.py: its workload is the benchmark's, and its
placements respect what any placement must."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sharing_bound as sb  # noqa: E402


def test_the_workload_is_the_benchmarks():
    # The same values are pinned on the Rust side
    # (cmd_bench_sharing/tests.rs, the_workload_is_pinned), and
    # `corefarm bench sharing --apps 2 --seed 1 --json` reports
    # node_work_s 2.0201 for it.
    w = sb.workload(1, 2)
    assert [len(a) for a in w] == [28, 23]
    assert w[0][:4] == [(10, 37), (8, 34), (5, 20), (13, 4)]
    assert w[1][:4] == [(5, 53), (14, 2), (2, 241), (12, 72)]
    work = sum(n * sb.delay_us(f) for a in w for f, n in a)
    assert work == 2_020_100
    # Equal shares, to within one input of the slowest function (the last
    # call has at least one input, even past the share).
    for apps in (2, 4, 8):
        for a in sb.workload(3, apps):
            share = sum(n * sb.delay_us(f) for f, n in a)
            assert abs(share - 20 * sb.MEAN_CALL_US) < 1600


def test_messages_split_as_the_benchmark_does():
    assert sb.messages(37, 6) == [7, 7, 7, 7, 7, 2]
    assert sb.messages(3, 6) == [1, 1, 1]
    assert sb.messages(12, 6) == [2] * 6


def test_no_placement_beats_the_node_time_bound():
    for apps in (1, 2, 4):
        w = sb.workload(2, apps)
        work = sum(sum(sb.jobs_of(c, 6)[1]) for a in w for c in a)
        for r in (0.0, 0.01):
            for m in (sb.partition(w, 8, r), sb.shared(w, 8, r), sb.shared(w, 8, r, True)):
                assert m >= work / 8 - 1e-9


def test_one_application_alone_places_the_same_everywhere_without_programming():
    # One application owns every node: partition and pool are the same
    # list schedule when programming is free.
    w = sb.workload(4, 1)
    assert abs(sb.partition(w, 8, 0.0) - sb.shared(w, 8, 0.0)) < 1e-9


def test_the_sweep_reports_every_point():
    rows = sb.sweep(2, rs_ms=(0, 10), apps=(2, 4))
    assert [(r["reconfigure_ms"], r["apps"]) for r in rows] == [(0, 2), (0, 4), (10, 2), (10, 4)]
    for r in rows:
        assert r["partition_over_bound"]["min"] >= 1.0 - 1e-9
        assert r["pool"]["min"] <= r["pool"]["mean"] <= r["pool"]["max"]


def test_the_multi_tenant_workloads_are_the_benchs():
    # The same values are pinned on the Rust side
    # (sharing/workloads.rs, the_workloads_are_pinned).
    u = sb.generate(sb.shape("arrivals"), 1)
    assert len(u) == 44
    assert u[0][0] == 12_297
    assert u[0][1][:2] == [(0, 13, 22), (295_197, 13, 4)]
    assert sum(n * sb.wdelay_us(f) for _, c in u for _, f, n in c) == 5_611_900
    b = sb.generate(sb.shape("bursts"), 1)
    assert [len(c) for _, c in b] == [13, 15, 11, 37]


def test_multi_tenant_placements_do_every_call_and_respect_the_node_time():
    for name in sb.WORKLOADS:
        p = sb.multi_point(name, 2, 10, quick=True)
        for mode in ("exclusive", "static", "pool", "fair"):
            # No call finishes faster than its work on every node at once.
            assert p[mode]["jct_p50_s"] > 0
            assert p[mode]["makespan_s"] >= p["node_work_s"] / 8 - 1e-9


def test_an_idle_owner_keeps_its_nodes_until_the_timeout():
    # Two users asking for all 8 nodes: the first calls, thinks for 1 s and
    # calls again; the second arrives while the first thinks. With the 20 s
    # timeout it waits for the first to leave; with 0.5 s it gets the nodes
    # half a second into the first one's idleness.
    users = [(0, [(0, 0, 80), (1_000_000, 0, 80)]), (100_000, [(0, 0, 80)])]
    jct, _ = sb.multi_exclusive(users, 8, 0.0, 8, idle_timeout=20.0)
    assert max(jct) > 0.9  # the second user waited for the first to leave
    jct, _ = sb.multi_exclusive(users, 8, 0.0, 8, idle_timeout=0.5)
    assert max(jct) < 0.6
    # The fair pool serves the second user at once.
    jct, _ = sb.multi_fair(users, 8, 0.0)
    assert max(jct) < 0.01
