"""One PNG per seed figure from a suite result document, with the seed's
numbers (bench/seed_figures.json) drawn beside corefarm's where the seed
printed them."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SEED = json.loads((Path(__file__).resolve().parent / "seed_figures.json").read_text())


def _ok(doc):
    return [p for p in doc["points"] if p["status"] == "ok"]


def _mean(p, m):
    return p["metrics"].get(m, {}).get("mean")


def _err(p, m):
    s = p["metrics"].get(m, {})
    if s.get("mean") is None:
        return (0, 0)
    return (s["mean"] - s["min"], s["max"] - s["mean"])


def _series(points, x, y):
    pts = sorted((x(p), _mean(p, y), _err(p, y)) for p in points if _mean(p, y) is not None)
    xs = [a for a, _, _ in pts]
    ys = [b for _, b, _ in pts]
    errs = [[e[0] for _, _, e in pts], [e[1] for _, _, e in pts]]
    return xs, ys, errs


def _save(fig, out: Path, name: str, title: str, machine: dict) -> Path:
    fig.suptitle(title, fontsize=10)
    fig.text(0.01, 0.005, f"corefarm on {machine.get('nproc')} CPUs ({machine.get('cpu')}), {machine.get('date')}",
             fontsize=6, color="gray")
    fig.tight_layout(rect=(0, 0.02, 1, 0.97))
    path = out / name
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_echo(doc, out):
    fig, ax = plt.subplots(figsize=(7, 4))
    pts = _ok(doc)
    for n in sorted({p["key"]["clients"] for p in pts}):
        xs, ys, e = _series([p for p in pts if p["key"]["clients"] == n], lambda p: p["key"]["size"], "throughput_bps")
        ax.errorbar(xs, [y / 1e9 for y in ys], yerr=[[v / 1e9 for v in e[0]], [v / 1e9 for v in e[1]]],
                    marker="o", ms=3, label=f"{n} client(s)")
    ax.axhline(SEED["echo"]["plateau_bps"] / 1e9, ls="--", color="gray", label="seed plateau (16 Gbit/s)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("payload size (bytes)")
    ax.set_ylabel("total throughput (Gbit/s)")
    ax.legend(fontsize=7)
    return [_save(fig, out, "fig4_1_echo.png", "Fig 4.1: SMP echo throughput vs payload size", doc["machine"])]


def plot_server(doc, out):
    pts = _ok(doc)
    policies = [p for p in ("queue", "stack", "credit") if any(q["key"]["policy"] == p for q in pts)]
    paths = []
    for metric, scale, ylabel, name, title, seedkey in (
        ("input_bps", 1e9, "throughput (Gbit/s)", "fig4_3_server_throughput.png",
         "Fig 4.3: server throughput vs message size (zero delay)", "max_throughput"),
        ("latency_avg_ms", 1, "average latency (ms)", "fig4_4_server_latency.png",
         "Fig 4.4: server latency vs message size (zero delay)", "min_latency_ms"),
    ):
        if not policies:
            break
        fig, axes = plt.subplots(1, len(policies), figsize=(4.2 * len(policies), 3.8), squeeze=False, sharey=True)
        for ax, pol in zip(axes[0], policies):
            sel = [p for p in pts if p["key"]["policy"] == pol]
            for n, peers in sorted({(p["key"]["nodes"], p["key"].get("peers", "hello")) for p in sel}):
                # Several (size, count) pairs share a message size: keep the best.
                best = {}
                for p in sel:
                    if (p["key"]["nodes"], p["key"].get("peers", "hello")) != (n, peers) or _mean(p, metric) is None:
                        continue
                    mb = p["key"]["input_size"] * p["key"]["count"]
                    v = _mean(p, metric)
                    if mb not in best or (v > best[mb] if metric.endswith("bps") else v < best[mb]):
                        best[mb] = v
                xs = sorted(best)
                ax.plot(xs, [best[x] / scale for x in xs], marker="o", ms=3, ls="-" if peers == "hello" else ":",
                        label=f"{n} node(s)" + (", seed-format peers" if peers != "hello" else ""))
            for s in SEED["server"][seedkey].get(pol, []):
                v = s.get("bps", s.get("ms"))
                ax.scatter([s["message_bytes"]], [v / scale], marker="x", color="black", zorder=5)
            ax.set_xscale("log", base=2)
            if metric.startswith("latency"):
                ax.set_yscale("log")
            ax.set_title(f"{pol} policy (x = seed)", fontsize=9)
            ax.set_xlabel("message size (bytes)")
            ax.legend(fontsize=7)
        axes[0][0].set_ylabel(ylabel)
        paths.append(_save(fig, out, name, title, doc["machine"]))
    return paths


def plot_node(doc, out):
    fig, ax = plt.subplots(figsize=(6, 4))
    labels = {"direct": "corefarm: node manager alone (bench node)", "via-server": "corefarm: node behind the server"}
    for path in ("direct", "via-server"):
        sel = [p for p in _ok(doc) if p["key"].get("path", "via-server") == path]
        if not sel:
            continue
        xs, ys, e = _series(sel, lambda p: p["key"]["size"], "input_bps")
        ax.errorbar(xs, [y / 1e6 for y in ys], yerr=[[v / 1e6 for v in e[0]], [v / 1e6 for v in e[1]]],
                    marker="o", ms=3, label=labels[path])
    for s in SEED["node"]["points"]:
        ax.scatter([s["bytes"]], [s["bps"] / 1e6], marker="x", color="black", zorder=5, label="seed (393 Mbit/s @ 128 kB)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("data size (bytes)")
    ax.set_ylabel("throughput (Mbit/s)")
    ax.legend(fontsize=7)
    return [_save(fig, out, "fig4_5_node.png", "Fig 4.5: load-free node throughput vs data size", doc["machine"])]


def plot_node_matmul(doc, out):
    pts = _ok(doc)
    targets = [t for t in ("native", "rtl") if any(p["key"]["target"] == t for p in pts)]
    if not targets:
        return []
    fig, axes = plt.subplots(1, len(targets), figsize=(5.2 * len(targets), 4), squeeze=False)
    s = SEED["node_matmul"]
    for ax, t in zip(axes[0], targets):
        sel = [p for p in pts if p["key"]["target"] == t]
        for count in sorted({p["key"]["count"] for p in sel}):
            xs, ys, e = _series([p for p in sel if p["key"]["count"] == count], lambda p: p["key"]["cores"],
                                "input_bytes_per_s")
            ax.errorbar(xs, [y / 1e6 for y in ys], yerr=[[v / 1e6 for v in e[0]], [v / 1e6 for v in e[1]]],
                        marker="o", ms=3, label=f"count {count}")
        ax.axhline(s["max_bytes_per_s"]["counts_2_to_5"] / 1e6, ls="--", color="gray",
                   label="seed max (34 MB/s, FPGA board)")
        if t == "rtl":
            ax.set_yscale("log")
        ax.set_title(f"{t} cores", fontsize=9)
        ax.set_xlabel("matrix-multiplier cores on the node")
        ax.set_ylabel("input throughput (MB/s)")
        ax.legend(fontsize=7)
    return [_save(fig, out, "fig4_10_node_matmul.png",
                  "Fig 4.10: one node, matrix-multiplier cores x inputs per message", doc["machine"])]


def plot_headline(doc, out):
    pts = [p for p in _ok(doc) if p["key"].get("part") == "user" and p["key"].get("peers", "hello") == "hello"]
    if not pts:
        return []
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    delays = sorted({p["key"]["delay_us"] for p in pts})
    for ax, metric, scale, ylabel in ((axes[0], "input_bps", 1e9, "input throughput (Gbit/s)"),
                                      (axes[1], "latency_p50_ms", 1, "median latency (ms)")):
        for pol in ("credit", "queue"):
            for d in delays:
                xs, ys, e = _series([p for p in pts if p["key"]["policy"] == pol and p["key"]["delay_us"] == d],
                                    lambda p: p["key"]["nodes"], metric)
                ax.errorbar(xs, [y / scale for y in ys], yerr=[[v / scale for v in e[0]], [v / scale for v in e[1]]],
                            marker="o" if pol == "credit" else "x", ls="-" if pol == "credit" else "--", ms=4,
                            label=f"{pol}, delay {d} µs")
        ax.set_xlabel("nodes")
        ax.set_ylabel(ylabel)
        ax.set_xticks(sorted({p["key"]["nodes"] for p in pts}))
        ax.legend(fontsize=7)
    echo = [p for p in _ok(doc) if p["key"].get("part") == "echo"]
    if echo:
        axes[0].axhline(_mean(echo[0], "throughput_bps") / 1e9, color="gray", ls=":", label="SMP echo, same size")
        axes[0].axhline(5, color="red", ls=":", lw=0.8)
        axes[0].legend(fontsize=7)
    axes[1].axhline(10, color="red", ls=":", lw=0.8)
    axes[1].set_yscale("log")
    return [_save(fig, out, "headline_user.png", "Headline: 32 KiB inputs, 16 KiB outputs through corefarm server",
                  doc["machine"])]


def plot_cluster(doc, out):
    pts = _ok(doc)
    paths = []
    c = SEED["cluster"]
    for count, table, figs in ((1, c["table_4_1"], ("4_11", "4_12")), (4, c["table_4_2"], ("4_13", "4_14"))):
        sel = [p for p in pts if p["key"]["test"] == "unthrottled" and p["key"]["count"] == count]
        for metric, scale, ylabel, fig_no, seedcol in (("input_bps", 1e9, "throughput (Gbit/s)", figs[0], "bps"),
                                                       ("latency_avg_ms", 1, "average latency (ms)", figs[1],
                                                        "latency_avg_ms")):
            fig, ax = plt.subplots(figsize=(6, 4))
            xs, ys, _ = _series(sel, lambda p: p["key"]["nodes"], metric)
            ax.plot(xs, [y / scale for y in ys], marker="o", label="corefarm")
            rows = table["rows"]
            ax.plot([r["nodes"] for r in rows], [r[seedcol] / scale for r in rows], ls="--", marker="x",
                    color="gray", label=f"seed ({table['ref'].split(',')[0]})")
            ax.set_xlabel("nodes")
            ax.set_ylabel(ylabel)
            if metric.startswith("latency"):
                ax.set_yscale("log")
            ax.legend(fontsize=7)
            what = "throughput" if metric == "input_bps" else "latency"
            paths.append(_save(fig, out, f"fig{fig_no}_cluster_{what}_count{count}.png",
                               f"Fig {fig_no.replace('_', '.')}: {what}, {count} input(s)/message, unthrottled",
                               doc["machine"]))
    sel = [p for p in pts if p["key"]["test"] == "rate"]
    for metric, scale, ylabel, fig_no, seedtab in (("input_bps", 1e9, "throughput (Gbit/s)", "4_15", "table_4_3"),
                                                   ("latency_avg_ms", 1, "average latency (ms)", "4_16", "table_4_4")):
        if not sel:
            break
        fig, ax = plt.subplots(figsize=(6, 4))
        for i, rate in enumerate(sorted({p["key"]["rate_hz"] for p in sel})):
            xs, ys, _ = _series([p for p in sel if p["key"]["rate_hz"] == rate], lambda p: p["key"]["nodes"], metric)
            line, = ax.plot(xs, [y / scale for y in ys], marker="o", label=f"{rate / 1000:g} kHz")
            rows = c[seedtab]["rows"]
            col = "bps" if metric == "input_bps" else "latency_avg_ms"
            if str(rate) in rows[0][col]:
                ax.plot([r["nodes"] for r in rows], [r[col][str(rate)] / scale for r in rows], ls="--",
                        color=line.get_color(), alpha=0.5)
        ax.set_xlabel("nodes")
        ax.set_ylabel(ylabel)
        if metric.startswith("latency"):
            ax.set_yscale("log")
        ax.legend(fontsize=7, title="solid: corefarm, dashed: seed", title_fontsize=7)
        what = "throughput" if metric == "input_bps" else "latency"
        paths.append(_save(fig, out, f"fig{fig_no}_cluster_{what}_rates.png",
                           f"Fig {fig_no.replace('_', '.')}: {what}, 1 input/message, limited rate", doc["machine"]))
    return paths


def plot_software(doc, out):
    sp = doc["params"].get("speedups") or []
    fig, ax = plt.subplots(figsize=(6, 4))
    seed = SEED["speedups"]["rows"]
    ax.bar([r["nodes"] - 0.8 for r in seed], [r["speedup"] for r in seed], width=1.6, color="gray", label="seed §4.6")
    if sp:
        ax.bar([r["nodes"] + 0.8 for r in sp], [r["speedup"] for r in sp], width=1.6, label="corefarm")
    ax.set_xlabel("nodes")
    ax.set_ylabel("speedup over software")
    ax.legend(fontsize=7)
    return [_save(fig, out, "sec4_6_speedup.png", "§4.6: cluster speedup over the software multiplier",
                  doc["machine"])]


SHARING_VARIANTS = ["software", "exclusive", "static", "shared", "cowork"]
SHARING_COLORS = dict(zip(SHARING_VARIANTS, ["C0", "C1", "C2", "C3", "C4"]))


def plot_sharing(doc, out):
    """Shared nodes (seed 002 §5.5): normalised makespan and utilisation vs applications per variant, one panel
    per monitoring period; the speedup axis; single-function utilisation."""
    pts = _ok(doc)
    grid = [p for p in pts if p["key"].get("part") == "grid"]
    periods = sorted({p["key"]["period_ms"] for p in grid if p["key"]["variant"] != "software"})
    seed_makespan = {100: 0.67, 1: 0.23}  # §5.5.4, averaged over speedups 0x-10x and 1-8 applications
    paths = []
    for metric, name, label in (("normalised_makespan", "sharing_makespan.png", "makespan / software-only"),
                                ("utilisation", "sharing_utilisation.png", "utilisation U = T_e / T_o")):
        if not periods:
            break
        fig, axes = plt.subplots(1, len(periods), figsize=(4.2 * len(periods), 3.8), squeeze=False, sharey=True)
        for ax, period in zip(axes[0], periods):
            for v in SHARING_VARIANTS:
                sel = [p for p in grid if p["key"]["variant"] == v
                       and (p["key"]["period_ms"] == period or v == "software")]
                xs, ys, e = _series(sel, lambda p: p["key"]["apps"], metric)
                if xs:
                    ax.errorbar(xs, ys, yerr=e, marker="o", ms=3, label=v, ls="--" if v == "software" else "-",
                                color=SHARING_COLORS[v])
            if metric == "normalised_makespan" and period in seed_makespan:
                ax.axhline(seed_makespan[period], ls=":", color="gray",
                           label=f"seed, P = {period} ms ({seed_makespan[period]:.0%})")
            if metric == "normalised_makespan":
                ax.set_yscale("log")  # the measured software-only runs sit far above on a busy machine
            ax.set_title(f"P = reconfiguration = {period} ms", fontsize=9)
            ax.set_xlabel("concurrent applications")
            ax.set_xscale("log", base=2)
            ax.legend(fontsize=6)
        axes[0][0].set_ylabel(label)
        sp = doc["params"].get("main_speedup")
        paths.append(_save(fig, out, name, f"Shared nodes (seed 002 §5.5): {label}, 8 nodes, 16 functions, "
                           f"speedup {sp}", doc["machine"]))
    spd = [p for p in pts if p["key"].get("part") == "speedup"]
    single = [p for p in pts if p["key"].get("part") == "single"]
    if spd or single:
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.8), squeeze=False)
        ax = axes[0][0]
        for v in SHARING_VARIANTS:
            xs, ys, e = _series([p for p in spd if p["key"]["variant"] == v], lambda p: p["key"]["speedup"],
                                "normalised_makespan")
            if xs:
                ax.errorbar(xs, ys, yerr=e, marker="o", ms=3, label=v, color=SHARING_COLORS[v])
        ax.set_yscale("log")
        ax.set_xlabel("accelerator speedup S (software time / node time)")
        ax.set_ylabel("makespan / software-only")
        ax.set_title("P = 10 ms, 4 applications, 16 functions", fontsize=9)
        ax.legend(fontsize=6)
        ax = axes[0][1]
        apps = sorted({p["key"]["apps"] for p in single})
        width = 0.8 / max(len(SHARING_VARIANTS), 1)
        for i, v in enumerate(SHARING_VARIANTS):
            ys = [next((_mean(p, "utilisation") for p in single
                        if p["key"]["variant"] == v and p["key"]["apps"] == a), None) for a in apps]
            if any(y is not None for y in ys):
                ax.bar([j + i * width for j in range(len(apps))], [y or 0 for y in ys], width=width, label=v,
                       color=SHARING_COLORS[v])
        ax.axhline(0.93, ls=":", color="gray", label="seed: above 93 %")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(apps))], [f"{a} apps" for a in apps])
        ax.set_ylabel("utilisation U")
        ax.set_title("one function (seed §5.5.3), P = 10 ms", fontsize=9)
        ax.legend(fontsize=6)
        paths.append(_save(fig, out, "sharing_speedup_single.png", "Shared nodes: speedup axis and "
                           "single-function utilisation", doc["machine"]))
    return paths


COLL_COLOURS = {"linear": "tab:blue", "binomial": "tab:orange", "star": "tab:green", "server": "tab:purple",
                "openmpi": "black"}


def plot_collectives(doc, out):
    """Group collectives: latency vs message size per tree with the model's curve (dashed) and Open MPI, one panel
    per operation and group size; then corefarm's best tree over Open MPI."""
    pts = [p for p in _ok(doc) if p["key"]["op"] != "barrier"]
    ops = [o for o in ("bcast", "reduce", "allreduce", "allgather", "scatter", "gather")
           if any(p["key"]["op"] == o for p in pts)]
    ns = sorted({p["key"]["n"] for p in pts})
    if not ops or not ns:
        return []
    fig, axes = plt.subplots(len(ops), len(ns), figsize=(3.2 * len(ns), 2.4 * len(ops)), squeeze=False)
    for i, op in enumerate(ops):
        for j, n in enumerate(ns):
            ax = axes[i][j]
            here = [p for p in pts if p["key"]["op"] == op and p["key"]["n"] == n]
            for algo in COLL_COLOURS:
                mine = sorted((p for p in here if p["key"]["algo"] == algo), key=lambda p: p["key"]["bytes"])
                if not mine:
                    continue
                xs = [p["key"]["bytes"] for p in mine]
                ax.plot(xs, [_mean(p, "median_us") for p in mine], marker="o", ms=3, color=COLL_COLOURS[algo],
                        label=algo if algo != "openmpi" else "Open MPI")
                pred = [_mean(p, "predicted_us") for p in mine]
                if all(v is not None for v in pred):
                    ax.plot(xs, pred, ls="--", lw=1, color=COLL_COLOURS[algo])
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{op}, {n} nodes", fontsize=8)
            ax.tick_params(labelsize=6)
            if j == 0:
                ax.set_ylabel("median latency (µs)", fontsize=7)
            if i == len(ops) - 1:
                ax.set_xlabel("bytes per rank", fontsize=7)
            if i == 0 and j == 0:
                ax.legend(fontsize=6)
    paths = [_save(fig, out, "collectives_latency.png",
                   "Collectives: measured (solid), model (dashed), Open MPI over TCP loopback (black)",
                   doc["machine"])]
    fig, axes = plt.subplots(1, len(ns), figsize=(3.2 * len(ns), 3), squeeze=False)
    for j, n in enumerate(ns):
        ax = axes[0][j]
        for op in ops:
            ratios = []
            for b in sorted({p["key"]["bytes"] for p in pts if p["key"]["n"] == n and p["key"]["op"] == op}):
                cf = [_mean(p, "median_us") for p in pts if p["key"]["impl"] == "corefarm"
                      and (p["key"]["op"], p["key"]["n"], p["key"]["bytes"]) == (op, n, b)]
                mpi = [_mean(p, "median_us") for p in pts if p["key"]["impl"] == "openmpi"
                       and (p["key"]["op"], p["key"]["n"], p["key"]["bytes"]) == (op, n, b)]
                if cf and mpi and mpi[0]:
                    ratios.append((b, min(cf) / mpi[0]))
            if ratios:
                ax.plot([r[0] for r in ratios], [r[1] for r in ratios], marker="o", ms=3, label=op)
        ax.axhline(1.0, ls=":", color="gray")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{n} nodes", fontsize=8)
        ax.set_xlabel("bytes per rank", fontsize=7)
        ax.tick_params(labelsize=6)
        if j == 0:
            ax.set_ylabel("corefarm (best tree) / Open MPI", fontsize=7)
            ax.legend(fontsize=6)
    paths.append(_save(fig, out, "collectives_vs_openmpi.png",
                       "Collectives: corefarm's best tree over Open MPI (below 1: corefarm faster)", doc["machine"]))
    return paths


