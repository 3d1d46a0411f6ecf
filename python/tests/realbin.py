"""Runs the real `corefarm` binary for the Python client tests: finds it at
$COREFARM_BIN, $CARGO_TARGET_DIR or target/{release,debug}, starts it on
OS-assigned ports and always stops it."""

import os
import pathlib
import re
import subprocess
import tempfile
import threading

ROOT = pathlib.Path(__file__).resolve().parents[2]
LISTENING = re.compile(r"listening nodes=(\S+) users=(\S+)")


def find_binary():
    candidates = []
    if os.environ.get("COREFARM_BIN"):
        candidates.append(pathlib.Path(os.environ["COREFARM_BIN"]))
    targets = [ROOT / "target"]
    if os.environ.get("CARGO_TARGET_DIR"):
        targets.insert(0, pathlib.Path(os.environ["CARGO_TARGET_DIR"]))
    for t in targets:
        candidates += [t / "release" / "corefarm", t / "debug" / "corefarm"]
    return next((str(c) for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


class Cluster:
    """`corefarm local`: a server and N simulated nodes in one process."""

    def __init__(self, binary, nodes=2, *extra):
        self.log = tempfile.TemporaryFile(mode="w+")
        self.p = subprocess.Popen(
            [binary, "local", "--nodes", str(nodes), "--nodes-listen", "127.0.0.1:0",
             "--users-listen", "127.0.0.1:0", *extra],
            stdout=subprocess.PIPE, stderr=self.log, stdin=subprocess.DEVNULL, text=True)
        found = {}

        def scan():
            for line in self.p.stdout:
                m = LISTENING.search(line)
                if m:
                    found["addrs"] = m.groups()
                    break
            for _ in self.p.stdout:  # keep draining
                pass

        threading.Thread(target=scan, daemon=True).start()
        for _ in range(600):
            if "addrs" in found or self.p.poll() is not None:
                break
            threading.Event().wait(0.1)
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
