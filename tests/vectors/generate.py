#!/usr/bin/env python3
"""Regenerates smp.json, the byte-exact SMP test vectors.

The bytes are assembled here with `struct` straight from the documented
layout (seed 000 §3.2 and the extension messages in crates/smp), and then
checked independently by crates/smp/tests/vectors.rs (the Rust codec) and
python/tests/test_vectors.py (a separate Python decoder and the extension).

Run: python3 tests/vectors/generate.py > tests/vectors/smp.json
"""

import hashlib
import hmac
import json
import struct

TYPES = {
    "configuration": 1,
    "configuration_response": 2,
    "data": 3,
    "hello": 0x10,
    "error": 0x11,
    "credit": 0x12,
    "auth_challenge": 0x16,
    "auth_response": 0x17,
}
NO_ID = 0xFFFFFFFF


def frame(ty, payload, size=None):
    size = len(payload) if size is None else size
    return struct.pack("<B3xI", ty, size) + payload


def configuration(input_size, output_size, cores, bitstream, ncores=None):
    ncores = len(cores) if ncores is None else ncores
    p = struct.pack("<III", input_size, output_size, ncores)
    for c in cores:
        p += struct.pack("<III", c["control"], c["input"], c["output"])
    return p + bitstream


def hello_json(obj):
    # serde_json's compact output: no spaces, fields in declaration order.
    return json.dumps(obj, separators=(",", ":")).encode()


AUTH_EXAMPLE = {
    "secret": "user-secret-0123456789",
    "nonce_hex": bytes(range(32)).hex(),
    "role": "user",
    "hello": '{"version":1,"role":"user","features":["error","auth"]}',
}


def auth_mac(ex):
    msg = (b"corefarm-auth-v1\x00" + bytes.fromhex(ex["nonce_hex"]) + ex["role"].encode()
           + b"\x00" + ex["hello"].encode())
    return hmac.new(ex["secret"].encode(), msg, hashlib.sha256).digest()