def plot_direct(doc, out):
    """A group's direct data path vs through the server: input throughput and the server's CPU per GB."""
    pts = _ok(doc)
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    for path, colour in (("server", "tab:purple"), ("direct", "tab:blue")):
        mine = [p for p in pts if p["key"]["path"] == path]
        xs, ys, e = _series(mine, lambda p: p["key"]["nodes"], "input_bps")
        a.errorbar(xs, [y / 1e9 for y in ys], yerr=[[v / 1e9 for v in e[0]], [v / 1e9 for v in e[1]]],
                   marker="o", ms=3, color=colour, label=f"via {path}" if path == "server" else "direct")
        xs, ys, _ = _series(mine, lambda p: p["key"]["nodes"], "server_cpu_s_per_gb")
        b.plot(xs, [max(y, 1e-4) for y in ys], marker="o", ms=3, color=colour, label=path)
    a.set_xlabel("nodes")
    a.set_ylabel("input throughput (Gbit/s)")
    a.set_xscale("log", base=2)
    a.legend(fontsize=7)
    b.set_xlabel("nodes")
    b.set_ylabel("server CPU-s per GB moved")
    b.set_xscale("log", base=2)
    b.set_yscale("log")
    return [_save(fig, out, "direct_vs_server.png", "Direct data path vs through the server (32 KiB in, 16 KiB out)",
                  doc["machine"])]


