"""A scripted fake corefarm server for the Python client tests: one thread,
one connection on 127.0.0.1 (OS-assigned port), plain socket + struct."""

import json
import socket
import struct
import threading

HDR = struct.Struct("<B3xI")
CONFIGURATION, RESPONSE, DATA, HELLO, ERROR, CREDIT = 1, 2, 3, 0x10, 0x11, 0x12
STATUS_REQUEST, STATUS = 0x13, 0x14
NO_ID = 0xFFFFFFFF


class Peer:
    def __init__(self, sock):
        self.sock = sock

    def _exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError(f"peer closed after {len(buf)} of {n} bytes")
            buf += chunk
        return bytes(buf)

    def read(self):
        ty, size = HDR.unpack(self._exact(HDR.size))
        return ty, self._exact(size)

    def expect(self, ty):
        got, payload = self.read()
        assert got == ty, f"fake server expected type {ty}, got {got}"
        return payload

    def at_eof(self):
        try:
            return self.sock.recv(1) == b""
        except OSError:
            return True

    def send(self, ty, payload):
        self.sock.sendall(HDR.pack(ty, len(payload)) + payload)

    def hello(self, features=("error", "credit"), nodes=1):
        h = json.loads(self.expect(HELLO))
        self.send(HELLO, json.dumps({"version": 1, "role": "server", "features": list(features),
                                     "nodes": nodes, "max_message": 1 << 24}).encode())
        return h

    def configuration(self, status=0, credit=None):
        """Answers a configuration; `credit` is granted just before the answer, so a client has it
        by the time its configure returns (it handles frames in order)."""
        p = self.expect(CONFIGURATION)
        i, o, n = struct.unpack_from("<III", p)
        cores = [struct.unpack_from("<III", p, 12 + 12 * k) for k in range(n)]
        if credit is not None:
            self.credit(credit)
        self.send(RESPONSE, bytes([status]))
        return {"input_size": i, "output_size": o, "cores": cores, "bitstream": p[12 + 12 * n:]}

    def data(self):
        p = self.expect(DATA)
        return struct.unpack_from("<I", p)[0], p[4:]

    def result(self, ident, body):
        self.send(DATA, struct.pack("<I", ident) + body)

    def credit(self, n):
        self.send(CREDIT, struct.pack("<I", n))

    def error(self, ident, code, reason):
        self.send(ERROR, struct.pack("<II", ident, code) + reason.encode())

    def status(self, status):
        self.expect(STATUS_REQUEST)
        self.send(STATUS, json.dumps(status).encode())

    def reordering_echo(self, total, credit=8):
        """Echoes `total` data messages, answering whatever has arrived in
        reverse order (out of order whenever several are in flight), one
        credit per answer. A reader thread feeds a queue; never waits for a
        batch to fill, so it cannot deadlock with the client's window."""
        import queue
        q = queue.Queue()

        def read():
            for _ in range(total):
                q.put(self.data())

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        self.credit(credit)
        answered = 0
        while answered < total:
            batch = [q.get(timeout=20)]
            while True:
                try:
                    batch.append(q.get_nowait())
                except queue.Empty:
                    break
            for ident, body in reversed(batch):
                self.result(ident, body)
                self.credit(1)
                answered += 1
        reader.join(20)


class FakeServer:
    """Runs `script(peer)` on the first connection. `join()` re-raises the
    script's assertion errors in the test thread."""

    def __init__(self, script):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.addr = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.error = None
        self.thread = threading.Thread(target=self._run, args=(script,), daemon=True)
        self.thread.start()

    def _run(self, script):
        try:
            self.listener.settimeout(20)
            sock, _ = self.listener.accept()
            sock.settimeout(20)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with sock:
                script(Peer(sock))
        except BaseException as e:  # reported by join()
            self.error = e
        finally:
            self.listener.close()

    def join(self, timeout=20):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "fake server script did not finish"
        if self.error is not None:
            raise self.error


class RestartingServer(FakeServer):
    """Runs `scripts[k]` on the k-th connection to one address (a server
    that restarts in place), then stops listening: later connections are
    refused."""

    def __init__(self, scripts):
        super().__init__(list(scripts))

    def _run(self, scripts):
        try:
            self.listener.settimeout(20)
            for script in scripts:
                sock, _ = self.listener.accept()
                sock.settimeout(20)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                with sock:
                    script(Peer(sock))
        except BaseException as e:  # reported by join()
            self.error = e
        finally:
            self.listener.close()
