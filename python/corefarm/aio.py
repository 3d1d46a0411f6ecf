"""asyncio interface to corefarm, over the same Rust client.

    import corefarm.aio
    async with await corefarm.aio.connect("127.0.0.1:9999") as c:
        await c.configure_benchmark(16, 16)
        fut = await c.submit(b"x" * 16)          # sent; fut is an asyncio.Future
        out = await fut                           # its Output
        async for data in c.map(inputs, window=32):   # bytes, in input order
            ...

How it waits without blocking the event loop: each data message is sent
with `submit_pending`, so its result is routed to its own handle; the
client's reader thread signals a completion queue when a result arrives,
and one helper thread per client (waiting on that queue with the GIL
released) resolves the asyncio futures through `loop.call_soon_threadsafe`.
Sending never waits on the loop either: with credit at hand it is one
non-blocking write; without, the wait for credit runs in a worker thread
(`asyncio.to_thread`), bounded by the client's `io_timeout`. `connect`,
`configure` and `status` also run in a worker thread, bounded by the
timeouts given to `connect`.
"""

import asyncio as _asyncio
import collections as _collections
import itertools as _itertools
import threading as _threading
import weakref as _weakref

from . import Client as _Client
from . import _corefarm, _map_result_type, connect as _connect_blocking
from .errors import InputError as _InputError
from .errors import ServerError as _ServerError
from .errors import UsageError as _UsageError

__all__ = ["connect", "AsyncClient"]


async def connect(addr="127.0.0.1:9999", nodes=None, timeout=10.0, *, legacy=False,
                  name=None, io_timeout=None, secret=None, secret_file=None, tls_ca=None,
                  tls_server_name=None, chunks=False, chunk_size=None, reconnect_timeout=30.0,
                  user=None):
    """Like `corefarm.connect`, awaitable; returns an AsyncClient."""
    client = await _asyncio.to_thread(_connect_blocking, addr, nodes, timeout, legacy=legacy,
                                      name=name, io_timeout=io_timeout, secret=secret,
                                      secret_file=secret_file, tls_ca=tls_ca,
                                      tls_server_name=tls_server_name, chunks=chunks,
                                      chunk_size=chunk_size,
                                      reconnect_timeout=reconnect_timeout, user=user)
    return AsyncClient(client)


