"""Writing a dask array (cupy or numpy chunks) as a standard Zarr v3 array: the write graph and its task.

The flow of :mod:`gpuzarr_dist.array.read` backwards. zarr-python writes the
metadata (``zarr.json``), before any data, from our codec list
(:mod:`gpuzarr_dist.stores.target`); then each dask block is one task that
computes the block (fused by dask with whatever produced it, e.g.
``from_zarr_gpu(a) - m``), cuts it into Zarr chunks, encodes all of them in
**one batch call** (nvCOMP on the GPU for cupy blocks, numcodecs on a thread
pool for numpy blocks: :mod:`gpuzarr_dist.codecs.encode`), builds shards where
asked and writes every object atomically (:mod:`gpuzarr_dist.stores.writer`).
Each task returns the number of bytes it stored, so no task ever holds the
whole array.

Blocks must be whole multiples of the stored object (the shard, or the chunk)
so that no two tasks write the same object; misaligned blocks are rechunked
to the smallest such multiple, with a warning that says how large a block
(and so a task's memory) becomes.

:func:`write_array_graph` holds the array-level logic (metadata in, graph
out) so that an ``xr.Dataset`` writer can call it once per variable with its
own codecs, fill value, attributes and dimension names. The public
:func:`gpuzarr_dist.to_zarr_gpu` (:mod:`gpuzarr_dist.api`) takes arrays and
Datasets and hands arrays to :func:`to_zarr_gpu` here.
"""

from __future__ import annotations

import itertools
import math
import os
import warnings
from typing import Any

import dask
import dask.array as da
import numpy as np
import zarr
from dask._task_spec import Task, TaskRef
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph
from dask.utils import format_bytes

from gpuzarr_dist.codecs.encode import BlockEncoder, CpuBlockEncoder, SubBatch, chunk_grid
from gpuzarr_dist.codecs.pipeline import CodecPipeline
from gpuzarr_dist.core.layout import block_shape, even_runs, plan_layout
from gpuzarr_dist.core.metadata import ArraySpec, spec_from_zarr_metadata
from gpuzarr_dist.core.redact import scrub_error
from gpuzarr_dist.runtime.stages import stage_timer
from gpuzarr_dist.stores.target import Target, codec_objects, create_metadata, open_target
from gpuzarr_dist.stores.writer import LocalObjectWriter, ObjectWriter, remove_stale_temporaries, settle

# --------------------------------------------------------------------------- layout


