"""CPU/cluster co-working from Python: `c.map(inputs, cowork=True)` against a
real `corefarm local` cluster gives the same bytes, in the same order, as
the all-cluster and the all-local runs."""

import shutil

import pytest

import corefarm
import corefarm.cowork
from realbin import Cluster, find_binary

np = pytest.importorskip("numpy")
ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
VADD = ROOT / "cores" / "vadd" / "vadd.cpp"
BIN = find_binary()
pytestmark = [
    pytest.mark.skipif(BIN is None, reason="no corefarm binary: build it (cargo build -p corefarm-cli) or set COREFARM_BIN"),
    pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler (c++)"),
]


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    out = tmp_path_factory.mktemp("cowork") / "vadd.cfimg"
    corefarm.build_image(hls=VADD, entry="vadd", input_size=2048, output_size=1024, cores=2, out=out)
    return out


@pytest.fixture
def cluster():
    c = Cluster(BIN, 2)
    try:
        yield c
    finally:
        c.stop()


def inputs(n, seed=7):
    rng = np.random.default_rng(seed)
    # Mixed buffer kinds; some messages carry two inputs.
    out = []
    for k in range(n):
        a = rng.integers(-128, 128, size=(1 + k % 2) * 2048, dtype=np.int8)
        out.append(a.tobytes() if k % 3 == 0 else a)
    return out


def vadd(x):
    v = np.frombuffer(bytes(memoryview(x).cast("B")), dtype=np.int8).reshape(-1, 2, 1024)
    return (v[:, 0, :] + v[:, 1, :]).astype(np.int8).tobytes()


def test_cowork_equals_all_cluster_and_all_local(cluster, image):
    ins = inputs(300)
    with corefarm.connect(cluster.users_addr, nodes=2, timeout=30) as c:
        c.configure(image)
        all_cluster = list(c.map(ins, window=16))
        assert all_cluster[:5] == [vadd(x) for x in ins[:5]]

        co = list(c.map(ins, window=16, cowork=True))
        assert co == all_cluster
        report = c._cowork.report
        assert report["local_items"] + report["cluster_items"] == len(ins)
        assert isinstance(report["backups"], int)
        assert report["cluster_error"] is None
        assert report["measured"]["x_c"] > 0

        # A Cowork made from the image, on a client that never configures:
        # the cluster path never becomes ready, so all of it runs here.
        cw = corefarm.cowork.Cowork(image, threads=2)
        assert cw.threads == 2 and "native" in cw.description
        with corefarm.connect(cluster.users_addr, nodes=0, timeout=30) as observer:
            assert not cw.matches(observer)
            all_local = list(observer.map(ins, window=16, cowork=cw))
        assert all_local == all_cluster
        assert (cw.report["local_items"], cw.report["cluster_items"]) == (len(ins), 0)

        # The same object co-works once the client is configured with it.
        assert cw.matches(c)
        assert list(c.map(ins, window=16, cowork=cw)) == all_cluster
        cw.set_cluster_throughput(1e6)
        assert cw.estimates["x_a"] == 1e6

        # Without backup copies: the same results, no copy sent.
        plain = corefarm.cowork.Cowork(image, threads=2, backup=False)
        assert list(c.map(ins, window=16, cowork=plain)) == all_cluster
        assert plain.report["backups"] == 0
        assert plain.report["local_items"] + plain.report["cluster_items"] == len(ins)


def test_cowork_true_needs_a_configuration(cluster, image):
    with corefarm.connect(cluster.users_addr, nodes=1, timeout=30) as c:
        with pytest.raises(corefarm.ConfigurationError):
            list(c.map([b"x" * 16], cowork=True))
        c.configure_benchmark(16, 16)
        # The benchmarking configuration has no function to run locally.
        with pytest.raises(corefarm.ConfigurationError):
            list(c.map([b"x" * 16], cowork=True))
        with pytest.raises(corefarm.InputError):
            corefarm.cowork.Cowork(image, threads=1).map(c, [b"x" * 2047])


def test_cowork_configures_the_client_itself_and_computes_meanwhile(cluster, image):
    ins = inputs(120)
    expected = [vadd(x) for x in ins]
    cw = corefarm.cowork.Cowork(image, threads=2, configure=True)
    with corefarm.connect(cluster.users_addr, nodes=2, timeout=30) as c:
        assert not cw.matches(c)
        for _ in range(200):
            assert list(c.map(ins, window=16, cowork=cw)) == expected
            if cw.report["cluster_items"] > 0:
                break
        assert cw.report["cluster_items"] > 0, "the cluster never joined"
        assert cw.matches(c)
        assert "x_a_beside" in cw.estimates


def test_a_cowork_that_configures_the_client_gives_the_images_typed_results(cluster, tmp_path):
    typed = tmp_path / "vadd-typed.cfimg"
    corefarm.build_image(hls=VADD, entry="vadd", input_size=2048, output_size=1024, cores=2,
                         input_type="int8[2,1024]", output_type="int8[1024]", out=typed)
    ins = [np.full((2, 1024), k % 50, dtype=np.int8) for k in range(40)]
    cw = corefarm.cowork.Cowork(typed, threads=2, configure=True)
    with corefarm.connect(cluster.users_addr, nodes=2, timeout=30) as c:
        out = list(c.map(ins, window=8, cowork=cw))
    assert all(isinstance(o, np.ndarray) and o.dtype == np.int8 and o.shape == (1024,) for o in out)
    assert [int(o[0]) for o in out] == [2 * (k % 50) for k in range(40)]