class AsyncClient:
    """An asyncio view of a `corefarm.Client`, bound to the running event
    loop on first use (and to a new one once that loop is closed, so that
    successive `asyncio.run` calls may share it; using it from another loop
    while the first still runs raises UsageError before anything is sent).
    The blocking client stays usable from threads (`.client`); results are
    routed by id, so they do not mix. An AsyncClient that is garbage
    collected unclosed closes its connection, like a `Client`."""

    def __init__(self, client):
        if not isinstance(client, _Client):
            raise TypeError("AsyncClient wraps a corefarm.Client (use corefarm.aio.connect)")
        self.client = client
        """The blocking `corefarm.Client` underneath (usable from other threads)."""
        self._raw = client._raw
        self._loop = None
        self._completions = None
        self._dispatcher = None
        self._waiting = {}       # token -> (future, Pending)
        self._tokens = _itertools.count()
        self._lock = _threading.Lock()

    # -- configuration, status ---------------------------------------------
    async def configure(self, image, input_size=None, output_size=None, cores=None):
        """See Client.configure."""
        await _asyncio.to_thread(self.client.configure, image, input_size, output_size, cores)

    async def configure_benchmark(self, input_size, output_size, delay_us=0):
        """See Client.configure_benchmark."""
        await _asyncio.to_thread(self.client.configure_benchmark, input_size, output_size,
                                 delay_us)

    async def status(self):
        """See Client.status."""
        return await _asyncio.to_thread(self.client.status)

    async def recv_notification(self, timeout=None):
        """See Client.recv_notification: the oldest handler notification
        (a Notification) or None after `timeout` s or once the connection
        has ended. Waits in a worker thread, so the event loop runs on."""
        return await _asyncio.to_thread(self.client.recv_notification, timeout)

    # -- data ----------------------------------------------------------------
    async def submit(self, data, *, priority=None):
        """Sends one data message (waiting for credit without blocking the
        loop) and returns an asyncio.Future of its Output. The future raises
        ServerError for this message, ConnectionError if the connection
        ends first. The buffer is copied (or, for bytes, kept) before this
        returns, so it may be reused at once. Numpy arrays are checked
        against the image's input type as `Client.submit` does (InputError
        before anything is sent). `priority`: as in `Client.submit`."""
        view, _ = self.client._prepare(data)
        return await self._send(view, priority)

    async def _send(self, view, priority=None):
        return (await self._send_pending(view, priority))[0]

    async def _send_pending(self, view, priority=None):
        """(future of the result, id of the data message)."""
        self._bind()  # before sending: a message sent from a wrong loop would be lost
        pending = self._raw.try_submit_pending(view, priority=priority)
        if pending is None:
            pending = await _asyncio.to_thread(
                lambda: self._raw.submit_pending(view, priority=priority))
        return self._watch(pending), pending.id

    async def run(self, data, *, priority=None):
        """Sends one data message and returns its Output."""
        return await (await self.submit(data, priority=priority))

    def map(self, inputs, window=64, raw=False, *, priority=None, return_exceptions=False,
            result_type=None):
        """Async iterator of the result of each input, in input order, with
        at most `window` data messages in flight. `inputs` may be an
        iterable or an async iterable. Results are typed as in
        `Client.map`: numpy arrays of the image's output type when it
        records one and `raw` is false, else bytes; a handler set's
        results as the type it declares, and every result as
        `result_type` when it is given.

        Failures are as in `Client.map`: the failure of one input is raised
        when its turn comes and the iterator goes on with the next input
        (`return_exceptions=True` yields it in its place instead); a failure
        of the session raises and ends it. Stopping early (`aclose()`, or
        leaving an `async for` with break) abandons the rest."""
        if window < 1:
            raise ValueError("window must be at least 1")
        client = self.client
        typed = not raw and client._types[1] is not None and not client._types[1].is_bytes
        if typed:
            client._types[1].numpy_dtype()  # no numpy: say so before sending anything
        results = client._map_results(raw, result_type)
        return _AsyncMap(self, inputs, window, typed, priority, return_exceptions, results)

    # -- plumbing ------------------------------------------------------------
    def _bind(self):
        """The running loop, after binding this client to it: the first
        loop that uses it, or a new one once that loop is closed (whose
        futures nobody can await any more). UsageError for another loop
        while the bound one is open."""
        loop = _asyncio.get_running_loop()
        with self._lock:
            if self._loop is loop:
                return loop
            if self._loop is not None and not self._loop.is_closed():
                raise _UsageError(
                    "this AsyncClient is bound to the event loop that first used it, which is "
                    "still open; use one AsyncClient per loop (corefarm.aio.AsyncClient(client) "
                    "wraps the same connection again)")
            old, self._completions = self._completions, _corefarm.Completions()
            self._loop, self._waiting = loop, {}
            # The dispatcher holds this client weakly, and the completion
            # queue is closed when the client goes: an AsyncClient dropped
            # unclosed is collected (closing its connection) and its thread
            # ends, instead of both living as long as the process.
            _weakref.finalize(self, self._completions.close)
            self._dispatcher = _threading.Thread(
                target=AsyncClient._dispatch,
                args=(_weakref.ref(self), loop, self._completions),
                name="corefarm-aio", daemon=True)
            self._dispatcher.start()
        if old is not None:
            old.close()  # the closed loop's dispatcher ends
        return loop

    def _watch(self, pending):
        loop = self._bind()
        with self._lock:
            token = next(self._tokens)
            fut = loop.create_future()
            self._waiting[token] = (fut, pending)
            completions = self._completions
        pending.notify(completions, token)
        return fut

    @staticmethod
    def _dispatch(client_ref, loop, completions):
        # A plain thread, not the loop's executor: it waits as long as the
        # client lives, so it must not take one of the executor's workers.
        while True:
            tokens = completions.wait()
            if tokens is None:
                return
            if tokens:
                client = client_ref()
                if client is None:  # collected: nobody is waiting
                    return
                try:
                    loop.call_soon_threadsafe(client._resolve, tokens)
                except RuntimeError:  # the loop is closed: nobody is waiting
                    return
                del client

    def _resolve(self, tokens):
        for token in tokens:
            with self._lock:
                fut, pending = self._waiting.pop(token, (None, None))
            if fut is None or fut.done():
                continue
            try:
                fut.set_result(pending.result(0))
            except Exception as e:  # the server's or the connection's error
                fut.set_exception(e)

    def close(self):
        """Closes the connection; awaited results raise ConnectionError."""
        self.client.close()
        with self._lock:
            completions = self._completions
        if completions is not None:
            # The results the close failed were queued before this: the
            # dispatcher passes them on before it sees the queue closed.
            completions.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return f"<corefarm.aio.AsyncClient {self.client.addr}>"


