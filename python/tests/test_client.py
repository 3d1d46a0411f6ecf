"""The Python client against a scripted fake server (no corefarm binaries)."""

import json
import struct
import threading
import time

import pytest

import corefarm
import corefarm.aio
from fakeserver import CONFIGURATION, DATA, HELLO, NO_ID, FakeServer

np = pytest.importorskip("numpy")


def echo(p, n, input_size, output_size):
    for _ in range(n):
        ident, body = p.data()
        out = b"".join(body[k:k + output_size] for k in range(0, len(body), input_size))
        p.result(ident, out)


def test_submit_accepts_every_buffer_kind_and_recv_returns_outputs():
    def script(p):
        h = p.hello(nodes=2)
        assert h["role"] == "user" and h["nodes"] == 2
        assert set(h["features"]) == {"error", "credit", "status", "any-length", "spin-notify"}
        cfg = p.configuration()
        assert (cfg["input_size"], cfg["output_size"], cfg["cores"]) == (16, 8, [])
        assert struct.unpack("<I", cfg["bitstream"]) == (5,)
        p.credit(10)
        echo(p, 5, 16, 8)
        assert p.at_eof()

    srv = FakeServer(script)
    with corefarm.connect(srv.addr, nodes=2) as c:
        assert c.nodes == 2 and c.credit_mode
        assert c.server_hello["role"] == "server"
        c.configure_benchmark(16, 8, delay_us=5)
        assert c.sizes == (16, 8)
        inputs = [
            bytes(range(16)),
            bytearray(range(16, 48)),
            memoryview(bytes(range(48, 64))),
            np.arange(8, dtype=np.uint16),          # 16 bytes, format 'H'
            np.arange(12, dtype=np.float32).reshape(3, 4),  # 48 bytes, 2-D
        ]
        ids = [c.submit(x) for x in inputs]
        assert ids == [0, 1, 2, 3, 4]
        for ident, x in zip(ids, inputs):
            out = c.recv(timeout=10)
            raw = np.ascontiguousarray(x).tobytes() if isinstance(x, np.ndarray) else bytes(x)
            want = b"".join(raw[k:k + 8] for k in range(0, len(raw), 16))
            assert out.id == ident
            assert out.count == len(raw) // 16
            assert out.data == want and bytes(out) == want and len(out) == len(want)
            assert bytes(memoryview(out)) == want          # buffer protocol
            got_id, got_data = out                          # unpacking
            assert (got_id, got_data) == (ident, want)
    srv.join()


def test_non_contiguous_and_misaligned_input_are_rejected_locally():
    def script(p):
        p.configuration()
        assert p.at_eof(), "nothing should have been sent"

    srv = FakeServer(script)
    with corefarm.connect(srv.addr, legacy=True) as c:
        c.configure_benchmark(16, 16)
        with pytest.raises(corefarm.InputError, match="contiguous"):
            c.submit(np.arange(64, dtype=np.uint8)[::2])
        with pytest.raises(corefarm.InputError, match="16-byte inputs"):
            c.submit(b"x" * 17)
        with pytest.raises(TypeError):
            c.submit(12345)
    srv.join()


def test_configuration_error_carries_the_reason():
    def script(p):
        p.hello()
        p.expect(CONFIGURATION)
        p.error(NO_ID, 7, "no node could load the bitstream")
        p.send(2, b"\x01")

    srv = FakeServer(script)
    with corefarm.connect(srv.addr) as c:
        with pytest.raises(corefarm.ConfigurationError) as e:
            c.configure(b"\x00" * 100, input_size=64, output_size=64)
        assert e.value.status == 1
        assert "no node could load the bitstream" in str(e.value)
        assert "no node could load the bitstream" in e.value.reason
        assert isinstance(e.value, corefarm.Error)
    srv.join()


def test_configure_reads_sizes_and_cores_from_an_image_manifest(tmp_path):
    manifest = json.dumps({"name": "t", "input_size": 32768, "output_size": 16384,
                           "cores": [{"control": 1, "input": 2, "output": 3}], "artifacts": []}).encode()
    image = b"CFIMAGE\0" + struct.pack("<II", 1, len(manifest)) + manifest + b"artifact"
    path = tmp_path / "x.cfimg"
    path.write_bytes(image)
    seen = []

    def script(p):
        seen.append(p.configuration())
        seen.append(p.configuration())

    srv = FakeServer(script)
    with corefarm.connect(srv.addr, legacy=True) as c:
        c.configure(path)                       # sizes and table from the manifest
        c.configure(bytes(200), input_size=32768, output_size=16384, cores=2)  # default table
    srv.join()
    assert seen[0]["input_size"] == 32768 and seen[0]["output_size"] == 16384
    assert seen[0]["cores"] == [(1, 2, 3)] and seen[0]["bitstream"] == image
    assert seen[1]["cores"] == corefarm.default_core_table(2, 32768, 16384)
    assert seen[1]["cores"][1] == (0xC0020000, 0xC0028000, 0xC0030000)


