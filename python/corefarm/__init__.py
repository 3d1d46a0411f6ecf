"""corefarm: stream data through a farm of hardware-core nodes.

    import corefarm
    with corefarm.connect("127.0.0.1:9999") as c:
        c.configure("matmul.cfimg")          # or configure_benchmark(...)
        for out in c.map(inputs, window=32):   # results in input order
            ...

The heavy lifting (sockets, framing, credit) is the Rust client in
`corefarm._corefarm`; blocking calls release the GIL. One `Client` may be
used from many threads; `corefarm.aio` is the asyncio interface.
"""

import collections as _collections
import json as _json
import math as _math
import operator as _operator
import os as _os
import shutil as _shutil
import struct as _struct
import subprocess as _subprocess
import sys as _sys
import tempfile as _tempfile
import warnings as _warnings

from . import _corefarm
from .errors import (
    ERROR_CODES,
    ConfigurationError,
    ConnectionError,
    Error,
    GroupError,
    GroupTimeoutError,
    ImageError,
    InputError,
    ProtocolError,
    ServerError,
    ServerLostError,
    TimeoutError,
    UnsupportedError,
    UsageError,
)

__all__ = [
    "connect", "Client", "Output", "Pending", "Notification", "read_image_manifest", "default_core_table",
    "build_image", "inspect_image", "ImageError",
    "Error", "ConnectionError", "ConfigurationError", "TimeoutError", "ServerError",
    "ServerLostError", "ProtocolError", "InputError", "UsageError", "UnsupportedError", "ERROR_CODES",
    "DEFAULT_PORT", "group", "Group", "GroupError", "GroupTimeoutError",
]

DEFAULT_PORT = 9999
"""The server's user port when an address gives none (`corefarm local` and `corefarm server` listen there)."""
# Bound here too so that the API reference shows its docstring (pdoc reads
# a variable's docstring from the module that assigns it).
ERROR_CODES = ERROR_CODES
"""Names of the server's error codes by number (docs/protocol.md, type 0x11)."""
from .group import Group, group  # noqa: E402  (after the errors it raises)

Output = _corefarm.Output
Pending = _corefarm.Pending
Notification = _collections.namedtuple("Notification", "id set data")
Notification.__doc__ = """A streaming handler's notification (`Client.recv_notification`):
the data message's `id`, the handler `set`'s index, the `data` bytes."""
_IMAGE_MAGIC = b"CFIMAGE\0"


def default_core_table(cores, input_size, output_size):
    """The documented default core table: a list of (control, input, output)."""
    return _corefarm.default_core_table(cores, input_size, output_size)


def read_image_manifest(image):
    """The JSON manifest of a corefarm image (bytes), or None for raw bytes."""
    if bytes(image[:8]) != _IMAGE_MAGIC or len(image) < 16:
        return None
    _version, length = _struct.unpack_from("<II", image, 8)
    if 16 + length > len(image):
        raise ConfigurationError(f"image manifest of {length} bytes runs past the end of the image")
    try:
        return _json.loads(bytes(image[16:16 + length]).decode("utf-8"))
    except ValueError as e:
        raise ConfigurationError(f"image manifest is not valid JSON: {e}") from None


def _corefarm_command():
    """Path of the `corefarm` command: $COREFARM_BIN, else the one on PATH."""
    env = _os.environ.get("COREFARM_BIN")
    if env:
        if _os.path.isfile(env) and _os.access(env, _os.X_OK):
            return env
        raise ImageError(f"COREFARM_BIN={env!r} is not an executable file")
    found = _shutil.which("corefarm")
    if found is None:
        raise ImageError(
            "building an image runs the `corefarm` command, which is not on PATH; "
            "install it (cargo build --release -p corefarm-cli) and put it on PATH "
            "or set COREFARM_BIN to its path")
    return found


