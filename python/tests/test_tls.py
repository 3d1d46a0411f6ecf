"""`connect(..., tls_ca=...)` against the real `corefarm server --tls-cert`
with a real node manager connecting with `--tls-ca`. The certificates are
made with the openssl commands of docs/operations.md ("TLS")."""

import shutil
import subprocess

import pytest

import corefarm
from realbin import find_binary, start_server, wait_for_node


def openssl(cwd, *args):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(d):
    assert shutil.which("openssl"), "the TLS test needs the openssl command (apt-get install openssl)"
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    for ca in ("ca", "other-ca"):
        openssl(d, "req", "-x509", *ec, "-days", "30", "-subj", f"/CN={ca}", "-keyout", f"{ca}.key",
                "-out", f"{ca}.pem")
    (d / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    openssl(d, "req", *ec, "-subj", "/CN=corefarm server", "-keyout", "server.key", "-out", "server.csr")
    openssl(d, "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "30", "-extfile", "server.ext", "-out", "server.pem")


@pytest.fixture
def server(tmp_path):
    binary = find_binary()
    assert binary, "no corefarm binary: build it (cargo build -p corefarm-cli) or set COREFARM_BIN"
    make_pki(tmp_path)
    ca = str(tmp_path / "ca.pem")
    procs = []
    try:
        nodes, users = start_server(binary, procs, "--tls-cert", str(tmp_path / "server.pem"),
                                    "--tls-key", str(tmp_path / "server.key"))
        procs.append(subprocess.Popen([binary, "node", "--server", nodes, "--name", "tls-node",
                                       "--tls-ca", ca], stderr=subprocess.DEVNULL))
        wait_for_node(users, "tls-node", tls_ca=ca)
        yield users, tmp_path
    finally:
        for p in procs:
            p.kill()
            p.wait(10)


def test_results_come_back_over_tls(server):
    users, tmp = server
    with corefarm.connect(users, tls_ca=str(tmp / "ca.pem"), timeout=30) as c:
        assert c.nodes == 1
        c.configure_benchmark(1 << 20, 1 << 20)
        data = bytes(range(16)) + bytes(1 << 20)[16:]
        ids = [c.submit(data) for _ in range(4)]
        for _ in ids:
            out = c.recv(timeout=30)
            assert out.id in ids
            assert bytes(out.data[:16]) == bytes(range(16)) and len(out.data) == 1 << 20
    # The certificate carries "localhost" too.
    with corefarm.connect(users, nodes=0, tls_ca=str(tmp / "ca.pem"), tls_server_name="localhost") as c:
        assert c.status()["nodes"]


def test_mismatches_fail_with_the_cause(server):
    users, tmp = server
    with pytest.raises(corefarm.ServerError, match="requires TLS"):
        corefarm.connect(users, nodes=0)
    with pytest.raises(ConnectionError, match="not signed by a CA"):
        corefarm.connect(users, nodes=0, tls_ca=str(tmp / "other-ca.pem"))
    with pytest.raises(ConnectionError, match="not valid for the name"):
        corefarm.connect(users, nodes=0, tls_ca=str(tmp / "ca.pem"), tls_server_name="farm.example")
    with pytest.raises(ValueError, match="no-such.pem"):
        corefarm.connect(users, nodes=0, tls_ca=str(tmp / "no-such.pem"))
