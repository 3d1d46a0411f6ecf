#!/usr/bin/env python3
"""Writes docs/benchmarks.md from the committed suite results and the seeds' numbers.

    python3 bench/report.py [--results bench/results] [--out docs/benchmarks.md] [--figures bench/figures]

Every table in the document comes from a result file (bench/results/*.json)
and bench/seed_figures.json; the only hand-written text is the short reading
per experiment (bench/readings.json). The output depends on nothing but those
files, so running it twice gives the same document.
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

ORDER = ["headline", "forwarding", "seedpeers", "echo", "server", "window", "policies", "node", "node-matmul", "cluster", "software",
         "collectives", "direct", "sharing", "streams", "irq", "hang", "soak", "scale"]
TITLES = {
    "headline": "Headline: the user through the server, and matrix multipliers per node",
    "forwarding": "Forwarding cost and latency targets",
    "seedpeers": "The seed's own peers: corefarm's server beside the seed's",
    "echo": "SMP echo (seed §4.2.1, figure 4.1)",
    "server": "Server, zero-delay benchmarking configuration (seed §4.2.2, figures 4.3 and 4.4)",
    "window": "The adaptive window against fixed ones, runs long enough to judge",
    "policies": "Policies when the nodes are the bottleneck (seed §4.2.2's queue-vs-stack finding)",
    "node": "Load-free node manager, isolated (seed §4.2.3, figure 4.5)",
    "node-matmul": "Node with matrix-multiplier cores (seed §4.4.1, figure 4.10)",
    "cluster": "Simulated matrix-multiplier cluster (seed §4.4.2, tables 4.1-4.4)",
    "software": "Software baseline and speedups (seed §4.5, §4.6)",
    "collectives": "Group collectives against Open MPI (seed 003)",
    "direct": "A group's direct data path against the path through the server",
    "sharing": "Shared nodes (seed 002 §5.5)",
    "streams": "Streams: priority classes, head-of-line blocking, overlap",
    "irq": "FPGA cores: completion by interrupt against polling",
    "hang": "A hung node: one node SIGSTOPped under load",
    "soak": "Soak: one hour of every fault kind",
    "scale": "One server at thousands of nodes: memory, fan-out, status and the scheduler",
}
# Sections shown even without a result (`suite.py all` runs them); the others appear once measured.
ALWAYS = [n for n in ORDER if n in suite.EXPERIMENTS]
PLACEHOLDER = "> **TODO (reading needs full-run numbers):** "
# The plots each experiment writes (bench/plots.py), in document order.
FIGURES = {
    "headline": ["headline_user.png"],
    "forwarding": [],
    "seedpeers": [],
    "hang": [],
    "echo": ["fig4_1_echo.png"],
    "server": ["fig4_3_server_throughput.png", "fig4_4_server_latency.png"],
    "policies": [],
    "window": [],
    "node": ["fig4_5_node.png"],
    "node-matmul": ["fig4_10_node_matmul.png"],
    "cluster": ["fig4_11_cluster_throughput_count1.png", "fig4_12_cluster_latency_count1.png",
                "fig4_13_cluster_throughput_count4.png", "fig4_14_cluster_latency_count4.png",
                "fig4_15_cluster_throughput_rates.png", "fig4_16_cluster_latency_rates.png"],
    "software": ["sec4_6_speedup.png"],
    "collectives": ["collectives_vs_openmpi.png"],
    "direct": ["direct_vs_server.png"],
    "sharing": ["sharing_makespan.png", "sharing_utilisation.png", "sharing_workloads_jct.png"],
    "streams": ["streams_model.png"],
    "irq": [],
    "soak": [],
    "scale": ["scale.png"],
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
        pts = doc["points"]
        clients = sorted({p["key"]["clients"] for p in pts})
        by = {(p["key"]["size"], p["key"]["clients"]): p for p in pts}
        rows = [[size(sz)] + [("-" if (sz, c) not in by else with_spread(by[(sz, c)], "throughput_bps", bps)
                               if by[(sz, c)]["status"] == "ok" else status_cell(by[(sz, c)])) for c in clients]
                for sz in sorted({p["key"]["size"] for p in pts})]
        lines += ["", "**corefarm** (echoed payload bits/s, all clients together):", "",
                  table(["payload"] + [f"{c} client{'s' if c > 1 else ''}" for c in clients], rows)]
        ok = [p for p in pts if p["status"] == "ok"]
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
        paths = sorted({p["key"].get("path", "via-server") for p in doc["points"]})
        by = {(p["key"]["size"], p["key"].get("path", "via-server")): p for p in doc["points"]}
        rows = []
        for sz in sorted({p["key"]["size"] for p in doc["points"]}):
            row = [size(sz)]
            for path in paths:
                p = by.get((sz, path))
                if p is None or p["status"] != "ok":
                    row += [status_cell(p) if p else "-", "", ""]
                else:
                    row += [with_spread(p, "input_bps", bps), ms(mean(p, "latency_avg_ms")),
                            ms(mean(p, "latency_p99_ms"))]
            rows.append(row)
        lines += ["", "**corefarm:**", "", table(["data size"] + [f"{path} {h}" for path in paths
                                                                  for h in ("throughput", "avg", "p99")], rows)]
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
    pts = [p for p in pts if "isolation" not in p["key"]]  # points of a removed option
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
        lines += ["", "**Matrix multiplier per node against software** (`corefarm demo --json`: the same "
                      "run measures the cluster, then the software baseline — the same C++ function called in a loop "
                      "on one thread — and, for RTL, one simulated instance alone):", "",
                  table(["target", "cluster", "corefarm matrices/s per node", "software matrices/s", "ratio",
                         "p50 latency", "RTL simulated cycles/s per instance"], rows)]
    return lines


def sec_forwarding(doc, seed, docs=None):
    """What forwarding costs against the echo server, the latency targets at 919 us, and whether credit is
    ever below queue on the `server` grid; each target met or not."""
    docs = docs or {}
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
    cq = suite.credit_below_queue(docs["server"]) if docs.get("server") else None
    if cq and cq["below"]:
        lines += ["", "Grid points where credit is below queue beyond the noise: " + "; ".join(
            f"{b['peers']} peers, {b['nodes']} node(s), {size(b['input_size'])} × {b['count']}: "
            f"{bps(b['credit_bps'])} vs {bps(b['queue_bps'])}" for b in cq["below"]) + "."]
    return lines


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
        lines += ["", f"**{t['ref']}** — {count} input(s) per message, unthrottled; seed delay {t['delay_us']} µs, corefarm 919 µs (the delay of the headline targets):", "",
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


# ------------------------------------------------------------- experiments outside `all`

def sec_rtl_cores(doc) -> list[str]:
    """Both styles of the simulated matrix multiplier side by side (`corefarm bench rtl-cores`), shown in the
    node-matmul section: a few lines, as the document has a length budget."""
    if not doc:
        return []
    ok = {p["key"]["family"]: p for p in doc["points"] if p["status"] == "ok"}
    ratio = ""
    if "intel" in ok and "amd" in ok:
        r = mean(ok["amd"], "cycles_per_job") / mean(ok["intel"], "cycles_per_job")
        sp = mean(ok["amd"], "sim_cycles_per_s") / mean(ok["intel"], "sim_cycles_per_s")
        ratio = f" AMD-style ÷ Intel-style, same run: ×{r:.3f} cycles per job, ×{sp:.2f} simulated cycles/s."
    rows = []
    for p in doc["points"]:
        k = p["key"]
        if p["status"] != "ok":
            rows.append([f"{k['family']} `{k['protocol']}`", status_cell(p), "", "", ""])
            continue
        cyc, other, master = (mean(p, m) for m in ("cycles_per_job", "other_cycles", "master_busy_cycles"))
        rows.append([f"{k['family']} `{k['protocol']}`", f"{cyc:,.0f}", f"{other:,.0f} ({other / cyc * 100:.1f} %)",
                     f"{master:,.0f} ({master / cyc * 100:.1f} %)" if master is not None else "— (the host's writes)",
                     with_spread(p, "sim_cycles_per_s", lambda v: f"{v / 1e6:.2f} M")])
    return ["", "**One RTL instance per style** (`corefarm bench rtl-cores`: cores/matmul's `matmul.v`, Avalon agents "
                "the host writes A, B into and reads C from, beside `matmul_axi.v`, Vitis `ap_ctrl_hs` with an AXI4 "
                "master moving A, B and C itself in bursts to a memory model that withholds ready one cycle in four; "
                "262,144 multiply-accumulate cycles per job in both, the rest is data movement and control; the AXI "
                "master's busy cycles are its memory traffic)." + ratio, "",
            table(["core", "cycles / job", "not multiply-accumulate", "AXI master busy", "simulated cycles / s"], rows)]


COLL_BIG = 64 * 1024
COLL_TARGET_OPS = ("bcast", "reduce", "allreduce")


def us(v) -> str:
    if v is None:
        return "-"
    return f"{v / 1000:.2f} ms" if v >= 1000 else f"{v:.0f} µs"


def collectives_medians(doc) -> dict:
    """(op, algo, n, bytes) -> median latency in µs (mean over passes) and model error, of the ok points."""
    out = {}
    for p in doc["points"]:
        if p["status"] != "ok":
            continue
        k = p["key"]
        out[(k["op"], k["algo"], k["n"], k["bytes"])] = (mean(p, "median_us"), mean(p, "model_error"))
    return out


def collectives_best(m, op, n, b):
    """corefarm's fastest tree at one point, as (algo, µs), or None."""
    c = [(us_, algo) for (o, algo, nn, bb), (us_, _) in m.items()
         if (o, nn, bb) == (op, n, b) and algo != "openmpi" and us_ is not None]
    return min(c)[::-1] if c else None


