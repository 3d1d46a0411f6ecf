#!/usr/bin/env python3
"""Regenerates peer.json, byte-exact vectors of peer messages (SMP type 0x15).

The bytes are assembled here with `struct` from the layout in
docs/protocol.md ("Type 0x15 — peer") and checked by
crates/smp/tests/peer_vectors.rs against the Rust codec.

Run: python3 tests/vectors/generate_peer.py > tests/vectors/peer.json
"""

import json
import struct

PEER = 0x15
KINDS = {"hello": 1, "collective": 2, "abort": 3}
OPS = {"barrier": 1, "bcast": 2, "reduce": 3, "allreduce": 4, "gather": 5, "scatter": 6, "allgather": 7}
ALGOS = {"linear": 1, "binomial": 2, "star": 3}
DTYPES = ["bytes", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f32", "f64"]
REDUCE = ["none", "sum", "prod", "min", "max"]


def frame(payload, ty=PEER, size=None):
    size = len(payload) if size is None else size
    return struct.pack("<B3xI", ty, size) + payload


def routing(kind, ttl, group, src, dst, seq, flags=0):
    return struct.pack("<BBHIIIQ", kind, flags, ttl, group, src, dst, seq)


def coll(seq, op, phase, algo, dtype, reduce, root, block, offset, total, klass=4):
    # Byte 9: the priority class field, 0 for the default class 4, else 8 + class.
    field = 0 if klass == 4 else 8 | klass
    return struct.pack("<IBBBBBB2xII4xQQ", seq, op, phase, algo, dtype, reduce, field, root, block,
                       offset, total)


def header(kind, ttl, group, src, dst, seq):
    return {"kind": kind, "ttl": ttl, "group": group, "src": src, "dst": dst, "seq": seq}


def main():
    valid, invalid = [], []
    valid.append({
        "name": "hello opening a link from rank 0 to rank 3 of group 7",
        "hex": frame(routing(1, 0, 7, 0, 3, 0) + struct.pack("<Q", 0x5EC12E7_0F_6A0B) + b"n0").hex(),
        "decoded": {"header": header("hello", 0, 7, 0, 3, 0), "token": "%016x" % 0x5EC12E7_0F_6A0B, "name": "n0"},
    })
    c = {"seq": 4, "op": "allreduce", "phase": 0, "algo": "binomial", "dtype": "i32",
         "reduce": "sum", "root": 0, "block": 2, "offset": 8, "total": 16, "class": 4}
    data = struct.pack("<ii", 5, -1)
    body = coll(4, OPS["allreduce"], 0, ALGOS["binomial"], DTYPES.index("i32"), REDUCE.index("sum"), 0, 2, 8, 16)
    valid.append({
        "name": "second chunk of an i32 allreduce from rank 2, routed to rank 0",
        "hex": frame(routing(2, 5, 7, 2, 0, 41) + body + data).hex(),
        "decoded": {"header": header("collective", 5, 7, 2, 0, 41), "coll": c, "data_hex": data.hex()},
    })
    e = {"seq": 1, "op": "bcast", "phase": 0, "algo": "linear", "dtype": "bytes",
         "reduce": "none", "root": 1, "block": 1, "offset": 0, "total": 0, "class": 4}
    valid.append({
        "name": "the only chunk of an empty broadcast",
        "hex": frame(routing(2, 2, 1, 1, 2, 1) + coll(1, 2, 0, 1, 0, 0, 1, 1, 0, 0)).hex(),
        "decoded": {"header": header("collective", 2, 1, 1, 2, 1), "coll": e, "data_hex": ""},
    })
    u = {"seq": 3, "op": "bcast", "phase": 0, "algo": "binomial", "dtype": "bytes",
         "reduce": "none", "root": 0, "block": 0, "offset": 0, "total": 2, "class": 0}
    valid.append({
        "name": "chunk of an urgent (class 0) broadcast",
        "hex": frame(routing(2, 1, 7, 0, 1, 9) + coll(3, 2, 0, 2, 0, 0, 0, 0, 0, 2, klass=0) + b"hi").hex(),
        "decoded": {"header": header("collective", 1, 7, 0, 1, 9), "coll": u, "data_hex": b"hi".hex()},
    })
    reason = "link lost".encode()
    valid.append({
        "name": "abort blaming rank 3 for collective 4",
        "hex": frame(routing(3, 4, 7, 1, 0, 42) + struct.pack("<II", 3, 4) + reason).hex(),
        "decoded": {"header": header("abort", 4, 7, 1, 0, 42), "culprit": 3, "coll_seq": 4, "reason": "link lost"},
    })

    invalid.append({"name": "shorter than the routing header",
                    "hex": frame(routing(1, 0, 7, 0, 3, 0)[:20]).hex(), "error": "truncated"})
    invalid.append({"name": "unknown kind 9",
                    "hex": frame(routing(9, 0, 7, 0, 3, 0)).hex(), "error": "bad_peer"})
    invalid.append({"name": "non-zero flags",
                    "hex": frame(routing(1, 0, 7, 0, 3, 0, flags=1)).hex(), "error": "bad_peer"})
    invalid.append({"name": "collective without its collective header",
                    "hex": frame(routing(2, 1, 7, 0, 1, 5) + b"\x00" * 39).hex(), "error": "truncated"})
    invalid.append({"name": "unknown collective operation 8",
                    "hex": frame(routing(2, 1, 7, 0, 1, 5) + coll(1, 8, 0, 1, 0, 0, 0, 0, 0, 0)).hex(),
                    "error": "bad_peer"})
    invalid.append({"name": "unknown element type 11",
                    "hex": frame(routing(2, 1, 7, 0, 1, 5) + coll(1, 3, 0, 1, 11, 1, 0, 0, 0, 0)).hex(),
                    "error": "bad_peer"})
    invalid.append({"name": "chunk overrunning its block",
                    "hex": frame(routing(2, 1, 7, 0, 1, 5) + coll(1, 2, 0, 1, 0, 0, 0, 0, 14, 16) + b"abc").hex(),
                    "error": "bad_peer"})
    invalid.append({"name": "hello name not UTF-8",
                    "hex": frame(routing(1, 0, 7, 0, 3, 0) + bytes(8) + b"\xff").hex(), "error": "bad_peer"})
    invalid.append({"name": "hello without its 8-byte token",
                    "hex": frame(routing(1, 0, 7, 0, 3, 0) + b"n0").hex(), "error": "truncated"})
    invalid.append({"name": "abort shorter than culprit and sequence",
                    "hex": frame(routing(3, 0, 7, 0, 3, 0) + b"\x01\x00\x00").hex(), "error": "truncated"})

    doc = {
        "about": "Byte-exact peer messages (SMP type 0x15, docs/protocol.md). Little-endian. "
                 "Valid vectors decode to 'decoded' and re-encode to the same bytes; invalid ones are "
                 "rejected with 'error' (ProtocolError::kind). Regenerate with generate_peer.py.",
        "type": PEER,
        "valid": valid,
        "invalid": invalid,
    }
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
