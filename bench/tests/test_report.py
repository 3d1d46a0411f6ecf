"""docs/benchmarks.md generation from a small fixture of suite results."""

import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import report  # noqa: E402
import suite  # noqa: E402


def build(tmp_path, with_png=True):
    results = tmp_path / "results"
    shutil.copytree(HERE / "fixture", results)
    if with_png:
        (results / "fig4_1_echo.png").write_bytes(b"\x89PNG fake")
    out = tmp_path / "docs" / "benchmarks.md"
    figs = tmp_path / "bench" / "figures"
    assert report.main(["--results", str(results), "--out", str(out), "--figures", str(figs),
                        "--readings", str(tmp_path / "no-readings.json")]) == 0
    return out.read_text(), figs


def test_seed_numbers_sit_beside_corefarm_numbers(tmp_path):
    text, _ = build(tmp_path)
    # Table 4.1 row 1 (seed) and the fixture's 1-node point (corefarm), same row.
    row = next(l for l in text.splitlines() if l.startswith("| 1 | 236.58 Mbit/s"))
    assert "500.8 ms" in row and "250.00 Mbit/s ±10%" in row
    # Table 4.3 cell: seed / corefarm.
    assert "225.00 Mbit/s / **220.00 Mbit/s ±10%**" in text
    # §4.2.2 seed lists and §4.2.3 / §4.5 / §4.6 numbers.
    assert "9.62 Gbit/s @ 256 KiB" in text and "27.680 ms" not in text and "27.7 ms @ 256 KiB" in text
    assert "393" in text and "96 MB/s" in text and "36 nodes ×11.5" in text
    # Software baseline and our speedup against the seed's.
    assert "100 MB/s of input" in text and "×1.50" in text and "×1.3" in text


def test_machine_failures_figures_and_placeholders(tmp_path):
    text, figs = build(tmp_path)
    assert "Test CPU, 2 logical CPUs" in text and "| echo | `abcdef1` | 2026-01-01 |" in text
    assert "4 cores / 8 threads" in text
    assert "failed: echo server exited" in text
    assert "skipped: no driver" in text
    # The plot is copied next to the document and linked relatively.
    assert (figs / "fig4_1_echo.png").exists()
    assert "![fig4_1_echo](../bench/figures/fig4_1_echo.png)" in text
    # Every experiment of `all` has a marked reading placeholder; missing ones say so.
    assert text.count(report.PLACEHOLDER.strip()) == len(report.ALWAYS)
    assert "## Server" in text and "_Not run._" in text
    assert "These are `--quick` results" not in text


def test_quick_results_are_flagged(tmp_path):
    results = tmp_path / "r"
    shutil.copytree(HERE / "fixture", results)
    d = json.loads((results / "echo.json").read_text())
    d["quick"] = True
    (results / "echo.json").write_text(json.dumps(d))
    text = report.render(results, tmp_path / "b.md", tmp_path / "f", json.loads((HERE.parent / "seed_figures.json").read_text()))
    assert "These are `--quick` results" in text


def test_spread_and_grids():
    s = suite.spread([1.0, 2.0, 3.0])
    assert s == {"runs": 3, "mean": 2.0, "min": 1.0, "max": 3.0, "stdev": 1.0, "values": [1.0, 2.0, 3.0]}
    assert suite.spread([5.0])["stdev"] == 0.0
    grid = suite.server_grid(False, 16 << 20)
    assert (16, 1) in grid and (128 * 1024, 1) in grid
    assert all(s * c <= 16 << 20 for s, c in grid)
    assert max(s * c for s, c in grid) > 8 << 20
    plan = suite.cluster_plan(False, 40)
    assert plan["nodes"][0] == 1 and plan["nodes"][-1] == 40
    assert plan["rates"] == [1000, 2000, 5000, 10000, 50000, 100000]


def _point(key, metrics, status="ok"):
    return {"key": key, "status": status, "reason": None if status == "ok" else "boom", "runs": 1,
            "metrics": {m: {"runs": 1, "mean": v, "min": v, "max": v, "stdev": 0.0} for m, v in metrics.items()}}


