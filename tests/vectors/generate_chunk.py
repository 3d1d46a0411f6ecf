#!/usr/bin/env python3
"""Regenerates chunk.json, byte-exact vectors of chunk messages (SMP type 0x1D).

The bytes are assembled here with `struct` from the layout in
docs/protocol.md ("Type 0x1D — chunk") and checked by
crates/smp/tests/chunk_vectors.rs against the Rust codec.

Run: python3 tests/vectors/generate_chunk.py > tests/vectors/chunk.json
"""

import json
import struct

CHUNK = 0x1D


def frame(payload):
    return struct.pack("<B3xI", CHUNK, len(payload)) + payload


def chunk(id, flags, cls, offset, total, data, reserved=0):
    return struct.pack("<IBBHQQ", id, flags, cls, reserved, offset, total) + data


def decoded(id, cls, first, last, offset, total, data):
    return {"id": id, "class": cls, "first": first, "last": last, "offset": offset, "total": total,
            "data_hex": data.hex()}


def main():
    valid = [
        {"name": "the whole of a 3-byte message in class 0",
         "hex": frame(chunk(7, 3, 0, 0, 3, b"abc")).hex(),
         "decoded": decoded(7, 0, True, True, 0, 3, b"abc")},
        {"name": "first of two chunks of a 6-byte message in class 5",
         "hex": frame(chunk(0x01020304, 1, 5, 0, 6, b"\x00\x01\x02\x03")).hex(),
         "decoded": decoded(0x01020304, 5, True, False, 0, 6, b"\x00\x01\x02\x03")},
        {"name": "its last chunk",
         "hex": frame(chunk(0x01020304, 2, 5, 4, 6, b"\x04\x05")).hex(),
         "decoded": decoded(0x01020304, 5, False, True, 4, 6, b"\x04\x05")},
        {"name": "a message with no data",
         "hex": frame(chunk(1, 3, 7, 0, 0, b"")).hex(),
         "decoded": decoded(1, 7, True, True, 0, 0, b"")},
    ]
    invalid = [
        {"name": "shorter than the chunk header", "hex": frame(chunk(7, 3, 0, 0, 3, b"")[:20]).hex(),
         "error": "truncated"},
        {"name": "unknown flag 4", "hex": frame(chunk(7, 7, 0, 0, 3, b"abc")).hex(), "error": "bad_chunk"},
        {"name": "class 8", "hex": frame(chunk(7, 3, 8, 0, 3, b"abc")).hex(), "error": "bad_chunk"},
        {"name": "bytes past the message's length", "hex": frame(chunk(7, 1, 0, 0, 2, b"abc")).hex(),
         "error": "bad_chunk"},
        {"name": "first chunk not at offset 0", "hex": frame(chunk(7, 1, 0, 1, 9, b"abc")).hex(),
         "error": "bad_chunk"},
        {"name": "last flag on a chunk that does not end the message",
         "hex": frame(chunk(7, 2, 0, 1, 9, b"abc")).hex(), "error": "bad_chunk"},
        {"name": "empty middle chunk", "hex": frame(chunk(7, 0, 0, 1, 9, b"")).hex(), "error": "bad_chunk"},
    ]
    doc = {
        "about": "Byte-exact chunk messages (SMP type 0x1D, docs/protocol.md). Little-endian. "
                 "Valid vectors decode to 'decoded' and re-encode to the same bytes; invalid ones are "
                 "rejected with 'error' (ProtocolError::kind). Regenerate with generate_chunk.py.",
        "type": CHUNK,
        "valid": valid,
        "invalid": invalid,
    }
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
