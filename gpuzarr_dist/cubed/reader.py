"""``from_zarr_gpu``: a cubed array whose blocks are read and decoded by gpuzarr-dist's batched read path."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from gpuzarr_dist.array.read import auto_block_shape
from gpuzarr_dist.array.reader import BlockReader
from gpuzarr_dist.cubed.backend import use_backend
from gpuzarr_dist.cubed.memory import decode_limit, min_allowed
from gpuzarr_dist.cubed.spec import choose_device
from gpuzarr_dist.cubed.storage import add_io
from gpuzarr_dist.errors import GpuZarrError
from gpuzarr_dist.stores.source import open_source


class MemoryBudgetError(GpuZarrError, ValueError):
    """A Zarr chunk (or shard) is bigger than a task's memory budget allows."""


def read_zarr_gpu(_empty: Any, *, reader: BlockReader, chunks: tuple, block_id: tuple) -> Any:
    """One cubed task's read: block ``block_id`` of ``chunks``, all its Zarr chunks in one batched decode."""
    sel = tuple(slice(sum(c[:i]), sum(c[: i + 1])) for c, i in zip(chunks, block_id))
    return reader[sel]


def _budget(spec: Any, dev: str) -> tuple[int, int]:
    """``(data, read_block)``: bytes one read block may have so cubed's projection fits and the workspace suffices."""
    allowed, reserved = int(spec.allowed_mem), int(spec.reserved_mem)
    # cubed projects a map_blocks read task as reserved + 2 x its (virtual) input chunk + 2 x the block
    data = (allowed - reserved) // 4
    rb = getattr(spec, "gpuzarr_read_block", None)
    return data, min(data, rb) if rb else data


def from_zarr_gpu(
    source: Any,
    component: str | None = None,
    *,
    spec: Any = None,
    chunks: Any = "auto",
    device: str | None = None,
    storage_options: dict | None = None,
) -> Any:
    """A ``cubed.Array`` over a Zarr array, each block read and decoded in one batch (nvCOMP on the GPU).

    Blocks are whole multiples of the Zarr chunks (or shards), as big as the
    spec's budget allows, split evenly along the axis where they are split:
    at most ``read_block`` bytes (``allowed_mem / 5.525`` on the GPU by
    default, see :func:`gpuzarr_dist.cubed.spec`) and at most
    ``(allowed_mem - reserved_mem) / 4``, so cubed's projected memory for the
    read task fits ``allowed_mem``. On the GPU each block is decoded in nvCOMP
    calls of at most half a read block (:func:`.memory.decode_limit`). Raises
    :class:`MemoryBudgetError` when even one chunk does not fit. ``source``, ``component`` and ``storage_options``
    are as for :func:`gpuzarr_dist.from_zarr_gpu`; ``device`` defaults to the spec's.
    """
    dev = device or getattr(spec, "gpuzarr_device", None) or "auto"
    dev = choose_device(dev)
    use_backend(dev)
    import cubed

    if spec is None:
        from cubed.spec import spec_from_config

        spec = spec_from_config(cubed.config)
    store, aspec = open_source(source, component, storage_options)
    data, target = _budget(spec, dev)
    reader = BlockReader(store, aspec, dev, decode_bytes=decode_limit(spec, dev))
    unit = aspec.read_unit
    item = aspec.dtype.itemsize
    unit_bytes = math.prod(min(u, max(n, 1)) for u, n in zip(unit, aspec.shape)) * item
    what = "shard" if aspec.shard_shape else "chunk"
    if unit_bytes > target:
        raise MemoryBudgetError(
            f"{aspec.name}: one Zarr {what} {tuple(unit)} is {unit_bytes} bytes, more than a read block may be "
            f"({target} bytes) under allowed_mem={spec.allowed_mem}, reserved_mem={spec.reserved_mem} "
            f"(cubed projects 4 x a block's bytes, plus the decoder workspace in reserved_mem). Raise allowed_mem "
            f"to at least {min_allowed(unit_bytes, dev)} bytes (with spec()'s defaults), or use smaller Zarr chunks"
        )
    if isinstance(chunks, str) and chunks == "auto":
        shape = auto_block_shape(aspec, target, balance=True)
    elif isinstance(chunks, str):
        from dask.utils import parse_bytes

        shape = auto_block_shape(aspec, min(target, int(parse_bytes(chunks))), balance=True)
    else:
        shape = tuple(int(c) for c in chunks)
        if len(shape) != aspec.ndim:
            raise ValueError(f"{aspec.name}: chunks {chunks!r} must give one block size per axis ({aspec.ndim})")
        if math.prod(shape) * item > target:
            raise MemoryBudgetError(f"{aspec.name}: blocks {shape} are {math.prod(shape) * item} bytes, more than "
                                    f"the budget allows ({target} bytes)")
    from cubed.utils import normalize_chunks

    block_chunks = normalize_chunks(shape, aspec.shape, dtype=aspec.dtype)
    source_array = _as_source(reader, tuple(c[0] if c else 0 for c in block_chunks), spec)
    if source_array is not None:
        return source_array
    return cubed.map_blocks(  # a cubed whose Plan we do not know: a read operation (materialised when shared)
        _block_fn(block_chunks),
        dtype=np.dtype(aspec.dtype),
        chunks=block_chunks,
        spec=spec,
        reader=reader,
    )


