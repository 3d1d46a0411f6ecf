#!/usr/bin/env python3
"""saxpy user program: configures a corefarm cluster with saxpy.cfimg,
streams random inputs through it and checks every result against numpy.

    python3 examples/saxpy/run.py 127.0.0.1:9999 saxpy.cfimg [--inputs 4000] [--batch 8]

One input is a (int32) + 4 padding bytes, x[256], y[256]; one output is
a*x + y (int32, wrapping). A data message carries `batch` inputs back to
back, so the server hands whole batches to the nodes."""

import argparse
import time

import numpy as np

import corefarm

N = 256
INPUT_SIZE = 8 + 2 * N * 4   # 2056 bytes
OUTPUT_SIZE = N * 4          # 1024 bytes


def make_batch(rng, batch):
    """`batch` random inputs as one (batch, 2 + 2N) int32 array, and the
    expected outputs (batch, N)."""
    msg = np.zeros((batch, 2 + 2 * N), dtype="<i4")
    msg[:, 0] = rng.integers(-2**31, 2**31, batch, dtype=np.int64)
    msg[:, 2:] = rng.integers(-2**31, 2**31, (batch, 2 * N), dtype=np.int64)
    a, x, y = msg[:, :1], msg[:, 2:2 + N], msg[:, 2 + N:]
    return msg, a * x + y  # int32 arithmetic wraps like the core


def run(addr, image, inputs=4000, batch=8, nodes=None, seed=0):
    """Returns (inputs checked, nodes used, seconds). Raises on a wrong result."""
    rng = np.random.default_rng(seed)
    batches = [make_batch(rng, batch) for _ in range(-(-inputs // batch))]
    with corefarm.connect(addr, nodes=nodes) as c:
        c.configure(image)                   # sizes and core table from the image
        assert c.sizes == (INPUT_SIZE, OUTPUT_SIZE)
        t0 = time.perf_counter()
        # map keeps `window` data messages in flight, yields results in order.
        # The image records int32[514] inputs and int32[256] outputs, so a
        # (batch, 514) int32 array gives a (batch, 256) int32 array.
        for i, got in enumerate(c.map((m for m, _ in batches), window=16)):
            if not np.array_equal(got, batches[i][1]):
                raise AssertionError(f"data message {i}: wrong result")
        return len(batches) * batch, c.nodes, time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("server", help="user port, HOST:PORT")
    p.add_argument("image", help="saxpy.cfimg")
    p.add_argument("--inputs", type=int, default=4000)
    p.add_argument("--batch", type=int, default=8, help="inputs per data message")
    p.add_argument("--nodes", type=int, help="nodes to ask for (default: all free)")
    a = p.parse_args()
    n, nodes, secs = run(a.server, a.image, a.inputs, a.batch, a.nodes)
    print(f"{n} inputs on {nodes} nodes in {secs:.2f} s: all results correct")


if __name__ == "__main__":
    main()