def main():
    valid = []
    invalid = []

    two_cores = [
        {"control": 0xC0000000, "input": 0xC0008000, "output": 0xC0010000},
        {"control": 0xC0020000, "input": 0xC0028000, "output": 0xC0030000},
    ]
    bit = bytes(range(0x10, 0x1A))
    valid.append({
        "name": "configuration with a 2-core table",
        "hex": frame(1, configuration(32768, 16384, two_cores, bit)).hex(),
        "type": "configuration",
        "decoded": {
            "input_size": 32768, "output_size": 16384, "cores": two_cores,
            "bitstream_hex": bit.hex(), "benchmark": None,
        },
    })
    valid.append({
        "name": "benchmarking configuration (zero cores, 4-byte delay)",
        "hex": frame(1, configuration(64, 32, [], struct.pack("<I", 919))).hex(),
        "type": "configuration",
        "decoded": {
            "input_size": 64, "output_size": 32, "cores": [],
            "bitstream_hex": struct.pack("<I", 919).hex(),
            "benchmark": {"input_size": 64, "output_size": 32, "delay_us": 919},
        },
    })
    valid.append({
        "name": "configuration response ok",
        "hex": frame(2, b"\x00").hex(),
        "type": "configuration_response",
        "decoded": {"status": 0, "ok": True},
    })
    valid.append({
        "name": "configuration response failed",
        "hex": frame(2, b"\x01").hex(),
        "type": "configuration_response",
        "decoded": {"status": 1, "ok": False},
    })
    one = bytes(range(16))
    valid.append({
        "name": "data with 1 input of 16 bytes",
        "hex": frame(3, struct.pack("<I", 7) + one).hex(),
        "type": "data",
        "decoded": {"id": 7, "data_hex": one.hex(), "unit": 16, "count": 1},
    })
    three = bytes((i * 7) & 0xFF for i in range(48))
    valid.append({
        "name": "data with 3 inputs of 16 bytes",
        "hex": frame(3, struct.pack("<I", 0x01020304) + three).hex(),
        "type": "data",
        "decoded": {"id": 0x01020304, "data_hex": three.hex(), "unit": 16, "count": 3},
    })
    user_hello = {"version": 1, "role": "user", "name": "vectors",
                  "features": ["error", "credit"], "nodes": 2}
    valid.append({
        "name": "hello from a user",
        "hex": frame(0x10, hello_json(user_hello)).hex(),
        "type": "hello",
        "decoded": user_hello,
    })
    server_hello = {"version": 1, "role": "server", "features": ["error", "credit"],
                    "nodes": 2, "max_message": 268435456}
    valid.append({
        "name": "hello from the server",
        "hex": frame(0x10, hello_json(server_hello)).hex(),
        "type": "hello",
        "decoded": server_hello,
    })
    reason = "no node is left to process data"
    valid.append({
        "name": "error without a data id",
        "hex": frame(0x11, struct.pack("<II", NO_ID, 6) + reason.encode()).hex(),
        "type": "error",
        "decoded": {"id": NO_ID, "code": 6, "reason": reason},
    })
    reason = "core failed: busy stuck high (bitstream \u00b5-test)"
    valid.append({
        "name": "error for data id 42 with a non-ASCII reason",
        "hex": frame(0x11, struct.pack("<II", 42, 9) + reason.encode()).hex(),
        "type": "error",
        "decoded": {"id": 42, "code": 9, "reason": reason},
    })
    valid.append({
        "name": "credit for 8 messages",
        "hex": frame(0x12, struct.pack("<I", 8)).hex(),
        "type": "credit",
        "decoded": {"messages": 8},
    })

    # Authentication (crates/smp/src/auth.rs): the MAC is computed here with
    # Python's own hmac from the documented inputs (see "auth_mac" below).
    nonce = bytes(range(32))
    valid.append({
        "name": "auth challenge with nonce 00..1f",
        "hex": frame(0x16, nonce).hex(),
        "type": "auth_challenge",
        "decoded": {"nonce_hex": nonce.hex()},
    })
    mac = auth_mac(AUTH_EXAMPLE)
    valid.append({
        "name": "auth response answering that challenge (auth_mac example)",
        "hex": frame(0x17, mac).hex(),
        "type": "auth_response",
        "decoded": {"mac_hex": mac.hex()},
    })

    # Invalid vectors. "error" is the kind a decoder must report; max_payload
    # is the limit the receiver applies to the header's size field.
    invalid.append({
        "name": "unknown message type 9",
        "hex": frame(9, b"\x00\x00\x00\x00").hex(),
        "error": "unknown_type",
    })
    invalid.append({
        "name": "configuration declaring 2 cores with room for 1",
        "hex": frame(1, configuration(32768, 16384, two_cores[:1], b"", ncores=2)).hex(),
        "error": "core_table_too_long",
    })
    invalid.append({
        "name": "configuration declaring 2^32-1 cores (must not wrap)",
        "hex": frame(1, configuration(16, 16, [], b"", ncores=0xFFFFFFFF)).hex(),
        "error": "core_table_too_long",
    })
    invalid.append({
        "name": "configuration payload shorter than its 12 fixed bytes",
        "hex": frame(1, struct.pack("<II", 16, 16)).hex(),
        "error": "truncated",
    })
    invalid.append({
        "name": "data payload shorter than its id",
        "hex": frame(3, b"\x01\x02").hex(),
        "error": "truncated",
    })
    invalid.append({
        "name": "configuration response with an empty payload",
        "hex": frame(2, b"").hex(),
        "error": "truncated",
    })
    invalid.append({
        "name": "credit with 2 bytes",
        "hex": frame(0x12, b"\x01\x00").hex(),
        "error": "truncated",
    })
    invalid.append({
        "name": "stream ends in the middle of a data message",
        "hex": frame(3, struct.pack("<I", 1) + b"abcdef", size=20).hex(),
        "error": "truncated_stream",
    })
    invalid.append({
        "name": "stream ends in the middle of a header",
        "hex": "0300000010",
        "error": "truncated_stream",
    })
    invalid.append({
        "name": "benchmarking configuration with input size 8",
        "hex": frame(1, configuration(8, 16, [], struct.pack("<I", 0))).hex(),
        "error": "benchmark_too_small",
    })
    invalid.append({
        "name": "benchmarking configuration with output size 15",
        "hex": frame(1, configuration(16, 15, [], struct.pack("<I", 0))).hex(),
        "error": "benchmark_too_small",
    })
    invalid.append({
        "name": "configuration with input size 0",
        "hex": frame(1, configuration(0, 16, [], b"bits-bits")).hex(),
        "error": "zero_input_size",
    })
    # The checks of a configuration are made in a documented order
    # (docs/protocol.md, "Type 1"): the kind names the first one broken.
    invalid.append({
        "name": "configuration with input size 0 and a core table too long (table checked first)",
        "hex": frame(1, configuration(0, 16, [], b"", ncores=1)).hex(),
        "error": "core_table_too_long",
    })
    invalid.append({
        "name": "benchmarking configuration with input size 0 (zero input checked first)",
        "hex": frame(1, configuration(0, 8, [], struct.pack("<I", 0))).hex(),
        "error": "zero_input_size",
    })
    invalid.append({
        "name": "header announcing 4 GiB - 1 (over the receiver's limit)",
        "hex": "03000000ffffffff",
        "error": "too_large",
    })
    invalid.append({
        "name": "header one byte over the receiver's limit",
        "hex": frame(3, b"", size=1025).hex(),
        "error": "too_large",
    })
    invalid.append({
        "name": "hello without a version",
        "hex": frame(0x10, b'{"role":"user"}').hex(),
        "error": "bad_hello",
    })
    invalid.append({
        "name": "data message with an id and no input",
        "hex": frame(3, struct.pack("<I", 5)).hex(),
        "error": "empty_data",
    })
    invalid.append({
        "name": "TLS record header on a plain port (not an auth challenge)",
        "hex": "160301020000ffff",
        "error": "tls_on_plain_port",
    })
    invalid.append({
        "name": "hello with an unknown role",
        "hex": frame(0x10, b'{"version":1,"role":"admin"}').hex(),
        "error": "bad_hello",
    })
    invalid.append({
        "name": "hello that is a JSON array of its fields, not an object",
        "hex": frame(0x10, b'[1,"user"]').hex(),
        "error": "bad_hello",
    })
    invalid.append({
        "name": "hello that is not JSON",
        "hex": frame(0x10, b"hello").hex(),
        "error": "bad_hello",
    })
    invalid.append({
        "name": "auth challenge with a 31-byte nonce",
        "hex": frame(0x16, bytes(31)).hex(),
        "error": "bad_auth",
    })
    invalid.append({
        "name": "auth response with a 33-byte tag",
        "hex": frame(0x17, bytes(33)).hex(),
        "error": "bad_auth",
    })
    invalid.append({
        "name": "error message whose reason is not UTF-8",
        "hex": frame(0x11, struct.pack("<II", 1, 10) + b"\xff\xfe").hex(),
        "error": "bad_reason",
    })

    doc = {
        "about": "Byte-exact SMP messages (seed 000 section 3.2 plus the corefarm "
                 "extensions hello 0x10, error 0x11, credit 0x12, auth challenge 0x16, auth "
                 "response 0x17). All integers are "
                 "little-endian. Each valid vector is one whole message; decoding it "
                 "and re-encoding the result must give the same bytes. Each invalid "
                 "vector is the whole byte stream a receiver sees; it must be "
                 "rejected with the given error kind. Regenerate with generate.py.",
        "max_payload": 1024,
        "types": TYPES,
        "valid": valid,
        "invalid": invalid,
        "auth_mac": dict(AUTH_EXAMPLE, mac_hex=mac.hex(),
                         about="HMAC-SHA256(secret, 'corefarm-auth-v1' 0x00 || nonce || role "
                               "|| 0x00 || hello payload as sent)"),
    }
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