def test_headline_verdicts_and_section(tmp_path):
    pts = [
        _point({"part": "user", "policy": "credit", "nodes": 1, "delay_us": 0}, {"input_bps": 6e9, "output_bps": 3e9,
               "server_cpu_s_per_gb": 0.5, "latency_p50_ms": 0.2, "latency_p90_ms": 0.3, "latency_p99_ms": 0.5, "latency_max_ms": 2.0}),
        _point({"part": "user", "policy": "credit", "nodes": 4, "delay_us": 919}, {"input_bps": 1.0e9,
               "latency_p50_ms": 12.0}),
        _point({"part": "user", "policy": "queue", "nodes": 4, "delay_us": 919}, {"input_bps": 1.1e9,
               "latency_p50_ms": 3.0}),
        _point({"part": "matmul", "target": "rtl", "nodes": 1, "cores": 2, "count": 1},
               {"matrices_per_s": 100.0, "input_bytes_per_s": 3.2e6, "software_matrices_per_s": 5000.0,
                "ratio_vs_software": 0.02, "latency_p50_ms": 20.0, "rtl_standalone_cycles_per_s": 9e6,
                "rtl_cluster_cycles_per_s_per_instance": 8e6}),
    ]
    v = {x["target"].split(":")[0]: x for x in suite.headline_verdicts(pts)}
    assert v["delay 0, 1 node (credit)"]["met"] is True
    assert v["delay 919 us, 4 nodes (credit)"]["met"] is False  # 12 ms
    assert v["delay 919 us, 4 nodes"]["met"] is False  # 1.0 < 0.98 * 1.1 Gbit/s
    assert v["RTL matrix multiplier"]["met"] is False and abs(v["RTL matrix multiplier"]["ratio"] - 0.9) < 1e-9
    doc = {"experiment": "headline", "params": {"input_size": 32768, "output_size": 16384, "duration_s": 5,
                                                "runs": 2, "verdicts": suite.headline_verdicts(pts)},
           "points": pts}
    text = "\n".join(report.sec_headline(doc, {}))
    assert "| credit | 1 | 0 | 6.00 Gbit/s | 3.00 Gbit/s | 0.500 | 0.200 ms" in text
    assert "9.0 M alone, 8.0 M in the cluster" in text
    targets = "\n".join(report.targets_section({"headline": doc}))
    row = next(l for l in targets.splitlines() if "median latency < 10 ms" in l)
    assert row.startswith("| headline |") and "12.000 ms" in row and "**no** (×1.20 the target)" in row


def test_the_capacity_target_is_judged_run_by_run():
    cap = 4 * 1e6 / 919  # inputs/s of four nodes at 919 us

    def verdict(fractions, p50s):
        p = _point({"part": "user", "policy": "credit", "nodes": 4, "delay_us": 919}, {})
        for m, vals in (("inputs_per_s", [f * cap for f in fractions]), ("latency_p50_ms", p50s)):
            p["metrics"][m] = suite.spread(vals)
        v = suite.headline_verdicts([p])
        return next(x for x in v if "capacity" in x["target"])

    # Four runs in five at 99 % and 2.0 ms: met, though the mean is below 99 %.
    v = verdict([0.995, 0.993, 0.992, 0.991, 0.95], [1.8] * 5)
    assert v["met"] is True and "4 of 5 runs" in v["measured"]
    # Three in five: not met, though the mean is above 99 %.
    v = verdict([0.999, 0.999, 0.999, 0.985, 0.985], [1.8] * 5)
    assert v["met"] is False and "3 of 5 runs" in v["measured"]
    # A run at capacity but over 2.0 ms does not count.
    v = verdict([0.995] * 5, [1.8, 1.8, 1.8, 2.1, 2.1])
    assert v["met"] is False and "3 of 5 runs" in v["measured"]


