#!/usr/bin/env python3
"""Writes one artifact of a corefarm image to a file, e.g. the RTL shared
object for a testbench:

    python3 examples/extract_artifact.py saxpy.cfimg rtl saxpy_rtl.so

KIND is native, rtl or bitstream (the first artifact of that kind), or a
whole target such as native-aarch64-linux (inspect lists them). Checks
the artifact's SHA-256 like a node does. Standard library only
(format: docs/images.md)."""

import hashlib
import json
import struct
import sys


def extract(image: bytes, kind: str) -> bytes:
    if image[:8] != b"CFIMAGE\0":
        raise SystemExit("not a corefarm image (no CFIMAGE magic)")
    _version, length = struct.unpack_from("<II", image, 8)
    manifest = json.loads(image[16:16 + length])
    base = 16 + length
    for a in manifest["artifacts"]:
        if kind in (a["kind"], a["target"]):
            data = image[base + a["offset"]:base + a["offset"] + a["length"]]
            if hashlib.sha256(data).hexdigest() != a["sha256"]:
                raise SystemExit(f"{a['target']}: checksum mismatch")
            return data
    targets = sorted({a["target"] for a in manifest["artifacts"]})
    raise SystemExit(f"no {kind} artifact; the image has {targets}")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    with open(sys.argv[1], "rb") as f:
        data = extract(f.read(), sys.argv[2])
    with open(sys.argv[3], "wb") as f:
        f.write(data)
