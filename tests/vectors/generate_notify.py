#!/usr/bin/env python3
"""Regenerates notify.json, byte-exact vectors of handler notifications (SMP
type 0x1C, hello feature "spin-notify").

The bytes are assembled here with `struct` from the layout in
docs/protocol.md ("Type 0x1C — handler notification") and checked by
crates/smp/tests/notify_vectors.rs against the Rust codec.

Run: python3 tests/vectors/generate_notify.py > tests/vectors/notify.json
"""

import json
import struct

NOTIFICATION = 0x1C
MAX = 4096


def frame(payload):
    return struct.pack("<B3xI", NOTIFICATION, len(payload)) + payload


def notification(id, set, data):
    return struct.pack("<IB", id, set) + data


def decoded(id, set, data):
    return {"id": id, "set": set, "data_hex": data.hex()}


def main():
    tail = struct.pack("<Q", 4096)
    valid = [
        {"name": "8-byte notification of message 7 from handler set 0",
         "hex": frame(notification(7, 0, tail)).hex(),
         "decoded": decoded(7, 0, tail)},
        {"name": "text from handler set 3 of message 0x01020304",
         "hex": frame(notification(0x01020304, 3, b"tail")).hex(),
         "decoded": decoded(0x01020304, 3, b"tail")},
        {"name": "an empty notification",
         "hex": frame(notification(1, 255, b"")).hex(),
         "decoded": decoded(1, 255, b"")},
        {"name": "the longest notification (4096 bytes)",
         "hex": frame(notification(2, 1, bytes(i & 0xFF for i in range(MAX)))).hex(),
         "decoded": decoded(2, 1, bytes(i & 0xFF for i in range(MAX)))},
    ]
    invalid = [
        {"name": "shorter than id and set", "hex": frame(struct.pack("<I", 7)).hex(),
         "error": "truncated"},
        {"name": "one byte over 4096", "hex": frame(notification(2, 1, bytes(MAX + 1))).hex(),
         "error": "bad_notification"},
    ]
    doc = {
        "about": "Byte-exact handler notifications (SMP type 0x1C, docs/protocol.md). "
                 "Little-endian. Valid vectors decode to 'decoded' and re-encode to the same "
                 "bytes; invalid ones are rejected with 'error' (ProtocolError::kind). "
                 "Regenerate with generate_notify.py.",
        "type": NOTIFICATION,
        "valid": valid,
        "invalid": invalid,
    }
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