def test_node_matmul_table(tmp_path):
    seed = json.loads((HERE.parent / "seed_figures.json").read_text())
    pts = [_point({"target": "native", "cores": c, "count": k},
                  {"matrices_per_s": 1000.0 * c * k, "input_bytes_per_s": 32768e3 * c * k, "input_bps": 8 * 32768e3 * c * k})
           for c in (1, 2) for k in (1, 4)]
    pts.append(_point({"target": "rtl", "cores": 1, "count": 1}, {}, status="failed"))
    text = "\n".join(report.sec_node_matmul({"points": pts}, seed))
    assert "| 2 | 65.5 MB/s (2,000/s) | 262.1 MB/s (8,000/s) |" in text
    assert "Best native: 8,000 matrices/s" in text and "2 core(s) × count 4" in text
    assert "| 1 | failed |" in text


def test_readings_replace_placeholders(tmp_path):
    results = tmp_path / "r"
    shutil.copytree(HERE / "fixture", results)
    seed = json.loads((HERE.parent / "seed_figures.json").read_text())
    text = report.render(results, tmp_path / "b.md", tmp_path / "f", seed, {"echo": ["First.", "Second."]})
    assert "First.\n\nSecond." in text
    assert text.count(report.PLACEHOLDER.strip()) == len(report.ALWAYS) - 1


def test_cpu_metrics_are_per_decimal_gb_moved():
    rep = {"throughput": {"input_bps": 8e9, "output_bps": 8e9, "offered_input_bps": 8e9, "messages_per_s": 1.0,
                          "inputs_per_s": 1.0, "send_rate_hz": 1.0},
           "latency": {k: 1.0 for k in ("avg_ms", "min_ms", "p50_ms", "p90_ms", "p99_ms", "max_ms")},
           "cpu": [{"label": "server", "pid": 1, "cpu_s": 4.0, "user_s": 3.0, "sys_s": 1.0, "wall_s": 5.0,
                    "cpus": 0.8, "processes": 1},
                   {"label": "nodes", "pid": 2, "cpu_s": 2.0, "user_s": 1.0, "sys_s": 1.0, "wall_s": 5.0,
                    "cpus": 0.4, "processes": 1}]}
    m = suite.user_metrics(rep)
    # 1 GB/s in + 1 GB/s out forwarded; 0.8 CPUs busy -> 0.4 CPU-s per GB.
    assert m["forwarded_bytes_per_s"] == 2e9
    assert abs(m["server_cpu_s_per_gb"] - 0.4) < 1e-12 and m["server_cpus"] == 0.8 and m["server_cpu_s"] == 4.0
    assert abs(m["node_cpu_s_per_gb"] - 0.2) < 1e-12
    e = suite.echo_metrics({"throughput_bps": 8e9, "messages_per_s": 1.0, "cpu": rep["cpu"][:1]})
    assert abs(e["server_cpu_s_per_gb"] - 0.8) < 1e-12  # 1 GB/s echoed
    del rep["cpu"]
    assert "server_cpu_s_per_gb" not in suite.user_metrics(rep)


def _fwd_points(fwd_gb, echo_gb=0.5, seed_p50=30.0, ips=4300.0, p50=1.5):
    pts = [_point({"part": "echo", "size": 32772}, {"throughput_bps": 1e10, "server_cpu_s_per_gb": echo_gb})]
    for pol in ("queue", "credit"):
        for peers in ("hello", "seed"):
            pts.append(_point({"part": "cpu", "policy": pol, "peers": peers, "nodes": 1, "delay_us": 0},
                              {"input_bps": 5e9, "output_bps": 5e9, "server_cpu_s_per_gb": fwd_gb[(pol, peers)],
                               "server_cpus": 0.9}))
    pts.append(_point({"part": "latency", "policy": "credit", "user": "seed", "nodes": 4, "delay_us": 919},
                      {"latency_p50_ms": seed_p50, "latency_p99_ms": 2 * seed_p50, "inputs_per_s": 4000.0}))
    pts.append(_point({"part": "latency", "policy": "credit", "user": "hello", "nodes": 4, "delay_us": 919},
                      {"latency_p50_ms": p50, "latency_p99_ms": 3.0, "inputs_per_s": ips}))
    return pts


