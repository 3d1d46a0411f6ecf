#!/usr/bin/env python3
"""Markdown tables for docs/benchmarks.md from `bench/suite.py collectives` results.

    python3 bench/collectives_tables.py bench/results/collectives.json

Prints: latency per operation, tree and size beside Open MPI; the model's
error; the binomial/linear crossover; corefarm's best tree over Open MPI.
"""

from __future__ import annotations

import json
import statistics
import sys


def size(n: int) -> str:
    for unit, d in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= d and n % d == 0:
            return f"{n // d} {unit}"
    return f"{n} B"


def us(v) -> str:
    if v is None:
        return "-"
    return f"{v / 1000:.2f} ms" if v >= 1000 else f"{v:.0f} µs"


def main(path: str) -> None:
    doc = json.load(open(path))
    pts = [p for p in doc["points"] if p["status"] == "ok"]
    m = {}
    for p in pts:
        k = p["key"]
        m[(k["op"], k["algo"], k["n"], k["bytes"])] = {n: v["mean"] for n, v in p["metrics"].items()}
    ns = sorted({k[2] for k in m})
    sizes = sorted({k[3] for k in m if k[3] > 0})
    algos = ["linear", "binomial", "star"]

    for op in ("bcast", "reduce", "allreduce", "allgather"):
        print(f"\n**{op}** (median; model error in brackets)\n")
        print("| n | bytes/rank | " + " | ".join(algos) + " | Open MPI | best / MPI |")
        print("|---|---|" + "---|" * (len(algos) + 2))
        for n in ns:
            for b in sizes:
                cells, best = [], None
                for a in algos:
                    r = m.get((op, a, n, b))
                    if r is None:
                        cells.append("-")
                        continue
                    e = r.get("model_error")
                    cells.append(us(r["median_us"]) + (f" ({e * 100:+.0f} %)" if e is not None else ""))
                    best = r["median_us"] if best is None else min(best, r["median_us"])
                mpi = m.get((op, "openmpi", n, b))
                ratio = f"{best / mpi['median_us']:.2f}" if mpi and best else "-"
                print(f"| {n} | {size(b)} | " + " | ".join(cells) + f" | {us(mpi and mpi['median_us'])} | {ratio} |")

    print("\n**Other operations** (median; model error)\n")
    print("| op | n | bytes/rank | corefarm | Open MPI |")
    print("|---|---|---|---|---|")
    for op in ("barrier", "scatter", "gather"):
        for n in ns:
            for b in ([0] if op == "barrier" else sizes):
                cf = [(a, m[(op, a, n, b)]) for a in algos + ["server"] if (op, a, n, b) in m]
                mpi = m.get((op, "openmpi", n, b))
                txt = ", ".join(f"{a} {us(r['median_us'])} ({r['model_error'] * 100:+.0f} %)" if r.get("model_error")
                                is not None else f"{a} {us(r['median_us'])}" for a, r in cf)
                print(f"| {op} | {n} | {size(b) if b else '-'} | {txt} | {us(mpi and mpi['median_us'])} |")

    errs = [(k, r["model_error"]) for k, r in m.items() if r.get("model_error") is not None]
    print("\n**Model error** (|predicted − measured| / measured)\n")
    print("| op | points | median | within 20 % | worst |")
    print("|---|---|---|---|---|")
    for op in ("bcast", "reduce", "allreduce", "allgather", "barrier", "scatter", "gather", "all"):
        e = [abs(v) for k, v in errs if op == "all" or k[0] == op]
        if e:
            print(f"| {op} | {len(e)} | {statistics.median(e) * 100:.0f} % | "
                  f"{sum(x <= 0.2 for x in e)}/{len(e)} | {max(e) * 100:.0f} % |")

    print("\n**Binomial vs linear** (bcast, reduce, allreduce: which tree is faster, ratio linear/binomial)\n")
    print("| op | n | " + " | ".join(size(b) for b in sizes) + " |")
    print("|---|---|" + "---|" * len(sizes))
    for op in ("bcast", "reduce", "allreduce"):
        for n in ns:
            if n <= 2:
                continue
            row = []
            for b in sizes:
                lin, bi = m.get((op, "linear", n, b)), m.get((op, "binomial", n, b))
                row.append("-" if not (lin and bi) else
                           f"{'L' if lin['median_us'] < bi['median_us'] else 'B'} {lin['median_us'] / bi['median_us']:.2f}")
            print(f"| {op} | {n} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
