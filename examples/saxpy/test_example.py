"""Keeps examples/saxpy and docs/writing-a-core.md honest: builds the core
with both flows through the real `corefarm` binary, runs its native test and
RTL testbench, streams it through `corefarm local` clusters whose nodes may
only use one backend, and checks what a node refuses.

The binary comes from $COREFARM_BIN, $CARGO_TARGET_DIR or target/{release,debug};
tests skip (with the reason) when it, a C++ compiler, Verilator or the
corefarm Python package is missing."""

import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))
from corefarm_bin import find_binary  # noqa: E402
from local_cluster import Local  # noqa: E402
SIZES = ["--input-size", "2056", "--output-size", "1024"]


def load_run_module():
    """examples/saxpy/run.py, the user program the doc shows."""
    pytest.importorskip("numpy")
    pytest.importorskip("corefarm", reason="corefarm Python package not installed (bash python/build.sh)")
    spec = importlib.util.spec_from_file_location("saxpy_run", HERE / "run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sh(*cmd, **kw):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=ROOT, timeout=600, **kw)
    assert p.returncode == 0, f"{cmd} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    return p.stdout


@pytest.fixture(scope="module")
def corefarm_bin():
    b = find_binary()
    if b is None:
        pytest.skip("corefarm binary not found: set $COREFARM_BIN or cargo build --release -p corefarm-cli")
    return b


@pytest.fixture(scope="module")
def work():
    with tempfile.TemporaryDirectory(prefix="saxpy-example-") as d:
        yield pathlib.Path(d)


def need_cxx():
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler ($CXX / c++)")


def need_verilator():
    if shutil.which(os.environ.get("VERILATOR", "verilator")) is None:
        pytest.skip("Verilator not installed (apt-get install -y verilator make)")


@pytest.fixture(scope="module")
def image(corefarm_bin, work):
    """Both artifacts in one image, exactly as the doc builds it."""
    need_cxx()
    need_verilator()
    out = work / "saxpy.cfimg"
    sh(corefarm_bin, "image", "build",
       "--hls", "examples/saxpy/saxpy.cpp", "--entry", "saxpy",
       "--verilog", "examples/saxpy/saxpy.v", "--top", "saxpy",
       "--cores", "2", *SIZES, "--name", "saxpy", "-o", out)
    return out


@pytest.fixture(scope="module")
def native_image(corefarm_bin, work):
    need_cxx()
    out = work / "saxpy-native.cfimg"
    sh(corefarm_bin, "image", "build", "--hls", "examples/saxpy/saxpy.cpp", "--entry", "saxpy",
       "--cores", "2", *SIZES, "--name", "saxpy", "-o", out)
    return out


def test_hls_function_natively(work):
    need_cxx()
    exe = work / "test_saxpy"
    sh(os.environ.get("CXX", "c++"), "-O2", "-fwrapv", "-Iinclude", "examples/saxpy/test_saxpy.cpp", "-o", exe)
    assert "PASS saxpy" in sh(exe)


def test_rtl_testbench(image, work):
    so, tb = work / "saxpy_rtl.so", work / "tb_saxpy"
    sh(sys.executable, "examples/extract_artifact.py", image, "rtl", so)
    sh(os.environ.get("CXX", "c++"), "-O2", "-std=c++17", "-Icores/tb", "examples/saxpy/tb_saxpy.cpp",
       "-o", tb, "-ldl")
    assert "PASS tb_saxpy" in sh(tb, so)


def test_image_inspect(corefarm_bin, image):
    info = json.loads(sh(corefarm_bin, "image", "inspect", image, "--json"))
    m = info["manifest"]
    assert info["checksums_ok"]
    assert (m["name"], m["input_size"], m["output_size"], len(m["cores"])) == ("saxpy", 2056, 1024, 2)
    assert sorted((a["kind"], a["entry"]) for a in m["artifacts"]) == [("native", "saxpy"), ("rtl", "saxpy")]


@pytest.mark.parametrize("backend", ["native", "rtl"])
def test_cluster_runs_the_user_program(corefarm_bin, image, backend):
    run = load_run_module()
    # Nodes restricted to one backend must pick that artifact of the image.
    with Local(corefarm_bin, 2, "--backends", backend) as c:
        n, nodes, _ = run.run(c.users, str(image), inputs=800, batch=8)
        assert (n, nodes) == (800, 2)
        assert f"loaded 2 × {backend} saxpy" in c.stderr()


def test_user_program_catches_a_wrong_core(corefarm_bin, work):
    """run.py really checks results: a core computing a*x - y is caught."""
    run = load_run_module()
    need_cxx()
    bad_src = work / "saxpy_bad.cpp"
    bad_src.write_text((HERE / "saxpy.cpp").read_text().replace("a * x[i] + y[i]", "a * x[i] - y[i]"))
    bad = work / "bad.cfimg"
    sh(corefarm_bin, "image", "build", "--hls", bad_src, "--entry", "saxpy", "--cores", "2", *SIZES,
       "--name", "saxpy", "-o", bad)
    with Local(corefarm_bin, 2) as c:
        with pytest.raises(AssertionError, match="wrong result"):
            run.run(c.users, str(bad), inputs=64, batch=8)


def test_what_a_node_refuses(corefarm_bin, image, native_image, work):
    run = load_run_module()
    import corefarm

    corrupt = work / "corrupt.cfimg"
    data = bytearray(image.read_bytes())
    data[-100] ^= 1  # inside the last (RTL) artifact
    corrupt.write_bytes(data)
    # inspect reports the bad checksum and fails
    p = subprocess.run([corefarm_bin, "image", "inspect", corrupt], capture_output=True, text=True)
    assert p.returncode != 0 and "BAD:" in p.stdout

    with Local(corefarm_bin, 2, "--backends", "rtl") as c:
        cases = [
            (native_image, {}, 'carries artifacts for ["native-x86_64-linux"] but this node runs'),
            (corrupt, {}, "fails its checksum"),
            (image, {"input_size": 2048}, "is built for 2056 input / 1024 output bytes but the configuration says 2048"),
        ]
        for img, kw, reason in cases:
            with corefarm.connect(c.users) as user:
                with pytest.raises(corefarm.ConfigurationError) as e:
                    user.configure(str(img), **kw)
                assert reason in str(e.value)
        # Refusals leave the nodes usable.
        assert run.run(c.users, str(image), inputs=80, batch=8)[0] == 80


def test_verilog_template(corefarm_bin, work):
    """examples/template/mycore.v passes the generic testbench and serves jobs."""
    need_cxx()
    need_verilator()
    img, so, tb = work / "mycore.cfimg", work / "mycore_rtl.so", work / "tb_mycore"
    sh(corefarm_bin, "image", "build", "--verilog", "examples/template/mycore.v", "--top", "mycore",
       "--input-size", "1024", "--output-size", "1024", "--name", "mycore", "-o", img)
    sh(sys.executable, "examples/extract_artifact.py", img, "rtl", so)
    sh(os.environ.get("CXX", "c++"), "-O2", "-std=c++17", "-Icores/tb", "examples/template/tb_mycore.cpp",
       "-o", tb, "-ldl")
    assert "PASS tb_mycore" in sh(tb, so)

    load_run_module()
    import corefarm

    messages = [os.urandom(3 * 1024) for _ in range(20)]  # 3 inputs per data message
    with Local(corefarm_bin, 2, "--backends", "rtl") as c:
        with corefarm.connect(c.users) as user:
            user.configure(str(img))
            results = list(user.map(messages, window=8))
    assert results == [bytes(b ^ 0xFF for b in m) for m in messages]


LISTING = re.compile(r"<!-- (same as|excerpt of) (\S+) -->\n```[\w+]*\n(.*?)```", re.S)


def test_doc_listings_match_the_files():
    """Code the doc shows is the code these tests run: whole files verbatim,
    excerpts as exact substrings."""
    doc = (ROOT / "docs" / "writing-a-core.md").read_text()
    found = LISTING.findall(doc)
    assert len(found) == 6
    for how, path, body in found:
        text = (ROOT / path).read_text()
        if how == "same as":
            assert body == text, f"docs/writing-a-core.md listing of {path} differs from the file"
        else:
            assert body in text, f"docs/writing-a-core.md excerpt of {path} is not in the file:\n{body}"


def test_rust_user_program(corefarm_bin, image):
    # The program is a member of the workspace, and cargo test builds its
    # binary (its package has an integration test) with the features the
    # rest of the workspace's test build resolved: after the suite's own
    # `cargo test` (its profile: $COREFARM_PROFILE), this finds everything
    # built. `cargo build -p` would resolve other features and build the
    # dependencies again.
    profile = os.environ.get("COREFARM_PROFILE", "release")
    sh("cargo", "test", "--profile", profile, "--workspace", "--no-run", "--quiet")
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")
    with Local(corefarm_bin, 2) as c:
        out = sh(target / profile / "saxpy-user", c.users, image)
        assert "4000 inputs on 2 nodes: all results correct" in out
