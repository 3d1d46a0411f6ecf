#!/usr/bin/env python3
"""Streams, server<->node link: FPsPIN's overlap ratio and the bulk cost of
chunking, measured through a real `corefarm local` (one node).

Overlap: a compute-bound handler set (`work`) and a trivial one (`noop`) on
messages of 1-128 MiB, with chunks off on the node link (the node gets the
whole message, then its handlers run) and on (the handlers are fed chunk
by chunk as the message arrives):

    T_transfer = round trip of a `noop` message, chunks off
    T_compute  = round trip of a `work` message, chunks off - T_transfer
    T_total    = round trip of a `work` message with chunks on
    overlap    = (T_transfer + T_compute - T_total) / T_compute

Bulk: throughput of 16 MiB messages through the benchmarking core (zero
delay), chunks at the default size versus off, in the same run.

Both clusters run side by side and measurements alternate between them.
One handler thread by default: on a 2-core machine, more would take the
CPU the transfer needs (FPsPIN's handlers run on their own cores).

Usage: COREFARM_BIN=path/to/corefarm python3 bench/streams_overlap.py
Prints one JSON object (medians of --repeat runs)."""

import argparse
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import corefarm

LISTENING = re.compile(r"nodes=(\S+) users=(\S+)")
MIB = 1 << 20
INPUT = 64 * 1024

SINK = r"""
#include "corefarm/hls.h"
hls_avalon_agent_component
component void sink(hls_avalon_agent_memory_argument(65536) uint8_t *in,
                    hls_avalon_agent_memory_argument(64) uint8_t *out) {
    for (int i = 0; i < 64; i++) out[i] = in[i];
}
"""

# `work`: ROUNDS of a multiply-xor per 8-byte word, summed atomically;
# `noop`: nothing per chunk. Both emit 8 bytes from the tail.
HANDLERS = r"""
#include <corefarm/spin.h>
#include <string.h>
#define ROUNDS %d

int work_payload(const cf_spin_args *a, const cf_spin_ops *ops) {
    (void)ops;
    uint64_t h = 0;
    for (uint32_t i = 0; i + 8 <= a->len; i += 8) {
        uint64_t w;
        memcpy(&w, a->data + i, 8);
        for (int r = 0; r < ROUNDS; r++) w = (w ^ (w >> 29)) * 0xbf58476d1ce4e5b9ull;
        h += w;
    }
    __atomic_fetch_add((uint64_t *)a->scratch, h, __ATOMIC_RELAXED);
    return 0;
}

int work_tail(const cf_spin_args *a, const cf_spin_ops *ops) {
    uint64_t s = __atomic_load_n((uint64_t *)a->scratch, __ATOMIC_ACQUIRE);
    return ops->emit(ops->ctx, (const uint8_t *)&s, sizeof s);
}

int noop_tail(const cf_spin_args *a, const cf_spin_ops *ops) {
    return ops->emit(ops->ctx, a->scratch, 8);
}
"""


def rule(name, word0):
    return {"name": name,
            "ruleset": {"mode": "and",
                        "rules": [{"index": 0, "mask": 0xFFFFFFFF, "start": word0, "end": word0}]},
            "budgets": {"scratch": 64, "per_call_ms": 10000}}


def build(binary, d, rounds):
    d = pathlib.Path(d)
    (d / "sink.cpp").write_text(SINK)
    (d / "h.c").write_text(HANDLERS % rounds)
    (d / "sets.json").write_text(json.dumps([rule("work", 1), rule("noop", 2)]))
    out = d / "o.cfimg"
    subprocess.run([binary, "image", "build", "--hls", str(d / "sink.cpp"), "--entry", "sink",
                    "--handlers", str(d / "sets.json"), "--handler-source", str(d / "h.c"),
                    "-o", str(out)], check=True, capture_output=True)
    return out.read_bytes()


