"""Chunks and priorities from Python against the real binary:
`connect(chunks=True)`, `priority=` on submit, submit_pending and map, and
the same through corefarm.aio."""

import asyncio
import struct

import pytest

import corefarm
import corefarm.aio
from realbin import Cluster, find_binary

BIN = find_binary()


@pytest.fixture
def cluster():
    assert BIN is not None, "no corefarm binary: cargo build --release -p corefarm-cli"
    c = Cluster(BIN, 2)
    try:
        yield c
    finally:
        c.stop()


def inputs(k, n, size=1024):
    """`n` inputs whose first 16 bytes name (k, input)."""
    return b"".join(struct.pack("<QQ", k, j) + bytes([0x5A]) * (size - 16) for j in range(n))


def echoed(data, n, out=32):
    return [bytes(data[j * out:j * out + 16]) for j in range(n)]


def test_priorities_round_trip_as_chunks(cluster):
    with corefarm.connect(cluster.users_addr, timeout=30, chunks=True, chunk_size=4096) as c:
        assert c.chunk_size == 4096
        assert "chunks" in c.server_hello["features"]
        c.configure_benchmark(1024, 32)
        # 8 KiB: two chunks of 4 KiB, in the most urgent class.
        i = c.submit(inputs(1, 8), priority=0)
        out = c.recv(timeout=30)
        assert out.id == i and out.count == 8
        assert echoed(out.data, 8) == [struct.pack("<QQ", 1, j) for j in range(8)]
        p = c.submit_pending(inputs(2, 3), priority=7)
        assert echoed(p.result(30).data, 3) == [struct.pack("<QQ", 2, j) for j in range(3)]
        got = list(c.map((inputs(k, 1 + k % 5) for k in range(20)), window=4, priority=2))
        assert [len(r) for r in got] == [32 * (1 + k % 5) for k in range(20)]
        assert [bytes(r[:16]) for r in got] == [struct.pack("<QQ", k, 0) for k in range(20)]
        with pytest.raises(Exception, match="priority 8"):
            c.submit(inputs(3, 1), priority=8)


def test_without_chunks_a_priority_is_refused_with_the_fix(cluster):
    with corefarm.connect(cluster.users_addr, timeout=30) as c:
        assert c.chunk_size is None
        c.configure_benchmark(1024, 32)
        with pytest.raises(corefarm.InputError, match="chunks=True"):
            c.submit(inputs(4, 2), priority=0)
        # A map's priority is every input's: its refusal ends the map.
        it = c.map([inputs(k, 1) for k in range(3)], priority=0)
        with pytest.raises(corefarm.InputError, match="chunks=True"):
            next(it)
        assert list(it) == []
        # The default class needs nothing, and the session goes on.
        i = c.submit(inputs(4, 2), priority=4)
        out = c.recv(timeout=30)
        assert out.id == i and out.count == 2


def test_asyncio_priorities(cluster):
    async def main():
        c = await corefarm.aio.connect(cluster.users_addr, timeout=30, chunks=True)
        try:
            await c.configure_benchmark(1024, 32)
            out = await (await c.submit(inputs(5, 70), priority=0))
            assert out.count == 70
            got = [r async for r in c.map((inputs(k, 2) for k in range(10)), priority=6)]
            assert [bytes(r[:16]) for r in got] == [struct.pack("<QQ", k, 0) for k in range(10)]
            out = await c.run(inputs(6, 1), priority=3)
            assert out.count == 1
        finally:
            c.close()

    asyncio.run(main())
