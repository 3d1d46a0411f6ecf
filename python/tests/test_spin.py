"""Streaming handlers (docs/streams.md) from Python: an image built with
`corefarm image build --handlers` carries the reference handler sets of
cores/spin; each one, driven through a real node of `corefarm local`,
gives exactly the whole-message computation (the bytes its handlers
emitted, no padding: the client agrees `any-length`), typed results of
another length come back as 1-D arrays, and a message no ruleset matches
goes to the core."""

import random
import struct

import pytest

import corefarm
from spinimage import ROOT, handler_image, rule_set

INPUT, OUTPUT = 16, 64


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    names = ("sum", "filter", "histogram", "strided")
    sets = [rule_set(n, w, budgets={"scratch": 1 << 20}) for w, n in enumerate(names, 1)]
    return handler_image(tmp_path_factory.mktemp("spin"), "spin", sets,
                         [ROOT / "cores" / "spin" / f"{n}.c" for n in names])


def header(word0, a=0, b=0, c=0):
    return struct.pack("<4I", word0, a, b, c)


def exactly(got, msg, want):
    # Not the fixed size (inputs × 64 bytes): a padded result would differ.
    assert len(want) != len(msg) // INPUT * OUTPUT
    assert len(got) == len(want), msg[:4]
    assert got == want, msg[:4]


def test_reference_handlers_through_a_real_node(one_node, image):
    rng = random.Random(5)
    data = bytes(rng.getrandbits(8) for _ in range(16 * 700))
    ints = struct.unpack(f"<{len(data) // 4}i", data)
    threshold = 0
    records = [data[i:i + 16] for i in range(0, len(data), 16)]
    block, stride, count = 32, 96, 150
    packed = bytes(rng.getrandbits(8) for _ in range(block * count))
    unpacked = bytearray(count * stride)
    for i in range(count):
        unpacked[i * stride:i * stride + block] = packed[i * block:(i + 1) * block]
    hist = [0] * 256
    for x in data:
        hist[x] += 1

    cases = [
        (header(1) + data, struct.pack("<q", sum(ints))),
        (header(2, threshold) + data,
         b"".join(r for r in records if struct.unpack_from("<i", r, 4)[0] >= threshold)),
        (header(3) + data, struct.pack("<256Q", *hist)),
        (header(4, count, block, stride) + packed, bytes(unpacked)),
    ]
    with corefarm.connect(one_node.users_addr, nodes=1, timeout=60) as c:
        c.configure(image)
        got = list(c.map([m for m, _ in cases], window=1))
        for (msg, want), out in zip(cases, got):
            exactly(bytes(out), msg, want)
        # No ruleset matches word 0 = 99: the echo core answers.
        msg = header(99) + bytes(range(16))
        (out,) = list(c.map([msg], window=1))
        out = bytes(out)
        for k in range(2):
            assert out[k * OUTPUT:k * OUTPUT + 16] == msg[k * INPUT:(k + 1) * INPUT]
            assert out[k * OUTPUT + 16:(k + 1) * OUTPUT] == b"\xee" * 48


def test_a_typed_sum_comes_back_as_a_1d_array_of_the_output_element(one_node, tmp_path):
    np = pytest.importorskip("numpy")
    out = handler_image(tmp_path, "typed", [rule_set("sum", 1)],
                        [ROOT / "cores" / "spin" / "sum.c"],
                        extra=("--input-type", "int32[4]", "--output-type", "int64[8]"))
    rng = random.Random(11)
    words = [rng.randrange(-2**31, 2**31) for _ in range(4 * 300)]
    batch = np.array([[1, 0, 0, 0]] + [words[i:i + 4] for i in range(0, len(words), 4)],
                     dtype=np.int32)
    with corefarm.connect(one_node.users_addr, nodes=1, timeout=60) as c:
        c.configure(out)
        assert c.types == ("int32[4]", "int64[8]")
        (got,) = list(c.map([batch], window=1))
        # One int64 (the sum of the words after the header row), not 301 outputs.
        assert got.dtype == np.dtype("<i8") and got.shape == (1,)
        assert got.tolist() == [sum(words)]
        (raw,) = list(c.map([batch], window=1, raw=True))
        assert raw == struct.pack("<q", sum(words))


def test_seed_overlap_benchmark_runs_and_checks_every_unpack():
    """bench/spin_gemm_overlap.py (seed 004 §6.3.2, in the `streams` suite,
    which CI does not run): a small run through a real node gives a ratio
    in (0, 1] at each point, and its byte-for-byte check of the handlers'
    unpack against the host's passed (the script exits non-zero if not)."""
    import json
    import os
    import subprocess
    import sys

    from spinimage import BIN, require_tools

    require_tools()
    p = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "spin_gemm_overlap.py"), "--sizes", "64",
         "--inflight", "1,2", "--sweep-size", "64", "--samples", "4", "--warmup", "1"],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, COREFARM_BIN=BIN))
    assert p.returncode == 0, p.stderr
    points = json.loads(p.stdout)["points"]
    assert [(x["KiB"], x["inflight"]) for x in points] == [(64, 1), (64, 2)]
    for x in points:
        assert 0 < x["r_overlap_with_submit"] <= x["r_overlap"] <= 1, x
        assert x["polls_per_trial"] >= 1 and x["datatypes_ms_alone"] > 0, x


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """The reference sets as cores/spin/sets.json ships them, result types
    included, before an echo core typed uint32[16] (its 64-byte output), so
    a result no set types would come back as uint32 values."""
    import json
    sets = json.loads((ROOT / "cores" / "spin" / "sets.json").read_text())
    for s in sets:  # a budget no scheduling delay of a loaded machine reaches
        s["budgets"]["per_call_ms"] = 60_000
    names = [s["name"] for s in sets]
    return handler_image(tmp_path_factory.mktemp("shipped"), "shipped", sets,
                         [ROOT / "cores" / "spin" / f"{n}.c" for n in names],
                         extra=("--output-type", "uint32[16]"))


