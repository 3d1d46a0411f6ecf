#!/usr/bin/env python3
"""Writes docs/benchmarks.md from suite results and the seed's numbers.

    python3 bench/report.py [--results bench-results] [--out docs/benchmarks.md] [--figures bench/figures]

For every experiment: the seed's figures (bench/seed_figures.json) beside
corefarm's, the machine the results come from, the plots (copied next to the
document so that it can be committed) and a reading paragraph. Readings that
need numbers from a full (not --quick) run are left as marked placeholders.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import suite  # noqa: E402  (the targets and their checks are defined once, in the suite)

ORDER = ["headline", "forwarding", "echo", "server", "policies", "node", "node-matmul", "cluster", "software"]
TITLES = {
    "headline": "Headline: issue 2's table and issue 3's rows (one run)",
    "forwarding": "Issue 7 targets: forwarding CPU, seed-format latency, the headline point",
    "echo": "SMP echo (seed §4.2.1, figure 4.1)",
    "server": "Server, zero-delay benchmarking configuration (seed §4.2.2, figures 4.3 and 4.4)",
    "policies": "Policies when the nodes are the bottleneck (seed §4.2.2's queue-vs-stack finding)",
    "node": "Load-free node manager, isolated (seed §4.2.3, figure 4.5)",
    "node-matmul": "Node with matrix-multiplier cores (seed §4.4.1, figure 4.10)",
    "cluster": "Simulated matrix-multiplier cluster (seed §4.4.2, tables 4.1-4.4)",
    "software": "Software baseline and speedups (seed §4.5, §4.6)",
}
PLACEHOLDER = "> **TODO (reading needs full-run numbers):** "
# The plots each experiment writes (bench/plots.py), in document order.
FIGURES = {
    "headline": ["headline_user.png"],
    "forwarding": [],
    "echo": ["fig4_1_echo.png"],
    "server": ["fig4_3_server_throughput.png", "fig4_4_server_latency.png"],
    "policies": [],
    "node": ["fig4_5_node.png"],
    "node-matmul": ["fig4_10_node_matmul.png"],
    "cluster": ["fig4_11_cluster_throughput_count1.png", "fig4_12_cluster_latency_count1.png",
                "fig4_13_cluster_throughput_count4.png", "fig4_14_cluster_latency_count4.png",
                "fig4_15_cluster_throughput_rates.png", "fig4_16_cluster_latency_rates.png"],
    "software": ["sec4_6_speedup.png"],
}


def bps(v) -> str:
    if v is None:
        return "-"
    for p, d in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= d:
            return f"{v / d:.2f} {p}bit/s"
    return f"{v:.0f} bit/s"


def ms(v) -> str:
    return "-" if v is None else f"{v:.3f} ms" if v < 10 else f"{v:.1f} ms"


def size(n) -> str:
    if not isinstance(n, int):
        return str(n)
    for unit, d in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= d and n % d == 0:
            return f"{n // d} {unit}"
    return f"{n} B"


def mean(p, m):
    return p["metrics"].get(m, {}).get("mean")


def with_spread(p, m, fmt) -> str:
    s = p["metrics"].get(m)
    if not s or s.get("mean") is None:
        return "-"
    txt = fmt(s["mean"])
    if s.get("runs", 1) > 1 and s["mean"]:
        txt += f" ±{(s['max'] - s['min']) / 2 / abs(s['mean']) * 100:.0f}%"
    return txt


def table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def cpu_gb(p, metric="server_cpu_s_per_gb") -> str:
    v = mean(p, metric)
    return "-" if v is None else with_spread(p, metric, lambda x: f"{x:.3f}")


def peers_label(k) -> str:
    return " (seed peers)" if k.get("peers", "hello") != "hello" else ""


def status_cell(p) -> str:
    if p["status"] == "ok":
        return "ok"
    return f"{p['status']}: {(p.get('reason') or '')[:80]}"


# ------------------------------------------------------------- sections

def sec_echo(doc, seed):
    s = seed["echo"]
    lines = [f"**Seed ({s['ref']}):** {s['text']}. Plateau: {bps(s['plateau_bps'])} from {size(s['plateau_from_bytes'])}."]
    if doc:
        rows = [[p["key"]["clients"], size(p["key"]["size"]), with_spread(p, "throughput_bps", bps),
                 with_spread(p, "messages_per_s", lambda v: f"{v:,.0f}"), cpu_gb(p), status_cell(p)]
                for p in doc["points"]]
        lines += ["", "**corefarm** (server CPU-s/GB: the echo server process's CPU-seconds per decimal GB echoed, "
                      "over the measurement window):", "",
                  table(["clients", "payload", "throughput", "messages/s", "server CPU-s/GB", "status"], rows)]
        ok = [p for p in doc["points"] if p["status"] == "ok"]
        if ok:
            best = max(ok, key=lambda p: mean(p, "throughput_bps") or 0)
            lines += ["", f"Highest: {bps(mean(best, 'throughput_bps'))} with {best['key']['clients']} client(s) at "
                          f"{size(best['key']['size'])} payloads."]
    return lines


def sec_server(doc, seed):
    s = seed["server"]
    rows = []
    for pol in ("queue", "stack"):
        for t, l in zip(s["max_throughput"][pol], s["min_latency_ms"][pol]):
            rows.append([pol, t["nodes"], f"{bps(t['bps'])} @ {size(t['message_bytes'])}",
                         f"{ms(l['ms'])} @ {size(l['message_bytes'])}"])
    lines = [f"**Seed ({s['ref']}):** {s['text']}.", "", table(["policy", "nodes", "max throughput", "min latency"], rows)]
    if doc:
        best = {}
        for p in doc["points"]:
            k = (p["key"]["policy"], p["key"].get("peers", "hello"), p["key"]["nodes"])
            best.setdefault(k, []).append(p)
        rows = []
        for (pol, peers, n), pts in best.items():
            ok = [p for p in pts if p["status"] == "ok"]
            failed = len(pts) - len(ok)
            if not ok:
                rows.append([pol, peers, n, "-", "-", "-", f"all {failed} failed: {(pts[0].get('reason') or '')[:60]}"])
                continue
            t = max(ok, key=lambda p: mean(p, "input_bps") or 0)
            l = min(ok, key=lambda p: mean(p, "latency_avg_ms") or float("inf"))
            rows.append([pol, peers, n, f"{with_spread(t, 'input_bps', bps)} @ {size(t['message_bytes'])}",
                         cpu_gb(t), f"{with_spread(l, 'latency_avg_ms', ms)} @ {size(l['message_bytes'])}",
                         f"{len(ok)} ok, {failed} failed"])
        lines += ["", "**corefarm** (best point per policy, peers and node count; server CPU-s/GB at the best "
                      "throughput point = `corefarm server`'s CPU-seconds per decimal GB forwarded, inputs + outputs; "
                      "every point, with its CPU, is in server.csv):", "",
                  table(["policy", "peers", "nodes", "max throughput", "server CPU-s/GB", "min avg latency",
                         "points"], rows)]
        cq = suite.credit_below_queue(doc)
        lines += ["", f"Credit against queue at every grid point ({cq['compared']} compared): "
                  + ("credit is nowhere below queue beyond the noise." if not cq["below"] else
                     "credit below queue beyond the noise at " + "; ".join(
                         f"{b['peers']} peers, {b['nodes']} node(s), {size(b['input_size'])} × {b['count']}: "
                         f"{bps(b['credit_bps'])} vs {bps(b['queue_bps'])} (×{b['ratio']:.2f}, noise "
                         f"±{b['noise'] * 100:.0f}%)" for b in cq["below"]) + ".")]
    return lines


def sec_node(doc, seed):
    s = seed["node"]
    lines = [f"**Seed ({s['ref']}):** {s['text']}."]
    if doc:
        rows = [[p["key"].get("path", "via-server"), size(p["key"]["size"]), with_spread(p, "input_bps", bps),
                 with_spread(p, "latency_avg_ms", ms), with_spread(p, "latency_p99_ms", ms), status_cell(p)]
                for p in doc["points"]]
        lines += ["", "**corefarm:**", "", table(["path", "data size", "throughput", "avg latency", "p99 latency",
                                                  "status"], rows)]
        d = {p["key"]["size"]: p for p in doc["points"] if p["key"].get("path") == "direct" and p["status"] == "ok"}
        v = {p["key"]["size"]: p for p in doc["points"] if p["key"].get("path") == "via-server" and p["status"] == "ok"}
        near = min(d, key=lambda x: abs(x - 128000), default=None)
        if near is not None:
            lines += ["", f"At {size(near)} (the seed's 128 kB point) the isolated node manager carries "
                          f"{bps(mean(d[near], 'input_bps'))}, {mean(d[near], 'input_bps') / 393e6:.0f}× the seed's "
                          f"393 Mbit/s" + (f"; behind the server {bps(mean(v[near], 'input_bps'))}" if near in v else "")
                          + "."]
        lines += [f"", f"_Method:_ {doc['params'].get('method', '')}"] if doc["params"].get("method") else []
    return lines


def sec_node_matmul(doc, seed):
    s = seed["node_matmul"]
    lines = [f"**Seed ({s['ref']}):** {s['text']}; maximum {s['max_bytes_per_s']['counts_2_to_5'] / 1e6:g} MB/s "
             f"(counts 2-5), {s['max_bytes_per_s']['count_1'] / 1e6:g} MB/s (count 1); optimum "
             f"{s['optimal']['cores']} cores × {s['optimal']['count']} inputs; {s['core_time_ms']} ms per multiplication."]
    if not doc:
        return lines
    pts = doc["points"]
    for p in pts:
        if p["key"].get("target") not in ("native", "rtl") and p["status"] != "ok":
            lines += ["", f"**corefarm:** {p['status']}: {p.get('reason')}"]
    iso = [p for p in pts if "isolation" in p["key"]]
    pts = [p for p in pts if "isolation" not in p["key"]]
    for target in ("native", "rtl"):
        sel = [p for p in pts if p["key"].get("target") == target]
        if not sel:
            continue
        counts = sorted({p["key"]["count"] for p in sel})
        cores = sorted({p["key"]["cores"] for p in sel})
        by = {(p["key"]["cores"], p["key"]["count"]): p for p in sel}
        rows = []
        for c in cores:
            row = [c]
            for k in counts:
                p = by.get((c, k))
                if p is None:
                    row.append("")
                elif p["status"] != "ok":
                    row.append(p["status"])
                else:
                    row.append(f"{with_spread(p, 'input_bytes_per_s', lambda v: f'{v / 1e6:.1f} MB/s')} "
                               f"({mean(p, 'matrices_per_s'):,.0f}/s)")
            rows.append(row)
        lines += ["", f"**corefarm, {target} cores** (input MB/s and matrices/s; one node, every result checked):",
                  "", table(["cores"] + [f"count {k}" for k in counts], rows)]
        ok = [p for p in sel if p["status"] == "ok"]
        if ok:
            best = max(ok, key=lambda p: mean(p, "matrices_per_s") or 0)
            lines += ["", f"Best {target}: {mean(best, 'matrices_per_s'):,.0f} matrices/s = "
                          f"{mean(best, 'input_bytes_per_s') / 1e6:.1f} MB/s of input "
                          f"({bps(mean(best, 'input_bps'))}) with {best['key']['cores']} core(s) × count "
                          f"{best['key']['count']}; seed: 34 MB/s at 5 cores × count 4."]
    if iso:
        by = {(p["key"]["cores"], p["key"]["count"], p["key"]["isolation"]): p for p in iso}
        rows = []
        for c, k in sorted({(p["key"]["cores"], p["key"]["count"]) for p in iso}):
            a, b = by.get((c, k, "in-process")), by.get((c, k, "process"))
            ma = mean(a, "matrices_per_s") if a and a["status"] == "ok" else None
            mb = mean(b, "matrices_per_s") if b and b["status"] == "ok" else None
            rows.append([c, k, f"{ma:,.0f}/s" if ma else (a or {}).get("status", ""),
                         f"{mb:,.0f}/s" if mb else (b or {}).get("status", ""),
                         f"{mb / ma:.3f}" if ma and mb else ""])
        lines += ["", "**Isolation cost** (native 64×64 matmul, same run, runs interleaved): cores in worker "
                      "processes (`--isolation process`, the default) against in the node manager's own process "
                      "(`in-process`, opt-in and unsafe). Target: at most 5 % lower throughput (ratio ≥ 0.95).",
                  "", table(["cores", "count", "in-process", "process", "process ÷ in-process"], rows)]
    return lines


def sec_policies(doc, seed):
    if not doc:
        return []
    prm = doc["params"]
    rows = [[p["key"]["policy"], p["key"]["nodes"],
             with_spread(p, "input_bps", bps) if p["status"] == "ok" else status_cell(p),
             ms(mean(p, "latency_p50_ms")), ms(mean(p, "latency_avg_ms")), ms(mean(p, "latency_p99_ms"))]
            for p in doc["points"]]
    return [f"`corefarm bench suite policies`: {size(prm['input_size'])} inputs, {size(prm['output_size'])} outputs, "
            f"{prm['delay_us']} µs per input, {prm['duration_s']:g} s × {prm['runs']} runs per point. One node can "
            f"process {1e6 / prm['delay_us']:.0f} inputs/s = {bps(1e6 / prm['delay_us'] * prm['input_size'] * 8)}.",
            "", table(["policy", "nodes", "input", "p50", "avg latency", "p99"], rows)]


def sec_headline(doc, seed):
    if not doc:
        return ["The headline experiment was not run."]
    pts = doc["points"]
    prm = doc["params"]
    lines = [f"`corefarm bench user` against `corefarm node` processes through `corefarm server`, "
             f"{size(prm['input_size'])} inputs, {size(prm['output_size'])} outputs, one input per message, "
             f"{prm['duration_s']:g} s measured per run, {prm['runs']} runs per point (± = half the range "
             f"over runs). Latency is per message, from send to result.", ""]
    rows = []
    for p in pts:
        k = p["key"]
        if k.get("part") != "user":
            continue
        if p["status"] != "ok":
            rows.append([k["policy"] + peers_label(k), k["nodes"], k["delay_us"], status_cell(p), "", "", "", "", "",
                         ""])
            continue
        rows.append([k["policy"] + peers_label(k), k["nodes"], k["delay_us"], with_spread(p, "input_bps", bps),
                     with_spread(p, "output_bps", bps), cpu_gb(p), ms(mean(p, "latency_p50_ms")),
                     ms(mean(p, "latency_p90_ms")), ms(mean(p, "latency_p99_ms")), ms(mean(p, "latency_max_ms"))])
    lines += [table(["policy", "nodes", "delay µs", "input", "output", "server CPU-s/GB", "p50", "p90", "p99", "max"],
                    rows),
              "", "Server CPU-s/GB: `corefarm server`'s CPU-seconds per decimal GB forwarded (inputs + outputs) over "
                  "the measurement window. Seed peers: `bench user --legacy` and `corefarm node --no-hello`."]
    for p in pts:
        if p["key"].get("part") == "echo":
            lines += ["", f"`corefarm bench echo` at the same message size ({p['key']['size']} B payload, one "
                          f"client): {with_spread(p, 'throughput_bps', bps) if p['status'] == 'ok' else status_cell(p)} "
                          f"each way" + (f", echo server {cpu_gb(p)} CPU-s/GB echoed"
                                         if mean(p, "server_cpu_s_per_gb") is not None else "") + "."]
    mm = [p for p in pts if p["key"].get("part") == "matmul"]
    if mm:
        rows = []
        for p in mm:
            k = p["key"]
            if p["status"] != "ok":
                rows.append([k["target"], f"{k['nodes']} × {k['cores']} cores, count {k['count']}", status_cell(p),
                             "", "", "", ""])
                continue
            rtl = (f"{mean(p, 'rtl_standalone_cycles_per_s') / 1e6:.1f} M alone, "
                   f"{mean(p, 'rtl_cluster_cycles_per_s_per_instance') / 1e6:.1f} M in the cluster"
                   if mean(p, "rtl_standalone_cycles_per_s") else "")
            rows.append([k["target"], f"{k['nodes']} node × {k['cores']} cores, count {k['count']}",
                         f"{with_spread(p, 'matrices_per_s', lambda v: f'{v:,.0f}')} "
                         f"({mean(p, 'input_bytes_per_s') / 1e6:.0f} MB/s)",
                         f"{mean(p, 'software_matrices_per_s'):,.0f} ({mean(p, 'software_matrices_per_s') * 32768 / 1e6:.0f} MB/s)",
                         f"×{mean(p, 'ratio_vs_software'):.2f}", ms(mean(p, "latency_p50_ms")), rtl])
        lines += ["", "**Issue 3: matrix multiplier per node against software** (`corefarm demo --json`: the same "
                      "run measures the cluster, then the software baseline — the same C++ function called in a loop "
                      "on one thread — and, for RTL, one simulated instance alone):", "",
                  table(["target", "cluster", "corefarm matrices/s per node", "software matrices/s", "ratio",
                         "p50 latency", "RTL simulated cycles/s per instance"], rows)]
    verdicts = prm.get("verdicts") or []
    if verdicts:
        lines += ["", "**Targets:**", "",
                  table(["target", "measured", "met?"],
                        [[v["target"], v["measured"], ("**met**" if v["met"] else f"**missed** ({v['ratio']:.2f}× the target)")]
                         for v in verdicts])]
    return lines


def sec_forwarding(doc, seed, docs=None, before=None):
    """Issue 7 item 6: each target, the figure before the server work (bench/results/before/), the figure of
    this run, met or not."""
    docs, before = docs or {}, before or {}
    lines = []
    if doc:
        prm = doc["params"]
        lat = prm.get("latency", {})
        lines += [f"`corefarm bench suite forwarding`, one run: (1) {size(prm['size'])} inputs and outputs, zero "
                  f"delay, one node, `bench echo`'s server against `corefarm server` with hello peers and with "
                  f"seed-format peers (`bench user --legacy`, `corefarm node --no-hello`); (2) "
                  f"{lat.get('delay_us', 919)} µs per input, {lat.get('nodes', 4)} nodes, {size(lat.get('input_size', 0))} "
                  f"inputs, {size(lat.get('output_size', 0))} outputs. {prm['duration_s']:g} s measured per run, "
                  f"{prm['runs']} runs per point. CPU is each server process's utime + stime from /proc over the "
                  f"measurement window; CPU-s/GB = CPU-seconds per decimal GB forwarded (inputs + outputs) or "
                  f"echoed.", ""]
        pts = doc["points"]
        echo = next((p for p in pts if p["key"].get("part") == "echo" and p["status"] == "ok"), None)
        e = mean(echo, "server_cpu_s_per_gb") if echo else None
        rows = []
        for p in pts:
            k = p["key"]
            who = {"echo": "bench echo", "cpu": f"{k.get('peers')} peers", "latency": f"{k.get('user')} user"}.get(
                k.get("part"), "?")
            if p["status"] != "ok":
                rows.append([k.get("part"), k.get("policy", ""), who, k.get("nodes", ""), k.get("delay_us", ""),
                             status_cell(p)] + [""] * 7)
                continue
            thr = (with_spread(p, "throughput_bps", bps) + " each way" if k.get("part") == "echo"
                   else f"{with_spread(p, 'input_bps', bps)} in, {bps(mean(p, 'output_bps'))} out")
            f = mean(p, "server_cpu_s_per_gb")
            rows.append([k.get("part"), k.get("policy", ""), who, k.get("nodes", 1), k.get("delay_us", 0), thr,
                         f"{mean(p, 'server_cpus'):.2f}" if mean(p, "server_cpus") is not None else "-",
                         cpu_gb(p), f"×{f / e:.2f}" if f is not None and e else "-",
                         f"{mean(p, 'node_cpus'):.2f}" if mean(p, "node_cpus") is not None else "-",
                         ms(mean(p, "latency_p50_ms")) if k.get("part") != "echo" else "",
                         ms(mean(p, "latency_p99_ms")) if k.get("part") != "echo" else "",
                         f"{mean(p, 'inputs_per_s') / (k['nodes'] * 1e6 / k['delay_us']) * 100:.1f} %"
                         if k.get("delay_us") and mean(p, "inputs_per_s") else ""])
        lines += [table(["part", "policy", "peers", "nodes", "delay µs", "throughput", "server CPUs",
                         "server CPU-s/GB", "× echo", "node CPUs", "p50", "p99", "of capacity"], rows)]
    # Targets: this run beside the recorded "before" run.
    now = {v["id"]: v for v in suite.forwarding_verdicts(doc["points"])} if doc else {}
    bdoc = before.get("forwarding")
    then = {v["id"]: v for v in suite.forwarding_verdicts(bdoc["points"])} if bdoc else {}
    rows = []
    for vid in list(now) + [v for v in then if v not in now]:
        v = now.get(vid) or then[vid]
        rows.append([v["target"], then[vid]["measured"] if vid in then else "-",
                     now[vid]["measured"] if vid in now else "-",
                     ("**met**" if now[vid]["met"] else "**not met**") if vid in now else "not measured"])
    cq_now = suite.credit_below_queue(docs["server"]) if docs.get("server") else None
    cq_then = suite.credit_below_queue(before["server"]) if before.get("server") else None

    def cq_text(cq):
        if cq is None:
            return "-"
        if not cq["below"]:
            return f"never below ({cq['compared']} points)"
        return f"below at {len(cq['below'])} of {cq['compared']} points (worst ×" \
               f"{min(b['ratio'] for b in cq['below']):.2f})"
    if cq_now or cq_then:
        rows.append(["`server` grid: credit never below queue (beyond max(2 %, spread)), same run",
                     cq_text(cq_then), cq_text(cq_now),
                     ("**met**" if not cq_now["below"] else "**not met**") if cq_now else "not measured"])
    if rows:
        src = (f"before: `{before['_path']}`" if before.get("_path") else "no before run recorded")
        lines += ["", f"**Issue 7 targets** ({src}; now: this document's results):", "",
                  table(["target", "before", "now", "met?"], rows)]
    if cq_now and cq_now["below"]:
        lines += ["", "Grid points where credit is below queue beyond the noise: " + "; ".join(
            f"{b['peers']} peers, {b['nodes']} node(s), {size(b['input_size'])} × {b['count']}: "
            f"{bps(b['credit_bps'])} vs {bps(b['queue_bps'])}" for b in cq_now["below"]) + "."]
    return lines


def load_before(path: Path) -> dict:
    """Result files of the run recorded before a change (bench/results/before/), keyed by experiment."""
    out = {}
    if path.is_dir():
        for f in sorted(path.glob("*.json")):
            try:
                d = json.loads(f.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if isinstance(d, dict) and d.get("experiment"):
                out[d["experiment"]] = d
        if out:
            try:
                out["_path"] = path.resolve().relative_to(ROOT).as_posix()
            except ValueError:
                out["_path"] = path.name
    return out


def sec_cluster(doc, seed):
    c = seed["cluster"]
    lines = [f"**Seed ({c['ref']}):** {c['text']}"]
    by = {}
    if doc:
        for p in doc["points"]:
            k = p["key"]
            by[(k["test"], k["count"], k["rate_hz"], k["nodes"])] = p
    for tab, count in (("table_4_1", 1), ("table_4_2", 4)):
        t = c[tab]
        seed_rows = {r["nodes"]: r for r in t["rows"]}
        ours = {n: p for (test, cnt, rate, n), p in by.items() if test == "unthrottled" and cnt == count}
        nodes = sorted(set(seed_rows) | set(ours))
        rows = []
        for n in nodes:
            sr, p = seed_rows.get(n), ours.get(n)
            rows.append([n, bps(sr["bps"]) if sr else "", ms(sr["latency_avg_ms"]) if sr else "",
                         with_spread(p, "input_bps", bps) if p and p["status"] == "ok" else (status_cell(p) if p else ""),
                         with_spread(p, "latency_avg_ms", ms) if p and p["status"] == "ok" else ""])
        lines += ["", f"**{t['ref']}** — {count} input(s) per message, unthrottled; seed delay {t['delay_us']} µs, corefarm 919 µs (the issue's value):", "",
                  table(["nodes", "seed throughput", "seed avg latency", "corefarm throughput", "corefarm avg latency"],
                        rows)]
    for tab, metric, fmt in (("table_4_3", "input_bps", bps), ("table_4_4", "latency_avg_ms", ms)):
        t = c[tab]
        rates = t["rates_hz"]
        col = "bps" if metric == "input_bps" else "latency_avg_ms"
        seed_rows = {r["nodes"]: r[col] for r in t["rows"]}
        our_nodes = {n for (test, _, _, n) in by if test == "rate"}
        our_rates = sorted({r for (test, _, r, _) in by if test == "rate"})
        rows = []
        for n in sorted(set(seed_rows) | our_nodes):
            row = [n]
            for r in rates:
                cell = fmt(seed_rows[n][str(r)]) if n in seed_rows else ""
                p = by.get(("rate", 1, r, n))
                if p is not None:
                    cell += f" / **{with_spread(p, metric, fmt) if p['status'] == 'ok' else p['status']}**"
                row.append(cell)
            rows.append(row)
        extra = [r for r in our_rates if r not in rates]
        lines += ["", f"**{t['ref']}** — 1 input per message, limited rate, delay {t['delay_us']} µs "
                      f"(cells: seed / **corefarm**):", "",
                  table(["nodes"] + [f"{r / 1000:g} kHz" for r in rates], rows)]
        if extra:
            lines.append(f"(corefarm also measured rates {extra} Hz; see cluster.csv.)")
    return lines


def sec_software(doc, seed):
    s, sp = seed["software"], seed["speedups"]
    lines = [f"**Seed ({s['ref']}):** {s['text']}.", "",
             f"**Seed speedups ({sp['ref']}):** " + ", ".join(f"{r['nodes']} nodes ×{r['speedup']}" for r in sp["rows"])]
    if doc:
        for p in doc["points"]:
            if p["status"] == "ok":
                b = mean(p, "input_bytes_per_s")
                lines += ["", f"**corefarm machine, same algorithm (`bench/software/matmul.cpp`, c++ -O3):** "
                              f"{b / 1e6:.0f} MB/s of input ({with_spread(p, 'us_per_multiplication', lambda v: f'{v:.1f} µs')} "
                              f"per multiplication)."]
            else:
                lines += ["", f"**corefarm:** {status_cell(p)}"]
        speed = doc["params"].get("speedups") or []
        if speed:
            seed_sp = {r["nodes"]: r["speedup"] for r in sp["rows"]}
            rows = [[r["nodes"], bps(r["cluster_bps"]), f"×{r['speedup']:.2f}",
                     f"×{seed_sp[r['nodes']]}" if r["nodes"] in seed_sp else ""] for r in speed]
            lines += ["", table(["nodes", "cluster throughput (4 inputs/msg)", "corefarm speedup", "seed speedup"], rows)]
        else:
            lines += ["", "No speedup table: the cluster experiment had no successful 4-input unthrottled point."]
    return lines


SECTIONS = {"headline": sec_headline, "forwarding": sec_forwarding, "policies": sec_policies, "echo": sec_echo, "server": sec_server, "node": sec_node, "node-matmul": sec_node_matmul,
            "cluster": sec_cluster, "software": sec_software}

READINGS = {
    "policies": "queue vs stack vs credit when every node is busy.",
    "headline": "whether the targets are met, by how much, and why.",
    "forwarding": "where the server's CPU per byte goes compared with the echo server, and what changed since "
                  "the before run.",
    "echo": "where the plateau starts on this machine and how it compares with the seed's 16 Gbit/s "
            "(the seed had 4 cores / 8 threads; here client and server share 2 cores).",
    "server": "queue vs stack vs credit at 2-4 nodes, the best message size, and whether the seed's "
              "256-512 KB optimum holds.",
    "node": "the growth of throughput with data size and the value at 128 KiB against the seed's 393 Mbit/s "
            "(the seed's node was an ARM board; here the node runs on the server's machine).",
    "node-matmul": "how throughput grows with cores and inputs per message, where it peaks, against the seed's "
                   "34 MB/s at 5 cores x 4 inputs.",
    "cluster": "the node count where throughput saturates and latency drops, for 1 and 4 inputs, and the "
               "server overhead when processing matches the offered rate (seed: ~283 µs). With 2 cores the "
               "saturation comes far earlier than the seed's 24-36 nodes.",
    "software": "the software baseline is a modern vectorising compiler on this CPU, so the speedup ratios are "
                "not comparable one-to-one with the seed's.",
}


def render(results: Path, out: Path, figures: Path, seed: dict, readings: dict | None = None,
           before: Path | None = None) -> str:
    readings = readings or {}
    before_docs = load_before(before if before is not None else HERE / "results" / "before")
    docs = {}
    for name in ORDER:
        f = results / f"{name}.json"
        if f.exists():
            docs[name] = json.loads(f.read_text())
    machine = next((d["machine"] for d in docs.values() if d.get("machine")), {})
    quick = any(d.get("quick") for d in docs.values())
    figures.mkdir(parents=True, exist_ok=True)
    rel = Path(os.path.relpath(figures, out.parent))
    L = ["# corefarm benchmarks", "",
         "<!-- Generated by bench/report.py from suite results; edit the generator, not this file. -->", "",
         "Reproduce with `python3 bench/suite.py all [--quick]` (or `corefarm bench suite all`), then "
         "`python3 bench/report.py`. Compare two runs with `corefarm bench compare OLD.json NEW.json`. "
         "One experiment alone: `corefarm bench suite headline` (issues 2 and 3), `forwarding` (issue 7), `node`, "
         "`node-matmul`, ….", "",
         *targets_summary(),
         "## Tools", "",
         "- `corefarm bench echo [server --listen A | client --addr A] --size B --clients N --duration S [--json]`: "
         "SMP echo; throughput = echoed payload bits/s, all clients together. `--cpu-pid LABEL=PID` "
         "(repeatable, also on `bench user`): the benchmark samples that process's (and its descendants') "
         "utime + stime from /proc at the start and the end of its measurement window and reports "
         "`cpu[{label, pid, cpu_s, user_s, sys_s, wall_s, cpus, processes}]`; the suite passes the server's pid "
         "and records `server_cpus`, `server_cpu_s` and `server_cpu_s_per_gb` (CPU-seconds per decimal GB "
         "forwarded, inputs + outputs, or echoed).",
         "- `corefarm bench user --server A --input-size B --output-size B --delay-us U --count K --duration S "
         "[--warmup S] [--rate-hz F] [--nodes N | --legacy] [--drain-timeout S] [--json] [--quiet]`: the "
         "benchmarking user. Each input carries `u64 send-time ns, u32 id, u32 index` in its first 16 bytes; "
         "latency is per message, from the echoed timestamp, over messages sent after the warm-up; throughput "
         "counts results received inside the window (`input_bps` = input payload processed, the seed's "
         "definition; `output_bps` = output payload returned). Exit status 1 if a result is missing, "
         "corrupted, failed, or the run hangs.",
         "- `--json` prints `{benchmark, ok, errors[], server, config{input_size, output_size, delay_us, count, "
         "message_bytes, duration_s, warmup_s, rate_hz, nodes_requested, legacy}, session{hello, nodes, "
         "features[], credit}, window_s, counts{sent_messages, sent_inputs, received_messages, received_outputs, "
         "window_messages, missing, corrupted, failed}, throughput{input_bps, output_bps, offered_input_bps, "
         "messages_per_s, inputs_per_s, send_rate_hz}, latency{samples, avg_ms, min_ms, p50_ms, p90_ms, p99_ms, "
         "max_ms}}`.",
         "- `corefarm bench node [--no-spawn] [--node-arg A] --input-size B [--output-size B] --count K "
         "--window W --duration S [--json]`: the node manager isolated (seed §4.2.3). It listens on 127.0.0.1:0 "
         "as a server node port, starts one `corefarm node --server ADDR --once` (or waits for one), sends the "
         "benchmarking configuration with delay 0 and streams data messages straight to the node from a sender "
         "thread, at most W in flight, while a receiver thread checks every result; same report as `bench user`.",
         "- `corefarm demo --target native|rtl --nodes N --cores C --count K --jobs J --json`: real 64×64 "
         "matrix products (K per data message) through an embedded server and N node managers, every result "
         "checked, with the software baseline and (RTL) simulated cycles/s measured in the same run.",
         "- `corefarm bench compare OLD.json NEW.json [--threshold 0.05] [--json]`: a metric regresses when it "
         "moves the wrong way by more than max(threshold, (max−min)/mean of either recording); exit 1 on any "
         "regression or newly failed point.",
         "- Suite result files: `{experiment, quick, machine, params, notes, points: [{key, status: "
         "ok|failed|skipped, reason, runs, metrics: {name: {runs, mean, min, max, stdev}}}]}` plus a CSV.", "",
         "## Machines", "",
         table(["", "seed 000 (§4.1)", "corefarm results below"], [
             ["CPU", f"{seed['machine']['cpu']}, {seed['machine']['cores']} cores / {seed['machine']['threads']} threads",
              f"{machine.get('cpu', '?')}, {machine.get('nproc', '?')} logical CPUs"],
             ["memory", seed["machine"]["memory"],
              f"{machine['memory_bytes'] / 2**30:.0f} GiB" if machine.get("memory_bytes") else "?"],
             ["kernel", f"Linux {seed['machine']['kernel']}", f"{machine.get('os', '')} {machine.get('kernel', '?')}"],
             ["date / commit", "2022", f"{machine.get('date', '?')} / `{(machine.get('git_commit') or '?')[:12]}`"],
         ]), "",
         "The seed ran everything (user, server, up to 4 simulation nodes) on 4 cores / 8 threads and kept one "
         "thread each for the server and the user. This machine has 2 logical CPUs shared by the user, the "
         "server and every simulated node, so absolute numbers are lower and saturate earlier; the shapes "
         "of the curves are what compares.", ""]
    run = {}
    if (results / "run.json").exists():
        run = json.loads((results / "run.json").read_text())
    if run:
        L += ["## This run", "",
              f"`{run['command']}` with `COREFARM_BIN` = a release build of commit "
              f"`{(machine.get('git_commit') or '?')[:12]}`: {len(run.get('experiments', []))} experiments in "
              f"{run['total_s'] / 60:.1f} minutes (load waits included), {run['failed_points']} failed point(s).", "",
              "Reproduce (the `--compact` sweeps keep the whole run near 25 minutes on 2 CPUs; without it the "
              "suite runs the seed's full grids, many hours):", "",
              "```sh",
              "cargo build --release -p corefarm-cli",
              "target/release/corefarm bench suite all --out bench/results -- --compact --runs 2 --duration 2 "
              "--warmup 0.5 --wait-load 0.7 --wait-between 30",
              "# issue 2/3 table and the busy-node policy comparison alone (both re-measured after the run):",
              "target/release/corefarm bench suite headline --out DIR -- --runs 3 --duration 2 --warmup 0.5 --wait-load 0.7",
              "target/release/corefarm bench suite policies --out DIR -- --runs 3 --duration 2 --warmup 0.5 --wait-load 0.7",
              "python3 bench/report.py --results bench/results",
              "```", ""]
    loads = [[n, d["load"].get("load_at_start", ["?"])[0], d["load"].get("load_at_end", ["?"])[0],
              f"{d['load'].get('waited_s', 0):.0f} s", f"{d.get('elapsed_s', 0):.0f} s"]
             for n, d in docs.items() if d.get("load")]
    if loads:
        L += ["1-minute load average when each experiment started and ended, and how long the suite waited "
              "for it to fall below the threshold first. The suite itself keeps 1-2 CPUs busy and the 1-minute "
              "average decays over minutes, so a load above the threshold at the start of a later experiment "
              "(the wait between experiments is capped) is mostly the previous experiment's own processes:", "",
              table(["experiment", "load at start", "load at end", "waited", "duration"], loads), ""]
    if quick:
        L += ["**These are `--quick` results** (short runs, few points, one run per point): they show the "
              "harness works end to end, not the system's performance.", ""]
    if not docs:
        L += [PLACEHOLDER + "no suite results found; run the suite first.", ""]
    for name in ORDER:
        L += [f"## {TITLES[name]}", ""]
        doc = docs.get(name)
        L += (sec_forwarding(doc, seed, docs, before_docs) if name == "forwarding" else SECTIONS[name](doc, seed))
        if doc:
            for note in doc.get("notes", []):
                L += ["", f"_Note:_ {note}"]
            for fname in FIGURES.get(name, []):
                png = results / fname
                if png.exists():
                    shutil.copy2(png, figures / fname)
                elif not (figures / fname).exists():
                    continue  # committed results keep their plots in the figures directory only
                L += ["", f"![{Path(fname).stem}]({(rel / fname).as_posix()})"]
        else:
            L += ["", "_Not run._"]
        text = readings.get(name)
        if isinstance(text, list):
            text = "\n\n".join(text)
        L += ["", "**Reading.**", "", text if text else PLACEHOLDER + READINGS[name], ""]
    # Measurements made outside the suite (e.g. the metrics overhead) keep
    # their hand-written sections in bench/manual/, appended in name order.
    for extra in sorted((ROOT / "bench/manual").glob("*.md")):
        L += [extra.read_text().rstrip(), ""]
    return "\n".join(L).rstrip() + "\n"


def targets_summary() -> list[str]:
    """The hand-kept table of round-2 targets (bench/targets.md), right after the introduction."""
    p = HERE / "targets.md"
    return [p.read_text().rstrip(), ""] if p.exists() else []


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=str(ROOT / "bench-results"))
    ap.add_argument("--out", default=str(ROOT / "docs/benchmarks.md"))
    ap.add_argument("--figures", default=str(HERE / "figures"), help="where plots are copied for the document")
    ap.add_argument("--seed", default=str(HERE / "seed_figures.json"))
    ap.add_argument("--before", default=str(HERE / "results" / "before"),
                    help="results of the run before a change, shown beside this run's in the issue 7 targets")
    ap.add_argument("--readings", default=str(HERE / "readings.json"),
                    help="hand-written reading paragraphs per experiment, written from the results they describe")
    a = ap.parse_args(argv)
    seed = json.loads(Path(a.seed).read_text())
    out = Path(a.out).resolve()
    rp = Path(a.readings)
    readings = json.loads(rp.read_text()) if rp.exists() else {}
    text = render(Path(a.results), out, Path(a.figures).resolve(), seed, readings, Path(a.before))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
