"""`corefarm.group(..., tls_ca=...)` against the real `corefarm server
--tls-cert` (TLS on both ports) and two `corefarm node --tls-ca` processes
with peer ports. The certificates are made with the openssl commands of
docs/operations.md ("TLS"), as in test_tls.py."""

import struct
import subprocess

import pytest

import corefarm
from realbin import find_binary, start_server
from test_tls import make_pki


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    binary = find_binary()
    assert binary, "no corefarm binary: build it (cargo build -p corefarm-cli) or set COREFARM_BIN"
    tmp = tmp_path_factory.mktemp("group-tls")
    make_pki(tmp)
    ca = str(tmp / "ca.pem")
    procs = []
    try:
        # --node-wait: opening a group waits for the nodes to join, so the
        # tests need not.
        nodes, users = start_server(binary, procs, "--tls-cert", str(tmp / "server.pem"),
                                    "--tls-key", str(tmp / "server.key"), "--node-wait", "30")
        for i in range(2):
            procs.append(subprocess.Popen(
                [binary, "node", "--server", nodes, "--name", f"tls-g{i}", "--tls-ca", ca,
                 "--peer-listen", "127.0.0.1:0"], stderr=subprocess.DEVNULL))
        yield users, tmp
    finally:
        for p in procs:
            p.kill()
            p.wait(10)


def i64(values):
    return struct.pack(f"<{len(values)}q", *values)


def from_i64(b):
    return list(struct.unpack(f"<{len(b) // 8}q", b))


def test_a_group_runs_collectives_over_tls(server):
    users, tmp = server
    with corefarm.group(users, 2, tls_ca=str(tmp / "ca.pem"), timeout=30) as g:
        assert g.size == 2
        rows = [x * 3 - 7 for x in range(2 * 4096)]
        assert g.scatter("x", i64(rows), dtype="i64") == [4096, 4096]
        g.allreduce("x", "sum", op="sum")
        want = [rows[i] + rows[4096 + i] for i in range(4096)]
        assert [from_i64(b) for b in g.gather("sum")] == [want, want]
        # The members' peer ports are plain TCP: no direct path over TLS,
        # and the group goes on.
        g.configure_benchmark(16, 16)
        with pytest.raises(corefarm.UnsupportedError, match="plain TCP only"):
            g.direct_map([bytes(16)])
        g.barrier()
    # The certificate carries "localhost" too.
    with corefarm.group(users, 2, tls_ca=tmp / "ca.pem", tls_server_name="localhost") as g:
        g.barrier()


def test_group_tls_mismatches_fail_with_the_cause(server):
    users, tmp = server
    with pytest.raises(corefarm.ServerError, match="requires TLS"):
        corefarm.group(users, 2)
    with pytest.raises(ConnectionError, match="not signed by a CA"):
        corefarm.group(users, 2, tls_ca=str(tmp / "other-ca.pem"))
    with pytest.raises(ConnectionError, match="not valid for the name connected to, \"farm.example\""):
        corefarm.group(users, 2, tls_ca=str(tmp / "ca.pem"), tls_server_name="farm.example")
    with pytest.raises(ValueError, match="no-such.pem"):
        corefarm.group(users, 2, tls_ca=str(tmp / "no-such.pem"))
    with pytest.raises(ValueError, match="tls_server_name needs tls_ca"):
        corefarm.group(users, 2, tls_server_name="localhost")