def align_blocks(x: da.Array, unit: tuple[int, ...], name: str, what: str = "chunk") -> da.Array:
    """``x`` with blocks that are whole multiples of ``unit`` (the last block of an axis may be shorter).

    Each misaligned axis is rechunked to the smallest multiple of ``unit``
    that holds its largest block, with a warning giving the block size.
    """
    new = []
    changed = False
    for ax, (c, u) in enumerate(zip(x.chunks, unit)):
        if all(b % u == 0 for b in c[:-1]):
            new.append(c)
            continue
        changed = True
        size = max(u, -(-max(c) // u) * u)
        n = x.shape[ax]
        new.append(tuple(min(size, n - i) for i in range(0, n, size)) or (0,))
    if not changed:
        return x
    before = math.prod(block_shape(x.chunks)) * x.dtype.itemsize
    y = x.rechunk(tuple(new))
    after = math.prod(block_shape(y.chunks)) * x.dtype.itemsize
    warnings.warn(
        f"{name}: dask blocks {block_shape(x.chunks)} are not whole multiples of the stored "
        f"{what} shape {unit}; rechunking to blocks of {block_shape(y.chunks)} "
        f"({format_bytes(after)} per block, was {format_bytes(before)}): each write task holds one such "
        "block, and the rechunk moves data between tasks. Pass chunks=/shards= that divide the blocks to avoid it.",
        stacklevel=5,  # the user's call of gpuzarr_dist.to_zarr_gpu
    )
    return y


# --------------------------------------------------------------------------- the task


def _gpu_encode_usable() -> bool:
    """Whether nvCOMP is there to encode cupy blocks (else they are copied to the host and encoded there)."""
    from gpuzarr_dist.cuda.device import gpu_available

    return gpu_available()


def _is_cupy(block: Any) -> bool:
    return type(block).__module__.split(".")[0] == "cupy"


class BlockWriter:
    """The write task: encode all chunks of one block in one batch and store them (or their shards).

    Picklable and GPU-free until called: holds the array spec, the object
    writer and the block offsets; the codec pipeline is built lazily.
    """

    def __init__(self, spec: ArraySpec, writer: ObjectWriter, chunks: tuple[tuple[int, ...], ...], device: str):
        self.spec = spec
        self.writer = writer
        self.offsets = tuple(tuple(int(v) for v in np.cumsum((0,) + c)[:-1]) for c in chunks)
        self.device = device  # "auto" (follow the block's type), "cpu" or "gpu"
        self._pipeline: CodecPipeline | None = None
        self._index: Any = None
        CodecPipeline(spec)  # fail in the client on a chain we cannot encode

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_pipeline": None, "_index": None}

    def __repr__(self) -> str:
        return f"BlockWriter({self.spec.name!r})"

    @property
    def pipeline(self) -> CodecPipeline:
        if self._pipeline is None:
            self._pipeline = CodecPipeline(self.spec)
        return self._pipeline

    @property
    def index(self) -> Any:
        if self._index is None:
            from gpuzarr_dist.codecs.sharding import ShardIndex

            self._index = ShardIndex(self.spec)
        return self._index

    def __call__(self, block: Any, block_id: tuple[int, ...] | None = None) -> np.ndarray:
        start = tuple(o[i] for o, i in zip(self.offsets, block_id or (0,) * len(self.offsets)))
        n = self.write(block, start)
        return np.full((1,) * len(start), n, dtype=np.int64)

    # -- one block -------------------------------------------------------------------
    def write(self, block: Any, start: tuple[int, ...]) -> int:
        """Encode and store the block whose first element is at ``start``; the bytes stored.

        The block's chunks are encoded and written in sub-batches of about
        ``gpuzarr.write.batch-size`` bytes of input (whole objects: a shard is
        never split), pipelined: sub-batch k+1's encode is launched (on the
        thread's CUDA stream, or on the CPU encode threads) before sub-batch
        k's objects are written, so encoding and writing overlap within one
        task. Each object is still written once, whole and atomically.
        """
        if any(s == 0 for s in block.shape):
            return 0
        gpu = self.device == "gpu" or (self.device == "auto" and _is_cupy(block) and _gpu_encode_usable())
        if gpu:
            from gpuzarr_dist.cuda.write import gpu_block_encoder

            encoder = gpu_block_encoder(self, block)
        else:
            if _is_cupy(block):
                block = block.get()
            encoder = CpuBlockEncoder(self, np.asarray(block))
        first, grid, coords = self.chunk_layout(tuple(block.shape), start)
        return self.run_batches(encoder, self.sub_batches(first, grid, coords))

    def run_batches(self, encoder: BlockEncoder, batches: list[SubBatch]) -> int:
        """Encode and write ``batches`` in order, launching each encode before the previous batch's writes.

        With :mod:`~gpuzarr_dist.runtime.stages` on, books ``write: encode`` (launching the encodes and waiting
        for them: on the GPU, the encode and the copy of the compressed bytes to the host) and ``write: object
        writes`` (the stored bytes written).
        """
        total = 0
        timed = stage_timer()
        # the objects' folders are made (on a few background threads) while the block is encoded; all of that
        # ends before this task does (settle), so no folder is made after the task returns or fails
        folders = self.writer.prepare([k for b in batches for k in b.object_keys])
        pending = None
        try:
            pending = encoder.launch(batches[0].sel, batches[0].keys) if batches else None
            for k, batch in enumerate(batches):
                encoded = encoder.finish(pending)
                pending = None
                if k + 1 < len(batches):  # runs on the GPU (or the encode threads) while this thread writes
                    pending = encoder.launch(batches[k + 1].sel, batches[k + 1].keys)
                timed("write: encode")
                stored = self.writer.put_many(batch.objects(self, encoded))
                timed("write: object writes", stored)
                total += stored
                del encoded
        finally:
            try:
                if pending is not None:  # a write failed: let the launched encode finish before its buffers go
                    encoder.abandon(pending)
            finally:
                settle(folders)
        return total

    def chunk_layout(self, shape: tuple[int, ...], start: tuple[int, ...]) -> tuple[tuple[int, ...], list[int], list[tuple[int, ...]]]:
        """Grid coordinates of the block's first chunk, its chunk grid, and every chunk's coordinates."""
        chunk = self.spec.chunk_shape
        first = tuple(s // c for s, c in zip(start, chunk))
        grid = [-(-b // c) for b, c in zip(shape, chunk)]
        coords = [tuple(f + i for f, i in zip(first, idx)) for idx in np.ndindex(*grid)]
        return first, grid, coords

    def host_chunks(self, block: np.ndarray) -> np.ndarray:
        """The block's chunks as one host array ``(n, *chunk_shape)`` in the array's dtype."""
        spec = self.spec
        if block.dtype != spec.dtype and block.dtype.newbyteorder("=") != spec.dtype:
            block = block.astype(spec.dtype)
        return chunk_grid(block, spec.chunk_shape, spec.fill_value, np)

    def _encode_cpu(self, block: np.ndarray, start: tuple[int, ...]) -> tuple[list[Any], tuple[int, ...], list[int]]:
        """Every chunk of ``block`` encoded on the CPU in one batch (for benchmarks); ``(encoded, first, grid)``."""
        from gpuzarr_dist.runtime.threads import decode_pool

        first, grid, coords = self.chunk_layout(block.shape, start)
        chunks = self.host_chunks(block)
        keys = [self.spec.chunk_key(c) for c in coords]
        return self.pipeline.encode_batch(list(chunks), keys, decode_pool()), first, grid

    def _shards(self, first: tuple[int, ...], grid: list[int]) -> list[tuple[str, np.ndarray]]:
        """``(store key, positions)`` of each shard of the block: every inner chunk's position in the block's
        chunk list, -1 where it lies outside the array or the block (absent in the index, read as the fill value).

        Index arithmetic for all inner chunks of a shard at once, not a loop per chunk.
        """
        spec = self.spec
        per = spec.chunks_per_shard
        full_grid = np.asarray(spec.grid_shape)[:, None]
        shard_first = tuple(f // p for f, p in zip(first, per))
        shard_grid = [-(-g // p) for g, p in zip(grid, per)]
        inner = np.indices(per).reshape(len(per), -1) if per else None
        out = []
        for sidx in np.ndindex(*shard_grid):
            scoords = tuple(s + i for s, i in zip(shard_first, sidx))
            if inner is None:  # 0-d: one chunk in one shard
                pos = np.zeros(1, dtype=np.int64)
            else:
                g = np.asarray(scoords)[:, None] * np.asarray(per)[:, None] + inner
                local = g - np.asarray(first)[:, None]
                inside = np.all((g < full_grid) & (local < np.asarray(grid)[:, None]), axis=0)
                pos = np.where(inside, np.ravel_multi_index(tuple(np.where(inside, local, 0)), grid), -1)
            out.append((spec.store_key(scoords), pos.astype(np.int64)))
        return out

    def sub_batches(self, first: tuple[int, ...], grid: list[int], coords: list[tuple[int, ...]]) -> list[SubBatch]:
        """The block's chunks cut into sub-batches of whole objects, about ``gpuzarr.write.batch-size`` each.

        The objects (chunks, or shards) are split into as few equal runs as
        keep each run under the size; a single object larger than it is one
        sub-batch of its own.
        """
        from gpuzarr_dist.config import write_batch_bytes

        spec = self.spec
        chunk_bytes = max(1, math.prod(spec.chunk_shape) * spec.dtype.itemsize)
        limit = write_batch_bytes()
        keys = [spec.chunk_key(c) for c in coords]
        n = len(coords)
        if spec.shard_shape is None:
            parts = even_runs(n, n * chunk_bytes, limit)
            return [SubBatch(slice(lo, hi), keys[lo:hi], [spec.store_key(c) for c in coords[lo:hi]], None)
                    for lo, hi in parts]
        shards = self._shards(first, grid)
        present = [pos[pos >= 0] for _, pos in shards]
        out = []
        for lo, hi in even_runs(len(shards), n * chunk_bytes, limit):
            order = np.concatenate(present[lo:hi]) if hi > lo else np.zeros(0, dtype=np.int64)
            if len(order) and np.array_equal(order, np.arange(order[0], order[0] + len(order))):
                sel: Any = slice(int(order[0]), int(order[0]) + len(order))  # contiguous: a view, no copy
            else:
                sel = order
            out.append(SubBatch(sel, [keys[i] for i in order.tolist()], [k for k, _ in shards[lo:hi]],
                                [pos for _, pos in shards[lo:hi]]))
        return out

    def _store(self, encoded: list[Any], first: tuple[int, ...], grid: list[int]) -> int:
        """Write a block's encoded chunks (all of them, in the block's chunk order) as chunks or shards."""
        coords = [tuple(f + i for f, i in zip(first, idx)) for idx in np.ndindex(*grid)]
        total = 0
        for batch in self.sub_batches(first, grid, coords):
            sel = batch.sel
            part = encoded[sel] if isinstance(sel, slice) else [encoded[i] for i in sel.tolist()]
            total += self.writer.put_many(batch.objects(self, part))
        return total


def _total(*parts: Any) -> np.ndarray:
    return np.asarray(sum(int(np.sum(p)) for p in parts), dtype=np.int64)


# --------------------------------------------------------------------------- graph


def write_array_graph(
    x: da.Array,
    arr: zarr.Array,
    target: Target,
    *,
    device: str = "auto",
    resume: bool = False,
    folders: FolderPrefetch | None = None,
) -> da.Array:
    """The write graph of ``x`` into the existing Zarr array ``arr``: a 0-d dask array of the bytes stored.

    One task per (aligned) block: compute, encode in one batch, write. With
    ``resume``, blocks whose stored objects all exist already are left out,
    and the temporary files of a killed write are removed from the array's
    folder (local stores). ``folders``: where given, the objects' folders are
    added to it, to be made ahead while the graph computes (``with folders:
    graph.compute()``); building the graph makes no folder.
    """
    spec = spec_from_zarr_metadata(arr.metadata, target.name)
    if tuple(x.shape) != spec.shape:
        raise ValueError(f"{target.name}: array shape {spec.shape} differs from the data's {tuple(x.shape)}")
    unit = spec.read_unit
    x = align_blocks(x, unit, target.name, "shard" if spec.shard_shape else "chunk")
    writer = BlockWriter(spec, target.writer(target.name), x.chunks, device)
    name = "to-zarr-gpu-" + tokenize(x.name, spec, target.name, device)
    meta = np.empty((0,) * x.ndim, dtype=np.int64)
    written = da.map_blocks(writer, x, dtype=np.int64, chunks=tuple((1,) * len(c) for c in x.chunks), name=name,
                            meta=meta)
    keys = list(np.ndindex(*x.numblocks)) if x.ndim else [()]
    if resume:
        if isinstance(writer.writer, LocalObjectWriter) and os.path.isdir(writer.writer.root):
            remove_stale_temporaries(writer.writer.root)
        keys = [k for k in keys if not all(writer.writer.existing(_block_objects(spec, x.chunks, k)))]
    if folders is not None:
        folders.add(writer.writer, spec, x.chunks, keys)
    final = "to-zarr-gpu-done-" + tokenize(name, keys)
    layer = {(final,): Task((final,), _total, *(TaskRef((name, *k)) for k in keys))}
    graph = HighLevelGraph.from_collections(final, layer, dependencies=[written])
    return da.Array(graph, final, chunks=(), dtype=np.int64, meta=np.empty((), dtype=np.int64))


#: the most objects whose folders :func:`_prefetch_folders` starts making when the graph is built
PREFETCH_FOLDERS_MAX = 100_000


class FolderPrefetch:
    """The folders of one or more write graphs, made ahead on background threads while the graphs compute.

    ``with folders: graph.compute()`` starts making them on entry and, on
    exit (the computation done or failed), cancels what has not started and
    waits for the rest: no folder is made after the block ends, so a target
    deleted after a failed write stays deleted. A write whose folder is not
    made yet makes it itself.
    """

    def __init__(self) -> None:
        self._plans: list[tuple[Any, ArraySpec, tuple[tuple[int, ...], ...], list]] = []
        self._futures: list[Any] = []

    def add(self, writer: Any, spec: ArraySpec, chunks: tuple[tuple[int, ...], ...], blocks: list) -> None:
        """Add the folders of ``blocks`` (written by ``writer`` in blocks of ``chunks``) to make on entry."""
        self._plans.append((writer, spec, chunks, list(blocks)))

    def __enter__(self) -> FolderPrefetch:
        for plan in self._plans:
            self._futures += _prefetch_folders(*plan)
        return self

    def __exit__(self, *exc: Any) -> None:
        futures, self._futures = self._futures, []
        settle(futures)


def _prefetch_folders(writer: Any, spec: ArraySpec, chunks: tuple[tuple[int, ...], ...], blocks: list) -> list:
    """Start making every object's folder now, in block order, on background threads (local stores only);
    the futures (for :func:`~gpuzarr_dist.stores.writer.settle`).

    ``mkdir`` in one parent folder runs one at a time, so a write that first
    makes its own folder waits behind the others' (about three times slower
    on ext4 than writing into folders made beforehand). Made from the start, the folders
    are ready before most blocks are encoded. Best effort, as each block's own
    :meth:`prepare`: a write whose folder is not there yet makes it.
    """
    if type(writer).prepare is ObjectWriter.prepare or not blocks:
        return []
    n = math.prod(-(-sum(c) // u) for c, u in zip(chunks, spec.read_unit)) if chunks else 1
    if n > PREFETCH_FOLDERS_MAX:
        return []
    return writer.prepare([k for b in blocks for k in _block_objects(spec, chunks, b)])


def _block_objects(spec: ArraySpec, chunks: tuple[tuple[int, ...], ...], block: tuple[int, ...]) -> list[str]:
    """Store keys of the objects (chunks or shards) block ``block`` writes."""
    unit = spec.read_unit
    ranges = []
    for ax, i in enumerate(block):
        lo = sum(chunks[ax][:i])
        hi = lo + chunks[ax][i]
        ranges.append(range(lo // unit[ax], -(-hi // unit[ax])))
    return [spec.store_key(c) for c in itertools.product(*ranges)]


def to_zarr_gpu(
    x: Any,
    target: Any,
    component: str | None = None,
    *,
    codec: str = "zstd",
    level: int | None = None,
    chunks: Any = None,
    shards: Any = None,
    overwrite: bool = False,
    compute: bool = True,
    storage_options: dict | None = None,
    crc32c: bool = False,
    resume: bool = False,
    device: str = "auto",
    fill_value: Any = None,
    attributes: dict | None = None,
    dimension_names: Any = None,
) -> Any:
    """Write the array ``x`` as a Zarr v3 array that zarr-python and tensorstore read unchanged.

    The array half of :func:`gpuzarr_dist.to_zarr_gpu`, which takes an
    ``xr.Dataset`` too; the parameters are that function's. ``x`` is a dask
    array with cupy or numpy chunks; other arrays go through ``da.asarray``.
    """
    from gpuzarr_dist.cuda.device import resolve_device

    if device not in ("auto", "cpu", "gpu"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'gpu', got {device!r}")
    if device == "gpu":
        resolve_device("gpu")
    if overwrite and resume:
        raise ValueError("overwrite=True and resume=True contradict each other: pick one")
    if not isinstance(x, da.Array):
        x = da.asarray(x)
    dtype = np.dtype(x.dtype)
    if dtype.hasobject or dtype.kind not in "biufc":
        raise TypeError(f"to_zarr_gpu writes numeric and bool arrays, not {dtype}")
    if dask.config.get("array.query-planning", None):
        warnings.warn("dask's array query planning is on: it does not fuse blockwise layers, so each block's "
                      "compute and write run as separate tasks", stacklevel=3)
    secrets = _target_secrets(target, storage_options)
    try:
        t = open_target(target, component, storage_options)
        chunk, shard = plan_layout(x, chunks, shards)
        arr = create_metadata(
            t, shape=tuple(x.shape), dtype=dtype.newbyteorder("=") if dtype.byteorder in "<>" else dtype,
            chunk=chunk, shard=shard, compressors=codec_objects(codec, level, crc32c), fill_value=fill_value,
            attributes=attributes, dimension_names=dimension_names, overwrite=overwrite, resume=resume,
        )
        folders = FolderPrefetch() if compute else None  # compute=False: the tasks make their own folders
        result = write_array_graph(x, arr, t, device=device, resume=resume, folders=folders)
        if not compute:
            return result
        with folders:
            result.compute()
        return zarr.open_array(store=t.store, path=t.path, mode="r")
    except Exception as e:  # a store library's message or chained error may quote the URL's credentials
        raise scrub_error(e, secrets)  # noqa: B904 (the same exception, its message scrubbed)


def _target_secrets(target: Any, storage_options: dict | None) -> list[str]:
    """The credentials in a target URL and its ``storage_options``, kept out of logs (from now on) and errors."""
    from gpuzarr_dist.core.redact import install_log_filter, option_secrets, url_secrets

    secrets = option_secrets(storage_options)
    if isinstance(target, str):
        secrets += url_secrets(target)
    if secrets:
        install_log_filter(secrets)
    return secrets
