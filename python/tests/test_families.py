"""One program, both families: an image carrying the Intel-style vadd
(cores/vadd/vadd.cpp, an HLS component) and the AMD-style one
(vadd_vitis.cpp, a Vitis HLS top function with m_axi pointers), on a
cluster where one node runs Intel cores only and one AMD cores only
(`corefarm node --families`). Each node loads the artifact it runs, and
the results are the same and right whichever node computed them. An image
carrying one style goes only to the node that runs it."""

import shutil
import subprocess
import tempfile
import time

import pytest

import corefarm
from realbin import find_binary, start_server, wait_for_node

np = pytest.importorskip("numpy")
ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
VADD = ROOT / "cores" / "vadd"
BIN = find_binary()
pytestmark = [
    pytest.mark.skipif(BIN is None, reason="no corefarm binary: build it (cargo build -p corefarm-cli) or set COREFARM_BIN"),
    pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler (c++)"),
]


def run(*args):
    subprocess.run([BIN, *map(str, args)], check=True, stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    d = tmp_path_factory.mktemp("families")
    intel, amd, both = d / "intel.cfimg", d / "amd.cfimg", d / "both.cfimg"
    corefarm.build_image(hls=VADD / "vadd.cpp", entry="vadd", out=intel)
    run("image", "build", "--hls", VADD / "vadd_vitis.cpp", "--entry", "vadd",
        "--family", "amd", "--scalar", "n=1024", "--output", amd)
    run("image", "merge", intel, amd, "--output", both)
    return {k: p.read_bytes() for k, p in (("intel", intel), ("amd", amd), ("both", both))}


class Cluster:
    def __init__(self, users, logs):
        self.users = users
        self.logs = logs

    def log(self, family):
        """What the node running `family` logged (warnings: a configuration
        it refused among them)."""
        f = self.logs[family]
        f.seek(0)
        return f.read()


@pytest.fixture(scope="module")
def cluster():
    procs, logs = [], {}
    try:
        nodes, users = start_server(BIN, procs)
        for family in ("intel", "amd"):
            logs[family] = tempfile.TemporaryFile(mode="w+")
            procs.append(subprocess.Popen(
                [BIN, "node", "--server", nodes, "--name", f"{family}-0",
                 "--backends", "native", "--families", family],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=logs[family]))
            wait_for_node(users, f"{family}-0")
        yield Cluster(users, logs)
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            p.wait(10)
        for f in logs.values():
            f.close()


def inputs(n):
    rng = np.random.default_rng(38)
    return [rng.integers(-128, 128, size=2048, dtype=np.int8).tobytes() for _ in range(n)]


def vadd(x):
    v = np.frombuffer(x, dtype=np.int8).reshape(2, 1024)
    return (v[0] + v[1]).astype(np.int8).tobytes()


def by_name(status):
    return {n["name"]: n for n in status["nodes"]}


def test_both_families_serve_one_program_with_the_same_results(cluster, images):
    ins = inputs(64)
    with corefarm.connect(cluster.users, nodes=2, timeout=30) as c:
        c.configure(images["both"])
        out = list(c.map(ins, window=16))
        nodes = by_name(c.status())
    assert out == [vadd(x) for x in ins]
    # Each node announced the family it runs, and both computed results.
    arch = nodes["intel-0"]["targets"][0].split(":")[0]
    assert nodes["intel-0"]["targets"] == [f"{arch}:intel"]
    assert nodes["amd-0"]["targets"] == [f"{arch}:amd"]
    assert all(n["results"] > 0 for n in nodes.values()), nodes
    assert "configuration refused" not in cluster.log("intel") + cluster.log("amd")


def wait_free(users, n):
    deadline = time.monotonic() + 30
    with corefarm.connect(users, nodes=0) as obs:
        while sum(x["state"] == "free" for x in obs.status()["nodes"]) < n:
            assert time.monotonic() < deadline, "the nodes never came back to the pool"
            time.sleep(0.02)


@pytest.mark.parametrize("family", ["intel", "amd"])
def test_an_image_of_one_family_goes_to_its_node_only(cluster, images, family):
    wait_free(cluster.users, 2)
    ins = inputs(8)
    with corefarm.connect(cluster.users, timeout=30) as c:
        c.configure(images[family])
        out = list(c.map(ins, window=4))
        nodes = by_name(c.status())
    assert out == [vadd(x) for x in ins]
    other = "amd" if family == "intel" else "intel"
    assert nodes[f"{family}-0"]["results"] == len(ins)
    # The other node was never sent the image (it would have refused it):
    # it stays free.
    assert nodes[f"{other}-0"]["state"] == "free", nodes
    assert "configuration refused" not in cluster.log(other)
