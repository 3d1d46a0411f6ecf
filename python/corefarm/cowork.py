"""CPU/cluster co-working: compute part of a map on this machine.

    with corefarm.connect(addr) as c:
        c.configure("matmul.cfimg")
        results = list(c.map(inputs, cowork=True))     # same bytes, same order

An image that carries a native artifact for this machine can run here too
(the same C function a node runs). With `cowork=True` the client loads the
image it configured and splits the inputs between local threads and the
cluster following the partitioning model of seed 002 (eq. 4.4 and 4.8, see
docs/cowork.md): below the break-even size everything stays local; above
it the cluster gets its share, rebalanced as results arrive. Results come
back in input order and are the same bytes either side would give.

`cowork=` may also be a `Cowork` built from an image, which works before
(or without) configuring the client: the work is then done locally until the
client is configured with that image.

    cw = corefarm.cowork.Cowork("matmul.cfimg", threads=2)
    out = list(c.map(inputs, cowork=cw))
    cw.report        # last run: local_items, cluster_items, backups, estimates, ...
"""

import os as _os

from . import _corefarm

__all__ = ["Cowork", "map"]


class Cowork:
    """One function loaded on this machine for co-working.

    image: bytes-like or a path (sizes and core table from its manifest unless
    given). threads: local worker threads (0: one per CPU). local_batch_max
    and jobs: C_COWORK_MAX and n_j of the seed's Algorithm 2. configure:
    `map` sends this function's configuration when the client holds another
    one and computes locally until the server answers (Algorithm 2 lines
    7-12); without it an unconfigured client's work stays local. backup:
    once nothing is left to take, the cluster also computes the messages
    local threads are still on, the first result kept (report["backups"]
    counts the copies). Keeps the
    measured throughputs between runs; `set_cluster_throughput(x)` replaces
    the measured cluster throughput (messages/s) with a known one."""

    def __init__(self, image=None, *, input_size=None, output_size=None, cores=None,
                 threads=0, local_batch_max=16, jobs=6, configure=False, backup=True, _raw=None):
        self.report = None
        # The image's element types (for typed results of `Client.map`) and
        # sizes; none for a Cowork of a client's configuration.
        self._types, self._sizes = (None, None), None
        if _raw is not None:
            self._raw = _raw
            return
        import corefarm

        if isinstance(image, (str, _os.PathLike)):
            with open(image, "rb") as f:
                image = f.read()
        image = corefarm._as_bytes_view(image)
        manifest = corefarm.read_image_manifest(image) or {}
        input_size = input_size if input_size is not None else manifest.get("input_size")
        output_size = output_size if output_size is not None else manifest.get("output_size")
        if input_size is None or output_size is None:
            raise corefarm.ConfigurationError("input_size and output_size are required for an image without a manifest")
        self._sizes = (input_size, output_size)
        # As `Client.configure`: types describe the manifest's sizes only.
        if (input_size, output_size) == (manifest.get("input_size"), manifest.get("output_size")):
            self._types = tuple(corefarm._Type.from_manifest(manifest.get(k))
                                for k in ("input_type", "output_type"))
        if cores is None:
            listed = manifest.get("cores")
            cores = [(c["control"], c["input"], c["output"]) for c in listed] if listed else 1
        if isinstance(cores, int):
            cores = corefarm.default_core_table(cores, input_size, output_size)
        self._raw = _corefarm.Cowork(input_size, output_size, [tuple(c) for c in cores], image,
                                     threads=threads, local_batch_max=local_batch_max, jobs=jobs,
                                     configure=configure, backup=backup)

    @classmethod
    def for_client(cls, client, **options):
        """Loads the configuration `client` was last configured with."""
        return cls(_raw=_corefarm.Cowork.for_client(client._raw, **options))

    def matches(self, client):
        """Whether `client` is configured with this function now."""
        return self._raw.matches(client._raw)

    def map(self, client, inputs, window=64):
        """The results (bytes) of `inputs`, in input order, computed here
        and on `client`'s cluster. Sets `self.report`."""
        import corefarm

        if window < 1:
            raise ValueError("window must be at least 1")
        views = [corefarm._as_bytes_view(x) for x in inputs]
        results, self.report = self._raw.map(client._raw, views, window)
        return results

    def set_cluster_throughput(self, x_a):
        self._raw.set_cluster_throughput(x_a)

    @property
    def estimates(self):
        """Model parameters measured so far: x_c, x_a, x_a_beside (the
        cluster's throughput while local threads computed; messages/s),
        d_a, o_c, o_0 (s); None where unknown."""
        return self._raw.estimates

    @property
    def threads(self):
        return self._raw.threads

    @property
    def description(self):
        return self._raw.description

    def __repr__(self):
        return f"<corefarm.cowork.Cowork {self.description}>"


def map(client, inputs, window, cowork):
    """What `Client.map(inputs, window, cowork=...)` runs: `cowork` is True
    (a Cowork for the client's configuration, kept on the client and
    reloaded when the configuration changes) or a Cowork."""
    if cowork is True:
        cw = getattr(client, "_cowork", None)
        if cw is None or not cw.matches(client):
            cw = Cowork.for_client(client)
            client._cowork = cw
    elif isinstance(cowork, Cowork):
        cw = cowork
    else:
        raise TypeError(f"cowork must be True or a corefarm.cowork.Cowork, not {type(cowork).__name__}")
    return cw.map(client, inputs, window)
