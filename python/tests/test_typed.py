"""Typed images: numpy inputs checked against the manifest's input type,
results as arrays of its output type, bytes still available (fake server)."""

import json
import struct

import pytest

import corefarm
from fakeserver import FakeServer

np = pytest.importorskip("numpy")


def typed_image(input_type, output_type, input_size, output_size):
    manifest = json.dumps({
        "name": "widen", "input_size": input_size, "output_size": output_size,
        "input_type": input_type, "output_type": output_type,
        "cores": [{"control": 1, "input": 2, "output": 3}], "artifacts": []}).encode()
    return b"CFIMAGE\0" + struct.pack("<II", 1, len(manifest)) + manifest


# One input: int16[4] (8 bytes); one output: int32[2,2] (16 bytes), the
# inputs widened. The fake server computes exactly that.
IMAGE = typed_image({"dtype": "int16", "shape": [4]}, {"dtype": "int32", "shape": [2, 2]}, 8, 16)


def widen(body):
    return np.frombuffer(body, dtype="<i2").astype("<i4").tobytes()


def serve(messages):
    def script(p):
        p.hello()
        p.configuration()
        p.credit(64)
        for _ in range(messages):
            ident, body = p.data()
            p.result(ident, widen(body))
        assert p.at_eof(), "the client sent a data message it should have refused"
    return FakeServer(script)


def test_wrongly_typed_arrays_are_refused_before_anything_is_sent():
    srv = serve(0)
    with corefarm.connect(srv.addr) as c:
        c.configure(IMAGE)
        assert c.types == ("int16[4]", "int32[2,2]")
        cases = [
            # The foot-gun: int32[2] has the bytes of one int16[4] input.
            (np.arange(2, dtype=np.int32),
             "input array has dtype int32 but image 'widen' takes int16[4] inputs; convert it with "
             ".astype(numpy.dtype('<i2'))"),
            (np.arange(4, dtype=">i2"), "dtype >i2 but image 'widen' takes int16[4]"),
            # Two inputs flattened: ambiguous, so refused with the shapes to use.
            (np.arange(8, dtype=np.int16),
             "input array has shape (8,) but image 'widen' takes int16[4] inputs: pass shape (4,) "
             "for one input or (k, 4) for k inputs"),
            (np.arange(8, dtype=np.int16).reshape(2, 2, 2), "shape (2, 2, 2)"),
            (np.arange(8, dtype=np.int16)[::2], "not C-contiguous"),
            (np.zeros((0, 4), dtype=np.int16), "shape (0, 4)"),
        ]
        for a, message in cases:
            for send in (c.submit, c.submit_pending, lambda x: next(c.map([x]))):
                with pytest.raises(corefarm.InputError) as e:
                    send(a)
                assert message in str(e.value)
                assert isinstance(e.value, ValueError)
    srv.join()


def test_results_are_arrays_of_the_output_type_shaped_like_the_input():
    srv = serve(6)
    with corefarm.connect(srv.addr) as c:
        c.configure(IMAGE)
        one = np.array([1, -2, 3, 32767], dtype=np.int16)
        batch = np.arange(12, dtype=np.int16).reshape(3, 4)
        got = list(c.map([one, batch, one.tobytes(), batch.tobytes()], window=2))
        assert got[0].dtype == np.dtype("<i4") and got[0].shape == (2, 2)
        assert got[0].tolist() == [[1, -2], [3, 32767]]
        assert got[1].shape == (3, 2, 2) and got[1].reshape(-1).tolist() == list(range(12))
        assert got[2].shape == (2, 2)          # bytes of one input: no batch axis
        assert got[3].shape == (3, 2, 2)
        assert not got[0].flags.writeable      # a view of the received bytes
        # The raw bytes stay available.
        (raw,) = c.map([one], raw=True)
        assert raw == widen(one.tobytes())
        ident = c.submit(batch)
        out = c.recv(timeout=10)
        assert out.id == ident and c.array(out).shape == (3, 2, 2)
        assert c.array(out.data)[2].tolist() == [[8, 9], [10, 11]]
    srv.join()


def test_the_asyncio_client_checks_and_types_the_same_way():
    import asyncio

    import corefarm.aio

    srv = serve(3)

    async def main():
        async with corefarm.aio.AsyncClient(corefarm.connect(srv.addr)) as c:
            await c.configure(IMAGE)
            # The int32[2] foot-gun is refused before anything is sent.
            with pytest.raises(corefarm.InputError, match="dtype int32"):
                await c.submit(np.arange(2, dtype=np.int32))
            with pytest.raises(corefarm.InputError, match="shape \\(8,\\)"):
                async for _ in c.map([np.arange(8, dtype=np.int16)]):
                    pass
            one = np.array([1, -2, 3, 32767], dtype=np.int16)
            batch = np.arange(12, dtype=np.int16).reshape(3, 4)
            got = [r async for r in c.map([one, batch], window=2)]
            assert got[0].shape == (2, 2) and got[0].tolist() == [[1, -2], [3, 32767]]
            assert got[1].shape == (3, 2, 2) and got[1].reshape(-1).tolist() == list(range(12))
            raw = [r async for r in c.map([one], raw=True)]
            assert raw == [widen(one.tobytes())]

    asyncio.run(main())
    srv.join()


