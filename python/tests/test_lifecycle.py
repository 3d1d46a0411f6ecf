"""Threads, event loops and the interpreter's end: what a client leaves
behind when it is dropped, used from several loops, or still blocked in a
daemon thread when Python exits (fake server, no corefarm binaries)."""

import asyncio
import gc
import os
import pathlib
import subprocess
import sys
import threading
import weakref

import pytest

import corefarm
import corefarm.aio
from fakeserver import FakeServer

HERE = pathlib.Path(__file__).resolve().parent


def expect_eof(p):
    """The client closed its connection (and sent nothing more): a timeout
    or a data message fails the script."""
    p.sock.settimeout(20)
    assert p.sock.recv(1) == b"", "the client sent more instead of closing"


# A daemon thread blocked in recv(), Pending.result() or the asyncio
# dispatcher's wait when the interpreter exits: CPython <= 3.13 ends a thread
# that takes the GIL back during finalization with pthread_exit, which the
# extension's panic guard used to catch, aborting the process (SIGABRT,
# "FATAL: exception not rethrown"). The gc callback makes finalization last
# longer than the blocked calls' 100 ms slices, so that each of them comes
# back while the interpreter is finalizing (the client is closed by then, as
# module teardown drops it; the sleep is the window, not synchronisation).
EXIT_SCRIPT = r"""
import gc, os, sys, threading, time
sys.path.insert(0, sys.argv[1])
import corefarm, corefarm.aio
from fakeserver import FakeServer

go = threading.Event()

def script(p):
    p.hello()
    p.configuration(credit=4)
    p.data()
    p.data()
    go.wait(60)

srv = FakeServer(script)
c = corefarm.connect(srv.addr)
c.configure_benchmark(16, 16)
c.submit(bytes(16))
threading.Thread(target=c.recv, daemon=True).start()
assert c._raw._wait_blocked_receivers(1, 20)   # blocked in recv() for sure
pending = c.submit_pending(bytes(16))
threading.Thread(target=pending.result, daemon=True).start()
completions = corefarm._corefarm.Completions()  # what corefarm.aio's dispatcher waits on
threading.Thread(target=completions.wait, daemon=True).start()

def lingering_finalization(phase, info, sys=sys, sleep=time.sleep, write=os.write):
    if phase == "start" and sys.is_finalizing():
        write(1, b"finalizing\n")
        sleep(0.3)

gc.callbacks.append(lingering_finalization)
print("exiting", flush=True)
"""


def test_daemon_threads_blocked_in_the_client_do_not_abort_interpreter_exit(tmp_path):
    script = tmp_path / "exit_while_blocked.py"
    script.write_text(EXIT_SCRIPT)
    for _ in range(2):
        proc = subprocess.run([sys.executable, str(script), str(HERE)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        assert "exiting" in proc.stdout, proc.stderr
        assert "finalizing" in proc.stdout, "finalization ran no collection: the test tests nothing"
        assert "FATAL" not in proc.stderr, proc.stderr
        assert proc.returncode == 0, (proc.returncode, proc.stderr)


def test_an_unclosed_async_client_is_collected_and_closes_its_connection():
    def script(p):
        p.hello()
        p.configuration(credit=4)
        ident, body = p.data()
        p.result(ident, body)
        expect_eof(p)

    srv = FakeServer(script)

    async def use_and_drop():
        c = await corefarm.aio.connect(srv.addr)
        await c.configure_benchmark(16, 16)
        assert (await c.run(b"x" * 16)).data == b"x" * 16
        return weakref.ref(c), c._dispatcher

    ref, dispatcher = asyncio.run(use_and_drop())
    gc.collect()
    assert ref() is None, "the AsyncClient outlives every reference to it"
    dispatcher.join(20)
    assert not dispatcher.is_alive(), "its dispatcher thread never ends"
    srv.join()


def test_an_async_client_moves_to_a_new_loop_and_refuses_a_concurrent_one():
    def script(p):
        p.hello()
        p.configuration(credit=8)
        for _ in range(2):
            ident, body = p.data()
            p.result(ident, body)
        expect_eof(p)  # the message of the refused loop never came

    srv = FakeServer(script)
    c = asyncio.run(corefarm.aio.connect(srv.addr))
    asyncio.run(c.configure_benchmark(16, 16))
    # Each asyncio.run has a loop of its own, closed when it returns.
    assert asyncio.run(c.run(b"a" * 16)).data == b"a" * 16

    async def second():
        out = await c.run(b"b" * 16)
        refused = []

        def from_another_loop():
            try:
                asyncio.run(c.submit(b"z" * 16))
            except corefarm.UsageError as e:
                refused.append(e)

        t = threading.Thread(target=from_another_loop)
        t.start()
        await asyncio.to_thread(t.join, 20)
        return out, refused

    out, refused = asyncio.run(second())
    assert out.data == b"b" * 16
    assert len(refused) == 1 and "still open" in str(refused[0])
    assert isinstance(refused[0], RuntimeError)  # what it raised before, for old handlers
    c.close()
    srv.join()


def test_ctrl_c_interrupts_a_submission_waiting_for_credit(ctrl_c):
    """A server that grants no credit must not make a submission deaf to
    Ctrl-C until its io_timeout: the wait is sliced and signals are checked
    in between, as recv's is. Nothing is sent."""
    import _thread

    def script(p):
        p.hello()
        p.configuration()  # and no credit
        expect_eof(p)

    srv = FakeServer(script)
    c = corefarm.connect(srv.addr, io_timeout=30)
    c.configure_benchmark(16, 16)

    def interrupt():
        assert c._raw._wait_credit_waiters(1, 20), "the submission never waited for credit"
        _thread.interrupt_main()

    t = threading.Thread(target=interrupt)
    t.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            c.submit(bytes(16))
    finally:
        t.join(20)
        c.close()
    srv.join()