def build_image(*, input_size=None, output_size=None, cores=1, name=None, hls=None, entry=None,
                verilog=None, top=None, rbf=None, core_table=None, out=None,
                input_type=None, output_type=None, strict=False):
    """Builds a configuration image by running `corefarm image build`.

    `hls` + `entry`: an HLS-style C/C++ component compiled for this CPU;
    `verilog` (a path or a list of paths) + `top`: Verilog simulated by
    Verilator; `rbf`: a Cyclone V bitstream. Several may be combined. Returns
    the image bytes, and writes them to `out` if given.

    Sizes come from the sources (the HLS memory arguments, the Verilog top
    module's INPUT_SIZE/OUTPUT_SIZE parameters); `input_size`/`output_size`
    are needed only where no source states them and must agree otherwise.
    `input_type`/`output_type` ("int16[4127]", "int32[64,64]") record the
    element type and shape, which `Client` then checks arrays against.
    Verilator's warnings become Python warnings (UserWarning); `strict=True`
    makes them errors.

    The compilers are driven by the `corefarm` command ($COREFARM_BIN, else
    PATH), so this module carries no build toolchain; a missing command or a
    failed build raises ImageError with the reason."""
    if (hls is None) != (entry is None):
        raise ValueError("hls= and entry= go together")
    if (verilog is None) != (top is None):
        raise ValueError("verilog= and top= go together")
    if hls is None and verilog is None and rbf is None:
        raise ValueError("nothing to build: give hls=, verilog= or rbf=")
    if isinstance(verilog, (str, _os.PathLike)):
        verilog = [verilog]
    if verilog is not None and not verilog:
        raise ValueError("verilog= lists no sources")
    name = name or entry or top or "image"
    args = ["image", "build", f"--name={name}"]
    if input_size is not None:
        args.append(f"--input-size={_operator.index(input_size)}")
    if output_size is not None:
        args.append(f"--output-size={_operator.index(output_size)}")
    if input_type is not None:
        args.append(f"--input-type={input_type}")
    if output_type is not None:
        args.append(f"--output-type={output_type}")
    if strict:
        args.append("--strict")
    if hls is not None:
        args += [f"--hls={_os.fspath(hls)}", f"--entry={entry}"]
    if verilog is not None:
        args += [f"--verilog={_os.fspath(v)}" for v in verilog] + [f"--top={top}"]
    if rbf is not None:
        args.append(f"--rbf={_os.fspath(rbf)}")
    if core_table is not None:
        table = ",".join(":".join(str(_operator.index(a)) for a in tuple(c)) for c in core_table)
        args.append(f"--core-table={table}")
    else:
        args.append(f"--cores={_operator.index(cores)}")
    command = _corefarm_command()
    with _tempfile.TemporaryDirectory(prefix="corefarm-image-") as d:
        path = _os.path.join(d, "image.cfimg")
        try:
            proc = _subprocess.run([command, *args, f"--output={path}"], stdin=_subprocess.DEVNULL,
                                  stdout=_subprocess.PIPE, stderr=_subprocess.PIPE, text=True)
        except OSError as e:
            raise ImageError(f"cannot run {command}: {e}") from None
        if proc.returncode != 0:
            message = proc.stderr.strip()
            if message.startswith("error: "):
                message = message[len("error: "):]
            raise ImageError(f"corefarm image build failed: {message}")
        with open(path, "rb") as f:
            image = f.read()
    for w in _build_warnings(proc.stderr):
        _warnings.warn(w, UserWarning, stacklevel=2)
    if out is not None:
        with open(out, "wb") as f:
            f.write(image)
    return image


def _build_warnings(stderr):
    """Verilator's `%Warning-…` blocks (first line and indented context) and
    the builder's `warning: …` lines from `corefarm image build`."""
    found = []
    inside = False
    for line in stderr.splitlines():
        if line.startswith("%Warning") or line.startswith("warning: "):
            found.append(line)
            inside = line.startswith("%Warning")
        elif inside and line[:1].isspace():
            found[-1] += "\n" + line
        else:
            inside = False
    return found


# numpy's name of each manifest element type, little-endian as images are.
_DTYPES = {
    "int8": "<i1", "int16": "<i2", "int32": "<i4", "int64": "<i8",
    "uint8": "<u1", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8",
    "float32": "<f4", "float64": "<f8",
}


# Kind of each struct/buffer format code: (i)nteger, (u)nsigned, (f)loat;
# sizes come from the buffer's itemsize ('l' is 4 or 8 bytes by platform).
_BUFFER_KINDS = {**dict.fromkeys("bhilqn", "i"), **dict.fromkeys("BHILQN", "u"),
                 **dict.fromkeys("efd", "f")}


