#!/usr/bin/env python3
"""N-body-style iteration on a group of corefarm nodes (seed 001's
evaluation, docs/collectives.md): each rank owns a block of the 64 bodies;
every step the bodies' states are allgathered among the nodes, and each node
runs the `nbody` core (nbody.cpp) on each of its bodies followed by all
bodies' states, which yields the bodies one step later. The state never leaves
the nodes until the end; the result is checked against the same integer
arithmetic done locally.

    corefarm image build --hls examples/collectives/nbody.cpp --entry nbody -o nbody.cfimg
    python3 examples/collectives/nbody.py 127.0.0.1:9999 nbody.cfimg --steps 10 --nodes 4
"""

import argparse

import numpy as np

import corefarm

N = 64  # bodies (nbody.cpp)


def reference(x, v, steps):
    """The same update in int32 (wrapping), vectorised."""
    x, v = x.astype(np.int32), v.astype(np.int32)
    with np.errstate(over="ignore"):
        for _ in range(steps):
            pull = (x.sum(dtype=np.int32) - np.int32(N) * x).astype(np.int32)
            v = (v + (pull >> 6)).astype(np.int32)
            x = (x + v).astype(np.int32)
    return x, v


def nbody(addr, image, steps=10, nodes=4, seed=0):
    """Returns the final (x, v); raises if they differ from `reference`."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-10000, 10000, N, dtype=np.int32)
    v = np.zeros(N, dtype=np.int32)
    with corefarm.group(addr, nodes=nodes) as g:
        g.configure_image(image)
        g.scatter("s0", np.stack([x, v], axis=1))  # rows of (x, v), by rank
        for k in range(steps):
            # Every node gets every body's state, among the nodes only...
            g.allgather(f"s{k}", f"all{k}")
            # ...and moves its own bodies one step.
            g.run(f"s{k}", f"s{k + 1}", operand=f"all{k}")
            g.free(f"all{k}")
            g.free(f"s{k}")
        state = np.frombuffer(b"".join(g.gather(f"s{steps}")), dtype="<i4").reshape(N, 2)
    want_x, want_v = reference(x, v, steps)
    if not (np.array_equal(state[:, 0], want_x) and np.array_equal(state[:, 1], want_v)):
        raise AssertionError("the group's bodies differ from the local computation")
    return state[:, 0], state[:, 1]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("addr")
    p.add_argument("image")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--nodes", type=int, default=4)
    a = p.parse_args()
    x, _ = nbody(a.addr, a.image, a.steps, a.nodes)
    print(f"{a.steps} steps of {N} bodies over {a.nodes} nodes, checked; spread {x.min()}..{x.max()}")


if __name__ == "__main__":
    main()