def test_server_error_for_one_data_message():
    def script(p):
        p.hello()
        p.configuration()
        p.credit(2)
        ident, _ = p.data()
        p.error(ident, 9, "core 1 stuck busy")
        echo(p, 1, 16, 16)

    srv = FakeServer(script)
    with corefarm.connect(srv.addr) as c:
        c.configure_benchmark(16, 16)
        bad = c.submit(bytes(16))
        with pytest.raises(corefarm.ServerError) as e:
            c.recv(timeout=10)
        assert (e.value.id, e.value.code, e.value.code_name) == (bad, 9, "core-failure")
        assert e.value.reason == "core 1 stuck busy"
        good = c.submit(bytes(16))
        assert c.recv(timeout=10).id == good
    srv.join()


def test_recv_timeout_and_server_close():
    release = threading.Event()

    def script(p):
        p.configuration()
        release.wait(10)

    srv = FakeServer(script)
    with corefarm.connect(srv.addr, legacy=True) as c:
        c.configure_benchmark(16, 16)
        with pytest.raises(corefarm.TimeoutError):
            c.recv(timeout=0.05)
        release.set()
        srv.join()
        with pytest.raises(corefarm.ConnectionError, match="server closed the connection"):
            c.recv(timeout=10)
        with pytest.raises(ConnectionError):   # also the built-in class
            c.submit(bytes(16))


def test_connection_refused_mentions_the_address():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    addr = "127.0.0.1:%d" % s.getsockname()[1]
    s.close()
    with pytest.raises(corefarm.ConnectionError, match=addr):
        corefarm.connect(addr)


def test_blocked_submit_releases_the_gil():
    # The fake server is a Python thread: it can only grant the credit the
    # submit is waiting for if that submit released the GIL.
    granted = threading.Event()

    def script(p):
        p.hello()
        p.configuration()
        p.credit(1)
        p.data()
        granted.set()
        p.credit(1)
        p.data()

    srv = FakeServer(script)
    with corefarm.connect(srv.addr) as c:
        c.configure_benchmark(16, 16)
        c.submit(bytes(16))
        done = []
        t = threading.Thread(target=lambda: done.append(c.submit(bytes(16))))
        t.start()
        t.join(20)
        assert done == [1] and granted.is_set()
    srv.join()


def test_map_yields_in_input_order():
    window = 4

    def script(p):
        p.hello()
        p.configuration()
        p.credit(window)
        for _ in range(5):
            batch = [p.data() for _ in range(window)]
            for ident, body in reversed(batch):
                p.result(ident, body)
            p.credit(window)

    srv = FakeServer(script)
    with corefarm.connect(srv.addr) as c:
        c.configure_benchmark(16, 16)
        inputs = [bytes([k]) * 16 for k in range(20)]
        assert list(c.map(inputs, window=window)) == inputs
    srv.join()


def test_close_from_another_thread_unblocks_recv():
    def script(p):
        p.configuration()
        assert p.at_eof()

    srv = FakeServer(script)
    c = corefarm.connect(srv.addr, legacy=True)
    c.configure_benchmark(16, 16)
    errors = []

    def wait():
        try:
            c.recv()
        except corefarm.ConnectionError as e:
            errors.append(e)

    t = threading.Thread(target=wait)
    t.start()
    assert c._raw._wait_blocked_receivers(1, 20), "recv never blocked"
    c.close()
    t.join(10)
    assert errors and "closed by this client" in str(errors[0])
    srv.join()


def test_ctrl_c_interrupts_a_blocking_recv(ctrl_c):
    import _thread

    release = threading.Event()

    def script(p):
        p.configuration()
        release.wait(10)

    srv = FakeServer(script)
    with corefarm.connect(srv.addr, legacy=True) as c:
        c.configure_benchmark(16, 16)

        def interrupt_once_blocked():
            # The signal comes once recv() waits, not after a guessed delay.
            if c._raw._wait_blocked_receivers(1, 20):
                _thread.interrupt_main()

        interrupter = threading.Thread(target=interrupt_once_blocked)
        interrupter.start()
        with pytest.raises(KeyboardInterrupt):
            c.recv()   # no timeout: only the signal can end this wait
        interrupter.join()
    release.set()
    srv.join()


def test_try_submit_pending_returns_none_without_credit_and_sends_once_granted():
    go = threading.Event()

    def script(p):
        p.hello()
        p.configuration(credit=1)  # granted before configure returns, not racing it
        ident, body = p.data()
        p.result(ident, body)
        assert go.wait(20)  # the next credit only once the test saw None
        p.credit(1)
        ident, body = p.data()
        p.result(ident, body)

    srv = FakeServer(script)
    with corefarm.connect(srv.addr) as c:
        c.configure_benchmark(16, 16)
        first = c.try_submit_pending(bytes(range(16)))
        assert first is not None
        assert first.result(timeout=10).data == bytes(range(16))
        assert c.try_submit_pending(bytes(16)) is None  # the one credit is spent
        go.set()
        deadline = time.monotonic() + 20
        second = None
        while second is None and time.monotonic() < deadline:
            second = c.try_submit_pending(bytes(16))  # polled, as its users do
        assert second is not None
        assert second.result(timeout=10).data == bytes(16)
    srv.join()