class Local:
    def __init__(self, binary, extra):
        self.p = subprocess.Popen(
            [binary, "local", "--nodes", "1", "--nodes-listen", "127.0.0.1:0",
             "--users-listen", "127.0.0.1:0", "--spin-chunk-size", "65472", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
            text=True)
        found = threading.Event()
        self.users = None

        def scan():
            for line in self.p.stdout:
                m = LISTENING.search(line)
                if m and self.users is None:
                    self.users = m.group(2)
                    found.set()
            found.set()

        threading.Thread(target=scan, daemon=True).start()
        found.wait(60)
        if self.users is None:
            self.stop()
            raise RuntimeError("corefarm local did not start")

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            self.p.wait(10)


def message(word0, size):
    b = bytearray(os.urandom(size))
    b[0:4] = word0.to_bytes(4, "little")
    return bytes(b)


def round_trip(client, msg):
    t = time.perf_counter()
    client.submit(msg)
    client.recv(timeout=600)
    return time.perf_counter() - t


def bulk_rate(c, bulk, n=16, window=4):
    t = time.perf_counter()
    for i in range(n):
        c.submit(bulk)
        if i >= window:
            c.recv(timeout=600)
    for _ in range(min(n, window)):
        c.recv(timeout=600)
    return n * len(bulk) / (time.perf_counter() - t) / 1e6


def measure(binary, image, sizes, repeat, threads):
    """Both clusters run at once and every measurement alternates between
    them, so that the load of a shared machine drifts into both alike."""
    modes = {"whole": 0, "chunked": 64 * 1024}
    locals_, clients = {}, {}
    try:
        for m, chunk in modes.items():
            locals_[m] = Local(binary, ["--node-chunk-size", str(chunk),
                                        "--spin-threads", str(threads)])
            clients[m] = corefarm.connect(locals_[m].users, nodes=1, timeout=600)
            clients[m].configure(image)
        out = {m: {} for m in modes}
        for mib in sizes:
            noop, work = message(2, mib * MIB), message(1, mib * MIB)
            runs = {m: {"noop": [], "work": []} for m in modes}
            for m in modes:
                round_trip(clients[m], noop)  # warm-up
            for _ in range(repeat):
                for m in modes:
                    runs[m]["noop"].append(round_trip(clients[m], noop))
                    runs[m]["work"].append(round_trip(clients[m], work))
            for m in modes:
                out[m][mib] = {k: statistics.median(v) for k, v in runs[m].items()}
        bulk = message(0, 16 * MIB)
        rates = {m: [] for m in modes}
        for m in modes:
            clients[m].configure_benchmark(MIB, 16, 0)
            bulk_rate(clients[m], bulk, n=4)
        for _ in range(repeat):
            for m in modes:
                rates[m].append(bulk_rate(clients[m], bulk))
        for m in modes:
            out[m]["bulk_MBps"] = statistics.median(rates[m])
        return out["whole"], out["chunked"]
    finally:
        for c in clients.values():
            c.close()
        for lo in locals_.values():
            lo.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1,4,16,64,128")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=200, help="compute per 8-byte word")
    ap.add_argument("--spin-threads", type=int, default=1,
                    help="handler threads (1 leaves a core for the transfer)")
    a = ap.parse_args()
    binary = os.environ.get("COREFARM_BIN") or shutil.which("corefarm")
    sizes = [int(s) for s in a.sizes.split(",")]
    with tempfile.TemporaryDirectory() as d:
        image = build(binary, d, a.rounds)
    off, on = measure(binary, image, sizes, a.repeat, a.spin_threads)
    rows = []
    for mib in sizes:
        t_tr = off[mib]["noop"]
        t_c = off[mib]["work"] - t_tr
        row = {"MiB": mib, "T_transfer_s": round(t_tr, 4), "T_compute_s": round(t_c, 4),
               "T_total_chunked_s": round(on[mib]["work"], 4),
               "overlap_chunked": round((t_tr + t_c - on[mib]["work"]) / t_c, 3),
               "overlap_whole": round((t_tr + t_c - off[mib]["work"]) / t_c, 3),
               # The formula's ceiling is min(T_transfer, T_compute) / T_compute.
               "overlap_ceiling": round(min(t_tr, t_c) / t_c, 3),
               # The share of what could overlap that did (1: all of it).
               "hidden_share_chunked": round((t_tr + t_c - on[mib]["work"]) / min(t_tr, t_c), 3),
               "noop_chunked_over_whole": round(on[mib]["noop"] / t_tr, 3)}
        rows.append(row)
    print(json.dumps({"overlap": rows,
                      "bulk_MBps_whole": round(off["bulk_MBps"], 1),
                      "bulk_MBps_chunked": round(on["bulk_MBps"], 1),
                      "bulk_chunked_over_whole": round(on["bulk_MBps"] / off["bulk_MBps"], 3)},
                     indent=1))


if __name__ == "__main__":
    sys.exit(main())
