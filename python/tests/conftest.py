import glob
import os
import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
SRC = HERE.parent  # python/: holds the package sources without the built extension

# Let tests import their helpers (fakeserver, smp_ref) by name.
sys.path.insert(0, str(HERE))

# `python -m pytest` run from python/ puts the source tree first on sys.path,
# which would shadow the installed package (the one with _corefarm built in).
if not glob.glob(str(SRC / "corefarm" / "_corefarm*")):
    sys.path[:] = [p for p in sys.path if pathlib.Path(p or os.getcwd()).resolve() != SRC]

# corefarm.build_image runs the `corefarm` command ($COREFARM_BIN, else PATH):
# give it the binary the other tests use when the environment names none.
if not os.environ.get("COREFARM_BIN"):
    from realbin import find_binary

    if find_binary():
        os.environ["COREFARM_BIN"] = find_binary()


@pytest.fixture
def one_node():
    """`corefarm local` with one node, stopped after the test (the streaming
    handler tests: their images are built with spinimage.py)."""
    from realbin import Cluster
    from spinimage import BIN

    c = Cluster(BIN, 1)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def ctrl_c():
    """Python's own SIGINT handler for the test, so that
    `_thread.interrupt_main()` raises KeyboardInterrupt: a process started
    in the background of a non-interactive shell (as CI may start pytest)
    inherits SIGINT ignored, and interrupt_main() then does nothing."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
