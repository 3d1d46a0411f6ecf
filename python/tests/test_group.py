"""Groups from Python (mpi4py names) against the real corefarm binary:
`corefarm local` with four nodes, each with its peer port."""

import struct

import pytest

import corefarm
from realbin import Cluster, find_binary

BIN = find_binary()


@pytest.fixture(scope="module")
def cluster():
    # A missing binary is a failure with a reason, never a skip.
    assert BIN is not None, "no corefarm binary: build it (cargo build -p corefarm-cli) or set COREFARM_BIN"
    c = Cluster(BIN, 4)
    try:
        yield c
    finally:
        c.stop()


def i32(values):
    return struct.pack(f"<{len(values)}i", *values)


def from_i32(b):
    return list(struct.unpack(f"<{len(b) // 4}i", b))


def test_scatter_bcast_allreduce_gather_with_bytes(cluster):
    with corefarm.group(cluster.users_addr, nodes=4) as g:
        assert g.size == 4
        assert [r for r, _, _ in g.members] == [0, 1, 2, 3]
        rows = list(range(-20, 20))
        assert g.scatter("x", i32(rows), dtype="i32", row_bytes=40) == [1, 1, 1, 1]
        g.bcast("w", i32([7, 8, 9]), dtype="i32")
        assert all(from_i32(b) == [7, 8, 9] for b in g.gather("w"))
        for algo in ("auto", "linear", "binomial", "star"):
            g.allreduce("x", "s_" + algo, op="sum", algo=algo)
            want = [sum(rows[r * 10 + i] for r in range(4)) for i in range(10)]
            assert all(from_i32(b) == want for b in g.gather("s_" + algo)), algo
        g.reduce("x", "m", op="max", root=3)
        assert from_i32(g.get(3, "m")) == rows[30:40]
        g.allgather("x", "all")
        assert from_i32(g.get(1, "all")) == rows
        g.bcast("m", root=3, dst="m_everywhere")
        assert from_i32(g.get(0, "m_everywhere")) == rows[30:40]
        g.barrier()
        assert b"".join(g.gather("x")) == i32(rows)


def test_numpy_rows_and_float_reductions(cluster):
    np = pytest.importorskip("numpy")
    with corefarm.group(cluster.users_addr, nodes=4, topology="ring") as g:
        a = np.arange(24, dtype=np.float64).reshape(8, 3)
        assert g.scatter("a", a) == [2, 2, 2, 2]
        g.allreduce("a", "p", op="prod")
        got = np.frombuffer(g.get(2, "p"), dtype=np.float64).reshape(2, 3)
        want = np.prod(a.reshape(4, 2, 3), axis=0)
        assert np.array_equal(got, want)


def test_errors_name_the_buffer_and_the_rank(cluster):
    with corefarm.group(cluster.users_addr, nodes=2) as g:
        g.put(0, "x", b"\x01\x02", dtype="u8")
        with pytest.raises(corefarm.GroupError, match='no buffer named "nope"') as e:
            g.get(1, "nope")
        assert e.value.rank == 1
        with pytest.raises(corefarm.GroupError, match="already exists"):
            g.put(0, "x", b"\x00", dtype="u8")
        with pytest.raises(corefarm.UsageError, match="element type"):
            g.allreduce("unknown", "y")
        g.barrier()  # the group is still usable


def test_run_keeps_results_resident(cluster):
    with corefarm.group(cluster.users_addr, nodes=4) as g:
        g.configure_benchmark(16, 32)
        g.scatter("in", bytes(range(64)) * 2, row_bytes=16)  # 8 inputs, 2 per rank
        g.run("in", "out")
        outs = g.gather("out")
        assert [len(o) for o in outs] == [64] * 4
        # The benchmarking core echoes each input's first 16 bytes.
        assert outs[1][:16] == (bytes(range(64)) * 2)[32:48]


def test_a_group_larger_than_the_cluster_is_refused(cluster):
    with pytest.raises(corefarm.ServerError, match="a group of 5 nodes"):
        corefarm.group(cluster.users_addr, nodes=5)


def test_direct_map_past_the_server(cluster):
    with corefarm.group(cluster.users_addr, nodes=4) as g:
        g.configure_benchmark(16, 16)
        inputs = [bytes([i % 256]) * 32 for i in range(100)]  # two inputs each
        outs = g.direct_map(inputs, window=3)
        assert [o[:16] for o in outs] == [i[:16] for i in inputs]
        assert all(len(o) == 32 for o in outs)


def test_direct_map_takes_a_priority_class(cluster):
    with corefarm.group(cluster.users_addr, nodes=4) as g:
        g.configure_benchmark(16, 16)
        inputs = [bytes([i % 256]) * 16 * (1 + i % 3) for i in range(40)]
        for priority in (0, 7, None):
            outs = g.direct_map(inputs, window=3, priority=priority)
            assert [o[:16] for o in outs] == [i[:16] for i in inputs]
            assert [len(o) for o in outs] == [len(i) for i in inputs]
        with pytest.raises(corefarm.UsageError, match="class 8"):
            g.direct_map(inputs, priority=8)