PLOTTERS = {"echo": plot_echo, "server": plot_server, "node": plot_node, "node-matmul": plot_node_matmul,
            "cluster": plot_cluster, "software": plot_software, "headline": plot_headline,
            "sharing": plot_sharing}

PLOTTERS["collectives"] = plot_collectives
PLOTTERS["direct"] = plot_direct


def plot_streams(doc, out):
    """Streams: each part of the streams experiment that ran; `model`: per-class mean latency against
    offered load, measured (error bars: spread over runs) beside Cobham's formula (M/G/1 and M/M/1)."""
    pts = [p for p in _ok(doc) if p["key"].get("part") == "model"]
    if not pts:
        return []
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for cls, colour in ((0, "tab:red"), (1, "tab:blue")):
        mine = [p for p in pts if p["key"]["class"] == cls]
        xs, ys, e = _series(mine, lambda p: p["key"]["load"], "measured_mean_s")
        ax.errorbar(xs, [y * 1e3 for y in ys], yerr=[[v * 1e3 for v in e[0]], [v * 1e3 for v in e[1]]],
                    marker="o", ms=3, color=colour, label=f"class {cls} measured")
        xs, ys, _ = _series(mine, lambda p: p["key"]["load"], "predicted_mg1_s")
        ax.plot(xs, [y * 1e3 for y in ys], ls="--", color=colour, label=f"class {cls} M/G/1")
        xs, ys, _ = _series(mine, lambda p: p["key"]["load"], "predicted_mm1_s")
        ax.plot(xs, [y * 1e3 for y in ys], ls=":", color=colour, label=f"class {cls} M/M/1")
    ax.set_xlabel("offered load ρ")
    ax.set_ylabel("mean time from submit to result (ms)")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    return [_save(fig, out, "streams_model.png", "Priority classes: measured vs queueing model (30 % urgent)",
                  doc["machine"])]


