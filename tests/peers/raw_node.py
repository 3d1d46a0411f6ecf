#!/usr/bin/env python3
"""A seed-style computing node in benchmarking mode, from the byte format only.

Connects to a server's node port, answers configurations (status 0 for the
benchmarking configuration, 1 for anything else: it has no hardware), and
answers each data message with output_size bytes per input after delay_us
per input, copying the first 16 bytes of each input into its output.

    raw_node.py HOST:PORT
"""

import struct
import sys
import threading
import time

from smp_raw import (T_CONFIGURATION, T_CONFIGURATION_RESPONSE, T_DATA, Conn, PeerClosed,
                     data_message, parse_configuration, parse_data)


class RawNode:
    def __init__(self, server_addr):
        self.conn = Conn.dial(server_addr)
        self.conn.sock.settimeout(None)
        self.config = None
        self.configurations = 0
        self.inputs = 0
        self.messages = 0
        self.error = None

    def serve(self):
        try:
            while True:
                ty, p = self.conn.read()
                if ty == T_CONFIGURATION:
                    self.configurations += 1
                    i, o, cores, bit = parse_configuration(p)
                    bench = not cores and len(bit) == 4 and i >= 16 and o >= 16
                    self.config = (i, o, struct.unpack("<I", bit)[0]) if bench else None
                    self.conn.send(T_CONFIGURATION_RESPONSE, b"\x00" if bench else b"\x01")
                elif ty == T_DATA:
                    if self.config is None:
                        raise RuntimeError("data before a benchmarking configuration")
                    i, o, delay = self.config
                    ident, body = parse_data(p)
                    if len(body) == 0 or len(body) % i:
                        raise RuntimeError(f"data of {len(body)} bytes for {i}-byte inputs")
                    n = len(body) // i
                    if delay:
                        time.sleep(delay * n / 1e6)
                    out = b"".join(body[k * i:k * i + 16] + bytes(o - 16) for k in range(n))
                    self.conn.send(T_DATA, data_message(ident, out))
                    self.inputs += n
                    self.messages += 1
                else:
                    raise RuntimeError(f"unexpected message type {ty} on the node side")
        except (PeerClosed, OSError):
            pass  # the server went away or we were closed: normal end
        except Exception as e:  # reported to the test
            self.error = e
        finally:
            self.conn.close()

    def start(self):
        t = threading.Thread(target=self.serve, daemon=True)
        t.start()
        return t


if __name__ == "__main__":
    RawNode(sys.argv[1]).serve()
