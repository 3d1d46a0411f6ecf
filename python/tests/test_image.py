"""Building and inspecting configuration images from Python, and running one."""

import shutil

import pytest

import corefarm
from realbin import Cluster, find_binary

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
VADD = ROOT / "cores" / "vadd" / "vadd.cpp"
needs_cxx = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler (c++)")


@needs_cxx
def test_build_inspect_and_run_a_native_image(tmp_path):
    out = tmp_path / "vadd.cfimg"
    image = corefarm.build_image(hls=VADD, entry="vadd", input_size=2048, output_size=1024, cores=2, out=out)
    assert out.read_bytes() == image
    m = corefarm.inspect_image(out)
    assert (m["name"], m["input_size"], m["output_size"], len(m["cores"])) == ("vadd", 2048, 1024, 2)
    assert [a["kind"] for a in m["artifacts"]] == ["native"]
    assert all(a["checksum_ok"] for a in m["artifacts"])

    binary = find_binary()
    if binary is None:
        pytest.skip("no corefarm binary to run the image on")
    cluster = Cluster(binary, 1)
    try:
        with corefarm.connect(cluster.users_addr, nodes=1, timeout=30) as c:
            c.configure(image)
            a = bytes(range(256)) * 4
            b = bytes([1]) * 1024
            (out_bytes,) = list(c.map([a + b], window=1))
            assert out_bytes == bytes((x + 1) & 0xFF for x in a)
    finally:
        cluster.stop()


@needs_cxx
def test_a_corrupted_image_fails_its_checksum(tmp_path):
    image = bytearray(corefarm.build_image(hls=VADD, entry="vadd", input_size=2048, output_size=1024))
    image[-10] ^= 0xFF
    m = corefarm.inspect_image(bytes(image))
    assert not m["artifacts"][0]["checksum_ok"]
    assert "checksum" in m["artifacts"][0]["checksum_error"] or "sha256" in m["artifacts"][0]["checksum_error"]


def test_build_errors_say_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="nothing to build"):
        corefarm.build_image(input_size=16, output_size=16)
    with pytest.raises(ValueError, match="go together"):
        corefarm.build_image(input_size=16, output_size=16, hls=VADD)
    bad = tmp_path / "bad.cpp"
    bad.write_text("this is not C++\n")
    with pytest.raises(corefarm.ImageError):
        corefarm.build_image(input_size=16, output_size=16, hls=bad, entry="f")
    with pytest.raises(corefarm.ImageError):
        corefarm.inspect_image(b"CFIMAGE\0" + b"\xff" * 12)


def test_build_image_without_the_corefarm_command_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("COREFARM_BIN", str(tmp_path / "no-corefarm-here"))
    with pytest.raises(corefarm.ImageError, match="COREFARM_BIN"):
        corefarm.build_image(input_size=16, output_size=16, rbf=__file__)
    monkeypatch.delenv("COREFARM_BIN")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(corefarm.ImageError, match="not on PATH"):
        corefarm.build_image(input_size=16, output_size=16, rbf=__file__)


def test_build_image_passes_every_option_to_the_command(tmp_path):
    # Needs the corefarm command (conftest finds a built one); without it
    # build_image raises ImageError saying so.
    rbf = tmp_path / "x.rbf"
    rbf.write_bytes(b"\x01\x02\x03")
    table = [(0x8_4140, 0x5_0000, 0x8_0000)]
    image = corefarm.build_image(input_size=64, output_size=32, rbf=rbf, core_table=table, name="-dash")
    m = corefarm.inspect_image(image)
    assert (m["name"], m["input_size"], m["output_size"]) == ("-dash", 64, 32)
    assert [(c["control"], c["input"], c["output"]) for c in m["cores"]] == table
    assert [(a["kind"], a["length"], a["checksum_ok"]) for a in m["artifacts"]] == [("bitstream", 3, True)]
    m = corefarm.inspect_image(corefarm.build_image(input_size=16, output_size=16, rbf=rbf, cores=3))
    assert len(m["cores"]) == 3