class _Type:
    """Element type and shape of one input or output, from a manifest; or
    of a streaming handler's results. `shape` None: an element type alone
    (`result_type="int64"`), whose results are 1-D arrays of any length."""

    def __init__(self, spec):
        self.name = spec["dtype"]
        shape = spec["shape"]
        self.shape = None if shape is None else tuple(int(d) for d in shape)
        self.spec = self.name if shape is None else f"{self.name}[{','.join(map(str, self.shape))}]"
        # A byte memory (`uint8_t *in`, recorded as uint8[N]): takes bytes
        # and any array of 1-byte integers as bytes, and its results are
        # bytes, as for a memory of no recorded type. A shaped uint8 type
        # (--input-type uint8[480,640]) is an array type like the others.
        self.is_bytes = self.name == "uint8" and shape is not None and len(self.shape) == 1

    @classmethod
    def parse(cls, spec):
        """The _Type a caller names for results (`result_type=`): a type
        spec as `corefarm image build --output-type` takes it
        ("int64[1]", parsed by the same Rust parser), an element type alone
        ("int64", or what numpy.dtype takes: "<i8", numpy.int64), or an
        existing _Type. InputError says what is accepted."""
        if isinstance(spec, cls):
            return spec
        if isinstance(spec, str) and "[" in spec:
            try:
                name, shape = _corefarm.parse_type(spec)
            except ValueError as e:
                raise InputError(f"result_type: {e}") from None
            return cls({"dtype": name, "shape": shape})
        if isinstance(spec, str) and spec in _DTYPES:
            return cls({"dtype": spec, "shape": None})
        try:
            import numpy
            d = numpy.dtype(spec)
        except Exception:  # no numpy, or not a type numpy knows
            d = None
        names = {numpy.dtype(v): k for k, v in _DTYPES.items()} if d is not None else {}
        if d in names:
            return cls({"dtype": names[d], "shape": None})
        raise InputError(
            f"result_type {spec!r} is not a type like int64[1] or float32[64,64] (as "
            f"--output-type takes it) nor an element type: one of {', '.join(_DTYPES)}, "
            "little-endian")

    @classmethod
    def from_manifest(cls, spec):
        """A _Type, or None for a missing or unusable entry (nodes, which
        validate manifests, refuse an image whose types do not fit)."""
        try:
            if spec["dtype"] in _DTYPES and all(int(d) >= 1 for d in spec["shape"]) and spec["shape"]:
                return cls(spec)
        except (KeyError, TypeError, ValueError):
            pass
        return None

    def check_buffer(self, mv, image):
        """InputError unless typed buffer `mv` (a memoryview of an
        array.array, ctypes array... whose format is not bytes) holds
        elements of this type: an `array('i')` is never sent as int16
        inputs because its byte count happens to fit. Its length is left to
        the whole-inputs check; a flat buffer may hold several inputs."""
        fmt = mv.format
        order, code = (fmt[0], fmt[1:]) if fmt[:1] in "@=<>!" else ("@", fmt)
        kind = _BUFFER_KINDS.get(code)
        little = _sys.byteorder == "little" if order in "@=" else order == "<"
        want = _DTYPES[self.name]
        if self.is_bytes and kind in ("i", "u") and mv.itemsize == 1:
            return
        if kind is None or not little or (kind, mv.itemsize) != (want[1], int(want[2])):
            raise InputError(
                f"input buffer holds elements of format {fmt!r} ({mv.itemsize} bytes) but image "
                f"{image!r} takes {self.spec} inputs; pass {self.name} elements, or "
                "memoryview(x).cast('B') to send its bytes as they are")

    def numpy_dtype(self):
        try:
            import numpy
        except ImportError:
            raise UsageError(
                f"this image's results are typed ({self.spec}); install numpy, or pass raw=True "
                "to get bytes") from None
        return numpy.dtype(_DTYPES[self.name])

    def check(self, a, image):
        """Number of inputs in array `a` (None: exactly one, no batch axis;
        0: bytes, for a byte memory), or InputError saying what the image
        takes."""
        takes = f"image {image!r} takes {self.spec} inputs"
        want = self.numpy_dtype()
        one_byte = a.dtype.kind in "iu" and a.dtype.itemsize == 1
        if a.dtype != want:
            if self.is_bytes and one_byte:
                return 0
            shown = a.dtype.str if a.dtype.byteorder == '>' else a.dtype
            # Sent as it is, the array's bytes would be taken for other
            # values (an int32 array as four byte inputs): say how to ask.
            raw = "a.view(numpy.uint8)" if self.is_bytes else "memoryview(a).cast('B')"
            raise InputError(
                f"input array has dtype {shown} but {takes}; convert it with "
                f".astype(numpy.dtype({_DTYPES[self.name]!r})), or pass {raw} to send its "
                "bytes as they are")
        shape = tuple(a.shape)
        if shape == self.shape:
            batch = None
        elif len(shape) == len(self.shape) + 1 and shape[1:] == self.shape and shape[0] >= 1:
            batch = shape[0]
        elif self.is_bytes:
            return 0
        else:
            k = ", ".join(["k", *map(str, self.shape)])
            raise InputError(
                f"input array has shape {shape} but {takes}: pass shape {self.shape} for one "
                f"input or ({k}) for k inputs")
        if not a.flags.c_contiguous:
            raise InputError(f"input array is not C-contiguous (use numpy.ascontiguousarray); {takes}")
        return batch

    def array(self, data, batch, inputs=None):
        """`data` (k outputs' bytes) as a read-only array: shape `self.shape`
        for one input without a batch axis (`batch` None), else
        (k, *self.shape). A result of another length than `inputs` outputs
        (a streaming handler's: what its handlers emitted, docs/streams.md)
        has no such shape: it comes back as a read-only 1-D array of the
        element type when its length is a multiple of the element's size,
        else as the raw bytes."""
        import numpy
        dtype = self.numpy_dtype()
        whole = dtype.itemsize * _math.prod(self.shape)
        n = len(data)
        shaped = n == whole if batch is None else n % whole == 0
        if shaped and (inputs is None or n == inputs * whole):
            flat = numpy.frombuffer(data, dtype=dtype)
            return flat.reshape(self.shape if batch is None else (-1, *self.shape))
        if n % dtype.itemsize == 0:
            return numpy.frombuffer(data, dtype=dtype)
        return bytes(data)

    def result(self, data):
        """A streaming handler's result read as this type (its set's
        `result_type`, or `result_type=`): exactly one value of the type is
        shaped as the type; any other length is a read-only 1-D array of the
        element type (a set that emits a varying number of values, like
        `filter`), or the bytes if it is no whole number of elements. A 1-D
        uint8 type means bytes, as for a byte memory."""
        if self.is_bytes:
            return bytes(data)
        if self.shape is None:
            import numpy
            dtype = self.numpy_dtype()
            return numpy.frombuffer(data, dtype=dtype) if len(data) % dtype.itemsize == 0 \
                else bytes(data)
        return self.array(data, None)


