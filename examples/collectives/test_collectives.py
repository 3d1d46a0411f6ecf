"""Keeps examples/collectives honest: builds the dot and nbody cores with the
real `corefarm image build`, starts `corefarm local` with four nodes and runs
the matrix-vector product and the N-body-style iteration, each checked
against a local computation. A missing binary, compiler or package fails
the test with its name (it is never skipped)."""

import importlib.util
import pathlib
import subprocess
import sys
import tempfile
import threading

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))
from corefarm_bin import LISTENING, find_binary  # noqa: E402


def load(name):
    spec = importlib.util.spec_from_file_location(f"collectives_{name}", HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def binary():
    b = find_binary()
    assert b, "no corefarm binary: build it (cargo build -p corefarm-cli) or set COREFARM_BIN"
    return b


@pytest.fixture(scope="module")
def local(binary):
    p = subprocess.Popen([binary, "local", "--nodes", "4", "--users-listen", "127.0.0.1:0",
                          "--nodes-listen", "127.0.0.1:0"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                         text=True)
    found, scanned = {}, threading.Event()

    def scan():
        for line in p.stdout:
            m = LISTENING.search(line)
            if m:
                found["users"] = m.groups()[1]
                break
        scanned.set()
        for _ in p.stdout:
            pass

    threading.Thread(target=scan, daemon=True).start()
    scanned.wait(60)
    try:
        assert "users" in found, "corefarm local did not start"
        yield found["users"]
    finally:
        p.kill()
        p.wait(10)


def image(binary, source, entry, *extra):
    out = pathlib.Path(tempfile.mkdtemp()) / f"{entry}.cfimg"
    r = subprocess.run([binary, "image", "build", "--hls", HERE / source, "--entry", entry,
                        *extra, "-o", out], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"corefarm image build {source} failed:\n{r.stderr}"
    return out


def test_matvec(binary, local):
    m = load("matvec")
    y = m.matvec(local, image(binary, "dot.cpp", "dot", "--cores", "2"), rows=1001, nodes=4)
    assert len(y) == 1001


def test_nbody(binary, local):
    m = load("nbody")
    x, v = m.nbody(local, image(binary, "nbody.cpp", "nbody"), steps=8, nodes=4)
    assert len(x) == 64 and v.any(), "the bodies moved"
