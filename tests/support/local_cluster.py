"""`corefarm local` as a context manager for the Python test suites: OS-
assigned loopback ports, its log in a temporary file (never a pipe that
could fill and stall it), always stopped on exit."""

import re
import subprocess
import tempfile
import threading

from corefarm_bin import LISTENING

ANSI = re.compile(r"\x1b\[[0-9;]*m")


class Local:
    """`corefarm local --nodes N` on OS-assigned ports; always stopped by `with`."""

    def __init__(self, binary, nodes=2, *extra):
        self.log = tempfile.TemporaryFile(mode="w+")
        self.p = subprocess.Popen(
            [binary, "--log", "info", "local", "--nodes", str(nodes),
             "--users-listen", "127.0.0.1:0", "--nodes-listen", "127.0.0.1:0", *extra],
            stdout=subprocess.PIPE, stderr=self.log, stdin=subprocess.DEVNULL, text=True)
        found = threading.Event()

        def scan():
            for line in self.p.stdout:
                m = LISTENING.search(line)
                if m and not found.is_set():
                    self.nodes_addr, self.users = m.groups()
                    found.set()

        threading.Thread(target=scan, daemon=True).start()
        if not found.wait(30):
            self.stop()
            raise RuntimeError(f"corefarm local did not start:\n{self.stderr()}")

    def stderr(self):
        self.log.seek(0)
        return ANSI.sub("", self.log.read())

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        self.log.close()
        return False