def test_collectives_take_a_priority_class(cluster):
    with corefarm.group(cluster.users_addr, nodes=4) as g:
        assert g.priorities, "the server passes classes on to the nodes"
        rows = list(range(40))
        g.scatter("x", i32(rows), dtype="i32", row_bytes=40)
        want = [sum(rows[r * 10 + i] for r in range(4)) for i in range(10)]
        for priority in (0, 7, None):
            name = f"s{priority}"
            g.allreduce("x", name, op="sum", priority=priority)
            assert all(from_i32(b) == want for b in g.gather(name)), priority
        g.reduce("x", "m", op="max", root=2, priority=1)
        assert from_i32(g.get(2, "m")) == rows[30:40]
        g.bcast("w", i32([1, 2]), dtype="i32", priority=0)
        g.bcast("w", root=0, dst="w2", priority=6)
        assert all(from_i32(b) == [1, 2] for b in g.gather("w2"))
        g.allgather("x", "all", priority=3)
        assert from_i32(g.get(1, "all")) == rows
        g.barrier(priority=0)
        for call in (lambda: g.allreduce("x", "bad", priority=8),
                     lambda: g.reduce("x", "bad", priority=8),
                     lambda: g.bcast("x", root=0, dst="bad", priority=8),
                     lambda: g.bcast("bad", i32([1]), dtype="i32", priority=8),
                     lambda: g.allgather("x", "bad", priority=8),
                     lambda: g.barrier(priority=8)):
            with pytest.raises(corefarm.UsageError, match="priority class 8: 0 \\(most urgent\\) to 7"):
                call()
        # Nothing of the refused calls reached the nodes: "bad" exists nowhere.
        with pytest.raises(corefarm.GroupError, match="bad"):
            g.get(0, "bad")


def test_a_group_is_lent_nodes_beside_a_shared_user():
    """--sharing shared: the scheduler lends the group two of three nodes;
    the shared user is served throughout, and the nodes come back."""
    c = Cluster(BIN, 3, "--sharing", "shared")
    try:
        # More than can ever join: refused with the count, not after --node-wait
        # as "the promised nodes were still busy".
        with pytest.raises(corefarm.ServerError, match="only 3 of the 3 nodes connected can join"):
            corefarm.group(c.users_addr, nodes=4)
        with corefarm.connect(c.users_addr) as user:
            user.configure_benchmark(16, 16)
            inputs = [bytes([i]) * 16 for i in range(40)]
            assert [o[:16] for o in user.map(inputs, window=4)] == inputs
            with corefarm.group(c.users_addr, nodes=2) as g:
                assert g.size == 2
                g.bcast("w", i32([1, 2, 3]), dtype="i32")
                g.allreduce("w", "s", op="sum")
                assert from_i32(g.get(1, "s")) == [2, 4, 6]
                assert [o[:16] for o in user.map(inputs, window=4)] == inputs
            with corefarm.group(c.users_addr, nodes=3) as g:
                assert g.size == 3
            assert [o[:16] for o in user.map(inputs, window=4)] == inputs
    finally:
        c.stop()


def test_the_latency_model_can_be_chosen(cluster, tmp_path):
    bad = tmp_path / "model.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match="model: .*model.json"):
        corefarm.group(cluster.users_addr, nodes=2, model=bad)
    with pytest.raises(ValueError, match="model: .*missing.json"):
        corefarm.group(cluster.users_addr, nodes=2, model=str(tmp_path / "missing.json"))
    # No model: seed 003's stage count picks the algorithm of `auto`.
    with corefarm.group(cluster.users_addr, nodes=2, model=False) as g:
        g.bcast("w", i32([4, 5]), dtype="i32")
        g.allreduce("w", "s", op="sum", algo="auto")
        assert from_i32(g.get(0, "s")) == [8, 10]


def test_typed_buffers_carry_their_element_type(cluster):
    # An array.array('d') is float64 elements, not bytes: rows are whole
    # elements and reductions add floats (it used to fail with a bare
    # BufferError, "not compatible with u8").
    import array

    with corefarm.group(cluster.users_addr, nodes=4) as g:
        values = array.array("d", [0.5 * k for k in range(8)])
        assert g.scatter("d", values) == [2, 2, 2, 2]
        g.allreduce("d", "s", op="sum")
        want = [sum(values[2 * r + i] for r in range(4)) for i in range(2)]
        assert all(list(struct.unpack("<2d", b)) == want for b in g.gather("s"))
        g.put(1, "i", memoryview(i32([5, -6])))          # the same through a memoryview
        assert from_i32(g.get(1, "i")) == [5, -6]
        with pytest.raises(corefarm.UsageError, match="holds i32, not f32"):
            g.put(0, "x", array.array("i", [1, 2]), dtype="f32")
        with pytest.raises(corefarm.UsageError, match="format '\\?'"):
            g.bcast("b", memoryview(bytes(2)).cast("?"))


