"""The Python client against the real corefarm binary (`corefarm local`)."""

import struct
import threading

import pytest

import corefarm
from realbin import Cluster, find_binary

np = pytest.importorskip("numpy")
BIN = find_binary()
pytestmark = pytest.mark.skipif(
    BIN is None, reason="no corefarm binary: build it (cargo build -p corefarm-cli) or set COREFARM_BIN")


@pytest.fixture
def cluster():
    c = Cluster(BIN, 2)
    try:
        yield c
    finally:
        c.stop()


def connect(cluster, **kw):
    kw.setdefault("timeout", 30)
    return corefarm.connect(cluster.users_addr, **kw)


def tagged(k, input_size, inputs=1):
    """`inputs` inputs whose first 16 bytes identify (k, input)."""
    a = np.full((inputs, input_size), 0x5A, dtype=np.uint8)
    for j in range(inputs):
        a[j, :16] = np.frombuffer(struct.pack("<QQ", k, j), dtype=np.uint8)
    return a


def test_benchmark_session_echoes_the_first_16_bytes(cluster):
    with connect(cluster, nodes=2) as c:
        assert c.nodes == 2 and c.credit_mode
        c.configure_benchmark(64, 32)
        sent = {c.submit(tagged(k, 64, 3)): k for k in range(100)}
        for _ in range(100):
            out = c.recv(timeout=30)
            k = sent.pop(out.id)
            assert out.count == 3 and len(out) == 96
            got = np.frombuffer(out, dtype=np.uint8).reshape(3, 32)
            assert (got[:, :16] == tagged(k, 64, 3)[:, :16]).all()
        assert not sent


def test_map_in_order_and_reconfiguration(cluster):
    with connect(cluster, nodes=2, io_timeout=30) as c:
        c.configure_benchmark(16, 16)
        inputs = [struct.pack("<QQ", k, ~k & 0xFFFF) for k in range(300)]
        assert [r[:16] for r in c.map(inputs, window=16)] == inputs
        # A new configuration on the same connection: credit keeps flowing.
        c.configure_benchmark(32, 24, delay_us=50)
        assert c.sizes == (32, 24)
        inputs = [struct.pack("<QQ", k, 7) + bytes(16) for k in range(50)]
        out = list(c.map(inputs, window=8))
        assert [r[:16] for r in out] == [i[:16] for i in inputs]
        assert all(len(r) == 24 for r in out)


def test_seed_mode_against_the_real_server(cluster):
    with connect(cluster, nodes=2):
        pass  # wait until both simulated nodes are registered
    with connect(cluster, legacy=True) as c:
        assert c.nodes is None and not c.credit_mode
        c.configure_benchmark(16, 16)
        inputs = [struct.pack("<QQ", k, 1) for k in range(100)]
        assert list(c.map(inputs, window=8)) == inputs


def test_split_sender_and_receiver_threads(cluster):
    n = 500
    with connect(cluster, nodes=2) as c:
        c.configure_benchmark(16, 16)
        errors = []

        def send():
            try:
                for k in range(n):
                    c.submit(struct.pack("<QQ", k, 0))
            except Exception as e:  # reported below
                errors.append(e)

        t = threading.Thread(target=send)
        t.start()
        seen = set()
        for _ in range(n):
            out = c.recv(timeout=30)
            k = struct.unpack_from("<Q", out.data)[0]
            assert k == out.id
            seen.add(k)
        t.join(30)
        assert not errors and seen == set(range(n))


def test_unloadable_configuration_is_a_configuration_error(cluster):
    with connect(cluster, nodes=1) as c:
        assert c.nodes == 1
        with pytest.raises(corefarm.ConfigurationError) as e:
            c.configure(b"definitely not a bitstream", input_size=64, output_size=64, cores=1)
        assert e.value.reason, "the server gave no reason"


def _refusing_node(addr):
    """A node (raw SMP) that refuses every configuration."""
    import socket
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)))

    def serve():
        with s:
            f = s.makefile("rb")
            while True:
                head = f.read(8)
                if len(head) < 8:
                    return
                ty, size = struct.unpack("<B3xI", head)
                f.read(size)
                if ty == 1:
                    s.sendall(struct.pack("<B3xIB", 2, 1, 1))

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return s, t


def test_nodes_dropped_during_configuration_are_reported_as_warnings():
    cluster = Cluster(BIN, 1)
    try:
        sock, t = _refusing_node(cluster.nodes_addr)
        with connect(cluster, nodes=2) as c:
            assert c.nodes == 2
            c.configure_benchmark(16, 16)
            assert len(c.warnings) == 1 and "refused" in c.warnings[0], c.warnings
            assert c.map([b"w" * 16] * 5, window=2).__next__()[:16] == b"w" * 16
        sock.close()
        t.join(5)
    finally:
        cluster.stop()


def test_four_threads_map_on_one_client(cluster):
    per_thread = 150
    with connect(cluster, nodes=2, io_timeout=30) as c:
        c.configure_benchmark(32, 16)
        results, errors = {}, []

        def mapper(t):
            try:
                inputs = [struct.pack("<QQ", t, k) + bytes(16) for k in range(per_thread)]
                results[t] = (inputs, list(c.map(inputs, window=8)))
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=mapper, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "a mapping thread is stuck"
        assert not errors, errors
        for t in range(4):
            inputs, out = results[t]
            assert [r[:16] for r in out] == [i[:16] for i in inputs], f"thread {t}"


def test_asyncio_client_against_the_real_cluster(cluster):
    import asyncio

    import corefarm.aio

    async def main():
        async with await corefarm.aio.connect(cluster.users_addr, nodes=2, timeout=30) as c:
            await c.configure_benchmark(16, 16)
            futs = [await c.submit(struct.pack("<QQ", k, 3)) for k in range(20)]
            outs = await asyncio.gather(*futs)
            assert [o.data for o in outs] == [struct.pack("<QQ", k, 3) for k in range(20)]
            inputs = [struct.pack("<QQ", k, 4) for k in range(200)]

            async def one_map(tag):
                mine = [struct.pack("<QQ", k, tag) for k in range(100)]
                return mine, [r async for r in c.map(mine, window=8)]

            # Two maps interleaved on one loop, plus one more directly.
            for mine, got in await asyncio.gather(one_map(5), one_map(6)):
                assert got == mine
            assert [r async for r in c.map(inputs, window=16)] == inputs

    asyncio.run(main())


def test_status_from_the_real_cluster(cluster):
    with connect(cluster, nodes=2) as c:
        c.configure_benchmark(16, 16)
        assert len(list(c.map([tagged(k, 16) for k in range(30)], window=8))) == 30
        s = c.status()
        me = next(u for u in s["users"] if u["id"] == s["you"])
        assert me["results"] == 30 and me["outstanding"] == 0
        assert len(me["nodes"]) == 2
        assert sum(n["state"] == "ready" for n in s["nodes"]) == 2
