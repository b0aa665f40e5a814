"""Cubed's intermediate arrays, through one seam: :class:`IntermediateArray`.

Cubed stores every operation's output in Zarr (``work_dir``) and reads it back
in the next operation. Its tasks reach those arrays through the read and write
proxies of each operation (``BlockwiseSpec.reads_map`` / ``writes_map``);
:func:`wrap_pipeline` swaps each Zarr proxy for one whose array is an
:class:`IntermediateArray`:

- reads go through gpuzarr-dist's read path (:class:`gpuzarr_dist.array.reader.BlockReader`:
  one batched read, one batched decode, nvCOMP on the GPU);
- writes go through gpuzarr-dist's write path (:class:`gpuzarr_dist.array.write.BlockWriter`,
  as ``to_zarr_gpu``): the task's block (cupy on the GPU, numpy on the CPU) is
  cut into its Zarr chunks, all of them are encoded in one batch (nvCOMP on the
  GPU, numcodecs threads on the CPU) and each chunk object is written
  atomically into the array cubed created. On the GPU the block never goes to
  the host uncompressed: device -> nvCOMP -> file -> nvCOMP -> device.

Writes fall back to zarr-python (with zarr's GPU buffers on the GPU,
:func:`prepare_process`; zarr then compresses on the host) for a codec chain
our encoder does not write (anything but ``bytes`` + zstd/gzip/none, + crc32c:
e.g. a Blosc ``zarr_compressor``; one warning per array) and for a selection
that is not whole chunks. :func:`gpuzarr_dist.cubed.spec` asks cubed for zstd
intermediates so that the fast path is the default. Anything that is not a
plain Zarr array (cubed's virtual arrays, and the structured-dtype
intermediates of ``mean`` and friends, which cubed stores as a group of
arrays) is left to cubed and zarr-python. :func:`write_stats` counts the blocks
each way in this process. Nothing here imports cubed or cupy at import.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import warnings
from typing import Any

import numpy as np

_lock = threading.Lock()
_readers: dict[tuple, Any] = {}
_prepared: set[tuple[int, str]] = set()
_warned: set[str] = set()
_writers: dict[tuple, Any] = {}
_stats = {"blocks_encoded": 0, "bytes_stored": 0, "zarr_writes": 0}

#: bytes->bytes codecs our write path encodes (CPU and GPU), after the ``bytes`` codec; crc32c may follow
ENCODED_COMPRESSORS = ("zstd", "gzip")


def write_stats() -> dict[str, int]:
    """Intermediate writes in this process: ``blocks_encoded`` and ``bytes_stored`` by gpuzarr-dist, ``zarr_writes`` by zarr-python."""
    with _lock:
        return dict(_stats)


def reset_write_stats() -> None:
    """Zero the counters of :func:`write_stats`."""
    with _lock:
        for k in _stats:
            _stats[k] = 0


_io = {"read_s": 0.0, "write_s": 0.0, "read_bytes": 0, "write_bytes": 0}


def io_totals() -> dict[str, float]:
    """Block reads (the source and intermediates) and intermediate/output writes in this process:
    ``read_s``/``write_s``, seconds summed over threads (host time in the call: on the GPU that
    includes the waits for nvCOMP's results that the read and write paths make), and
    ``read_bytes``/``write_bytes``, the decoded bytes of the blocks read and written.
    :class:`~gpuzarr_dist.cubed.OpTimings` reports them per operation."""
    with _lock:
        return dict(_io)


def add_io(kind: str, seconds: float, nbytes: int) -> None:
    """Count one block read (``kind="read"``) or write (``"write"``) of ``nbytes`` decoded bytes."""
    with _lock:
        _io[f"{kind}_s"] += seconds
        _io[f"{kind}_bytes"] += int(nbytes)


def _count(**inc: int) -> None:
    with _lock:
        for k, v in inc.items():
            _stats[k] += v


def unencodable(spec: Any) -> str | None:
    """Why our write path does not write this array (a codec or layout), or ``None`` when it does.

    Written by us: Zarr v3, not sharded, ``bytes`` then at most one of
    :data:`ENCODED_COMPRESSORS`, then crc32c codecs only.
    """
    if spec.zarr_format != 3:
        return f"Zarr format {spec.zarr_format}"
    if spec.shard_shape is not None:
        return "sharding_indexed"
    names = [c.name for c in spec.codecs]
    if not names or names[0] != "bytes":
        return f"codec {names[0] if names else None!r} before 'bytes'"
    rest = names[1:]
    while rest and rest[-1] == "crc32c":
        rest.pop()
    if len(rest) > 1 or (rest and rest[0] not in ENCODED_COMPRESSORS):
        return f"codecs {rest}"
    return None


def block_start(selection: Any, value: Any, spec: Any) -> tuple[int, ...] | None:
    """The first element of the whole-chunk block ``selection`` writes with ``value``; ``None`` if it is not one.

    A block is whole chunks along every axis (the last one of an axis may end
    at the array's edge) and ``value`` has exactly its shape (no broadcasting).
    """
    if not isinstance(selection, tuple):
        selection = (selection,)
    shape = spec.shape
    if not shape or len(selection) != len(shape) or not all(isinstance(s, slice) for s in selection):
        return None
    start, extent = [], []
    for s, n, c in zip(selection, shape, spec.chunk_shape):
        lo, hi, step = s.indices(n)
        if step != 1 or hi <= lo or lo % c or (hi != n and hi % c):
            return None
        start.append(lo)
        extent.append(hi - lo)
    if tuple(getattr(value, "shape", ())) != tuple(extent):
        return None
    return tuple(start)


def prepare_process(device: str) -> None:
    """Once per process: on the GPU, zarr-python uses device buffers, so cupy blocks are written without a host copy by us."""
    import os

    key = (os.getpid(), device)
    if key in _prepared:
        return
    with _lock:
        if key in _prepared:
            return
        if device == "gpu":
            import zarr

            zarr.config.set({"buffer": "zarr.buffer.gpu.Buffer", "ndbuffer": "zarr.buffer.gpu.NDBuffer"})
        _prepared.add(key)


def _warn_once(what: str, message: str) -> None:
    with _lock:
        if what in _warned:
            return
        _warned.add(what)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


class IntermediateArray:
    """A cubed intermediate Zarr array: reads and writes through gpuzarr-dist's batched read and write paths."""

    def __init__(self, zarray: Any, device: str, decode_bytes: int | None = None):
        self._zarray = zarray
        self.device = device
        self.decode_bytes = decode_bytes  # the GPU reader's nvCOMP calls, at most (BlockReader.decode_bytes)
        self.shape = tuple(zarray.shape)
        self.dtype = np.dtype(zarray.dtype)
        self.chunks = tuple(zarray.chunks)
        self.ndim = len(self.shape)

    def _reader(self) -> Any:
        from gpuzarr_dist.array.reader import BlockReader
        from gpuzarr_dist.stores.source import open_source

        z = self._zarray
        key = (str(z.store), z.path, self.shape, str(self.dtype), self.chunks, self.device, self.decode_bytes)
        r = _readers.get(key)
        if r is None:
            store, spec = open_source(z)
            r = BlockReader(store, spec, self.device, self.decode_bytes)
            with _lock:
                if len(_readers) > 256:
                    _readers.clear()
                _readers[key] = r
        return r

    def __getitem__(self, selection: Any) -> Any:
        t0 = time.perf_counter()
        block = None
        try:
            try:
                reader = self._reader()
            except Exception as e:  # a chain our registry cannot decode: zarr reads it, with one warning
                _warn_once(str(self._zarray.path), f"{self._zarray.path}: intermediate read through zarr-python ({e})")
                block = self._zarray[selection]
            else:
                block = reader[selection]
            return block
        finally:
            add_io("read", time.perf_counter() - t0, 0 if block is None else block.nbytes)

    def _writer(self) -> Any:
        """The array's :class:`~gpuzarr_dist.array.write.BlockWriter` (cached per process), or why there is none (a str)."""
        z = self._zarray
        key = (str(z.store), z.path, self.shape, str(self.dtype), self.chunks, repr(z.metadata.codecs))
        w = _writers.get(key)
        if w is None:
            from gpuzarr_dist.array.write import BlockWriter
            from gpuzarr_dist.core.metadata import spec_from_zarr_metadata
            from gpuzarr_dist.stores.target import open_target

            try:
                target = open_target(z.store, z.path, None)
                spec = spec_from_zarr_metadata(z.metadata, target.name)
                w = unencodable(spec) or BlockWriter(spec, target.writer(target.name), tuple((n,) for n in spec.shape),
                                                     "auto")
            except Exception as e:  # metadata our write path does not take (e.g. a rectilinear chunk grid)
                w = f"{type(e).__name__}: {e}"
            with _lock:
                if len(_writers) > 256:
                    _writers.clear()
                _writers[key] = w
        return w

    def __setitem__(self, selection: Any, value: Any) -> None:
        """Write one task's block: encoded in one batch and stored chunk by chunk by us, else by zarr-python."""
        t0 = time.perf_counter()
        written = 0
        try:
            self._write(selection, value)
            written = int(getattr(value, "size", 1)) * self.dtype.itemsize  # in the array's dtype, as stored
        finally:
            add_io("write", time.perf_counter() - t0, written)

    def _write(self, selection: Any, value: Any) -> None:
        w = self._writer()
        if isinstance(w, str):
            _warn_once(f"write:{self._zarray.path}", f"{self._zarray.path}: intermediate written through "
                       f"zarr-python, compressed on the host (gpuzarr-dist's write path does not write {w})")
        else:
            start = block_start(selection, value, w.spec)
            if start is not None:
                n = w.write(value, start)
                _count(blocks_encoded=1, bytes_stored=int(n))
                return
        _count(zarr_writes=1)
        self._zarray[selection] = value

    def __getattr__(self, name: str) -> Any:  # store, path, metadata, ... as zarr has them
        return getattr(self._zarray, name)


class IntermediateGroup:
    """A cubed structured intermediate (``mean``'s ``n``/``total`` partials: a group of one plain array per
    field) whose fields are read and written through :class:`IntermediateArray`, i.e. our batched paths.

    Cubed reads such a group with ``group[selection]`` (a dict of field blocks) and writes it with
    ``group.set_basic_selection(selection, block, fields=name)``. Through zarr-python those blocks
    would cost about a third of the anomaly's fused subtract task, which re-reads the mean's last
    partials for each of its blocks.
    """

    def __init__(self, group: Any, device: str, decode_bytes: int | None = None):
        self._group = group
        self.device = device
        self.decode_bytes = decode_bytes
        self._fields: dict[str, IntermediateArray] = {}
        self.shape = tuple(getattr(group, "shape", ()) or ())
        self.dtype = getattr(group, "dtype", None)
        self.chunks = getattr(group, "chunks", None)

    def field(self, name: str) -> IntermediateArray:
        a = self._fields.get(name)
        if a is None:
            a = self._fields[name] = IntermediateArray(dict.__getitem__(self._group, name), self.device,
                                                       self.decode_bytes)
        return a

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return self.field(key)
        return {name: self.field(name)[key] for name in self._group.keys()}

    def set_basic_selection(self, selection: Any, value: Any, fields: Any = None) -> None:
        if isinstance(fields, str):
            self.field(fields)[selection] = value
        else:  # several fields or none: as cubed's group does it, through zarr-python
            self._group.set_basic_selection(selection, value, fields=fields)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._group, name)


def _is_group(opened: Any) -> bool:
    """Cubed's group of field arrays (``ZarrV3ArrayGroup`` / ``ZarrArrayGroup``: a dict of plain zarr arrays)."""
    import zarr

    return isinstance(opened, dict) and bool(opened) and all(isinstance(v, zarr.Array) for v in opened.values())


class IntermediateProxy:
    """Stands in for cubed's ``CubedArrayProxy``: same ``array``/``chunks``; ``open()`` gives an
    :class:`IntermediateArray` (or an :class:`IntermediateGroup` for a structured intermediate).

    The opened array is kept (one per proxy, i.e. per operation run and process): cubed opens the
    Zarr array (a metadata read and parse) for every block each task reads or writes, which on the
    CPU was a fifth of the anomaly's time. The arrays exist before any task runs (cubed's
    ``create-arrays`` operation) and their metadata does not change while the operation runs.
    """

    def __init__(self, proxy: Any, device: str, decode_bytes: int | None = None):
        self.array = proxy.array
        self.chunks = proxy.chunks
        self._proxy = proxy
        self.device = device
        self.decode_bytes = decode_bytes
        self._opened: Any = None

    def open(self) -> Any:
        opened = self._opened
        if opened is None:
            z = self._proxy.open()
            if _is_group(z):
                opened = IntermediateGroup(z, self.device, self.decode_bytes)
            elif np.dtype(getattr(z, "dtype", None) or "V1").fields is not None or isinstance(z, dict):
                opened = z  # a structured array some other storage backend opened: cubed's own handling
            else:
                opened = IntermediateArray(z, self.device, self.decode_bytes)
            self._opened = opened
        return opened

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_opened"] = None  # reopened where it is unpickled
        return state


def _wrappable(proxy: Any) -> bool:
    import zarr

    try:
        from cubed.storage.zarr import LazyZarrArray
    except ImportError:  # pragma: no cover
        LazyZarrArray = ()  # type: ignore[assignment]
    arr = getattr(proxy, "array", None)
    if _is_group(arr):
        return True
    if not isinstance(arr, (zarr.Array, LazyZarrArray)):
        return False
    dtype = np.dtype(arr.dtype)
    if dtype.fields is not None:  # a lazy structured intermediate: a group once opened
        return all(np.dtype(f[0]).kind in "biuf" and np.dtype(f[0]).shape == () for f in dtype.fields.values())
    return dtype.kind in "biufc"


def wrap_config(config: Any, device: str, decode_bytes: int | None = None) -> Any:
    """A copy of a cubed ``BlockwiseSpec`` whose Zarr read/write proxies go through :class:`IntermediateArray`
    (GPU reads decoded in nvCOMP calls of at most ``decode_bytes``: :func:`.memory.decode_limit`)."""
    if config is None or not dataclasses.is_dataclass(config):
        return config
    if not hasattr(config, "reads_map") or not hasattr(config, "writes_map"):
        return config
    reads = {k: IntermediateProxy(p, device, decode_bytes) if _wrappable(p) else p for k, p in config.reads_map.items()}
    writes = {k: IntermediateProxy(p, device, decode_bytes) if _wrappable(p) else p
              for k, p in config.writes_map.items()}
    return dataclasses.replace(config, reads_map=reads, writes_map=writes)
