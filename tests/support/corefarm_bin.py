"""Shared by the Python test suites (python/tests, tests/peers, examples):
where to find the `corefarm` binary and how to read its startup line.

Looks at $COREFARM_BIN, then $CARGO_TARGET_DIR and target/ (release before
debug). Test helpers only: the independent peers in tests/peers share no
protocol code with corefarm, just this locator."""

import os
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]

# `corefarm server` / `corefarm local` print this line once they listen.
LISTENING = re.compile(r"listening nodes=(\S+) users=(\S+)")


def find_binary():
    """Path of an executable corefarm binary, or None."""
    candidates = [os.environ.get("COREFARM_BIN")]
    for t in (os.environ.get("CARGO_TARGET_DIR"), ROOT / "target"):
        if t:
            candidates += [pathlib.Path(t) / "release" / "corefarm", pathlib.Path(t) / "debug" / "corefarm"]
    return next((str(c) for c in candidates if c and os.path.isfile(c) and os.access(c, os.X_OK)), None)