def collectives_verdicts(doc) -> list[dict]:
    m = collectives_medians(doc)
    ns = sorted({k[2] for k in m})
    wins = total = 0
    for op in COLL_TARGET_OPS:
        for n in ns:
            for b in sorted({k[3] for k in m if k[3] >= COLL_BIG}):
                best, mpi = collectives_best(m, op, n, b), m.get((op, "openmpi", n, b))
                if best and mpi and mpi[0]:
                    total += 1
                    wins += best[1] <= mpi[0]
    errs = [abs(e) for (o, algo, _, _), (_, e) in m.items() if e is not None and algo != "openmpi"]
    out = []
    if total:
        out.append({"target": "bcast, reduce, allreduce no slower than Open MPI at ≥ 64 KiB",
                    "measured": f"{wins} of {total} points", "met": wins == total})
    if errs:
        within = sum(e <= 0.2 for e in errs)
        out.append({"target": "collectives model within 20 % of measurement",
                    "measured": f"{within} of {len(errs)} points, median error "
                                f"{sorted(errs)[len(errs) // 2] * 100:.0f} %", "met": within == len(errs)})
    return out


def sec_collectives(doc, seed):
    if not doc:
        return []
    prm, m = doc["params"], collectives_medians(doc)
    ns = sorted({k[2] for k in m})
    big = sorted({k[3] for k in m if k[3] >= COLL_BIG})
    lines = [f"`corefarm bench collectives` (an embedded cluster of n nodes on loopback) against Open MPI's "
             f"`osu_coll` over TCP on loopback (`bench/mpi/`), n = {', '.join(map(str, prm['nodes']))}, "
             f"{prm['runs']} passes a point, each point's median latency as the user sees it (the command goes "
             f"through the server; Open MPI's time is among the ranks only). Bytes are per rank.", "",
             "**corefarm's fastest tree ÷ Open MPI** (below 1: corefarm faster):", ""]
    rows = []
    for op in COLL_TARGET_OPS:
        for n in ns:
            row = [op, n]
            for b in big:
                best, mpi = collectives_best(m, op, n, b), m.get((op, "openmpi", n, b))
                row.append(f"{best[1] / mpi[0]:.2f} ({best[0]}, {us(best[1])})" if best and mpi and mpi[0] else "-")
            rows.append(row)
    lines += [table(["op", "n"] + [size(b) for b in big], rows)]
    sizes = sorted({k[3] for k in m if k[3] > 0})
    rows = []
    for op in COLL_TARGET_OPS:
        for n in [x for x in ns if x > 2]:
            row = [op, n]
            for b in sizes:
                lin, bi = m.get((op, "linear", n, b)), m.get((op, "binomial", n, b))
                row.append("-" if not (lin and bi and lin[0] and bi[0]) else
                           f"{'linear' if lin[0] < bi[0] else 'binomial'} {lin[0] / bi[0]:.2f}")
            rows.append(row)
    lines += ["", "**Binomial against linear** (the faster tree, and linear ÷ binomial):", "",
              table(["op", "n"] + [size(b) for b in sizes], rows)]
    rows = []
    for op in ("bcast", "reduce", "allreduce", "allgather", "barrier", "scatter", "gather", None):
        e = [abs(v) for (o, algo, _, _), (_, v) in m.items() if v is not None and algo != "openmpi"
             and (op is None or o == op)]
        if e:
            e.sort()
            rows.append([op or "all", len(e), f"{e[len(e) // 2] * 100:.0f} %", f"{sum(x <= 0.2 for x in e)}",
                         f"{e[-1] * 100:.0f} %"])
    lines += ["", "**Model error** (|predicted − measured| ÷ measured, the model calibrated in the same run):", "",
              table(["op", "points", "median", "within 20 %", "worst"], rows)]
    return lines


def direct_verdicts(doc) -> list[dict]:
    by = {(p["key"]["path"], p["key"]["nodes"]): p for p in doc["points"] if p["status"] == "ok"}
    s, d = by.get(("server", 4)), by.get(("direct", 4))
    if not (s and d):
        return []
    ratio = mean(d, "input_bps") / mean(s, "input_bps")
    cut = mean(s, "server_cpu_s_per_gb") / mean(d, "server_cpu_s_per_gb") if mean(d, "server_cpu_s_per_gb") else None
    return [{"target": "direct path at 4 nodes: ≥ the throughput through the server, server CPU per GB cut ≥ 10×",
             "measured": f"×{ratio:.1f} the throughput, server CPU per GB "
                         + (f"cut ×{cut:.0f}" if cut else "zero (no clock tick in any window)"),
             "met": ratio >= 1 and (cut is None or cut >= 10)}]


def sec_direct(doc, seed):
    if not doc:
        return []
    prm = doc["params"]
    by = {(p["key"]["path"], p["key"]["nodes"]): p for p in doc["points"]}
    rows = []
    for n in prm["nodes"]:
        s, d = by.get(("server", n)), by.get(("direct", n))
        ok = s and d and s["status"] == d["status"] == "ok"
        rows.append([n, with_spread(s, "input_bps", bps) if s else "-", cpu_gb(s) if s else "-",
                     with_spread(d, "input_bps", bps) if d else "-", cpu_gb(d) if d else "-",
                     f"×{mean(d, 'input_bps') / mean(s, 'input_bps'):.1f}" if ok else "-"])
    return [f"For each node count, on one cluster and back to back: `corefarm bench user --nodes N` (data through "
            f"the server) and `corefarm bench direct --nodes N` (a group of N; each message goes to a member's peer "
            f"port), benchmarking core at zero delay, {size(prm['input_size'])} inputs, {size(prm['output_size'])} "
            f"outputs, {prm['runs']} runs of {prm['duration_s']:g} s. Server CPU-s/GB counts inputs plus outputs.",
            "", table(["nodes", "through the server", "server CPU-s/GB", "direct", "server CPU-s/GB", "direct ÷ server"],
                      rows)]


SHARING_VARIANTS = ("exclusive", "static", "shared", "cowork")


def sharing_grid(doc) -> dict:
    return {(p["key"]["part"], p["key"]["period_ms"], p["key"]["apps"], p["key"]["speedup"], p["key"]["variant"]): p
            for p in doc["points"] if p["status"] == "ok"}


def sharing_verdicts(doc) -> list[dict]:
    g, prm = sharing_grid(doc), doc["params"]
    sp = prm.get("main_speedup", 2)
    out = []
    util = {v: mean(g[k], "utilisation") for v in ("exclusive", "static", "shared")
            for k in [("single", 10, max(prm["apps"]), sp, v)] if k in g}
    if util:
        out.append({"target": f"single-function utilisation ≥ 93 % ({max(prm['apps'])} applications, P = 10 ms)",
                    "measured": ", ".join(f"{v} {u * 100:.1f} %" for v, u in util.items()),
                    "met": all(u >= 0.93 for u in util.values())})
    one, more, cow = [], [], []
    for per in prm["periods_ms"]:
        for apps in prm["apps"]:
            ex, sh = g.get(("grid", per, apps, sp, "exclusive")), g.get(("grid", per, apps, sp, "shared"))
            co, sw = g.get(("grid", per, apps, sp, "cowork")), g.get(("grid", 0, apps, sp, "software"))
            if ex and sh:
                r = mean(sh, "makespan_s") / mean(ex, "makespan_s")
                (one if apps == 1 else more).append(r)
            if co and sw and sh:
                cow.append(mean(co, "makespan_s") / min(mean(sw, "makespan_s"), mean(sh, "makespan_s")))
    if one:
        out.append({"target": "shared makespan no worse than exclusive for one application (5 % noise)",
                    "measured": ", ".join(f"{r:.2f}" for r in one), "met": all(r <= 1.05 for r in one)})
    if more:
        out.append({"target": "shared makespan below exclusive for ≥ 2 applications",
                    "measured": f"below at {sum(r < 1 for r in more)} of {len(more)} points",
                    "met": all(r < 1 for r in more)})
    if cow:
        out.append({"target": "co-working within 10 % of the better of all-local and all-cluster",
                    "measured": f"{sum(r <= 1.1 for r in cow)} of {len(cow)} points (worst {max(cow):.2f})",
                    "met": all(r <= 1.1 for r in cow)})
    return out


def sec_sharing(doc, seed):
    if not doc:
        return []
    g, prm = sharing_grid(doc), doc["params"]
    sp = prm.get("main_speedup", 2)
    rows = []
    for per in prm["periods_ms"]:
        for apps in prm["apps"]:
            row = [per, apps]
            for v in SHARING_VARIANTS:
                p = g.get(("grid", per, apps, sp, v))
                row.append(f"{mean(p, 'normalised_makespan'):.2f} ({mean(p, 'utilisation') * 100:.0f} %)" if p else "-")
            sw = g.get(("grid", 0, apps, sp, "software"))
            ex, sh = g.get(("grid", per, apps, sp, "exclusive")), g.get(("grid", per, apps, sp, "shared"))
            co = g.get(("grid", per, apps, sp, "cowork"))
            row.append(f"{mean(sw, 'normalised_makespan'):.2f}" if sw else "-")
            row.append(f"{mean(sh, 'makespan_s') / mean(ex, 'makespan_s'):.2f}" if ex and sh else "-")
            row.append(f"{mean(co, 'makespan_s') / min(mean(sw, 'makespan_s'), mean(sh, 'makespan_s')):.2f}"
                       if co and sw and sh else "-")
            rows.append(row)
    return [f"`corefarm bench sharing`: concurrent applications calling 16 functions on {prm['nodes']} simulated "
            f"nodes, monitoring period P with a reconfiguration delay of P, hardware speedup {sp}, {prm['runs']} "
            f"runs a point, the variants of a point run back to back. Cells: makespan normalised to the expected "
            f"software time (node utilisation). Shared ÷ exclusive and co-working ÷ the better of all-local "
            f"(software) and all-cluster (shared) compare makespans.", "",
            table(["P ms", "apps"] + list(SHARING_VARIANTS) + ["software", "shared ÷ exclusive",
                                                                "cowork ÷ better"], rows)]