PLOTTERS["streams"] = plot_streams


def plot_sharing_workloads(doc, out):
    """Multi-tenant workloads: the distribution of the calls' completion times per mode (pooled over the seeds),
    one panel per workload (rows) and programming time R (columns)."""
    pts = [p for p in _ok(doc) if p["key"].get("part") == "workload" and p.get("jct_quantiles_ms")]
    if not pts:
        return []
    workloads = [w for w in doc["params"]["workloads"] if any(p["key"]["workload"] == w for p in pts)]
    rs = [r for r in doc["params"]["reconfigure_ms"] if any(p["key"]["reconfigure_ms"] == r for p in pts)]
    fig, axes = plt.subplots(len(workloads), len(rs), figsize=(3.6 * len(rs), 2.8 * len(workloads)),
                             squeeze=False, sharex=True)
    for i, w in enumerate(workloads):
        for j, r in enumerate(rs):
            ax = axes[i][j]
            for m in ("exclusive", "static", "shared", "cowork"):
                p = next((p for p in pts if p["key"]["workload"] == w and p["key"]["reconfigure_ms"] == r
                          and p["key"]["mode"] == m), None)
                if p is None:
                    continue
                q = p["jct_quantiles_ms"]
                ax.plot([max(x, 0.1) for x in q], [k / (len(q) - 1) for k in range(len(q))], label=m,
                        color=SHARING_COLORS[m])
            ax.set_xscale("log")
            ax.set_title(f"{w}, R = {r} ms", fontsize=9)
            if i == len(workloads) - 1:
                ax.set_xlabel("call completion time (ms)")
            if j == 0:
                ax.set_ylabel("share of calls")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    return [_save(fig, out, "sharing_workloads_jct.png", "Calls' completion time per mode "
                  f"({doc['params']['nodes']} nodes)", doc["machine"])]