class _block_fn:
    """A picklable ``func(empty, reader=, block_id=)`` with the block chunks bound (cubed passes ``chunks`` itself)."""

    def __init__(self, chunks: tuple):
        self.chunks = chunks
        self.__name__ = "read_zarr_gpu"

    def __call__(self, _empty: Any, *, reader: BlockReader, block_id: tuple) -> Any:
        return read_zarr_gpu(_empty, reader=reader, chunks=self.chunks, block_id=block_id)


class SourceArray:
    """The stored array under :func:`from_zarr_gpu`'s ``cubed.Array``: read-only, blocks of ``chunks`` via a BlockReader.

    It is what ``cubed.from_zarr`` has there (the ``zarr.Array``): an input of
    the plan, not an operation. So an array used twice (``x - x.mean(0)``) is
    read from the source by each operation that uses it, fused into that
    operation's tasks, instead of being written whole to an intermediate Zarr
    array by a read operation and read back twice (a copy that would cost
    about a third of an anomaly's time and double the bytes encoded).
    ``chunks`` (cubed's block shape) is a whole multiple of the Zarr chunks, so
    each task's read is one batched decode. Picklable (the reader travels).
    """

    def __init__(self, reader: BlockReader, chunks: tuple[int, ...]):
        self.reader = reader
        self.shape = tuple(reader.shape)
        self.dtype = np.dtype(reader.dtype)
        self.chunks = tuple(int(c) for c in chunks)
        self.ndim = len(self.shape)

    @property
    def nbytes(self) -> int:
        return int(math.prod(self.shape)) * self.dtype.itemsize

    @property
    def size(self) -> int:
        return int(math.prod(self.shape))

    @property
    def nchunks(self) -> int:
        """Blocks (cubed's chunks), as cubed's plan summaries count them."""
        return int(math.prod(-(-n // c) if c else 1 for n, c in zip(self.shape, self.chunks)))

    def __getitem__(self, selection: Any) -> Any:
        t0 = time.perf_counter()
        block = None
        try:
            block = self.reader[selection]
            return block
        finally:
            add_io("read", time.perf_counter() - t0, 0 if block is None else block.nbytes)

    def __repr__(self) -> str:
        return f"SourceArray({self.reader.spec.name!r}, shape={self.shape}, chunks={self.chunks}, device={self.reader.device!r})"


def _as_source(reader: BlockReader, chunks: tuple[int, ...], spec: Any) -> Any:
    """A ``cubed.Array`` whose target is a :class:`SourceArray`, planned as ``cubed.from_zarr`` plans its
    ``zarr.Array`` (an op node without a pipeline, then the array node), or ``None`` when this cubed's
    internals differ from the ones this was written against (0.27 / 0.28): the caller then reads
    through ``map_blocks``.

    ``Plan._new`` itself cannot be called from here: it looks for a cubed frame on the call stack
    (for its diagrams), so the two nodes are added as it adds them, without stack summaries.
    """
    try:
        import networkx as nx
        from cubed.array_api import Array
        from cubed.core.array import gensym
        from cubed.core.plan import Plan
        from cubed.core.plan import gensym as op_gensym

        target = SourceArray(reader, chunks)
        name, op = gensym(), op_gensym()
        dag = nx.MultiDiGraph()
        dag.add_node(op, name=op, op_name="from_zarr", func_name="from_zarr_gpu", type="op", stack_summaries=None,
                     hidden=False)
        dag.add_node(name, name=name, type="array", target=target, hidden=False, scalar_value=None)
        dag.add_edge(op, name)
        return Array(name, target, spec, Plan(dag, (name,)))
    except (ImportError, TypeError, AttributeError):  # pragma: no cover - another cubed
        return None