def test_element_types_may_be_given_as_numpy_names_them():
    np = pytest.importorskip("numpy")
    from corefarm.group import _element_type
    for given in ("f32", "float32", "<f4", "=f4", "f4", np.float32, np.dtype("float32"),
                  np.dtype("<f4")):
        assert _element_type(given) == "f32", given
    assert [_element_type(t) for t in ("int32", np.int16, "uint8", np.dtype("u8"), "<i8")] == \
        ["i32", "i16", "u8", "u64", "i64"]
    # The names here count bits: "i8" is int8, as DTYPES says.
    assert _element_type("i8") == "i8" and _element_type(None) is None
    for bad in ("float16", np.complex64, "nope", 3):
        with pytest.raises(corefarm.UsageError, match="unknown element type"):
            _element_type(bad)
    with pytest.raises(corefarm.UsageError, match="big-endian"):
        _element_type(">f4")


def test_numpy_dtype_names_work_in_every_call(cluster):
    np = pytest.importorskip("numpy")
    with corefarm.group(cluster.users_addr, nodes=2) as g:
        g.scatter("x", i32(range(8)), dtype="int32", row_bytes=4)
        g.allreduce("x", "s", op="sum", dtype=np.int32)
        assert from_i32(g.get(0, "s")) == [4, 6, 8, 10]
        g.put(1, "f", struct.pack("<2f", 1.5, 2.5), dtype=np.dtype("<f4"))
        g.put(0, "f", np.array([0.5, 0.5], dtype=np.float32), dtype="float32")
        g.allreduce("f", "fs", dtype="<f4")
        assert struct.unpack("<2f", g.get(1, "fs")) == (2.0, 3.0)
        g.bcast("w", i32([1, 2]), dtype=np.int32)
        g.reduce("w", "m", op="max", root=1, dtype="int32")
        assert from_i32(g.get(1, "m")) == [1, 2]


def test_a_wrong_type_or_unequal_blocks_are_refused_and_the_group_goes_on(cluster):
    with corefarm.group(cluster.users_addr, nodes=4) as g:
        g.scatter("v", struct.pack("<8f", *range(8)), dtype="f32")
        with pytest.raises(corefarm.UsageError, match='buffer "v" holds f32 elements, the allreduce '
                                                      'wants i32'):
            g.allreduce("v", "s", dtype="i32")
        g.scatter("x", i32(range(10)), dtype="i32")  # 3, 3, 2 and 2 rows
        with pytest.raises(corefarm.UsageError, match="its ranks hold 12, 12, 8, 8 bytes"):
            g.allreduce("x", "s")
        with pytest.raises(corefarm.UsageError, match="same length on every rank"):
            g.reduce("x", "s", op="max")
        g.barrier()
        g.allreduce("v", "s", dtype="float32")
        assert struct.unpack("<2f", g.get(3, "s")) == (12.0, 16.0)


def test_leaving_a_group_that_failed_raises_once(cluster):
    with corefarm.group(cluster.users_addr, nodes=2) as g:
        # A buffer no member has: the collective fails, and ends the group.
        with pytest.raises(corefarm.GroupError, match='no buffer named "nope"') as e:
            g.allreduce("nope", "s", dtype="i32")
        # The call's own name comes once, not again from each node.
        assert str(e.value).count("allreduce #") == 1, e.value
        with pytest.raises(corefarm.GroupError, match="the group failed earlier") as e:
            g.barrier()
        assert str(e.value).count("barrier #") == 1, e.value
        with pytest.raises(corefarm.GroupError, match="the group is closed"):
            g.barrier()
    g.close()  # and closing again is quiet too


def test_a_group_larger_than_every_node_able_to_join_is_refused_at_once(cluster):
    with pytest.raises(corefarm.ServerError, match="only 4 of the 4 nodes connected can join a group"):
        corefarm.group(cluster.users_addr, nodes=5)


def test_direct_map_takes_any_array_as_bytes(cluster):
    np = pytest.importorskip("numpy")
    with corefarm.group(cluster.users_addr, nodes=4) as g:
        g.configure_benchmark(16, 16)
        inputs = [np.full(32, k - 5, dtype=np.int8) for k in range(10)]
        inputs.append(np.arange(8, dtype=np.float32).reshape(2, 4))
        outs = g.direct_map(inputs, window=2)
        assert [o[:16] for o in outs] == [a.tobytes()[:16] for a in inputs]


def test_a_group_names_its_user_and_a_bad_name_is_refused_before_connecting():
    # Checked before any connection: the address is never dialled.
    with pytest.raises(ValueError, match="user name"):
        corefarm.group("127.0.0.1:1", 1, user="not a name!")
