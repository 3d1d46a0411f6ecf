#!/usr/bin/env python3
"""What sharing nodes can gain on `corefarm bench sharing`'s workload, in
an idealised model (docs/benchmarks.md "Shared nodes").

The workload is the benchmark's own (the same generator, checked against
the Rust one by bench/tests/test_sharing_bound.py): `--apps` applications,
each an exact equal share of calls of 1-100 ms of node time, each call cut
into at most `--jobs` messages of whole inputs. The model has no overheads
at all: no round trips, no scheduler, nodes exactly at their nominal delay,
programming taking exactly R. Three placements of the calls' messages:

- partition: each application owns nodes / apps nodes and reprograms them
  all when it calls another function (what `--sharing exclusive` does with
  each application asking for its share);
- pool: every message goes, in order, to whichever node of the whole
  cluster would finish it first, paying R on a node that holds another
  function (a work-conserving shared cluster with no notion of owners);
- borrow: an application's own nodes, plus any other node that is idle
  when the call starts (shared mode lending idle nodes).

Prints, per R and number of applications, each placement's makespan over
the partition's (mean, min, max over the seeds), and the partition's
makespan over the node-time bound W / nodes, below which no placement can
go: where the partition already sits on that bound, sharing has no idle
node time to reclaim, however it places the work.

    python3 bench/sharing_bound.py [--seeds 12] [--json]
"""

import argparse
import heapq
import json
import sys

MASK = (1 << 64) - 1
MEAN_CALL_US = 50_500


class Rng:
    """xorshift64*, as the benchmark's `Rng`."""

    def __init__(self, state):
        self.state = state

    def below(self, n):
        x = self.state
        x ^= x >> 12
        x ^= (x << 25) & MASK
        x ^= x >> 27
        self.state = x
        return ((x * 0x2545F4914F6CDD1D) & MASK) % max(n, 1)


def delay_us(f):
    return 100 * (f + 1)


def workload(seed, apps, calls=20, functions=16):
    """Per application, its calls as (function, inputs): the benchmark's
    `workload()`."""
    rng = Rng(((seed * 0x9E3779B97F4A7C15) & MASK) | 1)
    out = []
    for _ in range(apps):
        left = calls * MEAN_CALL_US
        mine = []
        while left > 0:
            f = rng.below(functions)
            work = min(1000 + rng.below(99_000), left)
            inputs = max(work // delay_us(f), 1)
            left = max(left - inputs * delay_us(f), 0)
            mine.append((f, inputs))
        out.append(mine)
    return out


def messages(inputs, parts):
    """Inputs per message: the benchmark's `messages()`."""
    per = -(-inputs // min(max(parts, 1), max(inputs, 1)))
    out, sent = [], 0
    while sent < inputs:
        n = min(per, inputs - sent)
        out.append(n)
        sent += n
    return out


def jobs_of(call, parts):
    f, inputs = call
    return f, [n * delay_us(f) * 1e-6 for n in messages(inputs, parts)]


def partition(w, nodes, r, parts=6):
    share = max(nodes // len(w), 1)
    ends = []
    for calls in w:
        t, loaded = 0.0, None
        for call in calls:
            f, jobs = jobs_of(call, parts)
            if f != loaded:
                t += r
                loaded = f
            free = [t] * share
            for j in jobs:
                i = free.index(min(free))
                free[i] += j
            t = max(free)
        ends.append(t)
    return max(ends)


def shared(w, nodes, r, parts=6, borrow_only=False):
    """`pool` (any node) or, with `borrow_only`, `borrow` (own nodes plus
    nodes idle when the call starts)."""
    share = max(nodes // len(w), 1)
    owner = [min(k // share, len(w) - 1) for k in range(nodes)]
    node = [[0.0, None] for _ in range(nodes)]  # free at, function held
    nxt = [0] * len(w)
    end = [0.0] * len(w)
    events = [(0.0, a) for a in range(len(w))]
    heapq.heapify(events)
    while events:
        t, a = heapq.heappop(events)
        if nxt[a] == len(w[a]):
            end[a] = t
            continue
        f, jobs = jobs_of(w[a][nxt[a]], parts)
        nxt[a] += 1
        done = t
        for j in jobs:
            best = None
            for k, (free, held) in enumerate(node):
                own = owner[k] == a
                if borrow_only and not own and free > t:
                    continue
                finish = max(free, t) + (0.0 if held == f else r) + j
                if best is None or finish < best[0] - 1e-12 or (
                    abs(finish - best[0]) < 1e-12 and own
                ):
                    best = (finish, k)
            finish, k = best
            node[k] = [finish, f]
            done = max(done, finish)
        heapq.heappush(events, (done, a))
    return max(end)


def sweep(seeds, nodes=8, parts=6, rs_ms=(0, 1, 10, 100), apps=(2, 4, 8)):
    rows = []
    for r_ms in rs_ms:
        r = r_ms * 1e-3
        for n in apps:
            ratios = {"pool": [], "borrow": [], "partition_over_bound": []}
            for seed in range(1, seeds + 1):
                w = workload(seed, n)
                base = partition(w, nodes, r, parts)
                work = sum(sum(jobs_of(c, parts)[1]) for calls in w for c in calls)
                ratios["pool"].append(shared(w, nodes, r, parts) / base)
                ratios["borrow"].append(shared(w, nodes, r, parts, True) / base)
                ratios["partition_over_bound"].append(base / (work / nodes))
            row = {"reconfigure_ms": r_ms, "apps": n, "seeds": seeds}
            for k, v in ratios.items():
                row[k] = {"mean": sum(v) / len(v), "min": min(v), "max": max(v)}
            rows.append(row)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=12)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.seeds < 1:
        ap.error("--seeds must be at least 1")
    rows = sweep(a.seeds)
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("R ms  apps  pool/partition        borrow/partition      partition/(W/nodes)")
    for row in rows:
        cells = "  ".join(
            "{mean:.3f} ({min:.3f}-{max:.3f})".format(**row[k])
            for k in ("pool", "borrow", "partition_over_bound")
        )
        print(f"{row['reconfigure_ms']:>4}  {row['apps']:>4}  {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
