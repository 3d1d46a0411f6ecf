"""Runs the real `corefarm` binary for the Python client tests: finds it at
$COREFARM_BIN, $CARGO_TARGET_DIR or target/{release,debug}, starts it on
OS-assigned ports and always stops it."""

import pathlib
import sys
import subprocess
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "support"))
from corefarm_bin import LISTENING, find_binary  # noqa: E402,F401  (re-exported to the tests)


class Cluster:
    """`corefarm local`: a server and N simulated nodes in one process."""

    def __init__(self, binary, nodes=2, *extra):
        if binary is None:
            raise RuntimeError(
                "no corefarm binary: build it (cargo build -p corefarm-cli) or set COREFARM_BIN")
        self.log = tempfile.TemporaryFile(mode="w+")
        self.p = subprocess.Popen(
            [binary, "local", "--nodes", str(nodes), "--nodes-listen", "127.0.0.1:0",
             "--users-listen", "127.0.0.1:0", *extra],
            stdout=subprocess.PIPE, stderr=self.log, stdin=subprocess.DEVNULL, text=True)
        found = {}
        scanned = threading.Event()

        def scan():
            for line in self.p.stdout:
                m = LISTENING.search(line)
                if m:
                    found["addrs"] = m.groups()
                    break
            scanned.set()  # the line, or end of output: the process exited
            for _ in self.p.stdout:  # keep draining
                pass

        threading.Thread(target=scan, daemon=True).start()
        scanned.wait(60)
        if "addrs" not in found:
            self.stop()
            raise RuntimeError(f"corefarm local did not start: {self.stderr()}")
        self.nodes_addr, self.users_addr = found["addrs"]

    def stderr(self):
        if self.log.closed:
            return ""
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


def start_server(binary, procs, *args):
    """`corefarm server` on OS-assigned loopback ports with `args`; the process
    is appended to `procs` (the caller kills it). Returns (nodes, users)."""
    srv = subprocess.Popen([binary, "server", "--nodes-listen", "127.0.0.1:0",
                            "--users-listen", "127.0.0.1:0", *args],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    procs.append(srv)
    m = LISTENING.search(srv.stdout.readline())
    assert m, "corefarm server did not start"
    threading.Thread(target=lambda: [None for _ in srv.stdout], daemon=True).start()
    return m.groups()


def wait_for_node(users, name, **connect):
    """Until the server lists a node called `name`, asked as an observer
    (`nodes=0`) connected with `connect`: polling the server's own account
    of its nodes, not a sleep used as synchronisation."""
    import corefarm

    deadline = time.monotonic() + 30
    with corefarm.connect(users, nodes=0, **connect) as obs:
        while not any(n.get("name") == name for n in obs.status()["nodes"]):
            assert time.monotonic() < deadline, f"the node {name} never joined"
            time.sleep(0.02)

