"""Locates the corefarm binary and runs servers/nodes on OS-assigned ports."""

import pathlib
import subprocess
import sys
import tempfile
import threading

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "support"))
from corefarm_bin import LISTENING, find_binary  # noqa: E402


@pytest.fixture(scope="session")
def corefarm_bin():
    b = find_binary()
    if b is None:
        pytest.skip("no corefarm binary: build it (cargo build -p corefarm-cli) or set COREFARM_BIN")
    return b


class Proc:
    """A child process whose stderr goes to a temporary file (shown on failure)."""

    def __init__(self, argv):
        self.log = tempfile.TemporaryFile(mode="w+")
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                  stdin=subprocess.DEVNULL)

    def wait_listening(self, timeout=60):
        """Reads stdout until the `listening nodes=A users=B` line."""
        found = {}

        def scan():
            for line in self.p.stdout:
                m = LISTENING.search(line)
                if m:
                    found["addrs"] = m.groups()
                    return

        t = threading.Thread(target=scan, daemon=True)
        t.start()
        t.join(timeout)
        if "addrs" not in found:
            raise AssertionError(f"no 'listening' line from {self.p.args}: {self.stderr()}")
        # Keep draining stdout so the child never blocks on a full pipe.
        threading.Thread(target=lambda: [None for _ in self.p.stdout], daemon=True).start()
        return found["addrs"]

    def stderr(self):
        self.log.seek(0)
        return self.log.read()[-4000:]

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(10)
        self.log.close()


@pytest.fixture
def spawn():
    """spawn(argv) -> Proc; every process is stopped at the end of the test."""
    procs = []

    def start(argv):
        p = Proc(argv)
        procs.append(p)
        return p

    yield start
    for p in reversed(procs):
        p.stop()


@pytest.fixture
def server(corefarm_bin, spawn):
    """A `corefarm server` on OS-assigned ports: returns (proc, nodes_addr, users_addr)."""
    def start(*extra):
        p = spawn([corefarm_bin, "server", "--nodes-listen", "127.0.0.1:0",
                   "--users-listen", "127.0.0.1:0", *extra])
        nodes, users = p.wait_listening()
        return p, nodes, users
    return start
