"""`connect(..., secret=...)` against the real `corefarm server --auth-file`
with a real node manager holding the node secret."""

import os
import subprocess

import pytest

import corefarm
from realbin import find_binary, start_server, wait_for_node

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
        nodes, users = start_server(binary, procs, "--auth-file", auth)
        env = {k: v for k, v in os.environ.items() if not k.startswith("COREFARM_SECRET")}
        procs.append(subprocess.Popen([binary, "node", "--server", nodes, "--name", "authed",
                                       "--secret-file", node_secret, "--peer-listen", "127.0.0.1:0"],
                                      stderr=subprocess.DEVNULL, env=env))
        wait_for_node(users, "authed", secret=USER)
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


def test_a_group_answers_the_challenge_too(server, monkeypatch):
    users, tmp = server
    monkeypatch.delenv("COREFARM_SECRET", raising=False)
    monkeypatch.delenv("COREFARM_SECRET_FILE", raising=False)
    with pytest.raises(corefarm.ServerError, match="user secret"):
        corefarm.group(users, 1)
    with corefarm.group(users, 1, secret=USER) as g:
        g.barrier()
    monkeypatch.setenv("COREFARM_SECRET_FILE", private(tmp / "user.secret", USER + "\n"))
    with corefarm.group(users, 1) as g:
        g.barrier()
