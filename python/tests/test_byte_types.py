"""Byte memories: an HLS `uint8_t *in` is recorded as uint8[N], so an array
of wider elements is refused instead of being sent as several inputs; bytes
and arrays of 1-byte integers go as bytes, and byte results stay bytes
(fake server)."""

import json
import struct

import pytest

import corefarm
from fakeserver import FakeServer

np = pytest.importorskip("numpy")

BLOCK = 4096


def image(input_type, output_type, input_size, output_size):
    manifest = json.dumps({
        "name": "crc32", "input_size": input_size, "output_size": output_size,
        "input_type": input_type, "output_type": output_type,
        "cores": [{"control": 1, "input": 2, "output": 3}], "artifacts": []}).encode()
    return b"CFIMAGE\0" + struct.pack("<II", 1, len(manifest)) + manifest


# What `corefarm image build` records for a CRC-32 core taking
# `uint8_t *in` (4096 bytes) and giving `uint32_t *out` (4 bytes).
CRC = image({"dtype": "uint8", "shape": [BLOCK]}, {"dtype": "uint32", "shape": [1]}, BLOCK, 4)


def serve(script_results):
    """Answers each data message with one word per input (its first byte)."""
    def script(p):
        p.hello()
        p.configuration()
        p.credit(64)
        for _ in range(script_results):
            ident, body = p.data()
            p.result(ident, b"".join(struct.pack("<I", body[k]) for k in range(0, len(body), BLOCK)))
        assert p.at_eof(), "the client sent a data message it should have refused"
    return FakeServer(script)


def test_an_int32_array_for_a_byte_memory_is_refused_with_the_fix():
    srv = serve(0)
    blk = np.arange(BLOCK, dtype=np.uint8)
    with corefarm.connect(srv.addr) as c:
        c.configure(CRC)
        assert c.types == ("uint8[4096]", "uint32[1]")
        for send in (c.submit, c.submit_pending, lambda x: next(c.map([x]))):
            with pytest.raises(corefarm.InputError) as e:
                # 16 KiB: four whole inputs if its bytes were sent.
                send(blk.astype(np.int32))
            assert ("input array has dtype int32 but image 'crc32' takes uint8[4096] inputs; "
                    "convert it with .astype(numpy.dtype('<u1')), or pass a.view(numpy.uint8) "
                    "to send its bytes as they are") in str(e.value)
        import array
        with pytest.raises(corefarm.InputError, match="format 'i'"):
            c.submit(array.array("i", bytes(BLOCK)))
    srv.join()


def test_bytes_and_one_byte_arrays_are_sent_as_bytes():
    srv = serve(6)
    blk = np.arange(BLOCK, dtype=np.uint8) + 7
    with corefarm.connect(srv.addr) as c:
        c.configure(CRC)
        got = list(c.map([
            blk,                                   # one input, the recorded shape
            blk.astype(np.int8),                   # the same bytes, signed
            np.concatenate([blk, blk[::-1]]),      # two inputs, flat
            blk.tobytes(),
            blk.astype(np.int32).view(np.uint8),   # asked for: the int32s' bytes
        ]))
        assert [g.dtype for g in got] == [np.dtype("<u4")] * 5
        assert [g.tolist() for g in got] == [[7], [7], [[7], [6]], [7], [[7], [7], [7], [7]]]
        import array
        c.submit(array.array("b", blk.tobytes()))
        assert c.recv(10).data == struct.pack("<I", 7)
    srv.join()


def test_byte_results_stay_bytes():
    echo = image({"dtype": "uint8", "shape": [BLOCK]}, {"dtype": "uint8", "shape": [4]}, BLOCK, 4)

    def script(p):
        p.hello()
        p.configuration()
        p.credit(8)
        ident, body = p.data()
        p.result(ident, bytes(body[:4]))
    srv = FakeServer(script)
    with corefarm.connect(srv.addr) as c:
        c.configure(echo)
        (out,) = list(c.map([bytes(range(4)) * (BLOCK // 4)]))
        assert out == bytes(range(4))
        assert c.array(out).tolist() == [0, 1, 2, 3]
    srv.join()
