#!/usr/bin/env python3
"""Regenerates group.json, byte-exact vectors of group messages (SMP types
0x18 control, 0x19 command, 0x1A reply).

The bytes are assembled here with `struct` from the layout in
docs/protocol.md ("Types 0x18-0x1A — groups") and checked by
crates/smp/tests/group_vectors.rs against the Rust codec.

Run: python3 tests/vectors/generate_group.py > tests/vectors/group.json
"""

import json
import struct

CTL, CMD, REPLY = 0x18, 0x19, 0x1A
CMDS = {"configure": 1, "put": 2, "get": 3, "free": 4, "bcast": 5, "reduce": 6,
        "allreduce": 7, "allgather": 8, "barrier": 9, "run": 10}
ALGOS = {None: 0, "linear": 1, "binomial": 2, "star": 3}
DTYPES = ["bytes", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f32", "f64"]
REDUCE = ["none", "sum", "prod", "min", "max"]


def frame(ty, payload):
    return struct.pack("<B3xI", ty, len(payload)) + payload


def cmd(seq, target, name, algo, dtype, reduce, root, timeout_ms, a, b, data, klass=4):
    a, b = a.encode(), b.encode()
    # The high nibble of the command byte: 0 for the default class 4, else 8 + class.
    field = 0 if klass == 4 else 8 | klass
    head = struct.pack("<IIBBBBIIHH", seq, target, CMDS[name] | field << 4, ALGOS[algo], DTYPES.index(dtype),
                       REDUCE.index(reduce), root, timeout_ms, len(a), len(b))
    wire = frame(CMD, head + a + b + data)
    decoded = {"seq": seq, "target": target, "cmd": name, "algo": algo, "dtype": dtype,
               "reduce": reduce, "root": root, "timeout_ms": timeout_ms, "class": klass, "a": a.decode(),
               "b": b.decode(), "data_hex": data.hex()}
    return wire, decoded


def reply(seq, rank, status, culprit, data):
    wire = frame(REPLY, struct.pack("<IIII", seq, rank, status, culprit) + data)
    return wire, {"seq": seq, "rank": rank, "status": status, "culprit": culprit, "data_hex": data.hex()}


def ctl(obj):
    return frame(CTL, json.dumps(obj, separators=(",", ":")).encode()), obj


def main():
    valid, invalid = [], []

    def add(name, t):
        valid.append({"name": name, "hex": t[0].hex(), "decoded": t[1]})

    add("user asks for a group of 4 nodes in a ring", ctl({"op": "open", "nodes": 4, "topology": "ring"}))
    add("server tells node n1 to join group 9 as rank 1", ctl({
        "op": "join", "group": 9, "rank": 1, "topology": "mesh", "token": 12345,
        "members": [{"rank": 0, "name": "n0", "peer": "10.0.0.1:7000"},
                    {"rank": 1, "name": "n1", "peer": "10.0.0.2:7000"}]}))
    add("group 9 closed because a member was lost",
        ctl({"op": "closed", "group": 9, "reason": "rank 1 (n1@10.0.0.2:40000) lost"}))
    add("put two i32 into buffer x of rank 2",
        cmd(3, 2, "put", None, "i32", "none", 0, 10000, "x", "", struct.pack("<ii", 5, -1)))
    add("i32 sum allreduce of x into s on every rank, binomial",
        cmd(4, 0xFFFFFFFF, "allreduce", "binomial", "i32", "sum", 0, 10000, "x", "s", b""))
    add("urgent (class 0) broadcast of x from rank 1 into y, linear",
        cmd(7, 0xFFFFFFFF, "bcast", "linear", "bytes", "none", 1, 10000, "x", "y", b"", klass=0))
    add("run the cores over A with operand v into y",
        cmd(5, 0xFFFFFFFF, "run", None, "bytes", "none", 0, 10000, "A", "y", b"v"))
    add("rank 1 answers a get with 4 bytes", reply(6, 1, 0, 0xFFFFFFFF, b"\x01\x02\x03\x04"))
    add("rank 0 reports allreduce failed, blaming rank 2",
        reply(4, 0, 8, 2, b"rank 2 lost"))

    def bad(name, wire, error):
        invalid.append({"name": name, "hex": wire.hex(), "error": error})

    bad("a group of 0 nodes", ctl({"op": "open", "nodes": 0})[0], "bad_group")
    bad("join whose rank is outside the member list", ctl({
        "op": "join", "group": 1, "rank": 1, "topology": "mesh", "token": 1,
        "members": [{"rank": 0, "name": "n0", "peer": "10.0.0.1:7000"}]})[0], "bad_group")
    bad("command of 23 bytes", frame(CMD, bytes(23)), "truncated")
    w, _ = cmd(1, 0, "get", None, "bytes", "none", 0, 1, "x", "", b"")
    bad("unknown command 99", w[:16] + bytes([99]) + w[17:], "bad_group")
    bad("command byte with a class field no sender writes (0x17)", w[:16] + bytes([0x17]) + w[17:],
        "bad_group")
    bad("class 4 spelt 8 + 4 in the command byte (0xC3): it is written as 0", w[:16] + bytes([0xC3]) + w[17:],
        "bad_group")
    bad("name longer than the payload",
        frame(CMD, struct.pack("<IIBBBBIIHH", 1, 0, 3, 0, 0, 0, 0, 1, 9, 0) + b"abc"), "truncated")
    bad("reply of 15 bytes", frame(REPLY, bytes(15)), "truncated")
    bad("failure reason that is not UTF-8",
        frame(REPLY, struct.pack("<IIII", 1, 0, 8, 0xFFFFFFFF) + b"\xff"), "bad_group")

    doc = {
        "about": "Byte-exact group messages (SMP types 0x18 control, 0x19 command, 0x1A reply; "
                 "docs/protocol.md). Little-endian. Valid vectors decode to 'decoded' (control: the "
                 "JSON object) and commands and replies re-encode to the same bytes; invalid ones "
                 "are rejected with 'error' (ProtocolError::kind). Regenerate with generate_group.py.",
        "valid": valid,
        "invalid": invalid,
    }
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
