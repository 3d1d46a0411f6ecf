#!/usr/bin/env python3
"""corefarm benchmark suite: the experiments of seed 000 chapter 4.

    python3 bench/suite.py EXPERIMENT [--quick] [--out DIR] [--runs N] [--duration S]

EXPERIMENT is one of echo, server, node, node-matmul, cluster, software, all.
It drives the real `corefarm` binary ($COREFARM_BIN, else target/release/corefarm)
as separate processes, the way the seed's Python scripts drove its programs:

    corefarm server --nodes-listen 127.0.0.1:0 --users-listen 127.0.0.1:0 --policy P
        -> prints "listening nodes=IP:PORT users=IP:PORT"
    corefarm node --server IP:PORT --count N        (N simulated nodes)
    corefarm bench user --server IP:PORT ... --json (one measurement)
    corefarm bench echo server / echo client --json

Each experiment writes DIR/<experiment>.json and .csv (every point records its
runs and their spread; a failed point records why) and one PNG per seed figure.
Child processes run in their own process groups and are always killed.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENTS = ["echo", "server", "node", "node-matmul", "cluster", "software"]
KIB = 1024

# Matrix multiplier sizes (seed 000 §4.3.2.3).
MM_INPUT, MM_OUTPUT = 32768, 16384


# ---------------------------------------------------------------- utilities

def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def human_bps(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    for p, d in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= d:
            return f"{v / d:.2f} {p}bit/s"
    return f"{v:.0f} bit/s"


def human_size(n: int) -> str:
    for unit, d in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= d and n % d == 0:
            return f"{n // d} {unit}"
    return f"{n} B"


def spread(values: list[float]) -> dict:
    """Mean, extremes and sample standard deviation of one metric over runs."""
    if not values:
        return {"runs": 0, "mean": None, "min": None, "max": None, "stdev": None}
    return {
        "runs": len(values),
        "mean": statistics.fmean(values),
        "min": min(values),
        "max": max(values),
        "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
    }


def machine(binary: Path | None) -> dict:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    try:
        mem = next((int(l.split()[1]) * 1024 for l in Path("/proc/meminfo").read_text().splitlines()
                    if l.startswith("MemTotal")), None)
    except OSError:
        mem = None
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory_bytes": mem,
        "kernel": platform.release(),
        "os": platform.system(),
        "python": platform.python_version(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": commit,
        "binary": str(binary) if binary else None,
    }


# ---------------------------------------------------------------- processes

class Child:
    """A child process in its own process group, logging to files.

    Output goes to files rather than pipes so a chatty child can never block
    on a full pipe; the first line announcing the ports is read from the file.
    """

    def __init__(self, args: list[str], logdir: Path, name: str):
        logdir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.out_path = logdir / f"{name}.out"
        self.err_path = logdir / f"{name}.err"
        self.out = open(self.out_path, "wb")
        self.err = open(self.err_path, "wb")
        self.proc = subprocess.Popen(args, stdout=self.out, stderr=self.err, stdin=subprocess.DEVNULL,
                                     start_new_session=True)

    def wait_line(self, prefix: str, timeout: float = 15.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.out_path.read_text(errors="replace").splitlines():
                if line.startswith(prefix):
                    return line
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.stderr_tail()}")
            time.sleep(0.02)
        raise RuntimeError(f"{self.name} printed no '{prefix}' line within {timeout:.0f} s: {self.stderr_tail()}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr_tail(self, n: int = 400) -> str:
        try:
            return " ".join(self.err_path.read_text(errors="replace")[-n:].split())
        except OSError:
            return ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self.out.close()
        self.err.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()


def run_json(args: list[str], timeout: float) -> tuple[dict | None, str]:
    """Runs a command that prints one JSON object; returns (object, error text)."""
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s"
    obj = None
    for line in reversed(p.stdout.strip().splitlines()):
        try:
            obj = json.loads(line)
            break
        except json.JSONDecodeError:
            continue
    err = "" if p.returncode == 0 else (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[0]
    if obj is None and not err:
        err = "no JSON output"
    return obj, err


# ---------------------------------------------------------------- recording

class Recorder:
    """Collects the points of one experiment, shows progress and ETA, writes CSV + JSON."""

    def __init__(self, ctx: "Context", experiment: str, planned: int, params: dict):
        self.ctx, self.experiment, self.planned = ctx, experiment, max(planned, 1)
        self.params = params
        self.points: list[dict] = []
        self.started = time.monotonic()
        self.notes: list[str] = []

    def add(self, key: dict, runs: list[dict], failure: str | None = None, extra: dict | None = None) -> dict:
        """Records a point from per-run metric dicts; a failure marks the point failed."""
        names = sorted({k for r in runs for k in r})
        metrics = {n: spread([r[n] for r in runs if r.get(n) is not None]) for n in names}
        point = {"key": key, "status": "failed" if failure else "ok", "reason": failure,
                 "runs": len(runs), "metrics": metrics}
        if extra:
            point.update(extra)
        self.points.append(point)
        self._progress(point)
        return point

    def skip(self, key: dict, reason: str) -> None:
        self.points.append({"key": key, "status": "skipped", "reason": reason, "runs": 0, "metrics": {}})
        self._progress(self.points[-1])

    def _progress(self, p: dict) -> None:
        done = len(self.points)
        el = time.monotonic() - self.started
        eta = el / done * max(self.planned - done, 0)
        key = " ".join(f"{k}={v}" for k, v in p["key"].items())
        m = p["metrics"]
        main = next((m[k]["mean"] for k in ("input_bps", "throughput_bps") if k in m and m[k]["mean"] is not None), None)
        lat = m.get("latency_avg_ms", {}).get("mean")
        what = p["status"] if p["status"] != "ok" else human_bps(main) + (f", {lat:.3f} ms" if lat is not None else "")
        if p["status"] != "ok" and p.get("reason"):
            what += f" ({p['reason'][:120]})"
        log(f"[{self.experiment} {done}/{self.planned}] {key}: {what}  (elapsed {el:.0f} s, ETA {eta:.0f} s)")

    def write(self) -> dict:
        doc = {
            "experiment": self.experiment,
            "quick": self.ctx.quick,
            "machine": self.ctx.machine,
            "params": self.params,
            "elapsed_s": round(time.monotonic() - self.started, 3),
            "notes": self.notes,
            "points": self.points,
        }
        out = self.ctx.out
        (out / f"{self.experiment}.json").write_text(json.dumps(doc, indent=1) + "\n")
        keys = sorted({k for p in self.points for k in p["key"]}, key=lambda k: list(self.points[0]["key"]).index(k)
                      if k in self.points[0]["key"] else 99)
        mets = sorted({m for p in self.points for m in p["metrics"]})
        with open(out / f"{self.experiment}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(keys + ["status", "reason", "runs"] +
                       [f"{m}_{s}" for m in mets for s in ("mean", "min", "max", "stdev")])
            for p in self.points:
                row = [p["key"].get(k, "") for k in keys] + [p["status"], p.get("reason") or "", p["runs"]]
                for m in mets:
                    s = p["metrics"].get(m, {})
                    row += [s.get(x, "") if s.get(x) is not None else "" for x in ("mean", "min", "max", "stdev")]
                w.writerow(row)
        return doc


class Context:
    def __init__(self, args):
        self.quick = args.quick
        self.out = Path(args.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.logs = self.out / "logs"
        self.binary = find_binary(required=False)
        self.machine = machine(self.binary)
        self.runs = args.runs or (1 if self.quick else 3)
        self.duration = args.duration or (0.5 if self.quick else 10.0)
        self.warmup = args.warmup if args.warmup is not None else (0.2 if self.quick else 1.0)
        self.policy = args.policy
        # Seconds results may trail the end of a run before the point fails.
        self.drain = 3.0 if self.quick else 10.0
        self.max_nodes = args.max_nodes
        self.seq = 0

    def need_binary(self) -> Path:
        if self.binary is None:
            raise SkipExperiment("corefarm binary not found: build it (cargo build --release) or set COREFARM_BIN")
        return self.binary

    def child(self, args: list[str], name: str) -> Child:
        self.seq += 1
        return Child(args, self.logs, f"{self.seq:04d}-{name}")


class SkipExperiment(Exception):
    pass


def find_binary(required: bool = True) -> Path | None:
    env = os.environ.get("COREFARM_BIN")
    cands = [Path(env)] if env else [ROOT / "target/release/corefarm"]
    for c in cands:
        if c.is_file() and os.access(c, os.X_OK):
            return c.resolve()
    if required:
        raise SkipExperiment(f"corefarm binary not found (tried {', '.join(map(str, cands))})")
    return None


# ---------------------------------------------------------------- cluster helpers

class Cluster:
    """A server plus a node process with `nodes` simulated nodes."""

    def __init__(self, ctx: Context, policy: str, nodes: int):
        self.ctx, self.policy, self.nodes = ctx, policy, nodes
        self.server = self.node = None

    def __enter__(self):
        b = str(self.ctx.need_binary())
        try:
            self.server = self.ctx.child([b, "server", "--nodes-listen", "127.0.0.1:0", "--users-listen",
                                          "127.0.0.1:0", "--policy", self.policy], f"server-{self.policy}")
            line = self.server.wait_line("listening")
            fields = dict(f.split("=", 1) for f in line.split()[1:])
            self.nodes_addr, self.users_addr = fields["nodes"], fields["users"]
            self.node = self.ctx.child([b, "node", "--server", self.nodes_addr, "--count", str(self.nodes)],
                                       f"nodes-{self.nodes}")
        except Exception:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        for c in (self.node, self.server):
            if c is not None:
                c.kill()

    def check(self) -> str | None:
        for c in (self.server, self.node):
            if c is not None and not c.alive():
                return f"{c.name} exited with {c.proc.returncode}: {c.stderr_tail()}"
        return None


def user_metrics(rep: dict) -> dict:
    t, l = rep["throughput"], rep["latency"]
    return {
        "input_bps": t["input_bps"], "output_bps": t["output_bps"], "offered_input_bps": t["offered_input_bps"],
        "messages_per_s": t["messages_per_s"], "send_rate_hz": t["send_rate_hz"],
        "latency_avg_ms": l["avg_ms"], "latency_min_ms": l["min_ms"], "latency_p50_ms": l["p50_ms"],
        "latency_p90_ms": l["p90_ms"], "latency_p99_ms": l["p99_ms"], "latency_max_ms": l["max_ms"],
    }


def user_point(ctx: Context, cl: Cluster, rec: Recorder, key: dict, *, input_size: int, output_size: int,
               count: int, delay_us: int, rate_hz: float | None = None, drain: float = 10.0) -> dict:
    """Runs `bench user` ctx.runs times against the cluster and records the point."""
    b = str(ctx.need_binary())
    args = [b, "bench", "user", "--server", cl.users_addr, "--input-size", str(input_size), "--output-size",
            str(output_size), "--count", str(count), "--delay-us", str(delay_us), "--duration", str(ctx.duration),
            "--warmup", str(ctx.warmup), "--nodes", str(cl.nodes), "--drain-timeout", str(drain), "--json"]
    if rate_hz:
        args += ["--rate-hz", str(rate_hz)]
    runs, failure = [], None
    timeout = ctx.duration + ctx.warmup + drain + 30
    for _ in range(ctx.runs):
        # Nodes register asynchronously and return to the pool after each user,
        # so "fewer nodes than asked for" is retried for a while.
        deadline = time.monotonic() + 15
        while True:
            rep, err = run_json(args, timeout)
            if rep is None and "assigned" in err and time.monotonic() < deadline and not cl.check():
                time.sleep(0.2)
                continue
            break
        if rep is not None and rep.get("ok"):
            runs.append(user_metrics(rep))
            continue
        failure = "; ".join((rep or {}).get("errors", [])[:3]) or err or "failed"
        dead = cl.check()
        if dead:
            failure += f" [{dead}]"
        break
    return rec.add(key, runs, failure, {"message_bytes": input_size * count})


def sweep(ctx: Context, rec: Recorder, policy: str, nodes: int, points: list[tuple[dict, dict]]) -> None:
    """Runs user points against one cluster, starting a fresh cluster after a
    failed point so that nodes left busy by a stuck run cannot fail the rest."""
    pending = list(points)
    while pending:
        try:
            with Cluster(ctx, policy, nodes) as cl:
                while pending:
                    key, kw = pending.pop(0)
                    p = user_point(ctx, cl, rec, key, **kw)
                    if p["status"] != "ok" and pending:
                        log(f"restarting server and nodes after the failed point")
                        break
        except RuntimeError as e:
            # The cluster itself did not start: every remaining point fails with that reason.
            for key, kw in pending:
                rec.add(key, [], str(e))
            pending = []


# ---------------------------------------------------------------- experiments

def exp_echo(ctx: Context) -> dict:
    """§4.2.1 / fig 4.1: SMP echo throughput vs payload size for 1-4 clients."""
    b = str(ctx.need_binary())
    if ctx.quick:
        sizes, clients = [1, 64, 4 * KIB, 64 * KIB, 1 << 20], [1, 2]
    else:
        sizes, clients = [1 << i for i in range(0, 28)], [1, 2, 3, 4]
    rec = Recorder(ctx, "echo", len(sizes) * len(clients), {"sizes": sizes, "clients": clients,
                                                             "duration_s": ctx.duration, "runs": ctx.runs})
    with ctx.child([b, "bench", "echo", "server", "--listen", "127.0.0.1:0"], "echo-server") as srv:
        addr = srv.wait_line("listening").split()[1]
        for n in clients:
            for size in sizes:
                runs, failure = [], None
                for _ in range(ctx.runs):
                    rep, err = run_json([b, "bench", "echo", "client", "--addr", addr, "--size", str(size),
                                         "--clients", str(n), "--duration", str(ctx.duration), "--warmup",
                                         str(ctx.warmup), "--json"], ctx.duration + ctx.warmup + 60)
                    if rep is None or rep.get("errors"):
                        failure = err or "; ".join(rep.get("error_samples", [])) or "echo errors"
                        break
                    runs.append({"throughput_bps": rep["throughput_bps"], "messages_per_s": rep["messages_per_s"]})
                if failure and not srv.alive():
                    failure += f" [echo server exited: {srv.stderr_tail()}]"
                rec.add({"clients": n, "size": size}, runs, failure)
    return rec.write()


def server_grid(quick: bool, max_message: int) -> list[tuple[int, int]]:
    """(input size, input count) pairs: input sizes 16 B -> 128 KiB, counts 1 -> as many as fit."""
    if quick:
        return [(16, 1), (1 * KIB, 16), (32 * KIB, 4)]
    grid = []
    for size in [16 << (2 * i) for i in range(7)] + [128 * KIB]:  # 16 B, 64 B ... 64 KiB, 128 KiB
        count = 1
        while size * count <= max_message:
            grid.append((size, count))
            count *= 16  # every 16x: the full grid stays a few hours at 10 s x 3 runs per point
    return grid


def exp_server(ctx: Context) -> dict:
    """§4.2.2 / figs 4.3, 4.4: zero-delay benchmarking configuration through the server."""
    ctx.need_binary()
    grid = server_grid(ctx.quick, 16 << 20)
    policies = ["queue", "stack", "credit"]
    nodes_list = [1, 2] if ctx.quick else [1, 2, 3, 4]
    rec = Recorder(ctx, "server", len(grid) * len(policies) * len(nodes_list),
                   {"grid": grid, "policies": policies, "nodes": nodes_list, "delay_us": 0,
                    "duration_s": ctx.duration, "runs": ctx.runs})
    for policy in policies:
        for n in nodes_list:
            sweep(ctx, rec, policy, n, [
                ({"policy": policy, "nodes": n, "input_size": size, "count": count},
                 dict(input_size=size, output_size=size, count=count, delay_us=0, drain=ctx.drain))
                for size, count in grid])
    return rec.write()


def exp_node(ctx: Context) -> dict:
    """§4.2.3 / fig 4.5: one node with zero-time cores, throughput vs data size."""
    ctx.need_binary()
    sizes = [16, 1 * KIB, 16 * KIB, 128 * KIB] if ctx.quick else [16 << (2 * i) for i in range(8)] + [128 * KIB]
    sizes = sorted(set(sizes))
    rec = Recorder(ctx, "node", len(sizes), {"sizes": sizes, "delay_us": 0, "method":
                   f"one simulated node behind the server ({ctx.policy} policy), one input per message"})
    rec.notes.append("The seed isolated the node manager on the board and generated data inside it; here the "
                     "node is driven through the server over loopback, so the figure includes the server hop.")
    sweep(ctx, rec, ctx.policy, 1, [({"size": size}, dict(input_size=size, output_size=size, count=1, delay_us=0,
                                                            drain=ctx.drain)) for size in sizes])
    return rec.write()


def exp_node_matmul(ctx: Context) -> dict:
    """§4.4.1 / fig 4.10: one node with 1..N matrix-multiplier cores x input counts 1-5."""
    rec = Recorder(ctx, "node-matmul", 1, {})
    reason = ("needs a driver that sends a real (image) configuration and streams matrices; `bench user` only "
              "speaks the benchmarking configuration and no matrix-multiplier image builder is wired into the "
              "CLI yet")
    b = ctx.binary
    if b is not None:
        h = subprocess.run([str(b), "image", "--help"], capture_output=True, text=True)
        if "matmul" in h.stdout or "mat-mul" in h.stdout:
            reason = "matrix-multiplier image tooling found, but the node-matmul driver is not implemented yet"
    log(f"node-matmul: skipped: {reason}")
    rec.skip({"cores": "1..N", "count": "1..5"}, reason)
    return rec.write()


def cluster_plan(quick: bool, max_nodes: int) -> dict:
    if quick:
        return {"nodes": [1, 4], "rates": [1000, 5000]}
    nodes = [n for n in [1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44] if n <= max_nodes]
    return {"nodes": nodes, "rates": [1000, 2000, 5000, 10000, 50000, 100000]}


def exp_cluster(ctx: Context) -> dict:
    """§4.4.2 / tables 4.1-4.4: simulated matrix-multiplier cluster."""
    ctx.need_binary()
    plan = cluster_plan(ctx.quick, ctx.max_nodes)
    tests = [("unthrottled", 919, 1, None), ("unthrottled", 919, 4, None)]
    tests += [("rate", 1117, 1, r) for r in plan["rates"]]
    rec = Recorder(ctx, "cluster", len(plan["nodes"]) * len(tests),
                   {**plan, "policy": ctx.policy, "input_size": MM_INPUT, "output_size": MM_OUTPUT,
                    "duration_s": ctx.duration, "runs": ctx.runs})
    for n in plan["nodes"]:
        sweep(ctx, rec, ctx.policy, n, [
            ({"test": mode, "delay_us": delay, "count": count, "rate_hz": rate or 0, "nodes": n},
             dict(input_size=MM_INPUT, output_size=MM_OUTPUT, count=count, delay_us=delay, rate_hz=rate,
                  drain=ctx.drain * 3))
            for mode, delay, count, rate in tests])
    return rec.write()


def exp_software(ctx: Context) -> dict:
    """§4.5/§4.6: software matrix multiplier baseline and speedups against the cluster."""
    rec = Recorder(ctx, "software", 1, {"source": "bench/software/matmul.cpp", "flags": "-O3"})
    cxx = shutil.which(os.environ.get("CXX", "c++"))
    if not cxx:
        rec.skip({"impl": "c++ -O3"}, "no C++ compiler (c++ or $CXX) on PATH")
        return rec.write()
    secs = 1.0 if ctx.quick else 5.0
    with tempfile.TemporaryDirectory() as d:
        exe = Path(d) / "matmul"
        c = subprocess.run([cxx, "-O3", "-o", str(exe), str(ROOT / "bench/software/matmul.cpp")],
                           capture_output=True, text=True)
        if c.returncode != 0:
            rec.add({"impl": "c++ -O3"}, [], f"compilation failed: {c.stderr.strip()[:300]}")
            return rec.write()
        runs = []
        for _ in range(ctx.runs):
            rep, err = run_json([str(exe), str(secs)], secs + 30)
            if rep is None:
                rec.add({"impl": "c++ -O3"}, runs, err)
                return rec.write()
            runs.append({"input_bps": rep["input_bytes_per_s"] * 8, "input_bytes_per_s": rep["input_bytes_per_s"],
                         "us_per_multiplication": rep["us_per_multiplication"]})
    sw = rec.add({"impl": "c++ -O3"}, runs)
    # Speedups as in §4.6: cluster throughput (4 inputs per message, unthrottled,
    # 919 us per input: table 4.2) over the software throughput.
    base = sw["metrics"]["input_bps"]["mean"]
    cl_path = ctx.out / "cluster.json"
    speedups = []
    if cl_path.exists():
        cl = json.loads(cl_path.read_text())
        for p in cl["points"]:
            k = p["key"]
            if k.get("test") == "unthrottled" and k.get("count") == 4 and p["status"] == "ok":
                speedups.append({"nodes": k["nodes"], "cluster_bps": p["metrics"]["input_bps"]["mean"],
                                 "speedup": p["metrics"]["input_bps"]["mean"] / base})
    else:
        rec.notes.append("no cluster.json next to this file: run the cluster experiment first for speedups")
    rec.params["speedups"] = speedups
    return rec.write()


RUNNERS = {"echo": exp_echo, "server": exp_server, "node": exp_node, "node-matmul": exp_node_matmul,
           "cluster": exp_cluster, "software": exp_software}


# ---------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiment", choices=EXPERIMENTS + ["all"])
    ap.add_argument("--quick", action="store_true", help="a few seconds per experiment (CI)")
    ap.add_argument("--out", default=str(ROOT / "bench-results"), help="results directory")
    ap.add_argument("--runs", type=int, help="runs per point (default 1 quick, 3 full)")
    ap.add_argument("--duration", type=float, help="measured seconds per run (default 0.5 quick, 10 full)")
    ap.add_argument("--warmup", type=float, help="warm-up seconds per run (default 0.2 quick, 1 full)")
    ap.add_argument("--policy", default="queue", help="server policy for node and cluster (seed: queue)")
    ap.add_argument("--max-nodes", type=int, default=44, help="largest node count of the cluster sweep")
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    ctx = Context(args)
    names = EXPERIMENTS if args.experiment == "all" else [args.experiment]
    log(f"corefarm suite: {', '.join(names)}{' (quick)' if ctx.quick else ''} -> {ctx.out}; "
        f"binary {ctx.binary or 'NOT FOUND'}; {ctx.machine['nproc']} CPUs ({ctx.machine['cpu']})")
    failed = 0
    t0 = time.monotonic()
    for name in names:
        try:
            doc = RUNNERS[name](ctx)
        except SkipExperiment as e:
            log(f"{name}: skipped: {e}")
            rec = Recorder(ctx, name, 1, {})
            rec.skip({}, str(e))
            doc = rec.write()
        bad = [p for p in doc["points"] if p["status"] == "failed"]
        failed += len(bad)
        if not args.no_plots:
            try:
                import plots
                for png in plots.plot(doc, ctx.out):
                    log(f"{name}: wrote {png}")
            except ImportError as e:
                log(f"{name}: plots skipped ({e})")
    log(f"suite finished in {time.monotonic() - t0:.0f} s; {failed} failed point(s); results in {ctx.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
