#!/usr/bin/env python3
"""A benchmarking user from the byte format only.

Sends the benchmarking configuration, then `count` data messages of
`inputs` inputs each, each input starting with (id, k, sequence) so the
echoed 16 bytes prove which input a result belongs to; checks every result.
In hello mode it negotiates error+credit and never sends without credit.

    raw_user.py HOST:PORT [--hello]
"""

import json
import struct
import sys

from smp_raw import (NO_ID, T_CONFIGURATION, T_CONFIGURATION_RESPONSE, T_CREDIT, T_DATA,
                     T_ERROR, T_HELLO, Conn, benchmark_configuration, data_message, parse_data,
                     parse_error)


class ServerError(Exception):
    pass


class RawUser:
    def __init__(self, addr, hello=False, nodes=None, timeout=30.0):
        self.conn = Conn.dial(addr, timeout)
        self.conn.sock.settimeout(timeout)
        self.hello = None
        self.credit = None  # None: no credit flow control
        self.max_credit_seen = 0
        if hello:
            req = {"version": 1, "role": "user", "name": "raw_user", "features": ["error", "credit"]}
            if nodes is not None:
                req["nodes"] = nodes
            self.conn.send(T_HELLO, json.dumps(req).encode())
            ty, p = self.conn.read()
            if ty == T_ERROR:
                raise ServerError(parse_error(p))
            assert ty == T_HELLO, f"expected a hello reply, got type {ty}"
            self.hello = json.loads(p)
            assert self.hello["role"] == "server"
            if "credit" in self.hello.get("features", []):
                self.credit = 0

    def _next(self):
        """Next message, raising on errors. A credit message is applied and
        returned as (T_CREDIT, b"") so that a sender loop can react."""
        while True:
            ty, p = self.conn.read()
            if ty == T_CREDIT:
                assert self.credit is not None, "credit without the credit feature"
                self.credit += struct.unpack("<I", p)[0]
                self.max_credit_seen = max(self.max_credit_seen, self.credit)
                return ty, b""
            if ty == T_ERROR:
                ident, code, reason = parse_error(p)
                if ident == NO_ID and self.expect_config:
                    self.config_reason = reason
                    continue
                raise ServerError(ident, code, reason)
            return ty, p

    expect_config = False
    config_reason = None

    def configure_benchmark(self, input_size, output_size, delay_us=0):
        """Returns the configuration response's status byte."""
        self.conn.send(T_CONFIGURATION, benchmark_configuration(input_size, output_size, delay_us))
        self.expect_config = True
        try:
            while True:
                ty, p = self._next()
                if ty == T_CREDIT:
                    continue  # counted by _next; credits carry over
                break
        finally:
            self.expect_config = False
        assert ty == T_CONFIGURATION_RESPONSE, f"expected a configuration response, got {ty}"
        # Unused credits stay valid across a reconfiguration.
        return p[0]

    def run(self, input_size, output_size, count, inputs, window=8):
        """Sends `count` messages of `inputs` inputs and checks every result.
        With credit it sends whenever it holds one; without, it keeps at
        most `window` messages in flight."""
        sent = results = 0
        pending = {}
        while results < count:
            if self.credit is not None:
                may_send = self.credit > 0
            else:
                may_send = sent - results < window
            if sent < count and may_send:
                body = b"".join(struct.pack("<IIQ", sent, k, 0xC0FFEE00 + sent).ljust(input_size, b"\xa5")
                                for k in range(inputs))
                self.conn.send(T_DATA, data_message(sent, body))
                pending[sent] = body
                sent += 1
                if self.credit is not None:
                    self.credit -= 1
                continue
            ty, p = self._next()
            if ty == T_CREDIT:
                continue
            assert ty == T_DATA, f"expected data, got type {ty}"
            ident, out = parse_data(p)
            assert ident in pending, f"result for unknown id {ident}"
            body = pending.pop(ident)
            assert len(out) == inputs * output_size, f"result of {len(out)} bytes"
            for k in range(inputs):
                assert out[k * output_size:k * output_size + 16] == body[k * input_size:k * input_size + 16], \
                    f"id {ident} input {k}: first 16 bytes not echoed"
            results += 1
        return results

    def close(self):
        self.conn.close()


if __name__ == "__main__":
    u = RawUser(sys.argv[1], hello="--hello" in sys.argv)
    assert u.configure_benchmark(64, 32) == 0
    print("results", u.run(64, 32, 100, 3))
    u.close()
