#!/usr/bin/env python3
"""Two whole builds side by side at a few points, more runs a point than a suite takes.

    python3 bench/recheck.py OLD_BINARY NEW_BINARY [--runs 6] [--out bench/results]

A suite's comparison (`corefarm bench compare` on two suites' results) takes 3 runs a point; at zero
delay, latency percentiles on this 2-CPU machine move by more than that resolves. This re-measures
the zero-delay points of the headline grid (2 and 4 nodes, credit and queue; 32 KiB inputs, 16 KiB
outputs) with each build whole (its own server, nodes and benchmarking user), the builds' runs
interleaved, and writes the two recordings in the suite's format (DIR/recheck-old.json,
recheck-new.json) and their comparison (DIR/compare-recheck.json, which bench/report.py renders).
Each run starts a fresh cluster; children run in their own process groups and are always killed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

POINTS = [(nodes, policy) for nodes in (2, 4) for policy in ("credit", "queue")]
METRICS = {"input_bps": ("throughput", "input_bps"), "latency_p50_ms": ("latency", "p50_ms"),
           "latency_p99_ms": ("latency", "p99_ms")}


def spawn(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)


def kill(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


def one_run(binary: str, nodes: int, policy: str) -> dict:
    """One `bench user` measurement on a fresh cluster of this build."""
    server = spawn([binary, "server", "--nodes-listen", "127.0.0.1:0", "--users-listen", "127.0.0.1:0",
                    "--policy", policy])
    node = None
    try:
        line = server.stdout.readline()  # "listening nodes=IP:PORT users=IP:PORT"
        m = re.search(r"nodes=(\S+) users=(\S+)", line)
        if not m:
            raise RuntimeError(f"{binary} server did not say where it listens: {line!r}")
        node = spawn([binary, "node", "--server", m.group(1), "--count", str(nodes)])
        out = subprocess.run([binary, "bench", "user", "--server", m.group(2), "--input-size", "32768",
                              "--output-size", "16384", "--count", "1", "--delay-us", "0",
                              "--nodes", str(nodes), "--duration", "3", "--warmup", "1", "--json"],
                             capture_output=True, text=True, timeout=60, check=True)
        r = json.loads(out.stdout)
        return {name: r[a][b] for name, (a, b) in METRICS.items()}
    finally:
        for p in (node, server):
            if p is not None:
                kill(p)


def recording(build: str, runs: dict) -> dict:
    points = []
    for (nodes, policy), rs in runs.items():
        metrics = {}
        for name in METRICS:
            v = [r[name] for r in rs]
            metrics[name] = {"runs": len(v), "mean": statistics.mean(v), "min": min(v), "max": max(v),
                             "stdev": statistics.stdev(v) if len(v) > 1 else 0.0}
        points.append({"key": {"part": "user", "policy": policy, "nodes": nodes, "delay_us": 0},
                       "status": "ok", "reason": None, "runs": len(rs), "metrics": metrics})
    return {"experiment": "recheck", "build": build, "points": points}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    a = ap.parse_args()
    builds = {"old": a.old, "new": a.new}
    runs = {b: {p: [] for p in POINTS} for b in builds}
    t0 = time.monotonic()
    for i in range(a.runs):
        for p in POINTS:
            for b, binary in builds.items():
                r = one_run(binary, *p)
                runs[b][p].append(r)
                print(f"[{time.monotonic() - t0:5.0f} s] run {i + 1}/{a.runs} {b} nodes={p[0]} {p[1]}: "
                      f"{r['input_bps'] / 1e9:.2f} Gbit/s p50 {r['latency_p50_ms']:.3f} ms "
                      f"p99 {r['latency_p99_ms']:.3f} ms", file=sys.stderr)
    a.out.mkdir(parents=True, exist_ok=True)
    files = {}
    for b in builds:
        files[b] = a.out / f"recheck-{b}.json"
        files[b].write_text(json.dumps(recording(b, runs[b]), indent=1) + "\n")
    cmp = subprocess.run([a.new, "bench", "compare", "--json", str(files["old"]), str(files["new"])],
                         capture_output=True, text=True)
    (a.out / "compare-recheck.json").write_text(cmp.stdout)
    print(f"wrote {files['old']}, {files['new']}, {a.out / 'compare-recheck.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
