"""Minimal SMP framing from the byte format alone (seed 000 section 3.2):
8-byte header = u8 type, 3 reserved bytes, u32 LE payload size."""

import socket
import struct

HEADER = struct.Struct("<B3xI")
T_CONFIGURATION = 1
T_CONFIGURATION_RESPONSE = 2
T_DATA = 3
T_HELLO = 0x10
T_ERROR = 0x11
T_CREDIT = 0x12
NO_ID = 0xFFFFFFFF


class PeerClosed(Exception):
    pass


class Conn:
    def __init__(self, sock):
        self.sock = sock
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    @classmethod
    def dial(cls, addr, timeout=20.0):
        host, port = addr.rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=timeout)
        return cls(s)

    def recv_exact(self, n):
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:])
            if k == 0:
                if got == 0:
                    raise PeerClosed("peer closed the connection")
                raise PeerClosed(f"peer closed after {got} of {n} bytes")
            got += k
        return bytes(buf)

    def read(self):
        """Returns (type, payload)."""
        ty, size = HEADER.unpack(self.recv_exact(HEADER.size))
        return ty, self.recv_exact(size) if size else b""

    def send(self, ty, payload=b""):
        self.sock.sendall(HEADER.pack(ty, len(payload)) + payload)

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def benchmark_configuration(input_size, output_size, delay_us):
    """Seed 000 section 4.2.2: zero cores, 4-byte bitstream = delay in us."""
    return struct.pack("<IIII", input_size, output_size, 0, delay_us)


def parse_configuration(p):
    input_size, output_size, ncores = struct.unpack_from("<III", p)
    table_end = 12 + 12 * ncores
    if table_end > len(p):
        raise ValueError("core table longer than the payload")
    cores = [struct.unpack_from("<III", p, 12 + 12 * i) for i in range(ncores)]
    return input_size, output_size, cores, p[table_end:]


def data_message(ident, body):
    return struct.pack("<I", ident) + body


def parse_data(p):
    if len(p) < 4:
        raise ValueError("data message shorter than its id")
    return struct.unpack_from("<I", p)[0], p[4:]


def parse_error(p):
    ident, code = struct.unpack_from("<II", p)
    return ident, code, p[8:].decode("utf-8", "replace")
