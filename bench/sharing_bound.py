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
    python3 bench/sharing_bound.py --workloads [--seeds 12] [--user-idle-timeout 20] [--json]

With --workloads, the same for the multi-tenant workloads of `corefarm
bench sharing --workload NAME` (below): per workload and R, the calls'
completion times and the makespan of each placement, and what the best
of them gains over exclusive mode.
"""

import argparse
import heapq
import json
import math
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


# ------------------------------------------------- multi-tenant workloads
#
# `corefarm bench sharing --workload NAME` (crates/bench/src/sharing/
# workloads.rs; the same generator, pinned on both sides): users arriving
# and leaving, bursts, Zipf popularity, heavy-tailed call sizes. Each call
# is cut into at most `parts` messages; a user issues its next call `wait`
# after the previous one's last result. Placements, all overhead-free:
#
# - exclusive: what `--sharing exclusive` does. A user asks for
#   nodes / divisor nodes at its arrival and takes what is free; with none
#   free it waits, and freed nodes go to the waiting users with the fewest
#   nodes, first come first served. It programs its nodes (R, unless a node
#   already holds the function) when it calls another function, runs each
#   call on its own nodes only, and holds them while it thinks or is off,
#   until it leaves or has been idle for `--user-idle-timeout` while a
#   user waits with no node at all.
# - static: the `nodes - 2` most popular functions own one node each for
#   good; the other functions share the last 2 nodes, reprogrammed when the
#   function changes; each partition serves its calls first come first
#   served (what the bench's static variant does).
# - pool (the best placement the model knows): every message, in order of
#   issue, goes to whichever node of the cluster would finish it first,
#   paying R on a node that holds another function; no owners, no idle
#   holding. Shared mode is measured against it.

USER_IDLE_TIMEOUT_S = 20.0
NODE_WAIT_S = 5.0


def rround(x):
    """Rust's f64::round for x >= 0."""
    return int(math.floor(x + 0.5))


class WRng(Rng):
    def unit(self):
        return self.below(1 << 53) / float(1 << 53)

    def exp(self, mean):
        return rround(-mean * math.log(1.0 - self.unit()))

    def geometric(self, mean):
        p = 1.0 / max(mean, 1.0)
        if p >= 1.0:
            self.unit()
            return 1
        return 1 + int(math.floor(math.log(1.0 - self.unit()) / math.log(1.0 - p)))

    def pareto(self, alpha, lo, hi):
        u = self.unit()
        x = lo / (1.0 - u * (1.0 - (lo / hi) ** alpha)) ** (1.0 / alpha)
        return min(max(rround(x), lo), hi)


WORKLOADS = ("arrivals", "bursts", "zipf64")


def shape(name, quick=False):
    """The workload's parameters: workloads.rs `Workload::shape`."""
    window = 1_000_000 if quick else 5_000_000
    poisson = {"kind": "poisson", "per_s": 10.0, "window_us": window, "mean_calls": 8.0, "think_us": 100_000.0}
    common = {"alpha": 1.2, "min_call_us": 5_000, "max_call_us": 1_000_000, "exclusive_divisor": 8}
    if name == "arrivals":
        return dict(common, arrival=poisson, functions=32, zipf_s=1.1, stay=0.8)
    if name == "bursts":
        onoff = {"kind": "onoff", "users": 4, "bursts": 2 if quick else 6, "mean_calls": 4.0, "off_us": 500_000.0}
        return dict(common, arrival=onoff, functions=16, zipf_s=1.1, stay=0.8, min_call_us=10_000,
                    exclusive_divisor=4)
    if name == "zipf64":
        return dict(common, arrival=poisson, functions=64, zipf_s=0.8, stay=0.5)
    raise ValueError(name)


def wdelay_us(f):
    return delay_us(f % 16)