def _result_types(handler_sets):
    """What `Client._result_types` holds for a manifest's handler sets, or
    None when none declares a result type. ImageError for a set whose
    declaration is not valid (the node would refuse the image too)."""
    if not handler_sets or not any(isinstance(h, dict) and h.get("result_type") is not None
                                   for h in handler_sets):
        return None
    matcher = _corefarm.result_types(_json.dumps(handler_sets))
    if matcher is None:
        return None
    types = [None if t is None else _Type({"dtype": t[0], "shape": t[1]})
             for t in matcher.declared()]
    names = {h["name"]: t.spec for h, t in zip(handler_sets, types) if t is not None}
    return matcher, types, names


def _map_result_type(client, view, results):
    """The _Type of one map result (see _MapIterator): the call's own, the
    handler set's, or None."""
    if results is None:
        return None
    return client._result_type(view, None if results is True else results)


def _is_array(data):
    return hasattr(data, "dtype") and hasattr(data, "shape") and hasattr(data, "flags")


def inspect_image(image):
    """The manifest of an image (bytes or a path) as a dict, with each
    artifact's `checksum_ok` (and `checksum_error` when it fails), and
    `signature`: None for an unsigned image, else {"key": hex Ed25519
    public key, "valid": bool, "error": reason or None}
    (`corefarm image sign`, docs/operations.md)."""
    if isinstance(image, (str, _os.PathLike)):
        with open(image, "rb") as f:
            image = f.read()
    manifest, checks, signature = _corefarm.inspect_image(bytes(image))
    m = _json.loads(manifest)
    m["signature"] = None if signature is None else _json.loads(signature)
    for a, err in zip(m.get("artifacts", []), checks):
        a["checksum_ok"] = err is None
        if err is not None:
            a["checksum_error"] = err
    return m


def _as_bytes_view(data):
    """A C-contiguous unsigned-byte view of any buffer (bytes, bytearray,
    memoryview, numpy array...) without copying. The extension then sends
    `bytes` from their memory and copies anything else (see Client.submit)."""
    if isinstance(data, (bytes, bytearray)):
        return data
    try:
        mv = memoryview(data)
    except TypeError:
        raise TypeError(f"data must support the buffer protocol, not {type(data).__name__}") from None
    if not mv.c_contiguous:
        raise InputError("data must be C-contiguous (use numpy.ascontiguousarray)")
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


def connect(addr=f"127.0.0.1:{DEFAULT_PORT}", nodes=None, timeout=10.0, *, legacy=False,
            name=None, io_timeout=None, secret=None, secret_file=None, tls_ca=None,
            tls_server_name=None, chunks=False, chunk_size=None, reconnect_timeout=30.0,
            user=None):
    """Connects to a corefarm server.

    addr: "host:port" (port defaults to 9999), or several servers as a list
    of such strings or one comma-separated string: the first that answers
    is used, the others are where the session goes if that one is lost.
    reconnect_timeout: seconds to try to resume the session after its
    server connection broke (None: never). Resuming reconnects with
    back-off, to the next address of the list, authenticates and
    configures again, and sends every input not yet answered again: `map`,
    `recv` and `Pending` callers see each result once, `map` in input
    order. Past the limit, every waiting call raises ServerLostError, whose
    `unanswered` says how many data messages never got their result.
    Legacy (seed-format) sessions are never resumed; groups are not either.
    nodes: how many nodes to ask
    for (None: all free ones). timeout: seconds for connecting and the hello
    exchange; also the default io_timeout (configuration and credit waits).
    legacy: skip the hello exchange (seed-only behaviour).
    secret / secret_file: the user secret of a server with an auth file
    (docs/operations.md); without either, $COREFARM_SECRET or the file named
    by $COREFARM_SECRET_FILE is used when set. The secret never travels: the
    client answers the server's challenge with an HMAC of it.
    user: the user (tenant) to act for, a `[users.<name>]` of the server's
    auth file; the secret is then that user's own. Default: $COREFARM_USER
    when set, else the anonymous tenant (the shared user secret). The
    server keeps each user's share, limits and account by this name.
    tls_ca: path of the PEM file of the CA that signed the server's
    certificate, for a server with TLS on its user port (`--tls-cert`);
    tls_server_name: the name that certificate must carry (default: the
    host part of addr). A TLS failure raises ConnectionError naming the
    cause (wrong CA, wrong name, a plain port). `group()` takes the same two.
    chunks: ask for the `chunks` feature (docs/streams.md): large messages
    and messages with a `priority` travel as chunks, a more urgent
    message's chunks between a bulk one's, and results come back the same
    way; chunk_size: the largest chunk to ask for (default 128 KiB, at most
    1 MiB: larger chunks cost bulk messages less, urgent ones more). Without
    chunks every message is priority 4: a `priority=` other than 4 raises
    InputError saying to connect with chunks=True.
    """
    addr = _addresses(addr)
    if io_timeout is None:
        io_timeout = timeout
    return Client(_corefarm.Client(addr, legacy=legacy, nodes=nodes, name=name,
                                   connect_timeout=timeout, io_timeout=io_timeout,
                                   secret=secret, secret_file=secret_file, tls_ca=tls_ca,
                                   tls_server_name=tls_server_name, chunks=chunks,
                                   chunk_size=chunk_size, reconnect_timeout=reconnect_timeout,
                                   user=user))