def test_untyped_configurations_keep_bytes():
    def script(p):
        p.hello()
        p.configuration()
        p.credit(4)
        ident, body = p.data()
        p.result(ident, body)

    srv = FakeServer(script)
    with corefarm.connect(srv.addr) as c:
        c.configure_benchmark(8, 8)
        assert c.types == (None, None)
        # Any array is its bytes, as before.
        assert next(c.map([np.arange(2, dtype=np.int32)])) == np.arange(2, dtype=np.int32).tobytes()
        with pytest.raises(corefarm.UsageError, match="no output type"):
            c.array(b"\0" * 8)
    srv.join()


def test_a_file_that_is_not_an_image_is_named_so(tmp_path):
    def script(p):
        p.hello()
        assert p.at_eof(), "nothing is sent for a refused configure"

    srv = FakeServer(script)
    path = tmp_path / "notes.txt"
    path.write_text("not an image")
    with corefarm.connect(srv.addr) as c:
        with pytest.raises(corefarm.ConfigurationError) as e:
            c.configure(path)
        assert str(e.value) == (
            f"{path} is not a corefarm image (no CFIMAGE magic); to send a raw Cyclone V "
            "bitstream, give input_size= and output_size=")
        assert "input_size and output_size are required" not in str(e.value)
        with pytest.raises(corefarm.ConfigurationError, match="this buffer is not a corefarm image"):
            c.configure(b"RBF")
    srv.join()


def test_results_of_another_length_are_1d_arrays_or_bytes():
    # A streaming handler's result is what it emitted (docs/streams.md):
    # here 3 elements, nothing, 5 bytes, and 2 whole outputs for 1 input.
    answers = [struct.pack("<3i", 7, -8, 9), b"", b"\1\2\3\4\5", bytes(range(32))]

    def script(p):
        hello = p.hello(features=("error", "credit", "any-length"))
        assert "any-length" in hello["features"], hello
        p.configuration()
        p.credit(64)
        for body in answers + answers[:1]:
            ident, _ = p.data()
            p.result(ident, body)

    srv = FakeServer(script)
    with corefarm.connect(srv.addr) as c:
        c.configure(IMAGE)
        one = np.array([1, 2, 3, 4], dtype=np.int16)
        got = list(c.map([one, one, one, one.tobytes()], window=1))
        assert got[0].dtype == np.dtype("<i4") and got[0].shape == (3,)
        assert got[0].tolist() == [7, -8, 9] and not got[0].flags.writeable
        assert got[1].dtype == np.dtype("<i4") and got[1].shape == (0,)
        assert got[2] == b"\1\2\3\4\5"
        # Bytes of one input, two outputs' worth back: not shaped as outputs.
        assert got[3].shape == (8,) and got[3].dtype == np.dtype("<i4")
        ident = c.submit(one)
        out = c.recv(timeout=10)
        assert out.id == ident and out.count == 0 and len(out) == 12
        assert c.array(out).tolist() == [7, -8, 9]
    srv.join()


def test_typed_buffers_that_are_not_numpy_arrays_are_checked_too():
    # array.array, memoryviews of typed memory: their elements have a type
    # as surely as a numpy array's, and the same foot-gun applies.
    import array

    srv = serve(2)
    with corefarm.connect(srv.addr) as c:
        c.configure(IMAGE)  # int16[4] inputs (8 bytes)
        wrong = [
            array.array("i", [1, 2]),                        # int32: 8 bytes, one input's worth
            array.array("H", [1, 2, 3, 4]),                   # uint16: right size, wrong kind
            array.array("f", [0.5, 1.5]),
            memoryview(np.arange(2, dtype=np.int32)),
            memoryview(np.arange(4, dtype=">i2")),            # big-endian int16
            memoryview(bytes(8)).cast("q"),
        ]
        for a in wrong:
            for send in (c.submit, c.submit_pending, lambda x: next(c.map([x]))):
                with pytest.raises(corefarm.InputError, match="takes int16\\[4\\] inputs") as e:
                    send(a)
                assert isinstance(e.value, ValueError)
        # The right element type goes through, one input or a flat batch;
        # bytes stay unchecked.
        got = list(c.map([array.array("h", [1, -2, 3, 32767]),
                          memoryview(np.arange(8, dtype="<i2"))]))
        assert got[0].tolist() == [[1, -2], [3, 32767]]
        assert got[1].shape == (2, 2, 2) and got[1].ravel().tolist() == list(range(8))
    srv.join()
