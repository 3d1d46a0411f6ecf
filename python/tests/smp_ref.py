"""A pure-Python SMP decoder written from the byte layout alone (seed 000
section 3.2 and the extension messages), used to cross-check the shared
vectors and the Rust implementation. Deliberately independent of corefarm."""

import json
import struct

HEADER = struct.Struct("<B3xI")
TYPES = {1: "configuration", 2: "configuration_response", 3: "data",
         0x10: "hello", 0x11: "error", 0x12: "credit",
         0x16: "auth_challenge", 0x17: "auth_response"}
NO_ID = 0xFFFFFFFF


class DecodeError(Exception):
    def __init__(self, kind, detail=""):
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


def split_frame(wire, max_payload):
    """Returns (type name, payload) of the single message in `wire`."""
    if len(wire) < HEADER.size:
        raise DecodeError("truncated_stream", f"{len(wire)} header bytes")
    # A TLS record header (handshake 0x16, version 3.0-3.4) is a TLS client
    # on a plain port, refused as such; SMP writes its reserved bytes as zero.
    if wire[0] == 0x16 and wire[1] == 0x03 and wire[2] <= 0x04:
        raise DecodeError("tls_on_plain_port")
    ty, size = HEADER.unpack_from(wire)
    if ty not in TYPES:
        raise DecodeError("unknown_type", str(ty))
    if size > max_payload:
        raise DecodeError("too_large", f"{size} > {max_payload}")
    if len(wire) < HEADER.size + size:
        raise DecodeError("truncated_stream", f"{len(wire) - HEADER.size} of {size}")
    if len(wire) > HEADER.size + size:
        raise ValueError("more than one message")
    return TYPES[ty], wire[HEADER.size:]


def decode_payload(kind, p, unit=None):
    if kind == "configuration":
        if len(p) < 12:
            raise DecodeError("truncated", "configuration")
        i, o, n = struct.unpack_from("<III", p)
        if n * 12 > len(p) - 12:
            raise DecodeError("core_table_too_long", f"{n} cores")
        if n > 1024:
            raise DecodeError("too_many_cores", f"{n} cores")
        if i == 0:
            raise DecodeError("zero_input_size")
        cores = [dict(zip(("control", "input", "output"), struct.unpack_from("<III", p, 12 + 12 * k)))
                 for k in range(n)]
        bit = p[12 + 12 * n:]
        bench = None
        if n == 0 and len(bit) == 4:
            if i < 16 or o < 16:
                raise DecodeError("benchmark_too_small", f"{i}/{o}")
            bench = {"input_size": i, "output_size": o, "delay_us": struct.unpack("<I", bit)[0]}
        return {"input_size": i, "output_size": o, "cores": cores,
                "bitstream_hex": bit.hex(), "benchmark": bench}
    if kind == "configuration_response":
        if len(p) < 1:
            raise DecodeError("truncated", "configuration response")
        return {"status": p[0], "ok": p[0] == 0}
    if kind == "data":
        if len(p) < 4:
            raise DecodeError("truncated", "data")
        (ident,) = struct.unpack_from("<I", p)
        body = p[4:]
        if unit is None:
            return {"id": ident, "data_hex": body.hex()}
        if len(body) == 0:
            raise DecodeError("empty_data")
        if len(body) % unit:
            raise DecodeError("not_multiple")
        return {"id": ident, "data_hex": body.hex(), "unit": unit, "count": len(body) // unit}
    if kind == "hello":
        try:
            obj = json.loads(p.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise DecodeError("bad_hello", str(e)) from None
        if not isinstance(obj, dict) or obj.get("role") not in ("user", "node", "server"):
            raise DecodeError("bad_hello", "role")
        version = obj.get("version")
        if type(version) is not int or not 0 <= version < 1 << 32:
            raise DecodeError("bad_hello", "version")
        return obj
    if kind == "error":
        if len(p) < 8:
            raise DecodeError("truncated", "error")
        ident, code = struct.unpack_from("<II", p)
        try:
            reason = p[8:].decode("utf-8")
        except UnicodeDecodeError:
            raise DecodeError("bad_reason") from None
        return {"id": ident, "code": code, "reason": reason}
    if kind == "credit":
        if len(p) < 4:
            raise DecodeError("truncated", "credit")
        return {"messages": struct.unpack_from("<I", p)[0]}
    if kind in ("auth_challenge", "auth_response"):
        if len(p) != 32:
            raise DecodeError("bad_auth", f"{kind} of {len(p)} bytes")
        return {"nonce_hex" if kind == "auth_challenge" else "mac_hex": p.hex()}
    raise AssertionError(kind)


def encode(kind, d):
    """Encodes decoded fields back into a whole message."""
    if kind == "configuration":
        p = struct.pack("<III", d["input_size"], d["output_size"], len(d["cores"]))
        for c in d["cores"]:
            p += struct.pack("<III", c["control"], c["input"], c["output"])
        p += bytes.fromhex(d["bitstream_hex"])
    elif kind == "configuration_response":
        p = bytes([d["status"]])
    elif kind == "data":
        p = struct.pack("<I", d["id"]) + bytes.fromhex(d["data_hex"])
    elif kind == "hello":
        p = json.dumps(d, separators=(",", ":")).encode()
    elif kind == "error":
        p = struct.pack("<II", d["id"], d["code"]) + d["reason"].encode()
    elif kind == "credit":
        p = struct.pack("<I", d["messages"])
    elif kind == "auth_challenge":
        p = bytes.fromhex(d["nonce_hex"])
    elif kind == "auth_response":
        p = bytes.fromhex(d["mac_hex"])
    else:
        raise AssertionError(kind)
    ty = {v: k for k, v in TYPES.items()}[kind]
    return HEADER.pack(ty, len(p)) + p