PLOTTERS["sharing-workloads"] = plot_sharing_workloads
def plot_scale(doc, out):
    """The server at scale: resident memory per node, fan-out, status and /metrics time against the
    node count (with the control model's predictions), and the shared scheduler's costs against nodes."""
    pts = [p for p in _ok(doc) if p["key"].get("part") == "cluster"]
    sch = [p for p in _ok(doc) if p["key"].get("part") == "sched"]
    if not pts:
        return []
    model = {(m["nodes"], m["what"]): m for m in ((doc["params"].get("model") or {}).get("points") or [])}
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(12, 3.6))
    xs = [p["key"]["nodes"] for p in pts]
    m = lambda p, k: p["metrics"][k]["mean"]  # noqa: E731
    a.plot(xs, [m(p, "rss_per_node_kib") for p in pts], marker="o", ms=3, label="idle, per node")
    a.axhline(10, ls=":", color="grey", label="target 10 KiB")
    a.set_ylabel("server resident KiB per node")
    b.plot(xs, [m(p, "fanout_s") for p in pts], marker="o", ms=3, label="fan-out, measured")
    pred = [model.get((x, "fanout_s"), {}).get("predicted") for x in xs]
    if all(v is not None for v in pred):
        b.plot(xs, pred, ls="--", label="fan-out, model")
    b.plot(xs, [m(p, "status_all_ms") / 1e3 for p in pts], marker="s", ms=3, label="status, every node")
    b.plot(xs, [m(p, "status_summary_ms") / 1e3 for p in pts], marker="^", ms=3, label="status, summary")
    b.plot(xs, [m(p, "metrics_ms") / 1e3 for p in pts], marker="v", ms=3, label="/metrics")
    b.set_ylabel("seconds")
    b.set_yscale("log")
    for f in sorted({p["key"]["functions"] for p in sch}):
        mine = sorted((p for p in sch if p["key"]["functions"] == f), key=lambda p: p["key"]["nodes"])
        c.plot([p["key"]["nodes"] for p in mine], [m(p, "period_us") for p in mine], marker="o", ms=3,
               label=f"period, {f} fn")
        c.plot([p["key"]["nodes"] for p in mine], [m(p, "message_us") for p in mine], marker="x", ms=3, ls="--",
               label=f"message, {f} fn")
    c.set_ylabel("scheduler µs")
    c.set_yscale("log")
    for ax in (a, b, c):
        ax.set_xlabel("nodes")
        ax.set_xscale("log")
        ax.legend(fontsize=6)
    return [_save(fig, out, "scale.png", "One server against the node count", doc["machine"])]


PLOTTERS["scale"] = plot_scale


def plot(doc: dict, out: Path) -> list[Path]:
    f = PLOTTERS.get(doc["experiment"])
    if f is None or not _ok(doc):
        return []
    return f(doc, Path(out))