def test_infinite_and_huge_timeouts_wait_without_limit():
    # math.inf is the natural "no limit"; 1e19 s used to overflow the
    # clock inside the extension (a PanicException, which `except
    # Exception` does not catch).
    import math

    def script(p):
        p.hello()
        p.configuration(credit=8)
        echo(p, 6, 16, 16)

    srv = FakeServer(script)
    with corefarm.connect(srv.addr, timeout=math.inf, io_timeout=1e19) as c:
        c.configure_benchmark(16, 16)
        for k, t in enumerate((math.inf, 1e19, 1e300)):
            ident = c.submit(bytes([k]) * 16)
            out = c.recv(timeout=t)
            assert (out.id, out.data) == (ident, bytes([k]) * 16)
            assert c.submit_pending(b"p" * 16).result(timeout=t).data == b"p" * 16
        for bad in (-1.0, math.nan):
            with pytest.raises(ValueError, match="invalid timeout"):
                c.recv(timeout=bad)
    srv.join()


def _one_failing(p, n, bad):
    """Answers `n` data messages in order, the server's core-failure error
    for message `bad` (its index) and an echo for every other."""
    p.hello()
    p.configuration()
    p.credit(n)
    for k in range(n):
        ident, body = p.data()
        if k == bad:
            p.error(ident, 9, "core 0 crashed: signal 11")
        else:
            p.result(ident, body)


def test_a_failed_input_does_not_end_the_map():
    # Message 5 of 10 crashes its core: its error comes in its turn, and the
    # results of messages 6-10 are still there for the caller.
    srv = FakeServer(lambda p: _one_failing(p, 10, 4))
    inputs = [bytes([k]) * 16 for k in range(10)]
    with corefarm.connect(srv.addr) as c:
        c.configure_benchmark(16, 16)
        it = c.map(inputs, window=3)
        assert [next(it) for _ in range(4)] == inputs[:4]
        with pytest.raises(corefarm.ServerError, match="crashed") as e:
            next(it)
        assert e.value.code_name == "core-failure"
        assert list(it) == inputs[5:]
    srv.join()


def test_return_exceptions_yields_each_failure_in_its_place():
    srv = FakeServer(lambda p: _one_failing(p, 10, 4))
    inputs = [bytes([k]) * 16 for k in range(10)]
    with corefarm.connect(srv.addr) as c:
        c.configure_benchmark(16, 16)
        # A 15-byte input is refused by the client, in its place too.
        got = list(c.map(inputs[:7] + [b"short"] + inputs[7:], window=4, return_exceptions=True))
        assert len(got) == 11
        assert isinstance(got[4], corefarm.ServerError) and got[4].code == 9
        assert isinstance(got[7], corefarm.InputError)
        assert [g for k, g in enumerate(got) if k not in (4, 7)] == inputs[:4] + inputs[5:]
    srv.join()


def test_a_lost_connection_still_ends_the_map():
    def script(p):
        p.hello()
        p.configuration()
        p.credit(4)
        ident, body = p.data()
        p.result(ident, body)
        p.data()  # and the connection ends with it unanswered

    srv = FakeServer(script)
    # Not resuming (test_resume.py covers that): the loss ends the map now.
    with corefarm.connect(srv.addr, reconnect_timeout=None) as c:
        c.configure_benchmark(16, 16)
        it = c.map([bytes(16)] * 2, window=1, return_exceptions=True)
        assert next(it) == bytes(16)
        with pytest.raises(corefarm.ConnectionError):
            next(it)
        assert list(it) == []
    srv.join()


def test_asyncio_map_goes_on_after_a_failed_input():
    import asyncio

    async def main(addr):
        async with await corefarm.aio.connect(addr) as c:
            await c.configure_benchmark(16, 16)
            inputs = [bytes([k]) * 16 for k in range(10)]
            it = c.map(inputs, window=3)
            got = [await it.__anext__() for _ in range(4)]
            with pytest.raises(corefarm.ServerError, match="crashed"):
                await it.__anext__()
            got += [out async for out in it]
            assert got == inputs[:4] + inputs[5:]

    srv = FakeServer(lambda p: _one_failing(p, 10, 4))
    asyncio.run(main(srv.addr))
    srv.join()


def test_asyncio_map_return_exceptions():
    import asyncio

    async def main(addr):
        async with await corefarm.aio.connect(addr) as c:
            await c.configure_benchmark(16, 16)
            inputs = [bytes([k]) * 16 for k in range(10)]
            got = [out async for out in c.map(inputs, window=4, return_exceptions=True)]
            assert isinstance(got[4], corefarm.ServerError)
            assert got[:4] + got[5:] == inputs[:4] + inputs[5:]

    srv = FakeServer(lambda p: _one_failing(p, 10, 4))
    asyncio.run(main(srv.addr))
    srv.join()