WORKLOAD_MODES = ("exclusive", "static", "shared", "cowork")
# Student's t at 97.5 % by degrees of freedom: the 95 % interval of a mean over a few seeds.
T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 11: 2.20,
        12: 2.18, 13: 2.16, 14: 2.14, 15: 2.13, 16: 2.12, 20: 2.09, 30: 2.04}


def mean_interval(xs: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % interval (Student's t; 0 for one value)."""
    n = len(xs)
    m = sum(xs) / n
    if n < 2:
        return m, 0.0
    sd = (sum((x - m) ** 2 for x in xs) / (n - 1)) ** 0.5
    t = T975.get(n - 1) or T975[max(k for k in T975 if k <= n - 1)]
    return m, t * sd / n ** 0.5


def workload_points(doc) -> dict:
    return {(p["key"]["workload"], p["key"]["reconfigure_ms"], p["key"]["mode"]): p
            for p in doc["points"] if p["status"] == "ok" and p["key"].get("part") == "workload"}


def workload_capture(doc) -> list[dict]:
    """Per workload and R: the model's gain of its best placement over exclusive on the mean call completion
    time, shared mode's measured gain (ratio of the means over the seeds, and the mean and interval of the
    per-seed gains) and the share of the model's gain it captures."""
    g = workload_points(doc)
    out = []
    for w in doc["params"]["workloads"]:
        for r in doc["params"]["reconfigure_ms"]:
            ex, sh = g.get((w, r, "exclusive")), g.get((w, r, "shared"))
            if not ex or not sh:
                continue
            model = ex["model"]
            best = min(model[p]["jct_mean_s"] for p in ("exclusive", "static", "pool", "fair"))
            model_gain = 1 - best / model["exclusive"]["jct_mean_s"]
            gain = 1 - mean(sh, "jct_mean_ms") / mean(ex, "jct_mean_ms")
            by_seed = {x["seed"]: x["jct_mean_ms"] for x in ex["per_seed"]}
            paired = [1 - x["jct_mean_ms"] / by_seed[x["seed"]] for x in sh["per_seed"] if x["seed"] in by_seed]
            pm, half = mean_interval(paired)
            out.append({"workload": w, "r": r, "model_exclusive_ms": model["exclusive"]["jct_mean_s"] * 1e3,
                        "model_best_ms": best * 1e3, "model_gain": model_gain,
                        "exclusive_ms": mean(ex, "jct_mean_ms"), "shared_ms": mean(sh, "jct_mean_ms"),
                        "gain": gain, "paired": pm, "half": half, "seeds": len(paired),
                        "capture": gain / model_gain if model_gain > 0.05 else None})
    return out


def seed_part(doc) -> list[dict]:
    """Seed 002 §5.5's workload: shared ÷ exclusive makespan per seed, its mean and 95 % interval."""
    pts = {(p["key"]["apps"], p["key"]["mode"]): p for p in doc["points"]
           if p["status"] == "ok" and p["key"].get("part") == "seed"}
    out = []
    for apps in doc["params"].get("seed_part", {}).get("apps", []):
        ex, sh = pts.get((apps, "exclusive")), pts.get((apps, "shared"))
        if not ex or not sh:
            continue
        by_seed = {x["seed"]: x["makespan_s"] for x in ex["per_seed"]}
        ratios = [x["makespan_s"] / by_seed[x["seed"]] for x in sh["per_seed"] if x["seed"] in by_seed]
        m, half = mean_interval(ratios)
        out.append({"apps": apps, "exclusive_s": mean(ex, "makespan_s"), "shared_s": mean(sh, "makespan_s"),
                    "ratio": m, "half": half, "seeds": len(ratios)})
    return out


def sharing_workloads_verdicts(doc) -> list[dict]:
    """One row (docs/benchmarks.md is capped at 600 lines): the model's gain captured at every workload and R,
    and seed 002 §5.5's shared ÷ exclusive makespan."""
    caps = workload_capture(doc)
    judged = [c for c in caps if c["capture"] is not None]
    sp = seed_part(doc)
    if not caps and not sp:
        return []
    measured = []
    if caps:
        measured.append(f"captured at {sum(c['capture'] >= 0.7 for c in judged)} of {len(judged)} workload × R "
                        f"points (worst {min(c['capture'] for c in judged) * 100:.0f} %)" if judged else "no gain")
    if sp:
        measured.append("§5.5 shared ÷ exclusive " + ", ".join(f"{s['apps']} apps {s['ratio']:.3f} ± {s['half']:.3f}"
                                                              for s in sp) + f" (95 %, {sp[0]['seeds']} seeds)")
    return [{"target": "multi-tenant workloads: shared mode captures ≥ 70 % of the overhead-free model's gain over "
                       "exclusive (mean call completion); seed 002 §5.5: shared makespan within 3 % of exclusive",
             "measured": "; ".join(measured),
             "met": all(c["capture"] >= 0.7 for c in judged) and all(s["ratio"] <= 1.03 for s in sp)}]


def sec_sharing_workloads_short(doc) -> list[str]:
    """The multi-tenant workloads in docs/benchmarks.md: one row per workload, the header saying what the cells
    are (the document is capped at 600 lines; `report.py --sharing-workloads` prints every table, for
    docs/sharing.md)."""
    if not doc:
        return []
    caps = {(c["workload"], c["r"]): c for c in workload_capture(doc)}
    rs = doc["params"]["reconfigure_ms"]
    rows = [[f"`{w}`"] + [(f"{c['exclusive_ms']:.0f} → {c['shared_ms']:.0f} ms ({c['model_gain'] * 100:.0f} %, "
                           f"{c['capture'] * 100:.0f} %)" if c["capture"] is not None else
                           f"{c['exclusive_ms']:.0f} → {c['shared_ms']:.0f} ms (no gain)") if c else "-"
                          for c in (caps.get((w, r)) for r in rs)] for w in doc["params"]["workloads"]]
    head = (f"multi-tenant workload (`bench suite sharing-workloads`, {len(doc['params']['seeds'])} seeds; "
            "docs/sharing.md): mean call completion, exclusive → shared (the overhead-free model's gain, share "
            "of it captured)")
    return ["", table([head] + [f"R = {r} ms" for r in rs], rows)]


def sec_sharing_workloads(doc, seed):
    if not doc:
        return []
    g, prm = workload_points(doc), doc["params"]
    L = [f"`corefarm bench sharing --workload NAME`: {prm['nodes']} simulated nodes, monitoring period "
         f"{prm['period_ms']} ms, programming time R, calls cut into at most {prm['jobs']} messages, the "
         f"server's `--user-idle-timeout` {prm['user_idle_timeout_s']} s; co-working at speedup "
         f"{prm['cowork_speedup']}. One run per seed ({len(prm['seeds'])} seeds), the four modes of a seed run back "
         "to back. The workloads (docs/sharing.md): `arrivals`, Poisson users over 32 Zipf-popular functions with "
         "heavy-tailed calls; `bursts`, 4 users each owning 2 nodes in exclusive mode, on/off; `zipf64`, "
         "arrivals over 64 functions, flatter popularity.", "",
         "**Calls' completion time** (mean / p50 / p99 over every call of every seed's run, ms):", ""]
    rows = []
    for w in prm["workloads"]:
        for r in prm["reconfigure_ms"]:
            row = [w, r]
            for m in WORKLOAD_MODES:
                p = g.get((w, r, m))
                row.append(f"{mean(p, 'jct_mean_ms'):.1f} / {mean(p, 'jct_p50_ms'):.1f} / {mean(p, 'jct_p99_ms'):.0f}"
                           if p else "-")
            rows.append(row)
    L += [table(["workload", "R ms"] + list(WORKLOAD_MODES), rows), "",
          "**The cluster**: makespan in s (node utilisation = node work ÷ (nodes × makespan); reprogrammings "
          "per second):", ""]
    rows = []
    for w in prm["workloads"]:
        for r in prm["reconfigure_ms"]:
            row = [w, r]
            for m in WORKLOAD_MODES:
                p = g.get((w, r, m))
                row.append(f"{mean(p, 'makespan_s'):.2f} ({mean(p, 'utilisation') * 100:.0f} %, "
                           f"{mean(p, 'reprogrammings_per_s'):.1f}/s)" if p else "-")
            rows.append(row)
    L += [table(["workload", "R ms"] + list(WORKLOAD_MODES), rows), "",
          "**Against the overhead-free model** (bench/sharing_bound.py `--workloads`, the same seeds): its "
          "exclusive mode and its best placement (mean call completion, ms), the gain that placement has over "
          "exclusive, shared mode's measured gain (ratio of the means; in brackets the mean of the per-seed "
          "gains ± its 95 % interval) and the share of the model's gain it captures.", ""]
    rows = [[c["workload"], c["r"], f"{c['model_exclusive_ms']:.1f}", f"{c['model_best_ms']:.1f}",
             f"{c['model_gain'] * 100:.0f} %", f"{c['exclusive_ms']:.1f}", f"{c['shared_ms']:.1f}",
             f"{c['gain'] * 100:.0f} % ({c['paired'] * 100:.0f} ± {c['half'] * 100:.0f} %)",
             f"{c['capture'] * 100:.0f} %" if c["capture"] is not None else "no gain"] for c in workload_capture(doc)]
    L += [table(["workload", "R ms", "model exclusive", "model best", "model gain", "exclusive", "shared",
                 "shared's gain", "captured"], rows)]
    sp = seed_part(doc)
    if sp:
        sprm = prm["seed_part"]
        L += ["", f"**Seed 002 §5.5's workload** (unchanged: equal, always-busy applications, {sprm['functions']} "
                  f"functions, {sprm['calls']} calls of mean size each, P = R = {sprm['period_ms']} ms), exclusive "
                  "and shared run back to back per seed; shared ÷ exclusive makespan, mean of the per-seed ratios "
                  "± its 95 % interval:", "",
              table(["applications", "exclusive makespan s", "shared makespan s", "shared ÷ exclusive", "seeds"],
                    [[s["apps"], f"{s['exclusive_s']:.3f}", f"{s['shared_s']:.3f}",
                      f"{s['ratio']:.3f} ± {s['half']:.3f}", s["seeds"]] for s in sp])]
    return L


def streams_points(doc) -> list[dict]:
    return [p for p in doc["points"] if p["status"] == "ok"]


def _sp(doc, part, **key):
    for p in streams_points(doc):
        k = p["key"]
        if k.get("part") == part and all(k.get(a) == v for a, v in key.items()):
            return p
    return None


def streams_verdicts(doc) -> list[dict]:
    out = []
    hol = _sp(doc, "hol", summary="end to end")
    if hol:
        r = mean(hol, "p99_chunked_over_unloaded")
        out.append({"target": "urgent p99 under bulk load within 2× of unloaded", "measured": f"×{r:.1f}",
                    "met": r <= 2})
        r = mean(hol, "p99_unchunked_over_chunked")
        out.append({"target": "urgent p99 ≥ 10× better chunked than unchunked", "measured": f"×{r:.1f}",
                    "met": r >= 10})
        r = mean(hol, "bulk_chunked_over_unchunked")
        out.append({"target": "bulk throughput loses ≤ 5 % to chunking at the default chunk size",
                    "measured": f"{r:.2f}", "met": r >= 0.95})
    errs = [abs(mean(p, "error_mg1")) for p in streams_points(doc)
            if p["key"].get("part") == "model" and mean(p, "error_mg1") is not None]
    if errs:
        out.append({"target": "priority classes within 15 % of the M/G/1 model",
                    "measured": f"worst {max(errs) * 100:.0f} % over {len(errs)} points", "met": max(errs) <= 0.15})
    gemm = [mean(p, "r_overlap") for p in streams_points(doc) if p["key"].get("part") == "gemm"]
    if gemm:
        out.append({"target": "overlap > 90 % for a compute-bound handler (seed 004's r_Overlap)",
                    "measured": f"{min(gemm) * 100:.1f}–{max(gemm) * 100:.1f} %", "met": min(gemm) > 0.9})
    return out


def sec_streams(doc, seed):
    if not doc:
        return []
    pts = streams_points(doc)
    prm = doc["params"]
    rows = [[p["key"]["load"], f"{mean(p, 'achieved_load'):.2f}", p["key"]["class"],
             ms(mean(p, "measured_mean_s") * 1e3), ms(mean(p, "predicted_mg1_s") * 1e3),
             f"{abs(mean(p, 'error_mg1')) * 100:.0f} %", ms(mean(p, "measured_p99_s") * 1e3)]
            for p in pts if p["key"].get("part") == "model"]
    lines = [f"**Priority classes** (`corefarm bench classes`: {prm['urgent_share'] * 100:.0f} % urgent messages "
             f"(class 0), Poisson arrivals, one node in shared mode; {prm['runs']} runs): mean time from submit "
             f"to result against Cobham's M/G/1 formula with the calibrated service moments.", "",
             table(["load", "achieved", "class", "measured mean", "M/G/1", "error", "p99"], rows)]
    rows = [[p["key"]["node_link"], p["key"]["mode"], ms(mean(p, "small_p50_ms")), ms(mean(p, "small_p99_ms")),
             f"{mean(p, 'bulk_MBps'):,.0f}"] for p in pts if p["key"].get("part") == "hol" and "mode" in p["key"]]
    rows += [[f"chunks of {size(p['key']['sweep_chunk_size'])}", "chunked", ms(mean(p, "small_p50_ms")),
              ms(mean(p, "small_p99_ms")), f"{mean(p, 'bulk_MBps'):,.0f}"]
             for p in pts if p["key"].get("part") == "hol" and "sweep_chunk_size" in p["key"]]
    lines += ["", "**Head-of-line blocking** (`corefarm bench hol`, 2 nodes: small urgent messages at a fixed rate "
                  "behind a stream of large bulk messages; node link with whole frames or chunks; default chunk "
                  "size unless named):", "",
              table(["node link", "mode", "urgent p50", "urgent p99", "bulk MB/s"], rows)]
    rows = [[size(p["key"]["KiB"] * 1024), p["key"]["inflight"], f"{mean(p, 'r_overlap') * 100:.1f} %",
             f"{mean(p, 'r_overlap_with_submit') * 100:.1f} %", f"×{mean(p, 'gemm_slowdown'):.2f}"]
            for p in pts if p["key"].get("part") == "gemm"]
    if rows:
        lines += ["", "**Overlap of a transfer with compute** (seed 004's r_Overlap: a GEMM running while the node "
                      "unpacks a strided datatype):", "",
                  table(["message", "in flight", "r_Overlap", "with submit", "GEMM slowdown"], rows)]
    rows = [[p["key"]["rounds"], f"{mean(p, 'messages_per_s_1'):,.0f}", f"{mean(p, 'messages_per_s_2'):,.0f}",
             f"×{mean(p, 'two_over_one'):.2f}"] for p in pts if p["key"].get("part") == "pool"]
    if rows:
        lines += ["", "**Handler pool** (a compute-bound handler, 256 KiB messages; throughput with one and two "
                      "handler workers):", "",
                  table(["compute rounds", "1 worker msg/s", "2 workers msg/s", "2 ÷ 1"], rows)]
    return lines


def soak_verdicts(doc) -> list[dict]:
    checks = doc.get("checks", [])
    return [{"target": f"soak, {doc['seconds'] / 3600:.0f} h with every fault kind: every check holds",
             "measured": f"{sum(c['ok'] for c in checks)} of {len(checks)} checks",
             "met": all(c["ok"] for c in checks)}] if checks else []


SOAK_CAMPAIGN = (
    "`corefarm bench soak` is a fault campaign on the real binaries: a server (two with a standby), node "
    "managers and users on loopback, the in-tree fault proxy between every node or user and its server. "
    "Fault kinds (`--faults`, comma-separated): `node-kill` (SIGKILL, restart 0.1–1.5 s later), `node-stop` "
    "(SIGSTOP, SIGCONT 0.3–3 s later), `server-restart` (SIGKILL, the same ports again about 1 s later), "
    "`server-failover` (SIGKILL with a standby running, nodes and users given both addresses), and on a "
    "node's or a user's link `*-delay` (20–200 ms per chunk for 1–4 s), `*-blackhole` (nothing delivered "
    "either way, nothing closed, for 0.3–1.5 s), `*-reset` (an RST inside an SMP frame) and `*-half-open` "
    "(the server's side closed, the peer's held open and unanswered for 0.5–3 s). Every kind is played "
    "by default: users resume after a lost server connection, and nodes and users take a list of "
    "servers. "
    "The schedule (kind, target, time, length of every fault) is drawn from `--seed` before the load "
    "starts and printed with it: the same seed, duration, kinds, `--kill-every`, `--fault-every` and "
    "cluster shape replay the same schedule (the load around it depends on timing); `--schedule-only` "
    "prints a seed's schedule without running it. Checked at the end: "
    "every result correct and exactly once, no failed session, no wait for a result, a configuration or credit "
    "longer than 5 s plus what the faults it overlapped (or that ended within 5 s before it) explain: a stop "
    "or blackhole its length, a delay its length plus twice the delay, a node killed or cut off its length "
    "plus 5 s, a server fault or a user's lost connection its length plus 30 s (the clients' reconnect "
    "bound); a wait past its bound is named with what it waited for. Also every fault undone, no process crashed, "
    "bad peers cut off, notifications bounded, server and node memory flat (at the end at most 1.5× plus 8 MiB "
    "the most the active server, and node 0, used in the run's first tenth: with server faults the server at "
    "the end is another process, and a freshly restarted one is smaller than one at work), no leaked fd, and the "
    "cluster settled; the report counts each fault kind played, the messages, and what the proxies "
    "carried, and for each server fault the user-visible stall (from the kill to the first correct result "
    "after it; `server_stalls_ms`). The servers' and nodes' logs are kept in the directory the report names "
    "(`logs`), at the level `--cluster-log` gives (warn by default). A one-minute campaign with `--auth` is part of the "
    "test suite (crates/cli/tests/soak.rs)."
)


def sec_soak(doc, seed):
    if not doc:
        return []
    t = doc["totals"]
    played = doc.get("faults_played")
    faults = ("faults played: " + ", ".join(f"{n} {k}" for k, n in played.items()) + "."
              if played is not None else "this run predates the other fault kinds: node kills only.")
    lines = [SOAK_CAMPAIGN, "",
             f"`corefarm bench soak` for {doc['seconds'] / 60:.0f} minutes, {doc['sharing']} mode, {doc['nodes']} "
             f"nodes, {doc['users']} users, seed {doc['seed']}: sessions open and close, nodes are killed, bad peers "
             f"connect. {t['sessions']:,} sessions, {t['messages']:,} data messages ({t['inputs']:,} inputs), "
             f"{doc['nodes_killed']} nodes killed, {doc['bad_peers_played']} bad peers; {faults}", "",
             table(["check", "held?", "detail"],
                   [[c["name"], "yes" if c["ok"] else "**no**", c.get("detail", "")] for c in doc.get("checks", [])])]
    return lines


SEEDPEERS_LABELS = {
    "own-peers": "corefarm's seed-format user and node (`bench user --legacy`, `node --no-hello`)",
    "credit": "the seed's own `test_user` and `test_node`, default `--policy credit` (adaptive window)",
    "queue": "the same, `--policy queue`",
    "credit-fixed-16": "the same, `--credit 16 --credit-window fixed`",
}


def _times(v, lo_hi=None, detail="") -> str:
    """A ratio in bold, then the range of the per-round ratios and `detail` in one parenthesis."""
    if v is None:
        return "-"
    notes = [f"rounds {lo_hi[0]:.2f}–{lo_hi[1]:.2f}×"] if lo_hi and lo_hi[0] != lo_hi[1] else []
    notes += [detail] if detail else []
    return f"**{v:.2f}×**" + (f" ({'; '.join(notes)})" if notes else "")


def sec_seedpeers(doc, seed):
    """The seed authors' server, test_user and test_node beside corefarm's server with the same peers
    and with its own seed-format peers: the ratios to the seed server, then each variant's figures."""
    if not doc:
        return []
    prm = doc["params"]
    delay = prm.get("processing_delay_us")
    pts = {p["key"]["variant"]: p for p in doc["points"]}
    s = pts.get("seed")
    zero = " with `test_user`'s processing delay set to 0" if delay == 0 else ""
    lines = [f"`corefarm bench suite seedpeers -- --seed-build DIR`: the seed authors' `server`, `test_user` and "
             f"`test_node` ({prm.get('seed_repo', 'the seed repository')}, built outside this repository{zero}) against `corefarm server` on the same ports with the same "
             f"peers, and with corefarm's own seed-format peers; {size(prm['input_size'])} inputs, "
             f"{size(prm['output_size'])} outputs, delay "
             f"{'unknown' if delay is None else f'{delay} µs'} per input, one node. Each run starts fresh "
             f"processes, the variants taking turns run by run; {prm['runs']} run(s) each, `test_user` sending "
             f"for {prm.get('seed_send_s', 10):g} s, `bench user` measuring {prm['duration_s']:g} s. Throughput is "
             f"input processed per second; the seed's `test_user` reports its average latency only; server CPU is "
             f"the server process's utime + stime from /proc over the measurement window, per decimal GB "
             f"forwarded (inputs + outputs).", ""]
    if s is None or s["status"] != "ok":
        lines += [f"The seed server's runs: {status_cell(s) if s else 'not run'}.", ""]
    rows = []
    table_rows = {r["variant"]: r for r in prm.get("table", [])}
    for variant, label in SEEDPEERS_LABELS.items():
        p, r = pts.get(variant), table_rows.get(variant)
        if p is None:
            continue
        if p["status"] != "ok" or r is None or s is None:
            rows.append([label, status_cell(p) if p["status"] != "ok" else "-", "-", "-"])
            continue
        lat = r["latency_metric"]
        rows.append([
            label,
            _times(r["throughput"], r.get("throughput_range"),
                   f"{bps(mean(p, 'input_bps'))} vs {bps(mean(s, 'input_bps'))}"),
            f"{ms(mean(p, lat))} / {ms(mean(s, 'latency_avg_ms'))}"
            + (" (median / average)" if lat == "latency_p50_ms" else " (averages)"),
            _times(r["cpu_per_gb"], r.get("cpu_per_gb_range"),
                   f"{mean(p, 'server_cpu_s_per_gb'):.3f} vs {mean(s, 'server_cpu_s_per_gb'):.3f} CPU-s/GB"
                   if mean(p, "server_cpu_s_per_gb") is not None and mean(s, "server_cpu_s_per_gb") is not None
                   else "")])
    lines += [table(["peers", "corefarm / seed server, throughput", "corefarm latency / seed's",
                     "server CPU per GB forwarded, corefarm / seed's"], rows), ""]
    raw = []
    for p in doc["points"]:
        k = p["key"]
        if p["status"] != "ok":
            raw.append([k["variant"], k["server"], k["peers"], status_cell(p)] + [""] * 6)
            continue
        raw.append([k["variant"], k["server"], k["peers"], with_spread(p, "input_bps", bps),
                    bps(mean(p, "offered_input_bps")), with_spread(p, "latency_avg_ms", ms),
                    ms(mean(p, "latency_p50_ms")) if mean(p, "latency_p50_ms") is not None else "-",
                    f"{mean(p, 'server_cpus'):.2f}" if mean(p, "server_cpus") is not None else "-", cpu_gb(p),
                    f"{mean(p, 'node_cpus'):.2f}" if mean(p, "node_cpus") is not None else "-"])
    lines += ["Each variant (± half the range over runs):", "",
              table(["variant", "server", "peers", "processed", "offered", "latency avg", "p50", "server CPUs",
                     "server CPU-s/GB", "node CPUs"], raw)]
    return lines


def _hang_points(doc):
    by = {p["key"]["node"]: p for p in doc["points"] if p["status"] == "ok"}
    return by.get("running"), by.get("stopped")


def hang_verdicts(doc) -> list[dict]:
    """The hung-node targets: the worst latency (the stopped node's in-flight inputs) at most
    max(50 ms, 4 x service time) above the median without the stop, and throughput at least 90 % of the
    node time the remaining nodes offered."""
    run, stop = _hang_points(doc)
    if not (run and stop):
        return []
    service_ms = doc["params"]["delay_us"] / 1000
    allowed = max(50.0, 4 * service_ms)
    extra = mean(stop, "latency_max_ms") - mean(run, "latency_p50_ms")
    frac = mean(stop, "of_capacity")
    return [{"target": f"hung node: its inputs at most max(50 ms, 4 × service) = {allowed:.0f} ms above the median",
             "measured": f"{extra:.1f} ms above", "met": extra <= allowed, "ratio": extra / allowed},
            {"target": "hung node: throughput ≥ 90 % of the remaining nodes' capacity",
             "measured": f"{100 * frac:.1f} %", "met": frac >= 0.9}]


def sec_hang(doc, seed):
    if not doc:
        return []
    prm = doc["params"]
    lines = [f"`corefarm bench suite hang`: {prm['nodes']} node processes at {prm['delay_us']} µs per input, "
             f"{size(prm['input_size'])} inputs; in the `stopped` runs node 1 is SIGSTOPped {prm['stop_at_s']:g} s "
             f"into the measured window and SIGCONTinued {prm['stop_for_s']:g} s later, the `running` runs are the "
             f"same cluster without the stop, the two taking turns, {prm['runs']} runs each (± half the range). "
             "Throughput is against the node time the window offered (the stopped node's excluded while stopped); "
             "the worst latency is what the stopped node's in-flight inputs paid; copies are the server's "
             "`hedged_total`, late duplicates its `hedge_duplicates_total` (answers dropped after SIGCONT).", ""]
    rows = [[p["key"]["node"], with_spread(p, "inputs_per_s", lambda v: f"{v:.0f}/s"),
             f"{100 * mean(p, 'of_capacity'):.1f} %", ms(mean(p, "latency_p50_ms")), ms(mean(p, "latency_p99_ms")),
             with_spread(p, "latency_max_ms", ms), f"{mean(p, 'hedged'):g}", f"{mean(p, 'hedge_duplicates'):g}"]
            if p["status"] == "ok" else [p["key"]["node"], status_cell(p)] + [""] * 6 for p in doc["points"]]
    return lines + [table(["node 1", "inputs", "of node time offered", "p50", "p99", "worst", "copies",
                           "late duplicates"], rows)]


def sec_irq(doc, seed):
    """One paragraph (the document keeps within its line budget): each mode's figures and their ratio."""
    if not doc:
        return []
    prm = doc["params"]
    by = {p["key"].get("mode") or p["key"].get("summary"): p for p in doc["points"]}

    def mode(name, label):
        p = by.get(name)
        if not p or p["status"] != "ok":
            return f"{label}: -"
        return (f"{label}: **{with_spread(p, 'cpu_us_per_job', lambda v: f'{v:.1f} µs')}** CPU, "
                f"{with_spread(p, 'wakeups_per_job', lambda v: f'{v:.2f}')} wake-ups, "
                f"{with_spread(p, 'wall_ms_per_job', lambda v: f'{v:.3f} ms')} per job")
    r = by.get("poll ÷ interrupt")
    ratio = (f"; polling ÷ interrupt ×{mean(r, 'cpu_ratio'):.1f} CPU, ×{mean(r, 'wakeups_ratio'):.1f} wake-ups"
             if r and r["status"] == "ok" else "")
    return [f"`corefarm bench irq`: the Zynq backend on a fake board (sysfs and devfs as files, the UIO interrupt "
            f"a socket), a thread playing a core whose jobs take {prm['job_ms']:g} ms, {prm['jobs']} jobs per mode "
            f"and round, {prm['rounds']} rounds, the modes alternating; CPU and wake-ups (voluntary context "
            f"switches) of the job loop's thread, as a node's core handler's; polling sleeps "
            f"{prm['bus_idle_us']} µs between reads of the done register. "
            f"{mode('interrupt', 'UIO interrupt')}; {mode('poll', 'polling')}{ratio}."]


def _scale_points(doc, part):
    return [p for p in doc["points"] if p["key"].get("part") == part and p["status"] == "ok"]


def scale_verdicts(doc) -> list[dict]:
    m = lambda p, k: p["metrics"][k]["mean"]  # noqa: E731
    by = {p["key"]["nodes"]: p for p in _scale_points(doc, "cluster")}
    out = []
    if by:
        top = max(by)
        kib = m(by[top], "rss_per_node_kib")
        out.append({"target": "≤ 10 KiB of server memory per idle node",
                    "measured": f"{kib:.1f} KiB at {top:,} nodes", "met": kib <= 10})
    for n, limit in ((1000, 1.0), (10000, 5.0)):
        if n in by:
            f = m(by[n], "fanout_s")
            out.append({"target": f"a configuration reaches {n:,} nodes in < {limit:g} s",
                        "measured": f"{f:.2f} s", "met": f < limit})
    model = doc["params"].get("model")
    if model and any(not q["calibration"] for q in model["points"]):
        out.append({"target": "the control model within 20 % of the measurements it was not fitted on",
                    "measured": f"worst {model['worst_error'] * 100:.0f} % (fitted on "
                                f"{', '.join(f'{n:,}' for n in model['calibrated_on'])} nodes)",
                    "met": model["worst_error"] <= 0.2})
    return out


def sec_scale(doc, seed):
    if not doc:
        return []
    m = lambda p, k: p["metrics"][k]["mean"]  # noqa: E731
    L = ["`corefarm bench scale`: one `corefarm server` process and N simulated nodes over "
         "`corefarm node --count 2000` processes on the same 2 CPUs (the nodes' work is the machine's, the "
         "figures are the server's own, from `/proc`). Memory per node is (resident after the join − before) / N; "
         + 
         "the fan-out is one user given every node, from its configuration to its response"
         + (" (a configuration replacing the last, mean ± stdev of the samples; the first, to empty nodes, beside it)"
            if any("first_fanout_s" in p["metrics"] for p in _scale_points(doc, "cluster")) else "")
         + "; status and "
         "`/metrics` are the best of three requests; "
         + ("CPU figures are the server threads' time on a CPU (`/proc/<pid>/task/*/schedstat`, nanoseconds), "
            "the fan-out and a full status request's CPU the mean of a few"
            + ("; beside the fan-out, the CPU the simulated nodes spent over it (they share the server's two CPUs, "
               "so they, not the server, set its wall time here)."
               if any("fanout_nodes_cpu_s" in p["metrics"] for p in _scale_points(doc, "cluster")) else ".")
            if any("status_all_cpu_ms" in p["metrics"] for p in _scale_points(doc, "cluster"))
            else "CPU figures have the kernel's 10 ms tick as their grain."), ""]
    rows = []
    for p in sorted(_scale_points(doc, "cluster"), key=lambda p: p["key"]["nodes"]):
        rows.append([f"{p['key']['nodes']:,}", f"{m(p, 'join_s'):.2f} s", f"{m(p, 'rss_idle_kib') / 1024:.1f} MiB",
                     f"{m(p, 'rss_per_node_kib'):.1f}",
                     f"{m(p, 'connect_cpu_us_per_node'):.0f}",
                     f"{m(p, 'fanout_s'):.3f} s"
                     + (f" ± {p['metrics']['fanout_s']['stdev']:.3f} (first {m(p, 'first_fanout_s'):.3f} s)"
                        if "first_fanout_s" in p["metrics"] else "")
                     + (f"; nodes' CPU {m(p, 'fanout_nodes_cpu_s'):.2f} s"
                        if "fanout_nodes_cpu_s" in p["metrics"] else ""),
                     f"{m(p, 'fanout_cpu_us_per_node'):.0f}"
                     + (f" (first {m(p, 'first_fanout_cpu_us_per_node'):.0f})"
                        if "first_fanout_cpu_us_per_node" in p["metrics"] else ""),
                     f"{m(p, 'status_summary_ms'):.2f} ms / {size(int(m(p, 'status_summary_bytes')))}",
                     f"{m(p, 'status_all_ms'):.1f} ms / {size(int(m(p, 'status_all_bytes')))}"
                     + (f", CPU {m(p, 'status_all_cpu_ms'):.1f} ms" if 'status_all_cpu_ms' in p["metrics"] else ""),
                     f"{m(p, 'metrics_ms'):.1f} ms / {size(int(m(p, 'metrics_bytes')))}",
                     f"{m(p, 'load_at_start'):.1f}"])
    L += [table(["nodes", "join", "server RSS", "KiB/node", "join CPU µs/node", "fan-out", "fan-out CPU µs/node",
                 "status summary", "status, every node", "/metrics", "load"], rows), ""]
    sch = _scale_points(doc, "sched")
    if sch:
        fns = sorted({p["key"]["functions"] for p in sch})
        nodes = sorted({p["key"]["nodes"] for p in sch})
        by = {(p["key"]["nodes"], p["key"]["functions"]): p for p in sch}
        was = {(p["key"]["nodes"], p["key"]["functions"]): p for p in _scale_points(doc, "sched_before")}

        def cell(n, f, k):
            if (n, f) not in by:
                return "-"
            now = f"{m(by[(n, f)], k):.1f}"
            return f"{m(was[(n, f)], k):.1f} → {now}" if (n, f) in was else now
        L += ["The shared scheduler in process, fake clock, every function with one user and its replicas "
              "loaded: one monitoring period that runs Algorithm 1 (µs), and one data message's decisions, "
              "its submission and its result (µs)"
              + (", before → after the scheduler's indexes, the two builds run one after the other in one run."
                 if was else "."), "",
              table(["nodes"] + [f"period, {f} fn" for f in fns] + [f"message, {f} fn" for f in fns],
                    [[f"{n:,}"] + [cell(n, f, "period_us") for f in fns] + [cell(n, f, "message_us") for f in fns]
                     for n in nodes]), ""]
    ev = _scale_points(doc, "events")
    if ev:
        e = ev[0]
        L += ["Server CPU per event on a 4-node cluster (each event kind repeated for a few seconds): "
              f"a user session (connect, hello, status, close) {m(e, 'session_cpu_us'):.0f} µs; a group opened "
              f"and closed {m(e, 'group_open_cpu_us'):.0f} µs; a data message through the server "
              f"{m(e, 'message_server_cpu_us'):.1f} µs; on the direct path {m(e, 'message_direct_cpu_us'):.2f} µs.",
              ""]
    model = doc["params"].get("model")
    if model:
        whats = list(dict.fromkeys(q["what"] for q in model["points"]))
        by = {(q["nodes"], q["what"]): q for q in model["points"]}
        nodes = sorted({q["nodes"] for q in model["points"]})
        def cell(q):
            if not q:
                return "-"
            sp = q.get("spread") or {}
            if "median" in sp:
                pm = f" ({sp['min']:.2g}–{sp['max']:.2g})" if sp.get("samples", 0) > 1 else ""
            else:
                pm = f" ± {sp['stdev']:.2g}" if sp.get("samples", 0) > 1 else ""
            err = f"{q['error'] * 100:.0f} %"
            if q.get("resolution"):
                err += f", {q['judged_error'] * 100:.0f} % beyond ±{q['resolution']:.2g}"
            return f"{q['measured']:.3g}{pm} / {q['predicted']:.3g} ({err})"
        c = model["costs"]
        if "cpu_status" in c:
            L += ["Server CPU per event from the fitted model: a node's connection "
                  f"{c['cpu_connect'] * 1e6:.0f} µs; a configuration {c['cpu_config'] * 1e6:.0f} µs + "
                  f"{c['cpu_config_node'] * 1e6:.0f} µs per node it reaches; an idle node "
                  f"{c['cpu_idle_node'] * 1e6:.2f} µs per second (nodes send no heartbeat); a status request "
                  f"listing every node {c['cpu_status'] * 1e6:.0f} µs + {c['cpu_status_node'] * 1e6:.2f} µs per node.",
                  ""]
        medians = any("median" in (q.get("spread") or {}) for q in model["points"])
        if "idle_resolution" in model:
            head = ("The control model (`corefarm_model::control`) fitted on "
                    + ("the median of the samples" if medians else "every sample") + " at "
                    f"{', '.join(f'{n:,}' for n in model['calibrated_on'])} nodes: measured "
                    + ("median (the samples' range)" if medians else "mean (± sample stdev)") + " / "
                    "predicted (error); `*` marks the sizes it was fitted on, the others are its validation. "
                    + ("A sample's window can hold other work (the simulated nodes share the CPUs): it moves one "
                       "sample by several times and the mean with it, not the median. " if medians else "")
                    + 
                    "The idle server's CPU is at its measurement's floor: one mean of it resolves "
                    f"±{model['idle_resolution'] * 1e3:.2f} ms/s, and a per-node part below "
                    f"{model['idle_node_resolution'] * 1e9:.0f} ns/s per node is not told from none; it is judged "
                    "by its error beyond that resolution (the worst error below is so judged).")
        else:
            head = ("The control model (`corefarm_model::control`) fitted on "
                    f"{' and '.join(f'{n:,}' for n in model['calibrated_on'])} nodes: measured / predicted (error); "
                    "`*` marks the sizes it was fitted on, the others are its validation.")
        L += [head, "",
              table(["nodes"] + whats,
                    [[f"{n:,}" + ("*" if n in model["calibrated_on"] else "")] + [cell(by.get((n, w))) for w in whats]
                     for n in nodes])]
    return L


def sec_window(doc, seed):
    """The adaptive window against each fixed window, point by point, with the verdict of each point."""
    if not doc:
        return []
    prm = doc["params"]
    durs = ", ".join(f"{size(int(k.split('x')[0]) * int(k.split('x')[1]))} {d:g} s"
                     for k, d in prm.get("durations_s", {}).items())
    lines = [f"`python3 bench/suite.py window`: the hello points of the compact `server` grid (delay 0, output "
             f"size = input size) under the adaptive window (`credit`) and fixed windows of "
             f"{', '.join(p[len(suite.FIXED):] for p in prm['policies'] if p.startswith(suite.FIXED))}, "
             f"taking turns run by run, {prm['runs']} run(s) each; each run measures a duration from its message "
             f"size, so that large messages are judged on enough of them ({durs}). A point is met when the adaptive "
             f"window delivers at least 0.95× the best fixed window's mean input throughput at a median latency "
             f"no higher than that window's beyond the noise (`suite.credit_vs_fixed`, as for the `server` grid).",
             ""]
    v = suite.credit_vs_fixed(doc)
    missed = {(m["nodes"], m["input_size"], m["count"]): m for m in v["misses"]}
    by = {}
    for p in doc["points"]:
        k = p["key"]
        by.setdefault((k["nodes"], k["input_size"], k["count"]), {})[k["policy"]] = p
    rows = []
    for (n, sz, count), pol in sorted(by.items()):
        c = pol.get("credit")
        fixed = {w: p for w, p in pol.items() if w.startswith(suite.FIXED) and p["status"] == "ok"}
        if c is None or c["status"] != "ok" or not fixed:
            rows.append([str(n), f"{size(sz)} × {count}", status_cell(c) if c else "-", "", "", "", "", "-"])
            continue
        best = max(fixed, key=lambda w: mean(fixed[w], "input_bps"))
        f = fixed[best]
        msgs = mean(c, "messages_per_s") * prm["durations_s"].get(f"{sz}x{count}", 0)
        m = missed.get((n, sz, count))
        verdict = "yes" if m is None else ("**no**, " + ", ".join(
            w for w, on in (("slower", m["slow"]), ("later", m["late"]), ("beaten on both", m["dominated"])) if on))
        rows.append([str(n), f"{size(sz)} × {count}",
                     f"{with_spread(c, 'input_bps', bps)}, p50 {ms(mean(c, 'latency_p50_ms'))}",
                     f"{best[len(suite.FIXED):]}: {with_spread(f, 'input_bps', bps)}, p50 {ms(mean(f, 'latency_p50_ms'))}",
                     f"×{mean(c, 'input_bps') / mean(f, 'input_bps'):.2f}",
                     f"×{mean(c, 'latency_p50_ms') / mean(f, 'latency_p50_ms'):.2f}", f"{msgs:,.0f}", verdict])
    lines += [f"Met at {v['compared'] - len(v['misses'])} of {v['compared']} points (± half the range over runs):",
              "", table(["nodes", "message", "adaptive", "best fixed window", "throughput", "p50",
                         "messages a run (adaptive)", "met?"], rows)]
    lines += window_control(doc)
    return lines


def control_arm(doc) -> str | None:
    """The window experiment's control arm (a copy of a fixed window), if it ran one."""
    return next((p for p in doc["params"].get("policies", []) if p.startswith(suite.COPY)), None)


def control_missed(doc) -> str:
    """The control arm's misses, for a verdict: how much of a miss count the rule's own noise explains."""
    control = control_arm(doc)
    if control is None:
        return ""
    cv = suite.credit_vs_fixed(doc, control)
    return f"; judged by the same rule, a second copy of {control[len(suite.COPY):]} missed at {len(cv['misses'])}"


def window_control(doc) -> list[str]:
    """What the window rule makes of the control arm: a second cluster running one of the fixed windows."""
    control = control_arm(doc)
    if control is None:
        return []
    twin = control[len(suite.COPY):]
    cv = suite.credit_vs_fixed(doc, control)
    if not cv["compared"]:
        return []
    twin_best = [m for m in cv["misses"] if m["best"] == twin]
    by = {}
    for p in doc["points"]:
        if p["status"] == "ok":
            by.setdefault((p["key"]["nodes"], p["key"]["input_size"], p["key"]["count"]), {})[p["key"]["policy"]] = p
    best_twin = sum(1 for pol in by.values() if control in pol and max(
        (w for w in pol if w.startswith(suite.FIXED)), key=lambda w: mean(pol[w], "input_bps"), default=None) == twin)
    return ["", f"**Control.** The same rule judges `{control}`, a second cluster running the fixed window of "
                f"{twin[len(suite.FIXED):]} side by side with the others: as good as that window by construction, "
                f"it meets the target at {cv['compared'] - len(cv['misses'])} of {cv['compared']} points, and at "
                f"{best_twin - len(twin_best)} of the {best_twin} where its twin was the best fixed window. What it "
                f"misses is what the rule reads of the machine's noise at this many runs."]


SECTIONS = {"headline": sec_headline, "policies": sec_policies, "echo": sec_echo, "server": sec_server,
            "node": sec_node, "node-matmul": sec_node_matmul, "cluster": sec_cluster, "software": sec_software,
            "collectives": sec_collectives, "direct": sec_direct, "sharing": sec_sharing, "streams": sec_streams,
            "soak": sec_soak, "seedpeers": sec_seedpeers, "hang": sec_hang, "irq": sec_irq,
            "scale": sec_scale, "window": sec_window}

READINGS = {
    "policies": "queue vs stack vs credit when every node is busy.",
    "window": "where the adaptive window falls short of the best fixed one, and why.",
    "headline": "whether the targets are met, by how much, and why.",
    "forwarding": "where the server's CPU per byte goes compared with the echo server.",
    "seedpeers": "how corefarm's server does with the seed's own user and node against the seed's server, "
                 "and what the policies change.",
    "echo": "where the plateau starts on this machine and how it compares with the seed's 16 Gbit/s.",
    "server": "queue vs stack vs credit at 2-4 nodes, the best message size, and whether the seed's "
              "256-512 KB optimum holds.",
    "node": "the growth of throughput with data size and the value at 128 KiB against the seed's 393 Mbit/s.",
    "node-matmul": "how throughput grows with cores and inputs per message, against the seed's 34 MB/s.",
    "cluster": "the node count where throughput saturates and latency drops, for 1 and 4 inputs.",
    "software": "the software baseline on this CPU and what the speedups compare.",
    "collectives": "where corefarm's trees win and lose against Open MPI, and why.",
    "direct": "what the direct path gains over the server's.",
    "sharing": "where shared mode and co-working gain over exclusive mode, and where they cannot.",
    "streams": "which of the streams targets hold and what limits the others.",
    "irq": "what the interrupt saves per job, and what is left.",
    "hang": "what a hung node costs its users, against the same cluster without the hang.",
    "soak": "what the soak shows about losses and leaks.",
    "scale": "what one server holds and spends per node, and where it stops.",
}


def sec_compare(results: Path) -> list[str]:
    """Before/after comparisons made in one run: each `compare-NAME.json` is the `--json` output of
    `corefarm bench compare OLD.json NEW.json` for suite NAME, summarised per judged metric."""
    files = sorted(results.glob("compare-*.json"))
    if not files:
        return []
    L = ["## Before and after, same run", "",
         "`corefarm bench compare OLD.json NEW.json --json` on results of the two builds measured in one run, "
         "runs interleaved. A metric counts as worse or better only beyond max(threshold, the spread of its runs "
         "in either recording); the ratio is new ÷ old (geometric mean over the points, and its range).", ""]
    for f in files:
        c = json.loads(f.read_text())
        per = {}
        for pt in c.get("points", []):
            for m in pt.get("metrics", []):
                if m.get("verdict") == "info" or not m.get("ratio"):
                    continue
                per.setdefault(m["metric"], []).append(m)
        rows = []
        # The figures a reader judges a change by; the rest restate them in other units.
        key = ("input_bps", "latency_p50_ms", "latency_p99_ms", "server_cpu_s_per_gb", "matrices_per_s",
               "software_matrices_per_s", "rtl_standalone_cycles_per_s", "throughput_bps")
        for metric, ms_ in sorted((m, v) for m, v in per.items() if m in key):
            r = [m["ratio"] for m in ms_]
            g = 1.0
            for x in r:
                g *= x
            g **= 1 / len(r)
            rows.append([metric, len(r), f"{g:.3f}", f"{min(r):.3f}–{max(r):.3f}",
                         sum(m["verdict"] == "worse" for m in ms_), sum(m["verdict"] == "better" for m in ms_)])
        name = f.stem[len("compare-"):]
        L += [f"**{name}**: {len(c.get('points', []))} points, {c.get('regressions', 0)} regression(s), "
              f"{c.get('improvements', 0)} improvement(s), threshold {c.get('threshold', 0) * 100:.0f} %.", "",
              table(["metric", "points", "new ÷ old", "range", "worse", "better"], rows), ""]
    return L


# Results shown inside another experiment's section (no section of their own).
NESTED = ["rtl-cores"]


def load_results(results: Path) -> dict:
    docs = {}
    for name in ORDER + NESTED + ["sharing-workloads"]:
        f = results / f"{name}.json"
        if f.exists():
            docs[name] = json.loads(f.read_text())
    return docs


def all_verdicts(docs: dict) -> list[tuple[str, dict]]:
    """Every target the committed results can judge, with the experiment that measured it."""
    out = []
    if docs.get("headline"):
        out += [("headline", v) for v in suite.headline_verdicts(docs["headline"]["points"])]
    if docs.get("forwarding"):
        out += [("forwarding", v) for v in suite.forwarding_verdicts(docs["forwarding"]["points"])]
    if docs.get("seedpeers"):
        out += [("seedpeers", v) for v in suite.seedpeers_verdicts(docs["seedpeers"]["points"])]
    if docs.get("server"):
        cq = suite.credit_below_queue(docs["server"])
        out.append(("server", {"target": "credit never below queue on the `server` grid (beyond the noise)",
                               "measured": f"below at {len(cq['below'])} of {cq['compared']} points",
                               "met": not cq["below"]}))
        cf = suite.credit_vs_fixed(docs["server"])
        if cf["compared"]:
            out.append(("server", {"target": "the adaptive window within 5 % of the best fixed window at every "
                                             "`server` grid point, at no higher median latency",
                                   "measured": f"missed at {len(cf['misses'])} of {cf['compared']} points "
                                   f"({sum(m['dominated'] for m in cf['misses'])} of them beaten on throughput "
                                   "and latency by one fixed window)"
                                   + "".join(f"; {m['nodes']} node(s) {size(m['input_size'])} × {m['count']}: "
                                             f"×{m['ratio']:.2f} of {m['best']}, p50 ×{m['p50_ratio']:.2f}"
                                             for m in cf["misses"][:4]),
                                   "met": not cf["misses"]}))
    if docs.get("window"):
        cf = suite.credit_vs_fixed(docs["window"])
        out.append(("window", {"target": "the adaptive window within 5 % of the best fixed window at every point, "
                                         "at no higher median latency (runs long enough to judge)",
                               "measured": f"missed at {len(cf['misses'])} of {cf['compared']} points "
                               f"({sum(m['dominated'] for m in cf['misses'])} of them beaten on throughput "
                               "and latency by one fixed window)" + control_missed(docs["window"]),
                               "met": cf["compared"] > 0 and not cf["misses"]}))
    for name, f in (("collectives", collectives_verdicts), ("direct", direct_verdicts), ("hang", hang_verdicts),
                    ("sharing", sharing_verdicts), ("sharing-workloads", sharing_workloads_verdicts),
                    ("streams", streams_verdicts), ("soak", soak_verdicts), ("scale", scale_verdicts)):
        if docs.get(name):
            out += [(name, v) for v in f(docs[name])]
    return out


def verdict_cell(v: dict) -> str:
    if v["met"]:
        return "yes"
    return "**no**" + (f" (×{v['ratio']:.2f} the target)" if v.get("ratio") is not None else "")


def targets_section(docs: dict) -> list[str]:
    verdicts = all_verdicts(docs)
    if not verdicts:
        return []
    return ["## Targets", "",
            f"Each target the committed results can judge: {sum(v['met'] for _, v in verdicts)} of "
            f"{len(verdicts)} met. Why a target is missed is in its experiment's reading.", "",
            table(["experiment", "target", "measured", "met?"],
                  [[name, v["target"], v["measured"], verdict_cell(v)] for name, v in verdicts]), ""]


def provenance(docs: dict) -> list[list[str]]:
    rows = []
    for name, d in docs.items():
        m = d.get("machine") or {}
        load = (d.get("load") or {}).get("load_at_start", ["-"])[0]
        rows.append([name + (" (quick)" if d.get("quick") else ""), f"`{(m.get('git_commit') or '-')[:7]}`",
                     (m.get("date") or "-")[:10], load])
    return rows


def render(results: Path, out: Path, figures: Path, seed: dict, readings: dict | None = None) -> str:
    readings = readings or {}
    docs = load_results(results)
    machine = next((d["machine"] for d in docs.values() if d.get("machine")), {})
    quick = any(d.get("quick") for d in docs.values())
    figures.mkdir(parents=True, exist_ok=True)
    rel = Path(os.path.relpath(figures, out.parent))
    L = ["# corefarm benchmarks", "",
         "<!-- Generated by bench/report.py from bench/results/*.json; edit the generator, not this file. -->", "",
         "corefarm's figures on this machine beside the seeds'. Every table is generated from the committed "
         "result files (one per experiment); the short readings are bench/readings.json. Reproduce an "
         "experiment with `corefarm bench suite NAME --out bench/results` (`all` runs the seed's experiments; "
         "`collectives`, `direct`, `sharing`, `streams`, `policies`, `tls`, `window` and `seedpeers` run alone, `seedpeers` with `-- --seed-build DIR` holding the seed authors' binaries; the soak is "
         "`corefarm bench soak --json > bench/results/soak.json`), then `python3 bench/report.py`. Compare two runs of one experiment with "
         "`corefarm bench compare OLD.json NEW.json`. Measurements made by hand, and experiments tried and "
         "dropped, are archived in [bench/manual/](../bench/manual/README.md).", ""]
    L += targets_section(docs)
    L += ["## Machines", "",
          table(["", "seed 000 (§4.1)", "corefarm results below"], [
              ["CPU", f"{seed['machine']['cpu']}, {seed['machine']['cores']} cores / {seed['machine']['threads']} threads",
               f"{machine.get('cpu', '?')}, {machine.get('nproc', '?')} logical CPUs"],
              ["memory", seed["machine"]["memory"],
               f"{machine['memory_bytes'] / 2**30:.0f} GiB" if machine.get("memory_bytes") else "?"],
              ["kernel", f"Linux {seed['machine']['kernel']}", f"{machine.get('os', '')} {machine.get('kernel', '?')}"],
          ]), "",
          "The seed ran everything on 4 cores / 8 threads and kept one thread each for the server and the user. "
          "Here 2 logical CPUs are shared by the user, the server and every node, so absolute numbers are lower "
          "and saturate earlier; the shapes of the curves are what compares. Where each result comes from "
          "(commit, date, 1-minute load when the experiment started):", "",
          table(["experiment", "commit", "date", "load at start"], provenance(docs)), ""]
    if quick:
        L += ["**These are `--quick` results** (short runs, few points, one run per point) where marked: they show "
              "the harness works end to end, not the system's performance.", ""]
    if not docs:
        L += [PLACEHOLDER + "no suite results found; run the suite first.", ""]
    for name in ORDER:
        doc = docs.get(name)
        if doc is None and name not in ALWAYS:
            continue  # experiments outside `all` appear once they have a result
        L += [f"## {TITLES[name]}", ""]
        L += (sec_forwarding(doc, seed, docs) if name == "forwarding" else SECTIONS[name](doc, seed))
        if name == "node-matmul":
            L += sec_rtl_cores(docs.get("rtl-cores"))
        if name == "sharing":
            L += sec_sharing_workloads_short(docs.get("sharing-workloads"))
        if doc or (name == "sharing" and docs.get("sharing-workloads")):
            for note in (doc or {}).get("notes", []):
                if "isolation" not in note:  # notes on points of a removed option
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
        L += ["", "**Reading.** " + text if text else PLACEHOLDER + READINGS[name], ""]
    cmp = sec_compare(results)
    if cmp and readings.get("compare"):
        cmp += ["**Reading.** " + readings["compare"], ""]
    L += cmp
    return "\n".join(L).rstrip() + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=str(HERE / "results"))
    ap.add_argument("--out", default=str(ROOT / "docs/benchmarks.md"))
    ap.add_argument("--figures", default=str(HERE / "figures"), help="where plots are copied for the document")
    ap.add_argument("--seed", default=str(HERE / "seed_figures.json"))
    ap.add_argument("--readings", default=str(HERE / "readings.json"),
                    help="short reading paragraphs per experiment, written from the results they describe")
    ap.add_argument("--sharing-workloads", action="store_true",
                    help="print the multi-tenant workloads' full tables (for docs/sharing.md) and exit")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if the document differs from what the results generate")
    a = ap.parse_args(argv)
    if a.sharing_workloads:
        f = Path(a.results) / "sharing-workloads.json"
        print("\n".join(sec_sharing_workloads(json.loads(f.read_text()), None)) if f.exists() else f"{f}: not found")
        return 0
    seed = json.loads(Path(a.seed).read_text())
    out = Path(a.out).resolve()
    rp = Path(a.readings)
    readings = json.loads(rp.read_text()) if rp.exists() else {}
    text = render(Path(a.results), out, Path(a.figures).resolve(), seed, readings)
    if a.check:
        same = out.exists() and out.read_text() == text
        print(f"{out}: {'up to date' if same else 'differs from bench/report.py output'}", file=sys.stderr)
        return 0 if same else 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
