"""`connect(..., secret=...)` against the real `corefarm server --auth-file`
with a real node manager holding the node secret."""

import os
import subprocess
import threading
import time

import pytest

import corefarm
from realbin import LISTENING, find_binary

USER = "user-secret-for-the-python-test"
NODE = "node-secret-for-the-python-test"


def private(path, text):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return str(path)


@pytest.fixture
def server(tmp_path):
    binary = find_binary()
    assert binary, "no corefarm binary: build it (cargo build -p corefarm-cli) or set COREFARM_BIN"
    auth = private(tmp_path / "auth.toml", f'[users]\nsecret = "{USER}"\n[nodes]\nsecret = "{NODE}"\n')
    node_secret = private(tmp_path / "node.secret", NODE + "\n")
    procs = []
    try:
        srv = subprocess.Popen([binary, "server", "--auth-file", auth, "--nodes-listen", "127.0.0.1:0",
                                "--users-listen", "127.0.0.1:0"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        procs.append(srv)
        m = LISTENING.search(srv.stdout.readline())
        assert m, "corefarm server did not start"
        threading.Thread(target=lambda: [None for _ in srv.stdout], daemon=True).start()
        nodes, users = m.groups()
        env = {k: v for k, v in os.environ.items() if not k.startswith("COREFARM_SECRET")}
        procs.append(subprocess.Popen([binary, "node", "--server", nodes, "--name", "authed",
                                       "--secret-file", node_secret],
                                      stderr=subprocess.DEVNULL, env=env))
        # Wait on the server's own account of its nodes (polling it is not a sleep-as-sync).
        deadline = time.monotonic() + 30
        with corefarm.connect(users, nodes=0, secret=USER) as obs:
            while not any(n.get("name") == "authed" for n in obs.status()["nodes"]):
                assert time.monotonic() < deadline, "the node never joined"
                time.sleep(0.02)
        yield users, tmp_path
    finally:
        for p in procs:
            p.kill()
            p.wait(10)


def test_the_user_secret_opens_the_session(server):
    users, _ = server
    with corefarm.connect(users, secret=USER, timeout=30) as c:
        assert c.nodes == 1
        c.configure_benchmark(16, 16)
        i = c.submit(bytes(range(16)))
        out = c.recv(timeout=30)
        assert out.id == i and bytes(out.data) == bytes(range(16))


def test_secret_file_and_environment(server, monkeypatch):
    users, tmp = server
    path = private(tmp / "user.secret", USER + "\n")
    with corefarm.connect(users, nodes=0, secret_file=path) as c:
        assert c.status()["nodes"]
    monkeypatch.setenv("COREFARM_SECRET_FILE", path)
    with corefarm.connect(users, nodes=0) as c:
        assert c.status()["nodes"]


def test_wrong_or_missing_secret_is_refused_with_the_reason(server, monkeypatch):
    users, tmp = server
    monkeypatch.delenv("COREFARM_SECRET", raising=False)
    monkeypatch.delenv("COREFARM_SECRET_FILE", raising=False)
    with pytest.raises(corefarm.ServerError, match="user secret") as e:
        corefarm.connect(users, secret=NODE)
    assert e.value.code_name == "unauthorized"
    with pytest.raises(corefarm.ServerError, match="requires authentication"):
        corefarm.connect(users)
    readable = tmp / "readable.secret"
    readable.write_text(USER)
    readable.chmod(0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        corefarm.connect(users, secret_file=str(readable))