def test_forwarding_verdicts_and_targets_table(tmp_path):
    fwd = {("queue", "hello"): 0.6, ("queue", "seed"): 1.0, ("credit", "hello"): 0.65, ("credit", "seed"): 0.7}
    v = {x["id"]: x for x in suite.forwarding_verdicts(_fwd_points(fwd))}
    assert v["cpu-queue-hello"]["met"] and abs(v["cpu-queue-hello"]["value"] - 1.2) < 1e-12
    assert not v["cpu-queue-seed"]["met"]  # 2.0x the echo server
    assert not v["seed-user-p50"]["met"]  # 30 ms
    # 4300 inputs/s of 4 x 1088 possible = 98.79 % < 99 %.
    assert not v["headline-capacity"]["met"] and "98.79 %" in v["headline-capacity"]["measured"]
    good = {x["id"]: x for x in suite.forwarding_verdicts(_fwd_points(fwd, seed_p50=4.0, ips=4340.0))}
    assert good["seed-user-p50"]["met"] and good["headline-capacity"]["met"]

    doc = {"experiment": "forwarding", "points": _fwd_points(fwd, seed_p50=4.0, ips=4340.0),
           "params": {"size": 32768, "duration_s": 5, "runs": 3,
                      "latency": {"input_size": 32768, "output_size": 16384, "delay_us": 919, "nodes": 4}}}
    server = {"points": [
        _point({"policy": "queue", "nodes": 2, "input_size": 65536, "count": 1}, {"input_bps": 5e9}),
        _point({"policy": "credit", "nodes": 2, "input_size": 65536, "count": 1}, {"input_bps": 4e9}),
    ]}
    text = "\n".join(report.targets_section({"forwarding": doc, "server": server}))
    row = next(l for l in text.splitlines() if "queue, seed peers" in l)
    assert row.startswith("| forwarding |") and "= 2.00x" in row and "**no**" in row
    row = next(l for l in text.splitlines() if "seed-format user" in l)
    assert "p50 4.000 ms" in row and row.endswith("| yes |")
    row = next(l for l in text.splitlines() if "credit never below queue" in l)
    assert "below at 1 of 1 points" in row and "**no**" in row
    text = "\n".join(report.sec_forwarding(doc, {}, {"server": server}))
    assert "| cpu | credit | seed peers | 1 | 0 |" in text and "×1.40" in text
    assert "2 node(s), 64 KiB × 1: 4.00 Gbit/s vs 5.00 Gbit/s" in text


def test_credit_below_queue_allows_the_noise():
    def pair(q, c, peers=None, spread=0.0):
        extra = {"peers": peers} if peers else {}
        pts = []
        for pol, v in (("queue", q), ("credit", c)):
            p = _point({"policy": pol, "nodes": 1, "input_size": 16, "count": 1, **extra}, {"input_bps": v})
            p["metrics"]["input_bps"].update(min=v * (1 - spread), max=v * (1 + spread))
            pts.append(p)
        return pts
    assert suite.credit_below_queue({"points": pair(100, 99)})["below"] == []  # within 2 %
    assert len(suite.credit_below_queue({"points": pair(100, 95)})["below"]) == 1
    assert suite.credit_below_queue({"points": pair(100, 95, spread=0.1)})["below"] == []  # runs spread ±10 %
    # Seed-format and hello points are compared separately.
    r = suite.credit_below_queue({"points": pair(100, 100) + pair(100, 50, peers="seed")})
    assert r["compared"] == 2 and [b["peers"] for b in r["below"]] == ["seed"]


