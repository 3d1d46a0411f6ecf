"""Images with streaming handler sets for the Python sPIN tests: the cores'
side is the 16-in, 64-out echo of tests/fixtures/spin (shared with the Rust
tests); the handler sets and their C sources come from each test. They run
on the single node of the `one_node` fixture (conftest.py)."""

import json
import pathlib
import shutil
import subprocess

from realbin import find_binary

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "spin"
BIN = find_binary()


def require_tools():
    # A missing tool fails the test with its name (never a silent skip).
    assert BIN is not None, \
        "no corefarm binary: build it (cargo build -p corefarm-cli) or set COREFARM_BIN"
    for tool in ("c++", "cc"):
        assert shutil.which(tool), f"no C/C++ compiler ({tool}) on PATH"


def rule_set(name, word0, **extra):
    """A handler set selected by the message's word 0 being `word0`."""
    return {"name": name,
            "ruleset": {"mode": "and",
                        "rules": [{"index": 0, "mask": 0xFFFFFFFF, "start": word0, "end": word0}]},
            **extra}


def handler_image(d, name, sets, sources, extra=()):
    """Builds `name`.cfimg in directory `d` with `corefarm image build`
    (`extra`: more of its flags, e.g. element types)."""
    require_tools()
    echo = d / "echo.cpp"
    echo.write_text((FIXTURES / "echo.cpp").read_text())
    (d / "sets.json").write_text(json.dumps(sets))
    out = d / f"{name}.cfimg"
    subprocess.run(
        [BIN, "image", "build", "--hls", str(echo), "--entry", "echo", *extra,
         "--handlers", str(d / "sets.json"), "--handler-source", *map(str, sources),
         "-o", str(out)],
        check=True)
    return out
