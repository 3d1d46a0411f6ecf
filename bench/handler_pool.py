#!/usr/bin/env python3
"""Streams, handlers against worker count: throughput of a compute-bound
streaming handler set on one node with `--handler-workers 1` and `2`
(one payload thread each, `--spin-threads 1`), through a real
`corefarm local` per setting.

Each cluster gets the same stream of `work` messages (the handler set of
bench/streams_overlap.py: ROUNDS multiply-xors per 8-byte word) with up
to WINDOW in flight; one worker process runs one message at a time, so two
workers can run two messages at once. Both clusters run side by side and
the measurements alternate between them, so a shared machine's load
drifts into both alike.

Usage: COREFARM_BIN=path/to/corefarm python3 bench/handler_pool.py
Prints one JSON object: messages per second per setting (median of
--repeat runs) and their ratio."""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import corefarm

from streams_overlap import Local, build, message

KIB = 1024


def rate(client, msg, n, window):
    """Messages per second for `n` messages, at most `window` in flight."""
    t = time.perf_counter()
    for i in range(n):
        client.submit(msg)
        if i >= window - 1:
            client.recv(timeout=600)
    for _ in range(min(n, window - 1)):
        client.recv(timeout=600)
    return n / (time.perf_counter() - t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-kib", type=int, default=256, help="message size")
    ap.add_argument("--rounds", type=int, default=50, help="compute per 8-byte word")
    ap.add_argument("--messages", type=int, default=40, help="messages per run")
    ap.add_argument("--window", type=int, default=4, help="messages in flight")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workers", default="1,2")
    a = ap.parse_args()
    binary = os.environ.get("COREFARM_BIN") or shutil.which("corefarm")
    settings = [int(w) for w in a.workers.split(",")]
    with tempfile.TemporaryDirectory() as d:
        image = build(binary, d, a.rounds)
    work = message(1, a.size_kib * KIB)
    locals_, clients = {}, {}
    try:
        for w in settings:
            locals_[w] = Local(binary, ["--handler-workers", str(w), "--spin-threads", "1"])
            clients[w] = corefarm.connect(locals_[w].users, nodes=1, timeout=600)
            clients[w].configure(image)
            rate(clients[w], work, a.window, a.window)  # warm-up: every worker started
        runs = {w: [] for w in settings}
        for _ in range(a.repeat):
            for w in settings:
                runs[w].append(rate(clients[w], work, a.messages, a.window))
    finally:
        for c in clients.values():
            c.close()
        for lo in locals_.values():
            lo.stop()
    med = {w: statistics.median(v) for w, v in runs.items()}
    base = med[settings[0]]
    print(json.dumps({
        "size_kib": a.size_kib, "rounds": a.rounds, "messages": a.messages, "window": a.window,
        "cpus": os.cpu_count(),
        "messages_per_s": {str(w): round(m, 2) for w, m in med.items()},
        "runs": {str(w): [round(x, 2) for x in v] for w, v in runs.items()},
        "ratio_over_first": {str(w): round(m / base, 3) for w, m in med.items()},
    }, indent=1))


if __name__ == "__main__":
    sys.exit(main())
