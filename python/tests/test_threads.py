"""One client, many threads (and asyncio): results routed by id, misuse
errors, the status request and buffer safety, against a scripted fake server."""

import asyncio
import struct
import threading

import pytest

import corefarm
import corefarm.aio
from fakeserver import FakeServer


def tagged(t, k, size=16):
    return struct.pack("<II", t, k) + bytes([t]) * (size - 8)


def test_four_threads_map_on_one_client_while_a_fifth_uses_recv():
    per_thread, mappers = 200, 4

    def script(p):
        p.hello()
        p.configuration()
        p.reordering_echo((mappers + 1) * per_thread)

    srv = FakeServer(script)
    with corefarm.connect(srv.addr) as c:
        c.configure_benchmark(16, 16)
        results, errors = {}, []

        def mapper(t):
            try:
                results[t] = list(c.map((tagged(t, k) for k in range(per_thread)), window=4))
            except Exception as e:  # reported below
                errors.append(e)

        def plain():
            try:
                for k in range(per_thread):
                    ident = c.submit(tagged(99, k))
                    out = c.recv(timeout=20)
                    assert (out.id, out.data) == (ident, tagged(99, k))
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=mapper, args=(t,)) for t in range(mappers)]
        threads.append(threading.Thread(target=plain))
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "a thread is stuck"
        assert not errors, errors
        for t in range(mappers):
            assert results[t] == [tagged(t, k) for k in range(per_thread)]
    srv.join()


def test_misuse_is_a_clear_error_not_a_hang():
    go = threading.Event()

    def script(p):
        p.configuration()
        ident, body = p.data()
        go.wait(20)
        p.result(ident, body)

    srv = FakeServer(script)
    with corefarm.connect(srv.addr, legacy=True) as c:
        c.configure_benchmark(16, 16)
        pending = c.submit_pending(b"p" * 16)
        assert isinstance(pending, corefarm.Pending) and not pending.done()
        with pytest.raises(corefarm.UsageError, match="map()"):
            c.recv()
        with pytest.raises(corefarm.UsageError, match="already in flight"):
            c.submit(bytes(16), id=pending.id)
        go.set()
        assert pending.result(timeout=20).data == b"p" * 16
        with pytest.raises(corefarm.UsageError, match="already taken"):
            pending.result()
    srv.join()


def test_pending_gets_the_servers_error_for_its_message():
    def script(p):
        p.hello()
        p.configuration()
        p.credit(2)
        bad, _ = p.data()
        good, body = p.data()
        p.result(good, body)
        p.error(bad, 9, "core 0 stuck")

    srv = FakeServer(script)
    with corefarm.connect(srv.addr) as c:
        c.configure_benchmark(16, 16)
        bad = c.submit_pending(b"b" * 16)
        good = c.submit_pending(b"g" * 16)
        assert good.result(timeout=20).data == b"g" * 16
        with pytest.raises(corefarm.ServerError) as e:
            bad.result(timeout=20)
        assert (e.value.id, e.value.reason) == (bad.id, "core 0 stuck")
    srv.join()


def test_status_is_a_dict_and_needs_the_feature():
    answer = {"you": 3, "policy": "credit", "max_message": 1024,
              "nodes": [{"id": 1, "addr": "127.0.0.1:5", "state": "ready", "user": 3}],
              "users": [{"id": 3, "addr": "127.0.0.1:6", "phase": "routing", "nodes": [1]}]}

    def script(p):
        p.hello(features=("error", "credit", "status"))
        p.status(answer)

    srv = FakeServer(script)
    with corefarm.connect(srv.addr) as c:
        assert c._raw.has_status
        s = c.status()
        assert s["you"] == 3 and s["nodes"][0]["state"] == "ready"
        assert s["users"][0]["phase"] == "routing"
    srv.join()

    def plain(p):
        p.hello()
        assert p.at_eof(), "no status request may be sent"

    srv = FakeServer(plain)
    with corefarm.connect(srv.addr) as c:
        with pytest.raises(corefarm.UnsupportedError, match="status"):
            c.status()
    srv.join()


def test_a_buffer_written_by_another_thread_is_sent_as_one_snapshot():
    # A writer thread keeps filling the buffer with one byte value at a time;
    # every message sent must be one of those fillings, never a mix.
    size, n = 1 << 20, 20
    buf = bytearray(size)
    stop = threading.Event()
    torn = []

    def script(p):
        p.configuration()
        for _ in range(n):
            _, body = p.data()
            if body.count(body[:1]) != len(body):
                torn.append(len(set(body)))

    def writer():
        k = 0
        while not stop.is_set():
            k = (k + 1) % 251
            buf[:] = bytes([k]) * size

    srv = FakeServer(script)
    with corefarm.connect(srv.addr, legacy=True) as c:
        c.configure_benchmark(size, 16)
        t = threading.Thread(target=writer)
        t.start()
        try:
            for _ in range(n):
                c.submit(buf)
        finally:
            stop.set()
            t.join(20)
        srv.join()
    assert not torn, f"{len(torn)} messages mixed several fillings"


def test_the_package_exports_no_helper_modules():
    for name in ("os", "json", "struct", "collections"):
        assert not hasattr(corefarm, name), name
    assert set(corefarm.__all__) <= set(dir(corefarm))
    assert "Pending" in corefarm.__all__ and "UsageError" in corefarm.__all__


def test_asyncio_submit_run_map_and_errors():
    n = 60

    def script(p):
        p.hello()
        p.configuration()
        p.credit(4)   # less than the map window: some submits wait for credit
        for _ in range(n + 2):
            ident, body = p.data()
            if body[:1] == b"E":
                p.error(ident, 9, "refused")
            else:
                p.result(ident, body)
            p.credit(1)
        assert p.at_eof()

    async def main(addr):
        async with await corefarm.aio.connect(addr) as c:
            await c.configure_benchmark(16, 16)
            fut = await c.submit(b"a" * 16)
            assert (await fut).data == b"a" * 16
            with pytest.raises(corefarm.ServerError, match="refused"):
                await c.run(b"E" * 16)

            async def inputs():
                for k in range(n):
                    yield tagged(1, k)

            got = [out async for out in c.map(inputs(), window=8)]
            assert got == [tagged(1, k) for k in range(n)]

    srv = FakeServer(script)
    asyncio.run(main(srv.addr))
    srv.join()


def test_asyncio_close_fails_awaited_results():
    def script(p):
        p.hello()
        p.configuration()
        p.credit(1)
        p.data()
        assert p.at_eof()

    async def main(addr):
        c = await corefarm.aio.connect(addr)
        await c.configure_benchmark(16, 16)
        fut = await c.submit(bytes(16))
        c.close()
        with pytest.raises(corefarm.ConnectionError, match="closed by this client"):
            await asyncio.wait_for(fut, 20)

    srv = FakeServer(script)
    asyncio.run(main(srv.addr))
    srv.join()