def test_credit_vs_fixed_takes_the_best_fixed_window_and_its_latency():
    def point(pol, bps, p50, spread=0.0):
        p = _point({"policy": pol, "nodes": 2, "input_size": 1024, "count": 1},
                   {"input_bps": bps, "latency_p50_ms": p50})
        p["metrics"]["latency_p50_ms"].update(min=p50 * (1 - spread), max=p50 * (1 + spread))
        return p
    fixed = [point("fixed-4", 80, 1.0), point("fixed-16", 100, 3.0), point("fixed-64", 99, 9.0)]
    ok = suite.credit_vs_fixed({"points": fixed + [point("credit", 96, 2.9), point("queue", 50, 1.0)]})
    assert ok == {"compared": 1, "misses": []}
    # Under 0.95x the best (fixed-16), or slower at the median beyond the noise: a miss, named.
    slow = suite.credit_vs_fixed({"points": fixed + [point("credit", 94, 2.0)]})["misses"]
    assert [(m["best"], m["slow"], m["late"]) for m in slow] == [("fixed-16", True, False)]
    late = suite.credit_vs_fixed({"points": fixed + [point("credit", 100, 3.3)]})["misses"]
    assert [(m["slow"], m["late"], m["dominated"]) for m in late] == [(False, True, True)]
    # More throughput than any fixed window for more latency: a miss, but a different trade.
    more = suite.credit_vs_fixed({"points": fixed + [point("credit", 110, 3.3)]})["misses"]
    assert [(m["late"], m["dominated"]) for m in more] == [(True, False)]
    # A latency spread of ±20 % over runs is noise.
    assert suite.credit_vs_fixed({"points": fixed + [point("credit", 100, 3.3, spread=0.2)]})["misses"] == []
    # Points without fixed windows (seed-format peers) are not compared.
    assert suite.credit_vs_fixed({"points": [point("credit", 1, 1.0)]})["compared"] == 0
    assert suite.policy_args("fixed-16") == ["--policy", "credit", "--credit", "16", "--credit-window", "fixed"]
    assert suite.policy_args("stack") == ["--policy", "stack"]


def test_counter_total_sums_one_counters_samples_only():
    text = "\n".join(["# HELP corefarm_hedged_total copies", "# TYPE corefarm_hedged_total counter",
                      "corefarm_hedged_total 3", "corefarm_hedged_total_other 100",
                      'corefarm_hedge_duplicates_total{mode="shared"} 2', 'corefarm_hedge_duplicates_total{mode="x"} 1.5'])
    assert suite.counter_total(text, "corefarm_hedged_total") == 3
    assert suite.counter_total(text, "corefarm_hedge_duplicates_total") == 3.5
    assert suite.counter_total(text, "corefarm_absent_total") == 0


def test_committed_document_is_generated_from_the_committed_results(tmp_path):
    """docs/benchmarks.md is bench/report.py's output for bench/results (same bytes, twice), within 800 lines."""
    root = HERE.parent.parent
    seed = json.loads((HERE.parent / "seed_figures.json").read_text())
    readings = json.loads((HERE.parent / "readings.json").read_text())
    out = root / "docs" / "benchmarks.md"
    figs = tmp_path / "figures"
    first = report.render(HERE.parent / "results", out, figs, seed, readings)
    assert first == report.render(HERE.parent / "results", out, figs, seed, readings)
    # A guard on the page's length, not a figure: a section per experiment
    # (about twenty) stays readable; detail belongs in the results files.
    assert len(first.splitlines()) <= 800
    # Figures are linked from the committed figures directory, so render against it for the byte comparison.
    assert report.render(HERE.parent / "results", out, HERE.parent / "figures", seed, readings) == out.read_text()


def test_new_experiment_verdicts():
    coll = {"points": [
        _point({"impl": "corefarm", "op": "bcast", "algo": a, "n": 4, "bytes": 65536},
               {"median_us": v, "model_error": e}) for a, v, e in (("linear", 300.0, 0.1), ("binomial", 250.0, -0.3))
    ] + [_point({"impl": "openmpi", "op": "bcast", "algo": "openmpi", "n": 4, "bytes": 65536}, {"median_us": 260.0})]}
    v = {x["target"]: x for x in report.collectives_verdicts(coll)}
    assert v["bcast, reduce, allreduce no slower than Open MPI at ≥ 64 KiB"]["measured"] == "1 of 1 points"
    assert not v["collectives model within 20 % of measurement"]["met"]  # one point 30 % off
    soak = {"seconds": 3600, "checks": [{"name": "a", "ok": True}, {"name": "b", "ok": False}]}
    assert report.soak_verdicts(soak)[0]["measured"] == "1 of 2 checks" and not report.soak_verdicts(soak)[0]["met"]
    hol = {"points": [_point({"part": "hol", "summary": "end to end"}, {
        "p99_chunked_over_unloaded": 1.5, "p99_unchunked_over_chunked": 12.0, "bulk_chunked_over_unchunked": 0.9})]}
    assert [x["met"] for x in report.streams_verdicts(hol)] == [True, True, False]