def test_a_handler_sets_declared_result_type_types_its_results(one_node, shipped):
    np = pytest.importorskip("numpy")
    rng = random.Random(7)
    data = bytes(rng.getrandbits(8) for _ in range(16 * 40))
    ints = struct.unpack(f"<{len(data) // 4}i", data)
    hist = [0] * 256
    for x in data:
        hist[x] += 1
    records = [data[i:i + 16] for i in range(0, len(data), 16)]
    kept = [r for r in records if struct.unpack_from("<i", r, 4)[0] >= 0]
    packed = bytes(range(32))
    msgs = [header(1) + data, header(3) + data, header(2, 0) + data,
            header(4, 2, 16, 48) + packed, header(99) + bytes(range(16))]
    with corefarm.connect(one_node.users_addr, nodes=1, timeout=60) as c:
        c.configure(shipped)
        total, counts, filtered, unpacked, echoed = list(c.map(msgs, window=2))
        # Exactly one value of the declared type: shaped as the type.
        assert total.dtype == np.dtype("<i8") and total.shape == (1,)
        assert total.tolist() == [sum(ints)]
        assert counts.dtype == np.dtype("<u8") and counts.shape == (256,)
        assert counts.tolist() == hist
        # Another number of values: 1-D of the element type.
        assert filtered.dtype == np.dtype("<i4") and filtered.shape == (4 * len(kept),)
        assert filtered.tobytes() == b"".join(kept)
        # A 1-D uint8 type: bytes.
        assert unpacked == packed[:16] + bytes(32) + packed[16:] + bytes(32)
        # No set takes word 0 = 99: the core's two outputs, of its type.
        assert echoed.dtype == np.dtype("<u4") and echoed.shape == (2, 16)
        assert c.result_types == {"sum": "int64[1]", "filter": "int32[4]",
                                  "histogram": "uint64[256]", "strided": "uint8[1]"}

        # The call's own type wins over the set's; raw stays bytes.
        (as_words,) = list(c.map(msgs[:1], result_type="uint32"))
        assert as_words.dtype == np.dtype("<u4") and as_words.shape == (2,)
        assert as_words.tobytes() == struct.pack("<q", sum(ints))
        (spec,) = list(c.map(msgs[:1], result_type="int64[1]"))
        assert spec.tolist() == [sum(ints)]
        (raw,) = list(c.map(msgs[:1], raw=True))
        assert raw == struct.pack("<q", sum(ints))
        assert c.array(raw, result_type=np.int64).tolist() == [sum(ints)]
        with pytest.raises(corefarm.InputError, match=r"int24\[1\].*element types"):
            c.map(msgs[:1], result_type="int24[1]")
        with pytest.raises(corefarm.InputError, match="element type"):
            c.map(msgs[:1], result_type="complex")
        with pytest.raises(corefarm.UsageError, match="not both"):
            c.map(msgs[:1], raw=True, result_type="int64")

        # An image whose declared type is no type (edited after the build,
        # which refuses it) is refused before it is sent, naming the set;
        # the configuration in force stays.
        image = shipped.read_bytes()
        assert image.count(b'"int64[1]"') == 1
        with pytest.raises(corefarm.ImageError,
                           match=r'handler set 0 \("sum"\): result_type: "int64\[x\]"'):
            c.configure(image.replace(b'"int64[1]"', b'"int64[x]"'))
        assert c.result_types["sum"] == "int64[1]"
        (total,) = list(c.map(msgs[:1]))
        assert total.tolist() == [sum(ints)]


def test_the_asyncio_map_types_handler_results_the_same_way(one_node, shipped):
    import asyncio

    np = pytest.importorskip("numpy")
    import corefarm.aio

    async def run():
        async with await corefarm.aio.connect(one_node.users_addr, nodes=1, timeout=60) as c:
            await c.configure(shipped)
            msg = header(1) + struct.pack("<4i", 5, -7, 11, 1000)
            got = [r async for r in c.map([msg, msg], result_type=None)]
            words = [r async for r in c.map([msg], result_type="uint32")]
            return got, words

    got, words = asyncio.run(run())
    for total in got:
        assert total.dtype == np.dtype("<i8") and total.tolist() == [1009]
    assert words[0].dtype == np.dtype("<u4") and words[0].shape == (2,)


def test_a_bad_result_type_is_refused_when_the_image_is_built(tmp_path):
    import json
    import subprocess

    from spinimage import BIN, FIXTURES, require_tools

    require_tools()
    (tmp_path / "echo.cpp").write_text((FIXTURES / "echo.cpp").read_text())
    (tmp_path / "sets.json").write_text(json.dumps([rule_set("sum", 1, result_type="int64")]))
    p = subprocess.run(
        [BIN, "image", "build", "--hls", str(tmp_path / "echo.cpp"), "--entry", "echo",
         "--handlers", str(tmp_path / "sets.json"),
         "--handler-source", str(ROOT / "cores" / "spin" / "sum.c"), "-o", str(tmp_path / "x.cfimg")],
        capture_output=True, text=True)
    assert p.returncode != 0
    # The set, the field and the form to use.
    assert 'handler set 0 ("sum"): result_type: "int64" is not a type like int16[4127]' in p.stderr, \
        p.stderr
    assert not (tmp_path / "x.cfimg").exists()