def generate(sh, seed):
    """Users as (arrive_us, [(wait_us, function, inputs)]): workloads.rs `generate`."""
    rng = WRng(((seed * 0x9E3779B97F4A7C15) & MASK) | 1)
    table, acc = [], 0.0
    for k in range(1, sh["functions"] + 1):
        acc += float(k) ** -sh["zipf_s"]
        table.append(acc)

    def zipf():
        u = rng.unit() * table[-1]
        for i, c in enumerate(table):
            if u < c:
                return i
        return len(table) - 1

    a = sh["arrival"]
    arrivals = []
    if a["kind"] == "poisson":
        t = 0
        while True:
            t += rng.exp(1e6 / a["per_s"])
            if t > a["window_us"]:
                break
            arrivals.append((t, [rng.geometric(a["mean_calls"])]))
    else:
        for _ in range(a["users"]):
            arrivals.append((0, [rng.geometric(a["mean_calls"]) for _ in range(a["bursts"])]))
    users = []
    for arrive, bursts in arrivals:
        calls, current = [], None
        for b, n in enumerate(bursts):
            for i in range(n):
                if b == 0 and i == 0:
                    wait = 0
                elif a["kind"] == "poisson":
                    wait = rng.exp(a["think_us"])
                elif i == 0:
                    wait = rng.exp(a["off_us"])
                else:
                    wait = 0
                if current is not None and rng.unit() < sh["stay"]:
                    f = current
                else:
                    f = zipf()
                current = f
                size = rng.pareto(sh["alpha"], sh["min_call_us"], sh["max_call_us"])
                calls.append((wait, f, max(size // wdelay_us(f), 1)))
        users.append((arrive, calls))
    return users


def call_jobs(f, inputs, parts):
    return [n * wdelay_us(f) * 1e-6 for n in messages(inputs, parts)]


def _list_schedule(nodes, t, f, jobs, r):
    """Each job in turn on the listed nodes' earliest finish (dicts with
    free/held), paying r where the node holds another function; returns
    the last finish."""
    end = t
    for j in jobs:
        best = min(nodes, key=lambda n: max(n["free"], t) + (0.0 if n["held"] == f else r))
        start = max(best["free"], t) + (0.0 if best["held"] == f else r)
        best["free"], best["held"] = start + j, f
        end = max(end, start + j)
    return end


def _run_users(users, place):
    """Replays the users' calls in time order; `place(u, t, f, jobs)` returns
    when the call's results are all back. Returns per-call completion times
    and each user's end."""
    ev = [(a * 1e-6, k, 0) for k, (a, _) in enumerate(users)]
    heapq.heapify(ev)
    jct, ends = [], [0.0] * len(users)
    # Events at the calls' issue times: a placement that reserves node time
    # must see the calls in the order they are issued.
    while ev:
        issue, k, i = heapq.heappop(ev)
        calls = users[k][1]
        _, f, inputs = calls[i]
        done = place(k, issue, f, inputs)
        jct.append(done - issue)
        if i + 1 < len(calls):
            heapq.heappush(ev, (done + calls[i + 1][0] * 1e-6, k, i + 1))
        else:
            ends[k] = done
    return jct, ends


def multi_pool(users, nodes, r, parts=6):
    node = [{"free": 0.0, "held": None} for _ in range(nodes)]
    return _run_users(users, lambda k, t, f, n: _list_schedule(node, t, f, call_jobs(f, n, parts), r))


def multi_static(users, nodes, r, parts=6, tail=2):
    dedicated = max(nodes - tail, 0)
    parts_of = {}
    for f in range(dedicated):
        parts_of[f] = [{"free": 0.0, "held": f}]
    rest = [{"free": 0.0, "held": None} for _ in range(nodes - dedicated)]
    busy = {}  # partition -> free at (calls first come first served)

    def place(k, t, f, n):
        p = parts_of.get(f, rest)
        start = max(t, busy.get(id(p), 0.0))
        for node in p:
            node["free"] = max(node["free"], start)
        end = _list_schedule(p, start, f, call_jobs(f, n, parts), r)
        busy[id(p)] = end
        return end

    # Calls are placed when issued; a later call issued earlier in time is
    # placed first because events are processed in issue order.
    return _run_users(users, place)


def multi_exclusive(users, nodes, r, share, parts=6, idle_timeout=USER_IDLE_TIMEOUT_S, node_wait=NODE_WAIT_S):
    """Discrete-event replay of `--sharing exclusive` (see above)."""
    free = [{"free": 0.0, "held": None} for _ in range(nodes)]  # nodes in the pool
    own = [[] for _ in users]  # nodes each user holds
    waiting = []  # (since, user) with no node, first come first served
    idle_since = [None] * len(users)  # the user's last result, while it holds nodes and thinks
    jct, ends = [], [0.0] * len(users)
    ev = [(a * 1e-6, 0, k, "arrive") for k, (a, _) in enumerate(users)]
    heapq.heapify(ev)
    nxt = [0] * len(users)
    seq = [0]

    def push(t, k, what):
        seq[0] += 1
        heapq.heappush(ev, (t, seq[0], k, what))

    def give(t):
        # Freed nodes go to the waiting users, first come first served.
        while free and waiting:
            _, k = waiting.pop(0)
            while free and len(own[k]) < share:
                n = free.pop(0)
                n["free"] = max(n["free"], t)
                own[k].append(n)
            push(t, k, "call")

    def release(t, k):
        for n in own[k]:
            n["free"] = max(n["free"], t)
        free.extend(own[k])
        own[k] = []
        give(t)

    def idle_check(t):
        # An owner idle for the timeout gives its nodes back once a user
        # waits with none (the server's check, run as events here).
        if not waiting:
            return
        for k, since in enumerate(idle_since):
            if since is not None and own[k] and t - since >= idle_timeout - 1e-9:
                idle_since[k] = None
                release(t, k)

    while ev:
        t, _, k, what = heapq.heappop(ev)
        if what == "idle":
            idle_check(t)
            continue
        if what == "arrive":
            take = min(share, len(free))
            for _ in range(take):
                n = free.pop(0)
                n["free"] = max(n["free"], t)
                own[k].append(n)
            if not own[k]:
                waiting.append((t, k))
                idle_check(t)
                # Owners that went idle earlier reach the timeout later.
                for kk, since in enumerate(idle_since):
                    if since is not None and own[kk]:
                        push(max(t, since + idle_timeout), kk, "idle")
                continue
            what = "call"
        if what == "call":
            if not own[k]:
                # Its session ended while it was idle: it reconnects.
                waiting.append((t, k))
                continue
            idle_since[k] = None
            wait, f, n = users[k][1][nxt[k]]
            # The first call's clock starts at the arrival; later ones after
            # the think time, from the previous result.
            issue = users[k][0] * 1e-6 if nxt[k] == 0 else t
            start = t if nxt[k] == 0 else t
            done = _list_schedule(own[k], start, f, call_jobs(f, n, parts), r)
            jct.append(done - issue)
            nxt[k] += 1
            if nxt[k] == len(users[k][1]):
                ends[k] = done
                push(done, k, "leave")
            else:
                push(done, k, "think")
            continue
        if what == "think":
            idle_since[k] = t
            push(t + idle_timeout, k, "idle")
            wait = users[k][1][nxt[k]][0] * 1e-6
            push(t + wait, k, "resume")
            continue
        if what == "resume":
            if own[k]:
                push(t, k, "call")
            else:
                # Lost its nodes to the idle timeout: a new session.
                waiting.append((t, k))
                idle_check(t)
            continue
        if what == "leave":
            idle_since[k] = None
            release(t, k)
    return jct, ends


def multi_fair(users, nodes, r, parts=6):
    """Work-conserving fair sharing at message granularity: a free node
    serves the user with the fewest nodes serving it (then the oldest
    message), preferring a node that already holds the user's function; a
    user whose function another node holds and will finish within R waits
    for it rather than paying R elsewhere. Messages are never preempted."""
    node = [{"free": 0.0, "held": None, "user": None} for _ in range(nodes)]
    queue = [[] for _ in users]  # per user: [(enqueued, f, dur, call)]
    left = {}  # call -> messages not finished
    call_end = {}
    jct, ends = [], [0.0] * len(users)
    nxt = [0] * len(users)
    issued = {}
    ev = [(a * 1e-6, 0, "issue", k) for k, (a, _) in enumerate(users)]
    heapq.heapify(ev)
    seq = [0]

    def push(t, what, x):
        seq[0] += 1
        heapq.heappush(ev, (t, seq[0], what, x))

    def dispatch(t):
        while True:
            idle = [i for i, n in enumerate(node) if n["user"] is None]
            want = [k for k in range(len(users)) if queue[k]]
            if not idle or not want:
                return
            serving = [sum(n["user"] == k for n in node) for k in range(len(users))]
            placed = False
            for k in sorted(want, key=lambda k: (serving[k], queue[k][0][0])):
                f = queue[k][0][1]
                same = [i for i in idle if node[i]["held"] == f]
                if same:
                    i = same[0]
                    start = t
                else:
                    # Waiting for a busy node of the function beats paying R.
                    if any(n["held"] == f and n["user"] is not None and n["free"] <= t + r for n in node):
                        continue
                    wanted = {q[0][1] for q in queue if q}
                    i = min(idle, key=lambda i: (node[i]["held"] in wanted, node[i]["held"] is not None))
                    start = t + r
                _, f, dur, call = queue[k].pop(0)
                node[i].update(free=start + dur, held=f, user=k)
                push(start + dur, "done", (i, call))
                placed = True
                break
            if not placed:
                return

    while ev:
        t, _, what, x = heapq.heappop(ev)
        if what == "issue":
            k = x
            wait, f, n = users[k][1][nxt[k]]
            issue = t + wait * 1e-6
            if wait:
                push(issue, "go", k)
                continue
            what, x = "go", k
        if what == "go":
            k = x
            _, f, n = users[k][1][nxt[k]]
            call = (k, nxt[k])
            issued[call] = t
            jobs = call_jobs(f, n, parts)
            left[call] = len(jobs)
            queue[k].extend((t, f, j, call) for j in jobs)
        elif what == "done":
            i, call = x
            node[i]["user"] = None
            left[call] -= 1
            if left[call] == 0:
                k, c = call
                jct.append(t - issued[call])
                nxt[k] += 1
                if nxt[k] < len(users[k][1]):
                    push(t, "issue", k)
                else:
                    ends[k] = t
        dispatch(t)
    return jct, ends


def pctl(xs, q):
    s = sorted(xs)
    if not s:
        return 0.0
    return s[min(len(s) - 1, int(q * len(s)))]


def multi_point(name, seed, r_ms, nodes=8, parts=6, idle_timeout=USER_IDLE_TIMEOUT_S, quick=False):
    """One workload and seed at programming time r_ms: per placement, the
    calls' completion times (mean, p50, p99) and the makespan."""
    sh = shape(name, quick)
    users = generate(sh, seed)
    r = r_ms * 1e-3
    share = max(nodes // sh["exclusive_divisor"], 1)
    out = {}
    for mode, (jct, ends) in (
        ("exclusive", multi_exclusive(users, nodes, r, share, parts, idle_timeout)),
        ("static", multi_static(users, nodes, r, parts)),
        ("pool", multi_pool(users, nodes, r, parts)),
        ("fair", multi_fair(users, nodes, r, parts)),
    ):
        out[mode] = {"jct_mean_s": sum(jct) / len(jct), "jct_p50_s": pctl(jct, 0.5),
                     "jct_p99_s": pctl(jct, 0.99), "makespan_s": max(ends)}
    work = sum(n * wdelay_us(f) * 1e-6 for _, calls in users for _, f, n in calls)
    out["node_work_s"] = work
    out["users"] = len(users)
    out["calls"] = sum(len(c) for _, c in users)
    return out


def multi_sweep(seeds, workloads=WORKLOADS, rs_ms=(1, 10, 100), idle_timeout=USER_IDLE_TIMEOUT_S, quick=False):
    """Per workload and R: each placement's metrics (mean over the seeds) and
    the pool's gain over exclusive, 1 - pool / exclusive, per metric."""
    rows = []
    for name in workloads:
        for r_ms in rs_ms:
            pts = [multi_point(name, s, r_ms, idle_timeout=idle_timeout, quick=quick) for s in range(1, seeds + 1)]
            row = {"workload": name, "reconfigure_ms": r_ms, "seeds": seeds}
            for mode in ("exclusive", "static", "pool", "fair"):
                row[mode] = {m: sum(p[mode][m] for p in pts) / len(pts) for m in pts[0][mode]}
            # The best placement the model knows, per metric.
            # (exclusive itself is a placement: the gain is never negative).
            row["best"] = {m: min(row[p][m] for p in ("exclusive", "static", "pool", "fair")) for m in row["pool"]}
            row["gain"] = {m: 1 - row["best"][m] / row["exclusive"][m] for m in row["best"]}
            rows.append(row)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=12)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--workloads", action="store_true",
                    help="the multi-tenant workloads (arrivals, bursts, zipf64) instead of seed 002 §5.5's")
    ap.add_argument("--user-idle-timeout", type=float, default=USER_IDLE_TIMEOUT_S,
                    help="exclusive mode's --user-idle-timeout, in seconds")
    a = ap.parse_args(argv)
    if a.seeds < 1:
        ap.error("--seeds must be at least 1")
    if a.workloads:
        rows = multi_sweep(a.seeds, idle_timeout=a.user_idle_timeout)
        if a.json:
            print(json.dumps(rows, indent=1))
            return 0
        print("workload  R ms  mean call completion ms: exclusive static pool fair  gain of the best over exclusive: "
              "mean p99 makespan")
        for row in rows:
            cells = " ".join(f"{row[m]['jct_mean_s'] * 1e3:7.1f}" for m in ("exclusive", "static", "pool", "fair"))
            gains = " ".join(f"{row['gain'][m] * 100:5.1f} %" for m in ("jct_mean_s", "jct_p99_s", "makespan_s"))
            print(f"{row['workload']:>8}  {row['reconfigure_ms']:>4}  {cells}   {gains}")
        return 0
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