def test_same_run_comparisons_are_summarised_per_metric(tmp_path):
    results = tmp_path / "r"
    shutil.copytree(HERE / "fixture", results)

    def delta(metric, ratio, verdict):
        s = {"runs": 1, "mean": 1.0, "min": 1.0, "max": 1.0, "stdev": 0.0}
        return {"metric": metric, "old": s, "new": s, "ratio": ratio, "allowed": 0.05, "verdict": verdict}
    (results / "compare-headline.json").write_text(json.dumps({
        "threshold": 0.05, "regressions": 1, "improvements": 0, "only_in_old": [], "only_in_new": [],
        "points": [{"key": "a", "status": "ok", "metrics": [delta("input_bps", 1.0, "same"), delta("runs", None, "info")]},
                   {"key": "b", "status": "ok", "metrics": [delta("input_bps", 0.81, "worse")]}]}))
    seed = json.loads((HERE.parent / "seed_figures.json").read_text())
    text = report.render(results, tmp_path / "b.md", tmp_path / "f", seed)
    assert "**headline**: 2 points, 1 regression(s), 0 improvement(s), threshold 5 %." in text
    assert "| input_bps | 2 | 0.900 | 0.810–1.000 | 1 | 0 |" in text


def test_sharing_workloads_capture_and_the_seed_check():
    model = {p: {"jct_mean_s": v, "jct_p50_s": v, "jct_p99_s": v, "makespan_s": 1.0}
             for p, v in (("exclusive", 0.1), ("static", 0.2), ("pool", 0.08), ("fair", 0.02))}
    pts = []
    for mode, means in (("exclusive", (100.0, 100.0)), ("shared", (30.0, 40.0))):
        p = _point({"part": "workload", "workload": "arrivals", "reconfigure_ms": 10, "mode": mode},
                   {"jct_mean_ms": sum(means) / 2, "jct_p50_ms": 5.0, "jct_p99_ms": 90.0, "makespan_s": 6.0,
                    "utilisation": 0.2, "reprogrammings_per_s": 3.0})
        p.update(per_seed=[{"seed": s + 1, "jct_mean_ms": m} for s, m in enumerate(means)], model=model)
        pts.append(p)
    for mode, spans in (("exclusive", (1.0, 1.0, 1.0)), ("shared", (1.01, 1.02, 1.03))):
        p = _point({"part": "seed", "apps": 4, "mode": mode}, {"makespan_s": sum(spans) / 3})
        p["per_seed"] = [{"seed": s + 1, "makespan_s": m} for s, m in enumerate(spans)]
        pts.append(p)
    doc = {"params": {"workloads": ["arrivals"], "reconfigure_ms": [10], "seeds": [1, 2], "nodes": 8, "jobs": 6,
                      "period_ms": 10, "user_idle_timeout_s": 20, "cowork_speedup": 2,
                      "seed_part": {"apps": [4], "calls": 10, "functions": 16, "period_ms": 10}},
           "points": pts}
    [c] = report.workload_capture(doc)
    # The model's best (fair, 20 ms) gains 80 % over its exclusive (100 ms); shared gains 65 %: 81 % of it.
    assert abs(c["model_gain"] - 0.8) < 1e-9 and abs(c["gain"] - 0.65) < 1e-9
    assert abs(c["capture"] - 0.65 / 0.8) < 1e-9
    assert abs(c["paired"] - 0.65) < 1e-9 and c["half"] > 0
    [s] = report.seed_part(doc)
    assert abs(s["ratio"] - 1.02) < 1e-9 and abs(s["half"] - 4.30 * 0.01 / 3 ** 0.5) < 1e-9
    [v] = report.sharing_workloads_verdicts(doc)
    assert v["met"] and "1 of 1" in v["measured"] and "4 apps 1.020" in v["measured"]
    short = "\n".join(report.sec_sharing_workloads_short(doc))
    assert "| `arrivals` | 100 → 35 ms (80 %, 81 %) |" in short
    assert "65 % (65 ± " in "\n".join(report.sec_sharing_workloads(doc, None))


