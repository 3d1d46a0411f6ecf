"""Images for the boards' ARM CPUs: `image build --arch` cross-compiles the
HLS core for armv7 hard-float (the Cyclone V HPS of seed 000) and aarch64
with Debian's cross toolchains; each artifact, run under qemu-user by a
harness cross-compiled for the same CPU, gives byte for byte the results of
the x86 build; and a node picks the artifact of its own CPU from the
multi-architecture image."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "support"))
sys.path.insert(0, str(ROOT / "examples"))
from corefarm_bin import find_binary  # noqa: E402
from extract_artifact import extract  # noqa: E402
from local_cluster import Local  # noqa: E402

# arch -> (GNU triple, qemu-user program)
CROSS = {"armv7": ("arm-linux-gnueabihf", "qemu-arm"), "aarch64": ("aarch64-linux-gnu", "qemu-aarch64")}
SAXPY_IN, SAXPY_OUT = 2056, 1024


def need(program, package):
    path = shutil.which(program)
    if path is None:
        pytest.skip(f"{program} not installed (apt-get install {package})")
    return path


@pytest.fixture(scope="module")
def corefarm_bin():
    b = find_binary()
    if b is None:
        pytest.skip("no corefarm binary: build it (cargo build -p corefarm-cli) or set COREFARM_BIN")
    return b


@pytest.fixture(scope="module")
def image(corefarm_bin, tmp_path_factory):
    for arch, (triple, _) in CROSS.items():
        need(f"{triple}-g++", f"g++-{triple}")
    out = tmp_path_factory.mktemp("cross") / "saxpy.cfimg"
    subprocess.run([corefarm_bin, "image", "build", "--hls", "examples/saxpy/saxpy.cpp", "--entry", "saxpy",
                    "--arch", "armv7,aarch64,x86_64", "--cores", "2", "-o", out],
                   cwd=ROOT, check=True, capture_output=True)
    return out


def test_one_image_carries_an_artifact_per_architecture(corefarm_bin, image):
    info = json.loads(subprocess.run([corefarm_bin, "image", "inspect", image, "--json"],
                                     check=True, capture_output=True, text=True).stdout)
    assert info["checksums_ok"]
    targets = [a["target"] for a in info["manifest"]["artifacts"]]
    assert targets == ["native-armv7-linux", "native-aarch64-linux", "native-x86_64-linux"]
    # Each is a shared object for its CPU, not three copies of the host build.
    machines = set()
    for t in targets:
        so = extract(image.read_bytes(), t)
        assert so[:4] == b"\x7fELF"
        machines.add(int.from_bytes(so[18:20], "little"))  # e_machine
    assert machines == {0x3E, 0x28, 0xB7}  # x86-64, ARM, AArch64


def run_harness(tmp, arch, so, inputs):
    """Runs cores/tb/run_native.c, compiled for `arch` (None: this machine),
    on `inputs` and returns the outputs."""
    cc, prefix = "cc", []
    if arch:
        triple, qemu = CROSS[arch]
        cc = need(f"{triple}-gcc", f"gcc-{triple}")
        prefix = [need(qemu, "qemu-user"), "-L", f"/usr/{triple}"]
    exe, lib, inp, out = (tmp / f"{arch or 'host'}.{x}" for x in ("run", "so", "in", "out"))
    subprocess.run([cc, "-O2", "-std=c11", str(ROOT / "cores/tb/run_native.c"), "-o", exe, "-ldl"], check=True)
    lib.write_bytes(so)
    inp.write_bytes(inputs)
    p = subprocess.run([*prefix, exe, lib, "saxpy", str(SAXPY_IN), str(SAXPY_OUT), inp, out],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip() == f"run_native: {len(inputs) // SAXPY_IN} inputs"
    return out.read_bytes()


@pytest.mark.parametrize("arch", sorted(CROSS))
def test_cross_built_core_under_qemu_matches_the_x86_build(image, tmp_path, arch):
    rng = np.random.default_rng(7)
    n = 64
    msg = rng.integers(-2**31, 2**31, (n, SAXPY_IN // 4), dtype=np.int64).astype("<i4")
    inputs = msg.tobytes()
    data = image.read_bytes()
    host = run_harness(tmp_path, None, extract(data, "native-x86_64-linux"), inputs)
    cross = run_harness(tmp_path, arch, extract(data, f"native-{arch}-linux"), inputs)
    # The reference: a*x + y, wrapping, as the core computes it.
    a, x, y = msg[:, :1], msg[:, 2:258], msg[:, 258:]
    assert host == (a * x + y).astype("<i4").tobytes()
    assert cross == host


def test_a_node_picks_the_artifact_of_its_cpu(corefarm_bin, image):
    sys.path.insert(0, str(ROOT / "examples" / "saxpy"))
    import run as saxpy  # examples/saxpy/run.py

    # The ARM artifacts come first in the image: a node taking the first
    # native artifact instead of its own CPU's could not load it.
    with Local(corefarm_bin, 2, "--backends", "native") as c:
        n, nodes, _ = saxpy.run(c.users, str(image), inputs=160, batch=8)
        assert (n, nodes) == (160, 2)
        assert "loaded 2 × native saxpy" in c.stderr()
