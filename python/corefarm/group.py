"""Groups of nodes with resident buffers and MPI-style collectives
(docs/collectives.md). The names follow mpi4py: `bcast`, `scatter`,
`gather`, `allgather`, `reduce`, `allreduce`, `barrier`.

    import corefarm
    with corefarm.group("127.0.0.1:9999", nodes=4) as g:
        g.scatter("x", numpy.arange(4000, dtype=numpy.int64))  # rows to the ranks
        g.allreduce("x", "sum", op="sum")                       # among the nodes
        sums = g.gather("sum")                                  # one block per rank

Buffers live on the nodes under a name. Data given by the user (`scatter`,
`bcast` with data, `put`) and data returned to it (`gather`, `get`) go
through the server; collectives among the nodes and `run` do not.
"""

import sys as _sys
from os import fspath as _fspath

from . import _corefarm
from .errors import UsageError

__all__ = ["group", "Group", "DTYPES", "ALGORITHMS"]

DTYPES = ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f32", "f64")
"""Element types of buffers and reductions. A `dtype=` argument may also
be written as numpy writes it: "float32", numpy.float32,
numpy.dtype("<f4"), "<i2". The names here count bits ("i8" is int8) and
win over numpy's codes that count bytes (to numpy "i8" is int64; "<i8",
with a byte order, is read as numpy's)."""
ALGORITHMS = ("auto", "linear", "binomial", "star")
"""Trees a collective may run over; `auto` picks by message size (seed 003's model)."""

_NUMPY = {"int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8",
          "uint16": "u16", "uint32": "u32", "uint64": "u64", "float32": "f32", "float64": "f64"}
_SIZE = {"i8": 1, "u8": 1, "i16": 2, "u16": 2, "i32": 4, "u32": 4, "f32": 4, "i64": 8, "u64": 8, "f64": 8}


def group(address, nodes, topology="mesh", timeout=10.0, connect_timeout=30.0, name=None, model=None,
          secret=None, secret_file=None, *, tls_ca=None, tls_server_name=None, user=None):
    """Opens a group of `nodes` nodes (all or none, held until closed).

    `topology`: "mesh", "ring", "tree" or "torus:<cols>"; `timeout`: seconds
    any command may wait on a member before failing with its name.
    `model`: the latency model `algo="auto"` picks algorithms with — None:
    the file `corefarm model calibrate` wrote, if there is a valid one; a
    path: that file (ValueError if it is not a valid calibration); False:
    none (seed 003's stage count decides). `secret` / `secret_file`: the
    user secret of a server with an auth file, as for `connect` (default:
    $COREFARM_SECRET, or the file $COREFARM_SECRET_FILE). `user`: the user
    the server's auth file names with that secret, as for `connect`
    (default: $COREFARM_USER; none: the anonymous tenant); its node limit
    bounds the group and the group's node time goes to its account.

    `tls_ca` / `tls_server_name`: TLS to a server with TLS on its user port,
    as for `connect`: the PEM file of the CA that signed the server's
    certificate, and the name that certificate must carry (default: the
    host part of `address`). The group's commands and the data between the
    user and the group (`scatter`, `bcast` with data, `put`, `gather`,
    `get`) then travel encrypted. A TLS failure raises ConnectionError
    naming the cause (wrong CA, wrong name, a plain port); a plain group on
    a TLS port, the server's ServerError saying to give `tls_ca`. The
    members' peer ports speak plain TCP only, so `direct_map` on a group
    opened with `tls_ca` raises UnsupportedError rather than send the data
    unencrypted; collectives among the nodes run over the nodes' own links,
    which are plain TCP too (docs/operations.md, "TLS")."""
    path = None if model is None or model is False else _fspath(model)
    sfile = None if secret_file is None else _fspath(secret_file)
    ca = None if tls_ca is None else _fspath(tls_ca)
    raw = _corefarm.RawGroup.open(address, nodes, topology, timeout, connect_timeout, name,
                                  path, model is False, secret, sfile, tls_ca=ca,
                                  tls_server_name=tls_server_name, user=user)
    return Group(raw)


def _element_type(dtype):
    """`dtype` as one of DTYPES (None stays None): a name of DTYPES, a
    numpy name or code ("float32", "<f4"), a numpy dtype or scalar type
    (numpy.float32). UsageError for anything else, or big-endian elements."""
    if dtype is None or dtype in _SIZE:
        return dtype
    if isinstance(dtype, str) and dtype in _NUMPY:
        return _NUMPY[dtype]
    t = None
    try:
        import numpy
    except ImportError:
        numpy = None
    if numpy is not None:
        try:
            dt = numpy.dtype(dtype)
        except (TypeError, ValueError):
            dt = None
        if dt is not None:
            t = _NUMPY.get(dt.name)
            big = dt.byteorder == ">" or (dt.byteorder == "=" and _sys.byteorder != "little")
            if t is not None and big:
                raise UsageError(f"element type {dtype!r} is big-endian; the nodes hold "
                                 "little-endian elements")
    if t is None:
        raise UsageError(f"unknown element type {dtype!r}: one of {DTYPES}, or a numpy dtype "
                         "such as \"float32\" or numpy.float32")
    return t


