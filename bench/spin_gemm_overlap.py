#!/usr/bin/env python3
"""Seed 004 §6.3.2: computation/communication overlap as FPsPIN measures it.

FPsPIN unpacks MPI datatypes in NIC handlers while the host CPU runs a
double-precision GEMM, polling for the handlers' notification between GEMM
calls, and defines

    r_Overlap = T_GEMM / (T_GEMM + T_Poll)

the share of the host's time that went to its own computation rather than
to looking after the communication. Here the host is the user program, the
handlers are the strided-datatype reference set (cores/spin/strided.c) on a
`corefarm local` node, and the notification is the message's result:

    t0 = now; pending = submit_pending(message)        # T_submit (the "RTS")
    until pending.done():  gemm()                      # T_GEMM
                           pending.done()              # T_Poll
    pending.result()                                   # T_Poll as well

With several messages in flight, those after the first are sent between
GEMM calls with `try_submit_pending` (T_submit), which never waits for
credit.

The GEMM size is tuned per point, as FPsPIN does, so that one GEMM call
takes about 1/--polls of the datatypes latency measured alone: fewer polls
waste less GEMM time, coarser ones overstate the datatypes latency. Beside
r_Overlap each point reports the same ratio with T_submit counted as
overhead (in corefarm the host also sends the data, which FPsPIN's other
host did), the GEMM slowdown against GEMM alone, and the datatypes latency
overlapped against alone. Every result is checked byte for byte against
the unpack computed on the host (outside the timed region).

Usage: COREFARM_BIN=path/to/corefarm python3 bench/spin_gemm_overlap.py
Prints one JSON object."""

import os

# One BLAS thread: the GEMM is the host's single compute thread, and a
# second core is left to the transfer and the handlers.
for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import corefarm  # noqa: E402
from streams_overlap import Local  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
KIB = 1024
HEADER = 16
STRIDED = 4  # word 0 that selects the strided set

# The cores' side of the image: inputs of 16 bytes (the datatype header's
# size, so any whole number of blocks makes a valid message); matched
# messages never reach it.
SINK = r"""
#include "corefarm/hls.h"
hls_avalon_agent_component
component void sink(hls_avalon_agent_memory_argument(16) uint8_t *in,
                    hls_avalon_agent_memory_argument(16) uint8_t *out) {
    for (int i = 0; i < 16; i++) out[i] = in[i];
}
"""


def build(binary, d):
    """An image whose one handler set is the strided-datatype reference."""
    d = pathlib.Path(d)
    (d / "sink.cpp").write_text(SINK)
    sets = [{"name": "strided",
             "ruleset": {"mode": "and",
                         "rules": [{"index": 0, "mask": 0xFFFFFFFF, "start": STRIDED, "end": STRIDED}]},
             "budgets": {"scratch": 16 << 20, "output": 16 << 20, "per_call_ms": 60000}}]
    (d / "sets.json").write_text(json.dumps(sets))
    out = d / "o.cfimg"
    subprocess.run([binary, "image", "build", "--hls", str(d / "sink.cpp"), "--entry", "sink",
                    "--handlers", str(d / "sets.json"),
                    "--handler-source", str(ROOT / "cores" / "spin" / "strided.c"),
                    "-o", str(out)], check=True, capture_output=True)
    return out.read_bytes()


def datatype_message(packed_bytes, block, stride, rng):
    """A vector datatype of count blocks: the message and its unpacked form."""
    count = packed_bytes // block
    packed = rng.integers(0, 256, count * block, dtype=np.uint8)
    head = np.array([STRIDED, count, block, stride], dtype="<u4").tobytes()
    unpacked = np.zeros((count, stride), dtype=np.uint8)
    unpacked[:, :block] = packed.reshape(count, block)
    return head + packed.tobytes(), unpacked.tobytes()


def gemm_call(n):
    a = np.random.default_rng(1).random((n, n))
    b = np.random.default_rng(2).random((n, n))

    def call():
        return a @ b
    return call


def time_gemm(n, reps=7):
    call = gemm_call(n)
    call()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        call()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def tune_gemm(target_s):
    """The largest n whose GEMM call takes at most target_s (at least 8)."""
    best = 8
    for n in (8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512, 640, 768, 1024):
        if time_gemm(n) <= target_s:
            best = n
        else:
            break
    return best


def alone(client, messages, inflight):
    """Datatypes latency with the host idle-waiting (FPsPIN's reference)."""
    t = time.perf_counter()
    pend = [client.submit_pending(messages[i % len(messages)][0]) for i in range(inflight)]
    for p in pend:
        p.result(timeout=600)
    return time.perf_counter() - t


