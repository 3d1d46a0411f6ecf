#!/usr/bin/env python3
"""Distributed matrix-vector product on a group of corefarm nodes
(docs/collectives.md): the rows of A are scattered to the ranks, the vector
is broadcast (once through the server, then among the nodes), every node
runs the `dot` core (dot.cpp) on each of its rows followed by the vector,
and the results are gathered in rank order and checked against numpy.

    corefarm image build --hls examples/collectives/dot.cpp --entry dot --cores 2 -o dot.cfimg
    python3 examples/collectives/matvec.py 127.0.0.1:9999 dot.cfimg --rows 1000 --nodes 4
"""

import argparse

import numpy as np

import corefarm

K = 64  # elements per row (dot.cpp)


def matvec(addr, image, rows=1000, nodes=4, seed=0):
    """Returns y = A·v computed by the group; raises if it differs from numpy."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-1000, 1000, (rows, K), dtype=np.int32)
    v = rng.integers(-1000, 1000, K, dtype=np.int32)
    with corefarm.group(addr, nodes=nodes) as g:
        g.configure_image(image)
        g.scatter("A", a)           # contiguous blocks of rows, rank order
        g.bcast("v", v)             # every rank gets v (resident)
        g.run("A", "y", operand="v")  # dot(row ‖ v) for every row, on the nodes
        y = np.frombuffer(b"".join(g.gather("y")), dtype="<i4")
    want = a.astype(np.int64) @ v.astype(np.int64)
    if not np.array_equal(y, want.astype(np.int32)):
        raise AssertionError("the group's A·v differs from numpy's")
    return y


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("addr")
    p.add_argument("image")
    p.add_argument("--rows", type=int, default=1000)
    p.add_argument("--nodes", type=int, default=4)
    a = p.parse_args()
    y = matvec(a.addr, a.image, a.rows, a.nodes)
    print(f"A·v over {a.nodes} nodes: {len(y)} rows, checked against numpy")


if __name__ == "__main__":
    main()