SAXPY = ROOT / "examples" / "saxpy" / "saxpy.cpp"


@needs_cxx
def test_sizes_and_types_come_from_the_source_and_disagreeing_sizes_are_refused():
    image = corefarm.build_image(hls=SAXPY, entry="saxpy")
    m = corefarm.inspect_image(image)
    assert (m["input_size"], m["output_size"]) == (2056, 1024)
    assert m["input_type"] == {"dtype": "int32", "shape": [514]}
    assert m["output_type"] == {"dtype": "int32", "shape": [256]}
    with pytest.raises(corefarm.ImageError) as e:
        corefarm.build_image(hls=SAXPY, entry="saxpy", input_size=2048)
    assert "input size: --input-size says 2048 bytes but the first argument of saxpy in" in str(e.value)
    assert str(e.value).endswith("saxpy.cpp says 2056 bytes")
    m = corefarm.inspect_image(corefarm.build_image(hls=SAXPY, entry="saxpy", output_type="int32[16,16]"))
    assert m["output_type"] == {"dtype": "int32", "shape": [16, 16]}


@needs_cxx
def test_a_typed_image_runs_on_a_cluster_with_arrays():
    np = pytest.importorskip("numpy")
    binary = find_binary()
    if binary is None:
        pytest.fail("no corefarm binary: build it (cargo build -p corefarm-cli) or set COREFARM_BIN")
    image = corefarm.build_image(hls=SAXPY, entry="saxpy", cores=2)
    rng = np.random.default_rng(1)
    batch = rng.integers(-1000, 1000, (5, 514), dtype=np.int32)
    cluster = Cluster(binary, 1)
    try:
        with corefarm.connect(cluster.users_addr, nodes=1, timeout=30) as c:
            c.configure(image)
            assert c.types == ("int32[514]", "int32[256]")
            with pytest.raises(corefarm.InputError, match="dtype int16 but image 'saxpy' takes int32"):
                c.submit(batch.astype(np.int16))
            (out,) = c.map([batch])
            assert out.shape == (5, 256) and out.dtype == np.int32
            assert np.array_equal(out, batch[:, :1] * batch[:, 2:258] + batch[:, 258:])
    finally:
        cluster.stop()


def test_strict_turns_verilator_warnings_into_a_build_error(tmp_path):
    if shutil.which("verilator") is None:
        pytest.fail("Verilator is needed (apt-get install -y verilator make)")
    src = (ROOT / "examples" / "template" / "mycore.v").read_text()
    truncating = src.replace("reg [31:0] idx;", "reg [15:0] idx;")
    assert truncating != src
    v = tmp_path / "mycore.v"
    v.write_text(truncating)
    with pytest.raises(corefarm.ImageError) as e:
        corefarm.build_image(verilog=v, top="mycore", strict=True)
    assert "--strict makes them errors" in str(e.value) and "%Warning-WIDTH" in str(e.value)


def test_inspect_shows_who_signed(tmp_path):
    import subprocess

    binary = find_binary()
    assert binary, "no corefarm binary: build it (cargo build -p corefarm-cli) or set COREFARM_BIN"
    rbf = tmp_path / "x.rbf"
    rbf.write_bytes(b"\x01\x02\x03")
    path = tmp_path / "x.cfimg"
    image = corefarm.build_image(input_size=16, output_size=16, rbf=rbf, out=path, name="signed")
    assert corefarm.inspect_image(image)["signature"] is None
    key = subprocess.run([binary, "image", "keygen", "-o", str(tmp_path / "k")],
                         capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([binary, "image", "sign", str(path), "--key", str(tmp_path / "k")], check=True)
    signed = path.read_bytes()
    assert corefarm.inspect_image(signed)["signature"] == {"key": key, "valid": True, "error": None}
    # The manifest changed after signing ("signed" -> "signee", same length).
    forged = signed.replace(b'"signed"', b'"signee"', 1)
    sig = corefarm.inspect_image(forged)["signature"]
    assert sig["key"] == key and not sig["valid"] and "bad signature" in sig["error"]