def _retrieve(fut):
    """Marks a finished future's exception as retrieved: a map abandoned
    early leaves its results unread, which is no error worth a log line."""
    if not fut.cancelled():
        fut.exception()


class _AsyncMap:
    """What `AsyncClient.map` returns: an async iterator over the results
    in input order that a failure of one input does not end."""

    def __init__(self, aclient, inputs, window, typed, priority, return_exceptions, results):
        self._aclient = aclient
        self._window = window
        self._typed = typed
        self._results = results  # as in _MapIterator
        self._priority = priority
        # As for the blocking map: a priority refused for every input ends it.
        self._class_ok = priority is None or (
            0 <= priority <= 7 and (priority == 4 or aclient.client.chunk_size is not None))
        self._return_exceptions = return_exceptions
        if hasattr(inputs, "__aiter__"):
            self._async_source, self._source = inputs.__aiter__(), None
        else:
            self._async_source, self._source = None, iter(inputs)
        # In input order: (future, (message id, result form)), or (None,
        # (exception, ends the map)) for an input that was not sent.
        self._in_flight = _collections.deque()
        self._exhausted = False

    def __aiter__(self):
        return self

    async def _next_input(self):
        if self._async_source is not None:
            try:
                return True, await self._async_source.__anext__()
            except StopAsyncIteration:
                return False, None
        try:
            return True, next(self._source)
        except StopIteration:
            return False, None

    async def _fill(self):
        client = self._aclient.client
        while not self._exhausted and len(self._in_flight) < self._window:
            try:
                more, item = await self._next_input()
            except Exception as e:
                # The inputs' own iterator failed: raised after the results
                # of the inputs it gave, and nothing more is sent.
                self._exhausted = True
                self._in_flight.append((None, (e, True)))
                return
            if not more:
                self._exhausted = True
                return
            try:
                view, batch = client._prepare(item)
                rtype = _map_result_type(client, view, self._results)
                fut, ident = await self._aclient._send_pending(view, self._priority)
            except _InputError as e:
                # This input's result, in its place (see _MapIterator).
                self._exhausted = not self._class_ok
                self._in_flight.append((None, (e, not self._class_ok)))
                continue
            fut.add_done_callback(_retrieve)
            self._in_flight.append((fut, (ident, (batch, rtype))))

    def _end(self):
        self._exhausted = True
        for fut, _ in self._in_flight:
            if fut is not None:
                fut.cancel()
        self._in_flight.clear()

    async def __anext__(self):
        try:
            await self._fill()
        except BaseException:
            self._end()
            raise
        if not self._in_flight:
            raise StopAsyncIteration
        fut, form = self._in_flight[0]
        if fut is None:
            self._in_flight.popleft()
            failure, ends = form
            if ends:
                self._end()
                raise failure
        else:
            try:
                out = await fut
            except _ServerError as e:
                self._in_flight.popleft()
                if e.id != form[0]:  # the whole session's error, not this input's
                    self._end()
                    raise
                failure = e
            except BaseException:
                self._end()
                raise
            else:
                self._in_flight.popleft()
                client = self._aclient.client
                batch, rtype = form[1]
                return client._result(out.data, batch, rtype, self._typed)
        if self._return_exceptions:
            return failure
        raise failure

    async def aclose(self):
        """Stops the map: results still in flight are abandoned."""
        self._end()