def _addresses(addr):
    """"host[:port]", a list of them or a comma-separated string, as the
    comma-separated "host:port" list the client takes."""
    parts = addr.split(",") if isinstance(addr, str) else list(addr)
    parts = [a.strip() for a in parts if a.strip()]
    if not parts:
        raise ValueError(f"no server address in {addr!r}")
    return ",".join(a if ":" in a else f"{a}:{DEFAULT_PORT}" for a in parts)


class Client:
    """A connection to a corefarm server; use `connect()` to make one.
    Usable as a context manager (closes on exit).

    Any number of threads may use one client at once: every blocking call
    releases the GIL, and results are routed by id to whoever waits for
    them. `map()` and `submit_pending()` get their own results only;
    `recv()` returns the results of plain `submit()` calls, in arrival
    order, to whichever thread asks (one thread submitting and another
    receiving works). `recv()` raises UsageError instead of waiting forever
    when no plain submission is outstanding but `map()`/`Pending` ones are.

    Data buffers: `bytes` are written to the socket straight from their
    memory; any other buffer (bytearray, memoryview, numpy array) is copied
    once, with the GIL held, before the GIL is released. So the caller may
    reuse or modify a buffer as soon as `submit` returns, and another thread
    writing to it meanwhile cannot change what is sent."""

    def __init__(self, raw):
        self._raw = raw
        self._image = None          # name of the configured image
        self._types = (None, None)  # _Type of one input / output, if the image says
        # The image's handler sets that declare result types: (matcher, a
        # _Type or None per set, {set name: spec}), else None.
        self._result_types = None

    # -- configuration -------------------------------------------------
    def configure(self, image, input_size=None, output_size=None, cores=None):
        """Configures the nodes with an image (bytes-like or a path).

        Sizes and the core table default to the image manifest's; `cores`
        may be a number of cores (default table) or a list of
        (control, input, output) base addresses. Bytes that are not a
        corefarm image are sent as a raw Cyclone V bitstream, which needs
        `input_size` and `output_size`.

        When the manifest records element types and shapes (`types`),
        numpy arrays given to `submit`/`map` are checked against them and
        `map` yields typed arrays. When its handler sets declare result
        types (`result_types`), `map` types each message's result by the
        set its first words select (docs/streams.md); a set's result type
        that is not a valid type raises ImageError naming the set, before
        anything is sent.
        """
        what = "this buffer"
        if isinstance(image, (str, _os.PathLike)):
            what = _os.fspath(image)
            with open(image, "rb") as f:
                image = f.read()
        image = _as_bytes_view(image)
        manifest = read_image_manifest(image)
        if manifest is None and (input_size is None or output_size is None):
            raise ConfigurationError(
                f"{what} is not a corefarm image (no CFIMAGE magic); to send a raw Cyclone V "
                "bitstream, give input_size= and output_size=")
        manifest = manifest or {}
        input_size = input_size if input_size is not None else manifest.get("input_size")
        output_size = output_size if output_size is not None else manifest.get("output_size")
        if input_size is None or output_size is None:
            raise ConfigurationError(f"the manifest of {what} has no input_size/output_size")
        if cores is None:
            listed = manifest.get("cores")
            cores = [(c["control"], c["input"], c["output"]) for c in listed] if listed else 1
        if isinstance(cores, int):
            cores = default_core_table(cores, input_size, output_size)
        else:
            cores = [tuple(c[k] for k in ("control", "input", "output")) if isinstance(c, dict) else tuple(c)
                     for c in cores]
        result_types = _result_types(manifest.get("handler_sets"))
        self._image, self._types, self._result_types = None, (None, None), None
        self._raw.configure(input_size, output_size, cores, image)
        self._image = manifest.get("name", what)
        self._result_types = result_types
        # Types describe the manifest's sizes; other sizes make them moot.
        if (input_size, output_size) == (manifest.get("input_size"), manifest.get("output_size")):
            self._types = tuple(_Type.from_manifest(manifest.get(k))
                                for k in ("input_type", "output_type"))

    def configure_benchmark(self, input_size, output_size, delay_us=0):
        """Sends the benchmarking configuration: nodes answer each input with
        output_size bytes after delay_us, echoing the input's first 16 bytes."""
        self._image, self._types, self._result_types = None, (None, None), None
        self._raw.configure_benchmark(input_size, output_size, delay_us)

    @property
    def types(self):
        """(input type, output type) of the configured image, e.g.
        ("int32[514]", "int32[256]"); None where the image records none."""
        return tuple(t.spec if t else None for t in self._types)

    @property
    def result_types(self):
        """The result type each handler set of the configured image
        declares, by set name, e.g. {"sum": "int64[1]", "histogram":
        "uint64[256]"} (sets that declare none are left out); {} without
        any (docs/streams.md)."""
        return dict(self._result_types[2]) if self._result_types else {}

    def _result_type(self, view, override=None):
        """The _Type that a message's result is read as: `override` (a
        _Type), else the one its handler set declares, None when no set
        that declares one takes the message (the image's output type then
        applies). The set is found with the node's own matching."""
        if override is not None:
            return override
        if self._result_types is None:
            return None
        matcher, types, _ = self._result_types
        i = matcher.select(view)
        return None if i is None else types[i]

    def _result(self, data, form, rtype, typed):
        """One result of a map: read as `rtype` if given, else as the
        image's output type when `typed`, else the bytes."""
        if rtype is not None:
            return rtype.result(data)
        return self._array(data, form) if typed else data

    def _prepare(self, data, types=None, sizes=None):
        """The bytes view to send, and how its result is shaped (`_array`):
        (batch, inputs), batch None for one typed input without a batch
        axis, k for an array of k inputs, 0 for bytes; inputs the number of
        inputs the message holds (None if unknown). `types`/`sizes`: the
        configured image's unless given."""
        t = (types or self._types)[0]
        if t is not None and _is_array(data):
            batch = t.check(data, self._image)  # before the view: its errors name the type
            if batch != 0:
                return _as_bytes_view(data), (batch, 1 if batch is None else batch)
        elif t is not None and not isinstance(data, (bytes, bytearray)):
            try:
                mv = memoryview(data)
            except TypeError:
                mv = None  # _as_bytes_view says so
            if mv is not None and mv.format not in ("B", "b", "c"):
                t.check_buffer(mv, self._image)
        view = _as_bytes_view(data)
        sizes = sizes or self._raw.sizes
        return view, (0, len(view) // sizes[0] if sizes and sizes[0] else None)

    def array(self, result, result_type=None):
        """A result (an Output or its bytes) as a read-only numpy array of
        the image's output type: shaped as the type if it holds one output,
        else (k, *shape). A result that is no whole number of outputs (a
        streaming handler's, see `map`) comes back as a 1-D array of the
        element type, or as bytes if it is no whole number of elements
        either. Raises UsageError if the configured image records no output
        type. `result_type` ("int64[1]", "int64", numpy.int64): read it as
        that type instead, as `map(result_type=)` does (a handler's result:
        the type its set declares, `result_types`)."""
        data = result.data if isinstance(result, Output) else result
        if result_type is not None:
            return _Type.parse(result_type).result(data)
        return self._array(data, (0, None))

    def _array(self, data, form, types=None, sizes=None):
        t = (types or self._types)[1]
        if t is None:
            raise UsageError("the configured image records no output type (build it with "
                             "--output-type, or read the bytes)")
        batch, inputs = form
        if batch == 0:  # bytes in: one output gets no batch axis
            sizes = sizes or self._raw.sizes
            batch = None if sizes and len(data) == sizes[1] else -1
        return t.array(data, batch, inputs)

    # -- data ----------------------------------------------------------
    def submit(self, data, id=None, *, priority=None):
        """Sends one data message (a whole number of inputs) and returns its
        id; its result comes from `recv()`. Accepts bytes, bytearray,
        memoryview, numpy arrays (contiguous; checked against the image's
        input type when it has one: an array of another dtype is refused,
        `memoryview(a).cast("B")` sends its bytes as they are; a byte
        memory's uint8[N] also takes int8 arrays and several inputs flat).
        Blocks while the server grants no
        credit. `priority`: class 0 (most urgent) to 7, default 4 (see
        `connect(chunks=True)`)."""
        view, _ = self._prepare(data)
        if id is None:
            return self._raw.submit(view, priority=priority)
        self._raw.submit_with_id(id, view, priority=priority)
        return id

    def submit_pending(self, data, *, priority=None):
        """Sends one data message and returns a `Pending` (`.id`, `.done()`,
        `.result(timeout=None)`): its result goes to that handle only, never
        to `recv()` or another thread. Blocks while there is no credit."""
        view, _ = self._prepare(data)
        return self._raw.submit_pending(view, priority=priority)

    def try_submit_pending(self, data, *, priority=None):
        """Like `submit_pending()`, but never waits for credit: returns None,
        sending nothing, when the server grants none right now. For a program
        that computes while its messages are processed and sends the next one
        between its own steps (bench/spin_gemm_overlap.py)."""
        view, _ = self._prepare(data)
        return self._raw.try_submit_pending(view, priority=priority)

    def recv(self, timeout=None):
        """Next result of a plain `submit()` as an Output (`.id`, `.data`,
        `.count`; `id, data = out`; `memoryview(out)` without copying;
        `client.array(out)` for the typed array).
        Raises ServerError for a data message the server could not process,
        TimeoutError after `timeout` s, UsageError if only `map()`/`Pending`
        results are in flight (they never come here)."""
        return self._raw.recv(timeout)

    def recv_notification(self, timeout=None):
        """The oldest handler notification not yet taken, as a Notification
        (`.id`, `.set`, `.data`; also the tuple `id, set, data`), or None
        after `timeout` s (None: wait until one comes) or once the connection
        has ended and none is left.

        A streaming handler sends one with `ops->notify` (include/corefarm/
        spin.h): `id` is the id of the data message it concerns (as
        submitted), `set` the index of the handler set in the image,
        `data` its bytes (at most 4 KiB). All notifications of a message
        arrive before its result, so once the result is in they are all
        here. They wait in a queue of their own (the newest 1024; older ones
        are dropped and counted in `notifications_dropped`), apart from
        results, which they never delay."""
        n = self._raw.recv_notification(timeout)
        return None if n is None else Notification(*n)

    @property
    def notifications_dropped(self):
        """Notifications dropped because 1024 were waiting unread."""
        return self._raw.notifications_dropped

    def map(self, inputs, window=64, raw=False, cowork=None, *, priority=None,
            return_exceptions=False, result_type=None):
        """Returns an iterator of the result of each input, in input order,
        keeping at most `window` data messages in flight. The results come
        to this iterator only, so several threads may each run a `map` on
        one client.

        A failure of one input (the server's ServerError for it, e.g. a core
        that crashed on it; an InputError for an input the client cannot
        send) is raised when its turn comes, and the iterator stays usable:
        the next `next()` goes on with the following input, whose result,
        like every later one, is kept. `return_exceptions=True` (named after
        `asyncio.gather`'s) yields such a failure in its input's place
        instead of raising it, so `list(c.map(xs, return_exceptions=True))`
        has one entry per input. Either way a failure of the whole session
        (the connection lost or closed) raises and ends the map.

        Raising is the default because a result that is an exception object
        is easily stored or summed unnoticed; this is what
        `concurrent.futures.Executor.map` and `asyncio.gather` do, and, like
        `multiprocessing.Pool.imap`'s, the iterator can be resumed after it.

        Results are bytes, or, when the image records an output type (other
        than a byte memory's uint8[N]) and `raw` is false, read-only numpy
        arrays of that type: an input array
        of the input shape gives one output shaped as the output type, a
        batch (k, *input shape) gives (k, *output shape); bytes holding k
        inputs give k outputs the same way (no batch axis for k = 1).
        A streaming handler's result is exactly what its handlers emitted
        (a sum, the records a filter kept; docs/streams.md), of any length:
        when it is not the k outputs of its input it comes back as a
        read-only 1-D array of the output element type if its length is a
        multiple of the element's size, else as bytes. A handler set that
        declares its `result_type` in the image (`result_types`) has its
        results read as that type instead: the client finds each message's
        set by the image's rulesets, as the node does; exactly one value of
        the type is shaped as the type (a sum's int64[1] as shape (1,)),
        another length is a 1-D array of its element type, a 1-D uint8
        type is bytes. A message no such set takes keeps the output type.

        `result_type` ("int64[1]" as `--output-type` takes it, an element
        type alone such as "int64" or numpy.int64 for 1-D arrays of any
        length): read every result of this call as that type, whatever
        set or core answered; InputError for a type it cannot be, and
        UsageError with `raw=True`.

        `cowork=True` (or a `corefarm.cowork.Cowork`) computes part of the
        inputs on this machine too (seed 002, chapter 4); see
        `corefarm.cowork`. Inputs are then checked and taken up front.

        `priority`: the class of every input (0 most urgent to 7, default 4)."""
        if window < 1:
            raise ValueError("window must be at least 1")
        results = self._map_results(raw, result_type)
        types, sizes = self._types, self._raw.sizes
        if cowork:
            from . import cowork as _cowork
            # A Cowork made from an image may configure the client as the
            # map runs (configure=True): the image's types shape the results.
            if isinstance(cowork, _cowork.Cowork) and types == (None, None):
                types, sizes = cowork._types, cowork._sizes
        typed = not raw and types[1] is not None and not types[1].is_bytes
        if typed:
            types[1].numpy_dtype()  # no numpy: say so before sending anything
        if cowork:
            return self._cowork_map(_cowork, inputs, window, cowork, types, sizes, typed)
        return _MapIterator(self, inputs, window, typed, priority, return_exceptions, results)

    def _map_results(self, raw, result_type):
        """How a map reads its results besides the output type: a _Type for
        every result (`result_type=`), True for each handler set's declared
        type, None for bytes (`raw`). Raises before anything is sent."""
        if result_type is not None:
            if raw:
                raise UsageError("raw=True gives bytes: pass result_type= or raw=True, not both")
            result_type = _Type.parse(result_type)
            if not result_type.is_bytes:
                result_type.numpy_dtype()  # no numpy: say so before sending anything
            return result_type
        if raw:
            return None
        for t in self._result_types[1] if self._result_types else ():
            if t is not None and not t.is_bytes:
                t.numpy_dtype()
                break
        return True

    def _cowork_map(self, cowork_module, inputs, window, cowork, types, sizes, typed):
        prepared = [self._prepare(item, types, sizes) for item in inputs]
        results = cowork_module.map(self, [v for v, _ in prepared], window, cowork)
        for data, (_, batch) in zip(results, prepared):
            yield self._array(data, batch, types, sizes) if typed else data

    def status(self):
        """What the server is doing, as a dict: "you" (this user's id),
        "policy", "max_message", "nodes" (id, name, addr, state, user,
        in_flight, results) and "users" (id, addr, name, hello, phase,
        nodes, outstanding, queued, results). Raises UnsupportedError if the
        server does not offer the status extension (or in legacy mode)."""
        return _json.loads(self._raw.status())

    # -- connection ----------------------------------------------------
    @property
    def nodes(self):
        """Nodes the server assigned (None in legacy mode)."""
        return self._raw.nodes

    @property
    def resumes(self):
        """Times the session was resumed after losing its server (see `connect`)."""
        return self._raw.resumes

    @property
    def server_addr(self):
        """The address of the server in use now: it changes when the session
        resumes on another server of the address list."""
        return self._raw.server_addr

    @property
    def warnings(self):
        """What the server reported about the last successful configuration,
        e.g. nodes that refused it and were dropped (an empty list if none)."""
        return list(self._raw.warnings)

    @property
    def credit_mode(self):
        """Whether the server grants credit (the hello agreed on it): submits wait for credit."""
        return self._raw.credit_mode

    @property
    def sizes(self):
        """(input_size, output_size) in force, or None before configuring."""
        return self._raw.sizes

    @property
    def server_hello(self):
        """The server's hello as a dict (features, nodes, max_message), or None in legacy mode."""
        h = self._raw.server_hello
        return _json.loads(h) if h is not None else None

    @property
    def chunk_size(self):
        """The chunk size agreed with the server, or None without `chunks`."""
        return self._raw.chunk_size

    @property
    def addr(self):
        """The "host:port" this client connected to."""
        return self._raw.addr

    def close(self):
        """Closes the connection; blocked calls in other threads raise ConnectionError."""
        self._raw.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return f"<corefarm.Client {self.addr} nodes={self.nodes}>"


class _MapIterator:
    """What `Client.map` returns: an iterator over the results in input
    order that a failure of one input does not end (see `Client.map`)."""

    def __init__(self, client, inputs, window, typed, priority, return_exceptions, results):
        self._client = client
        self._inputs = iter(inputs)
        self._window = window
        self._typed = typed
        # A _Type for every result, True for each handler set's own, None
        # (raw) for none.
        self._results = results
        self._priority = priority
        # A priority every input shares: refused for all (out of range, or
        # not the default without chunks), so its refusal ends the map.
        self._class_ok = priority is None or (
            0 <= priority <= 7 and (priority == 4 or client.chunk_size is not None))
        self._return_exceptions = return_exceptions
        # In input order: (Pending, result form) for a sent input, or
        # (None, (exception, ends the map)) for one that was not sent.
        self._pending = _collections.deque()
        self._exhausted = False

    def __iter__(self):
        return self

    def _fill(self):
        while not self._exhausted and len(self._pending) < self._window:
            try:
                item = next(self._inputs)
            except StopIteration:
                self._exhausted = True
                return
            except Exception as e:
                # The inputs' own iterator failed: raised after the results
                # of the inputs it gave, and nothing more is sent.
                self._exhausted = True
                self._pending.append((None, (e, True)))
                return
            try:
                view, batch = self._client._prepare(item)
                rtype = _map_result_type(self._client, view, self._results)
                p = self._client._raw.submit_pending(view, priority=self._priority)
            except InputError as e:
                # This input's result, in its place; the map goes on, unless
                # the refusal is of the priority, which every input shares.
                self._exhausted = not self._class_ok
                self._pending.append((None, (e, not self._class_ok)))
                continue
            self._pending.append((p, (batch, rtype)))

    def _end(self):
        self._exhausted = True
        self._pending.clear()
        self._inputs = iter(())

    def __next__(self):
        try:
            self._fill()
        except BaseException:
            # Sending failed for the whole session (the connection, a
            # timeout waiting for credit, Ctrl-C): nothing more is sent.
            self._end()
            raise
        if not self._pending:
            raise StopIteration
        p, form = self._pending.popleft()
        if p is None:
            failure, ends = form
            if ends:
                self._end()
                raise failure
        else:
            try:
                data = p.result().data
            except ServerError as e:
                if e.id != p.id:  # the whole session's error, not this input's
                    self._end()
                    raise
                failure = e
            except BaseException:
                self._end()
                raise
            else:
                batch, rtype = form
                return self._client._result(data, batch, rtype, self._typed)
        if self._return_exceptions:
            return failure
        raise failure

    def close(self):
        """Stops the map: results still in flight are abandoned."""
        self._end()
