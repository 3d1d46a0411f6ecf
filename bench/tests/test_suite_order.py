"""The `server` experiment's side-by-side order, against fake clusters and runs."""

import sys
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import suite  # noqa: E402


class FakeRecorder:
    def __init__(self):
        self.points = []

    def add(self, key, runs, failure=None, extra=None):
        self.points.append((key, len(runs), failure))


def test_policies_take_turns_at_each_point_and_a_failed_run_restarts_only_its_cluster(monkeypatch):
    events = []

    class FakeCluster:
        def __init__(self, ctx, policy, nodes, seed_nodes=False):
            self.policy = policy

        def __enter__(self):
            events.append(("start", self.policy))
            return self

        def __exit__(self, *exc):
            events.append(("stop", self.policy))

    calls = []

    def fake_runs(ctx, cl, n_runs, prime=True, **kw):
        calls.append((kw["input_size"], cl.policy, prime))
        if cl.policy == "stack" and kw["input_size"] == 16 and len(calls) == 4:
            return [], "node died"
        return [{"input_bps": 1.0}] * n_runs, None

    monkeypatch.setattr(suite, "Cluster", FakeCluster)
    monkeypatch.setattr(suite, "user_runs", fake_runs)
    rec = FakeRecorder()
    points = [({"nodes": 1, "input_size": size, "count": 1}, dict(input_size=size, count=1))
              for size in (16, 1024)]
    suite.side_by_side(SimpleNamespace(runs=2), rec, ["queue", "stack", "credit"], 1, points)

    # The first pass starts with queue, the second with stack, whose run failed (the 4th call).
    assert [(s, p) for s, p, _ in calls[:5]] == [(16, "queue"), (16, "stack"), (16, "credit"),
                                                  (16, "stack"), (16, "credit")]
    assert calls[5][:2] == (16, "queue")
    assert [prime for _, _, prime in calls[:3]] == [True] * 3 and not calls[3][2]
    assert rec.points[:3] == [({"policy": "queue", "nodes": 1, "input_size": 16, "count": 1}, 2, None),
                              ({"policy": "stack", "nodes": 1, "input_size": 16, "count": 1}, 1, "node died"),
                              ({"policy": "credit", "nodes": 1, "input_size": 16, "count": 1}, 2, None)]
    assert [n for _, n, f in rec.points[3:]] == [2, 2, 2] and all(f is None for _, _, f in rec.points[3:])
    # Stack's cluster was stopped after the failure and started afresh for the next point; every
    # cluster is stopped at the end.
    assert events.count(("start", "stack")) == 2
    assert events.count(("start", "queue")) == events.count(("stop", "queue")) == 1
    assert events.count(("start", "stack")) == events.count(("stop", "stack"))


def test_sharing_workloads_run_the_modes_of_a_seed_back_to_back_beside_the_model(monkeypatch, tmp_path):
    order = []

    def fake_run_json(args, timeout):
        mode = args[args.index("--variant") + 1]
        workload = args[args.index("--workload") + 1] if "--workload" in args else "seed"
        order.append((workload, mode, args[args.index("--seed") + 1]))
        obj = {k: 1.0 for k in suite.WORKLOAD_METRICS}
        obj.update(jct_ms=[1.0, 2.0, 3.0], makespan_s=2.0, reconfigurations=5)
        return obj, ""

    monkeypatch.setattr(suite, "run_json", fake_run_json)
    ctx = SimpleNamespace(quick=True, runs=1, out=tmp_path, machine={}, load={}, need_binary=lambda: "corefarm")
    doc = suite.exp_sharing_workloads(ctx)
    # Quick: arrivals then bursts, the four modes of the one seed back to back; no seed part.
    assert order == [(w, m, "1") for w in ("arrivals", "bursts") for m in ("exclusive", "static", "shared", "cowork")]
    assert all(p["status"] == "ok" for p in doc["points"]) and len(doc["points"]) == 8
    p = doc["points"][0]
    assert p["per_seed"][0]["seed"] == 1 and p["jct_quantiles_ms"][0] == 1.0 and p["jct_quantiles_ms"][-1] == 3.0
    # The model's figures for the same (shortened) workload and seed.
    assert set(p["model"]) == {"exclusive", "static", "pool", "fair"}
    assert (tmp_path / "sharing-workloads.json").exists() and (tmp_path / "sharing-workloads.csv").exists()