def test_window_section_and_verdict_judge_each_point_against_its_best_fixed_window(tmp_path):
    def pt(policy, size, bps, p50, mps):
        p = _point({"policy": policy, "nodes": 1, "input_size": size, "count": 1},
                   {"input_bps": bps, "latency_p50_ms": p50, "messages_per_s": mps})
        return p
    doc = {"experiment": "window", "params": {"policies": ["credit", "fixed-4", "fixed-16"], "runs": 3,
                                              "durations_s": {"16x1": 2.0, "8388608x1": 10.0}},
           "points": [pt("credit", 16, 0.97e9, 1.0, 1000.0), pt("fixed-4", 16, 0.5e9, 0.5, 500.0),
                      pt("fixed-16", 16, 1.0e9, 1.0, 1000.0),
                      pt("credit", 8 << 20, 0.8e9, 9.0, 12.0), pt("fixed-4", 8 << 20, 1.0e9, 8.0, 15.0),
                      pt("fixed-16", 8 << 20, 0.9e9, 30.0, 14.0)]}
    text = "\n".join(report.sec_window(doc, {}))
    assert "Met at 1 of 2 points" in text
    row16 = next(l for l in text.splitlines() if l.startswith("| 1 | 16 B"))
    assert "16: " in row16 and "×0.97" in row16 and row16.endswith("| 2,000 | yes |")
    row8 = next(l for l in text.splitlines() if l.startswith("| 1 | 8 MiB"))
    assert "4: " in row8 and "×0.80" in row8 and "**no**, slower, later, beaten on both" in row8
    (v,) = [v for name, v in report.all_verdicts({"window": doc}) if name == "window"]
    assert v["met"] is False and "missed at 1 of 2 points" in v["measured"]
    assert "Control" not in text and "copy" not in v["measured"]


def test_the_window_control_arm_is_judged_by_the_adaptive_windows_rule():
    def pt(policy, size, bps, p50):
        return _point({"policy": policy, "nodes": 1, "input_size": size, "count": 1},
                      {"input_bps": bps, "latency_p50_ms": p50, "messages_per_s": 1000.0})
    control = suite.WINDOW_CONTROL
    assert control == "copy-of-fixed-64"
    assert suite.policy_args(control) == suite.policy_args("fixed-64")
    doc = {"experiment": "window",
           "params": {"policies": ["credit", "fixed-16", "fixed-64", control], "runs": 3,
                      "durations_s": {"16x1": 2.0, "1024x1": 2.0}},
           # 16 B: the twin is the best fixed window and its copy reads 0.90x of it, a miss by noise
           # alone; 1 KiB: the fixed window of 16 is best, and the copy is judged against it too.
           "points": [pt("credit", 16, 1.0e9, 1.0), pt("fixed-16", 16, 0.8e9, 0.5),
                      pt("fixed-64", 16, 1.0e9, 1.0), pt(control, 16, 0.9e9, 1.0),
                      pt("credit", 1024, 1.0e9, 1.0), pt("fixed-16", 1024, 1.0e9, 1.0),
                      pt("fixed-64", 1024, 0.9e9, 4.0), pt(control, 1024, 0.97e9, 4.0)]}
    # The copy is not a fixed window of its own: the best fixed window is chosen among the others.
    assert suite.credit_vs_fixed(doc)["misses"] == []
    cv = suite.credit_vs_fixed(doc, control)
    assert [(m["input_size"], m["best"], m["slow"], m["late"]) for m in cv["misses"]] == [
        (16, "fixed-64", True, False), (1024, "fixed-16", False, True)]
    text = "\n".join(report.sec_window(doc, {}))
    assert "meets the target at 0 of 2 points, and at 0 of the 1 where its twin was the best" in text
    (v,) = [v for name, v in report.all_verdicts({"window": doc}) if name == "window"]
    assert v["met"] is True and "a second copy of fixed-64 missed at 2" in v["measured"]
