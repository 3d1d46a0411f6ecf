#!/usr/bin/env python3
"""Loopback TCP throughput with a blocking receiver against a polling one.

Why: over TCP on loopback, Open MPI moves a 4 MiB broadcast between two
ranks about twice as fast as corefarm's peer link (bench/manual/collectives.md,
"Why Open MPI wins at two members"). This isolates the transport: two
processes, one socket, messages written back to back; the receiver either
blocks in recv (as an epoll-driven node does) or polls with non-blocking
reads (as an MPI progress engine does), or blocks with SO_RCVLOWAT set
(`--lowat`: the kernel wakes it only once that many bytes are queued, and
the low-water mark is lowered for the last bytes, which would otherwise
never wake it). No corefarm code runs.

    python3 bench/tcp_loopback.py [--message 4M] [--count 200] [--write 128K] [--reads 64K,1M] [--lowat 256K]
"""

import argparse
import json
import os
import socket
import sys
import time


def size(s: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20}
    return int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult else int(s)


def run(message: int, count: int, write: int, read: int, poll: bool, lowat: int = 0) -> float:
    """Bytes per second from the first write to the receiver's acknowledgement of the last byte."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    addr = srv.getsockname()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            c, _ = srv.accept()
            buf = memoryview(bytearray(read))
            c.setblocking(not poll)
            total, want = 0, message * count
            mark = lowat
            if mark:
                c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, mark)
            while total < want:
                if mark > want - total:
                    mark = want - total
                    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, mark)
                try:
                    n = c.recv_into(buf)
                except BlockingIOError:
                    continue
                if n == 0:
                    break
                total += n
            c.setblocking(True)
            c.sendall(b"x")
            code = 0
        finally:
            os._exit(code)
    srv.close()
    try:
        s = socket.create_connection(addr)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        data = b"\xa5" * write
        writes = message * count // write
        t0 = time.perf_counter()
        for _ in range(writes):
            s.sendall(data)
        if s.recv(1) != b"x":
            raise RuntimeError("receiver ended early")
        dt = time.perf_counter() - t0
        s.close()
    finally:
        _, status = os.waitpid(pid, 0)
    if status != 0:
        raise RuntimeError(f"receiver exited with status {status}")
    return writes * write / dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--message", default="4M", help="bytes per message (suffixes K, M)")
    ap.add_argument("--count", type=int, default=200, help="messages per run")
    ap.add_argument("--write", default="128K", help="bytes per write")
    ap.add_argument("--reads", default="64K,1M", help="receive buffer sizes to try, comma-separated")
    ap.add_argument("--lowat", default="0",
                    help="also a blocking receiver with this SO_RCVLOWAT (suffixes K, M; 0: not tried)")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds of every variant")
    ap.add_argument("--json", action="store_true", help="one JSON object per run instead of a table")
    a = ap.parse_args()
    message, write, lowat = size(a.message), size(a.write), size(a.lowat)
    if message % write:
        ap.error("--message must be a multiple of --write")
    for r in range(a.rounds):
        for read in map(size, a.reads.split(",")):
            kinds = [("blocking", False, 0), ("polling", True, 0)] + ([("lowat", False, lowat)] if lowat else [])
            for kind, poll, mark in kinds:
                bps = run(message, a.count, write, read, poll, mark)
                row = {"round": r + 1, "receiver": kind, "lowat": mark, "read": read,
                       "write": write, "message": message, "GB_per_s": round(bps / 1e9, 2),
                       "us_per_message": round(message / bps * 1e6)}
                if a.json:
                    print(json.dumps(row))
                else:
                    print(f"round {row['round']}  {row['receiver']:8}  reads of {read >> 10:5} KiB: "
                          f"{row['GB_per_s']:5.2f} GB/s, {row['us_per_message']} us per {message >> 10} KiB")
                sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