def overlapped(client, messages, inflight, gemm):
    """One trial: the first message is sent at once (FPsPIN's RTS), the
    others between GEMM calls as the server grants credit (never waiting
    for it), and each result is polled for between GEMM calls."""
    pend = []
    t_submit = 0.0

    def send_more(wait):
        nonlocal t_submit
        while len(pend) < inflight:
            t = time.perf_counter()
            m = messages[len(pend) % len(messages)][0]
            p = client.submit_pending(m) if wait else client.try_submit_pending(m)
            t_submit += time.perf_counter() - t
            if p is None:
                return
            pend.append(p)
            wait = False

    t0 = time.perf_counter()
    send_more(wait=True)
    t_gemm = t_poll = 0.0
    calls = 0
    results = {}
    while len(results) < inflight:
        t = time.perf_counter()
        gemm()
        u = time.perf_counter()
        t_gemm += u - t
        calls += 1
        for i, p in enumerate(pend):
            if i not in results and p.done():
                results[i] = p.result(timeout=0)
        t_poll += time.perf_counter() - u
        send_more(wait=False)
    latency = time.perf_counter() - t0
    for i, out in results.items():
        if bytes(memoryview(out)) != messages[i % len(messages)][1]:
            raise SystemExit(f"message {i}: the handlers' unpack differs from the host's")
    return {"T_submit": t_submit, "T_GEMM": t_gemm, "T_Poll": t_poll, "calls": calls,
            "latency": latency}


def ci95(xs):
    """Median and a distribution-free 95 % interval of the median."""
    s = sorted(xs)
    n = len(s)
    if n < 6:
        return statistics.median(s), s[0], s[-1]
    k = max(0, int(n / 2 - 0.98 * n ** 0.5))
    return statistics.median(s), s[k], s[n - 1 - k]


def point(client, kib, inflight, a, rng):
    block, stride = a.block, a.stride
    messages = [datatype_message(kib * KIB, block, stride, rng) for _ in range(2)]
    # The first messages of a size fault in fresh buffers along the whole
    # path (2-6x slower here); measure past them.
    for _ in range(a.warmup):
        alone(client, messages, inflight)
    ref = statistics.median(alone(client, messages, inflight) for _ in range(a.samples))
    n = tune_gemm(ref / a.polls)
    gemm = gemm_call(n)
    gemm_alone = time_gemm(n, reps=max(20, a.polls * 4))
    runs = [overlapped(client, messages, inflight, gemm) for _ in range(a.samples)]
    r = [x["T_GEMM"] / (x["T_GEMM"] + x["T_Poll"]) for x in runs]
    r_send = [x["T_GEMM"] / (x["T_GEMM"] + x["T_Poll"] + x["T_submit"]) for x in runs]
    med, lo, hi = ci95(r)
    per_call = sum(x["T_GEMM"] for x in runs) / sum(x["calls"] for x in runs)
    lat = statistics.median(x["latency"] for x in runs)
    return {"KiB": kib, "inflight": inflight, "gemm_n": n,
            "gemm_call_ms": round(gemm_alone * 1e3, 3),
            "polls_per_trial": round(statistics.median(x["calls"] for x in runs), 1),
            "r_overlap": round(med, 4), "r_overlap_ci95": [round(lo, 4), round(hi, 4)],
            "r_overlap_with_submit": round(statistics.median(r_send), 4),
            "T_poll_us_median": round(statistics.median(x["T_Poll"] for x in runs) * 1e6, 1),
            "T_submit_us_median": round(statistics.median(x["T_submit"] for x in runs) * 1e6, 1),
            "gemm_slowdown": round(per_call / gemm_alone, 3),
            "datatypes_ms_alone": round(ref * 1e3, 3),
            "datatypes_ms_overlapped": round(lat * 1e3, 3),
            "datatypes_MBps_alone": round(inflight * len(messages[0][0]) / ref / 1e6, 1),
            "samples": a.samples}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="256,1024,2160,4096,8192",
                    help="packed message sizes in KiB (2160: FPsPIN's parallelism sweep)")
    ap.add_argument("--inflight", default="1,4",
                    help="messages in flight at once (message-level parallelism), swept at --sweep-size")
    ap.add_argument("--sweep-size", type=int, default=2160, help="KiB of the in-flight sweep")
    ap.add_argument("--samples", type=int, default=20, help="trials per point (FPsPIN: 20)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed messages before each point")
    ap.add_argument("--polls", type=int, default=8,
                    help="GEMM calls per datatypes latency the tuning aims at")
    ap.add_argument("--block", type=int, default=1024, help="datatype block bytes")
    ap.add_argument("--stride", type=int, default=1280, help="datatype stride bytes")
    ap.add_argument("--spin-threads", type=int, default=1,
                    help="payload handler threads on the node (1 leaves a core to the GEMM)")
    a = ap.parse_args()
    binary = os.environ.get("COREFARM_BIN") or shutil.which("corefarm")
    if not binary:
        raise SystemExit("no corefarm binary: set COREFARM_BIN or put corefarm on PATH")
    with tempfile.TemporaryDirectory() as d:
        image = build(binary, d)
    rng = np.random.default_rng(7)
    sizes = [int(s) for s in a.sizes.split(",")]
    inflight = [int(s) for s in a.inflight.split(",")]
    plan = [(kib, 1) for kib in sizes] + [(a.sweep_size, k) for k in inflight if k != 1]
    local = Local(binary, ["--spin-threads", str(a.spin_threads)])
    client = None
    try:
        client = corefarm.connect(local.users, nodes=1, timeout=600)
        client.configure(image)
        rows = []
        for kib, k in plan:
            rows.append(point(client, kib, k, a, rng))
            print(f"{kib} KiB x{k}: r_Overlap {rows[-1]['r_overlap']}", file=sys.stderr)
    finally:
        if client is not None:
            client.close()
        local.stop()
    print(json.dumps({"datatype": {"block": a.block, "stride": a.stride}, "polls": a.polls,
                      "spin_threads": a.spin_threads, "points": rows}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