def _typed(data, dtype):
    """(bytes-like view, element type, bytes per first-axis row) of `data`."""
    dtype = _element_type(dtype)
    if hasattr(data, "dtype") and hasattr(data, "shape"):
        t = _NUMPY.get(str(data.dtype))
        if t is None:
            raise UsageError(f"numpy arrays of {data.dtype} cannot be reduced; use one of {DTYPES}")
        if dtype is not None and dtype != t:
            raise UsageError(f"the array holds {t}, not {dtype}")
        row = data.itemsize
        for d in data.shape[1:]:
            row *= d
        import numpy
        return numpy.ascontiguousarray(data).view("u1").reshape(-1), t, row
    held = _buffer_type(data)
    if held is not None:
        # A typed buffer (array.array, a memoryview of typed memory): its
        # elements say what it holds, as a numpy array's dtype does.
        if dtype is not None and dtype != held:
            raise UsageError(f"the buffer holds {held}, not {dtype}")
        return memoryview(data).cast("B"), held, _SIZE[held]
    t = dtype or "u8"
    if t not in _SIZE:
        raise UsageError(f"unknown element type {t!r} (one of {DTYPES})")
    return data, t, _SIZE[t]


def _buffer_type(data):
    """The element type of a typed, non-numpy buffer (None for bytes and
    objects without the buffer protocol); UsageError for elements that are
    none of DTYPES (bool, big-endian, multi-dimensional or strided ones)."""
    try:
        mv = memoryview(data)
    except TypeError:
        return None
    if mv.format in ("B", "b", "c"):
        return None
    fmt = mv.format
    order, code = (fmt[0], fmt[1:]) if fmt[:1] in "@=<>!" else ("@", fmt)
    kind = {**dict.fromkeys("bhilqn", "i"), **dict.fromkeys("BHILQN", "u"),
            **dict.fromkeys("fd", "f")}.get(code)
    little = _sys.byteorder == "little" if order in "@=" else order == "<"
    t = f"{kind}{8 * mv.itemsize}" if kind else None
    if t not in _SIZE or not little or not mv.c_contiguous:
        raise UsageError(f"buffers of format {fmt!r} cannot be sent; use one of {DTYPES}")
    return t


class Group:
    """A group of nodes; use as a context manager (closes on exit)."""

    def __init__(self, raw):
        self._raw = raw
        self._dtypes = {}

    @property
    def size(self):
        """Number of members (ranks 0 … size-1)."""
        return len(self._raw.members())

    @property
    def members(self):
        """[(rank, name, peer address)] in rank order."""
        return self._raw.members()

    def _dtype(self, name, dtype):
        t = _element_type(dtype) or self._dtypes.get(name)
        if t is None:
            raise UsageError(f"the element type of buffer {name!r} is not known here: pass dtype=")
        return t

    def put(self, rank, name, data, dtype=None):
        """Creates buffer `name` on `rank` from `data`: bytes-like, a numpy array
        or a typed buffer such as array.array (whose element type it keeps)."""
        view, t, _ = _typed(data, dtype)
        self._raw.put(rank, name, t, view)
        self._dtypes[name] = t

    def get(self, rank, name):
        """Buffer `name` of `rank`, as bytes."""
        return self._raw.get(rank, name)

    def free(self, name):
        """Frees buffer `name` on every member."""
        self._raw.free(name)
        self._dtypes.pop(name, None)

    def scatter(self, name, data, dtype=None, row_bytes=None):
        """Gives each rank a contiguous block of rows of `data` as buffer
        `name` (rank order; the first rows % size ranks get one more row).
        A numpy array's rows are its first axis; for bytes or a typed buffer
        (array.array), `row_bytes` (default: one element). Returns the number
        of rows of each rank."""
        view, t, row = _typed(data, dtype)
        counts = self._raw.scatter_rows(name, t, view, row_bytes or row)
        self._dtypes[name] = t
        return counts

    def gather(self, name):
        """Every rank's buffer `name`, in rank order (a list of bytes)."""
        return self._raw.gather(name)

    # The collectives take `priority`: the class of their data on the links
    # between the members, 0 (most urgent) to 7, default 4. Each link
    # serves classes by strict priority (with an anti-starvation guard), so
    # an urgent collective's data passes a bulk one's queued before it. A
    # class over 7 raises UsageError; through a server that predates
    # classes every collective is class 4 (see `priorities`).

    def bcast(self, name, data=None, root=0, dst=None, dtype=None, algo="auto", *,
              priority=None):
        """With `data`: gives every member `data` as buffer `name` (one copy
        through the server, then a broadcast among the nodes). Without:
        broadcasts `root`'s buffer `name` into buffer `dst` (default `name`)
        of every member. `priority`: the broadcast's class (0–7, default 4)."""
        if data is not None:
            view, t, _ = _typed(data, dtype)
            self._raw.bcast_from_user(name, t, view, algo, priority=priority)
            self._dtypes[name] = t
            return
        t = self._dtype(name, dtype)
        self._raw.bcast(root, name, dst or name, t, algo, priority=priority)
        self._dtypes[dst or name] = t

    def reduce(self, src, dst, op="sum", root=0, dtype=None, algo="auto", *, priority=None):
        """Element-wise `op` ("sum", "prod", "min", "max") of every member's
        `src` into buffer `dst` of `root`. `priority`: its class (0–7, default 4)."""
        t = self._dtype(src, dtype)
        self._raw.reduce(root, src, dst, t, op, algo, priority=priority)
        self._dtypes[dst] = t

    def allreduce(self, src, dst, op="sum", dtype=None, algo="auto", *, priority=None):
        """Element-wise `op` of every member's `src` into buffer `dst` of every
        member. `priority`: its class (0–7, default 4)."""
        t = self._dtype(src, dtype)
        self._raw.allreduce(src, dst, t, op, algo, priority=priority)
        self._dtypes[dst] = t

    def allgather(self, src, dst, algo="auto", *, priority=None):
        """Every member's `src`, in rank order, into buffer `dst` of every
        member. `priority`: its class (0–7, default 4)."""
        self._raw.allgather(src, dst, algo, priority=priority)
        if src in self._dtypes:
            self._dtypes[dst] = self._dtypes[src]

    def barrier(self, algo="auto", *, priority=None):
        """Returns once every member has entered the barrier. `priority`:
        checked like any collective's; a barrier moves no data and its
        messages ride above every class anyway."""
        self._raw.barrier(algo, priority=priority)

    @property
    def priorities(self):
        """Whether the server passes a collective's `priority` on to the
        nodes (it agreed the `group-priority` feature); if not, every
        collective is class 4."""
        return self._raw.priorities()

    def configure_benchmark(self, input_size, output_size, delay_us=0):
        """Loads the benchmarking core on every member, for `run`."""
        self._raw.configure_benchmark(input_size, output_size, delay_us)

    def configure(self, input_size, output_size, cores, bitstream):
        """Loads a configuration on every member, for `run`: `cores` is a list
        of (control, input, output) base addresses (see default_core_table)."""
        self._raw.configure(input_size, output_size, list(cores), bitstream)

    def configure_image(self, image):
        """Loads a corefarm image (bytes-like or a path) on every member, for
        `run`: sizes and core table come from its manifest."""
        import os

        from . import default_core_table, read_image_manifest
        if isinstance(image, (str, os.PathLike)):
            with open(image, "rb") as f:
                image = f.read()
        m = read_image_manifest(image)
        if m is None:
            raise UsageError("not a corefarm image (no CFIMAGE magic)")
        listed = m.get("cores")
        cores = ([(c["control"], c["input"], c["output"]) for c in listed] if listed
                 else default_core_table(1, m["input_size"], m["output_size"]))
        self._raw.configure(m["input_size"], m["output_size"], cores, image)

    def run(self, input, output, operand=None):
        """Every member runs its configured cores over each input of its
        buffer `input` (followed by the whole buffer `operand`, if given);
        the outputs stay on the member as buffer `output`."""
        self._raw.run(input, output, operand)
        self._dtypes[output] = "u8"

    def direct_map(self, inputs, window=4, *, priority=None):
        """Sends each data message of `inputs` (whole inputs of the configured
        cores) straight to the members' peer ports, past the server, and
        returns the outputs in input order (a list of bytes), each exactly
        once: a member that is lost has its messages re-sent to the others.
        `priority`: the class of every message, 0 (most urgent) to 7,
        default 4; at each member they run ahead of queued messages of less
        urgent classes (a member that predates chunks ignores it).

        Each input may be any C-contiguous buffer (bytes, a numpy array of
        any dtype, array.array...): its bytes are sent, as `Client.map`
        sends them.

        The peer ports speak plain TCP only: on a group opened with
        `tls_ca`, UnsupportedError (the group goes on; send the data
        through the server with `scatter`/`run`/`gather` instead)."""
        from . import _as_bytes_view
        return self._raw.direct_map([_as_bytes_view(x) for x in inputs], window,
                                    priority=priority)

    def close(self):
        """Ends the group; its nodes go back to the server's pool. Closing a
        group that already ended (a member failed, which the call that met
        it raised) does nothing."""
        self._raw.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            self.close()
        except Exception:
            # The error leaving the block says what went wrong; the close
            # that follows it is no news.
            if exc_type is None:
                raise
        return False
