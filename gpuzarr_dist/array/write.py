"""``to_zarr_gpu``: write a dask array (cupy or numpy chunks) as a standard Zarr v3 array.

The flow of :mod:`gpuzarr_dist.array.read` backwards. zarr-python writes the
metadata (``zarr.json``), before any data, from our codec list; then each dask
block is one task that computes the block (fused by dask with whatever
produced it, e.g. ``from_zarr_gpu(a) - m``), cuts it into Zarr chunks, encodes
all of them in **one batch call** (nvCOMP on the GPU for cupy blocks,
numcodecs on a thread pool for numpy blocks), builds shards where asked and
writes every object atomically (:mod:`gpuzarr_dist.stores.writer`). Each task
returns the number of bytes it stored, so no task ever holds the whole array.

Blocks must be whole multiples of the stored object (the shard, or the chunk)
so that no two tasks write the same object; misaligned blocks are rechunked
to the smallest such multiple, with a warning that says how large a block
(and so a task's memory) becomes.

:func:`write_array_graph` holds the array-level logic (metadata in, graph
out) so that an ``xr.Dataset`` writer can call it once per variable with its
own codecs, fill value, attributes and dimension names.
"""

from __future__ import annotations

import itertools
import math
import os
import warnings
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import dask
import dask.array as da
import numpy as np
import zarr
from dask._task_spec import Task, TaskRef
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph
from dask.utils import format_bytes

from gpuzarr_dist.codecs.pipeline import CodecPipeline
from gpuzarr_dist.errors import ArrayExistsError, MetadataError
from gpuzarr_dist.core.metadata import ArraySpec, spec_from_zarr_metadata
from gpuzarr_dist.stores.remote import REMOTE_SCHEMES
from gpuzarr_dist.stores.writer import LocalObjectWriter, ObjectWriter, ZarrStoreWriter

#: URL schemes written through obstore (as they are read); other URLs (http, memory, ...) go through fsspec
OBJECT_WRITE_SCHEMES = tuple(s for s in REMOTE_SCHEMES if s not in ("http", "https"))
#: chunks=None: a dask block up to this size becomes one Zarr chunk; larger blocks are split
MAX_CHUNK_FROM_BLOCK = 16 * 2**20
#: chunks=None and a larger block: Zarr chunks of about this size (many per block: one big nvCOMP batch)
SPLIT_CHUNK_BYTES = 4 * 2**20
#: shards=... and chunks=None: inner chunks of about this size. nvCOMP zstd decodes 64 KiB - 1 MiB chunks
#: fastest in large batches; 1 MiB keeps the index small.
INNER_CHUNK_BYTES = 2**20

CODECS = ("zstd", "gzip", "none")
DEFAULT_LEVELS = {"zstd": 0, "gzip": 5}  # zstd level 0 means zstd's default (3); gzip 5 as zarr-python


# --------------------------------------------------------------------------- layout


def _divisors_at_most(n: int, limit: int) -> int:
    """The largest divisor of ``n`` that is at most ``limit`` (at least 1)."""
    best = 1
    for d in range(1, int(math.isqrt(n)) + 1):
        if n % d == 0:
            for c in (d, n // d):
                if best < c <= limit:
                    best = c
    return best


def split_shape(shape: tuple[int, ...], itemsize: int, target: int) -> tuple[int, ...]:
    """A shape that divides ``shape`` exactly, about ``target`` bytes or less.

    Axes shrink from the first (slowest varying) on, each to its largest
    divisor that brings the size under ``target`` (down to 1 before the next
    axis shrinks), so chunks stay contiguous along the fast axes.
    """
    out = [max(1, s) for s in shape]
    for ax in range(len(out)):
        size = math.prod(out) * itemsize
        if size <= target:
            break
        rest = size // out[ax]
        out[ax] = _divisors_at_most(out[ax], max(1, target // max(rest, 1)))
    return tuple(out)


def block_chunks(block: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """The default Zarr chunk shape for blocks of shape ``block``: the block itself up to
    :data:`MAX_CHUNK_FROM_BLOCK`, else the block split into chunks of about :data:`SPLIT_CHUNK_BYTES`
    that divide it (so one block's write is one batch of many chunks)."""
    if math.prod(block) * itemsize <= MAX_CHUNK_FROM_BLOCK:
        return tuple(block)
    return split_shape(block, itemsize, SPLIT_CHUNK_BYTES)


def _block_shape(x: da.Array) -> tuple[int, ...]:
    return tuple(max(c) if c else 0 for c in x.chunks)


def _as_shape(value: Any, ndim: int, what: str, array_shape: tuple[int, ...]) -> tuple[int, ...]:
    if isinstance(value, int):
        value = (value,) * ndim
    shape = tuple(value)
    if len(shape) != ndim:
        raise ValueError(f"{what}={value!r} has {len(shape)} entries, the array has {ndim} dimensions")
    out = []
    for s, n in zip(shape, array_shape):
        if s is None or s == -1:
            s = max(n, 1)
        if not isinstance(s, (int, np.integer)) or s < 1:
            raise ValueError(f"{what}={value!r}: every entry must be a positive whole number (or -1/None: the whole axis)")
        out.append(int(s))
    return tuple(out)


def plan_layout(x: da.Array, chunks: Any, shards: Any) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """``(chunk_shape, shard_shape or None)`` for writing ``x``; see :func:`to_zarr_gpu` for the rules."""
    item = x.dtype.itemsize
    block = tuple(max(b, 1) for b in _block_shape(x))
    shard = None
    if shards is not None and shards is not False:
        shard = block if shards is True or shards == "auto" else _as_shape(shards, x.ndim, "shards", x.shape)
    if chunks is not None:
        chunk = _as_shape(chunks, x.ndim, "chunks", x.shape)
        if shards is True or shards == "auto":  # one shard per block: the block rounded up to whole chunks
            shard = tuple(-(-s // c) * c for s, c in zip(shard, chunk))
    elif shard is not None:
        chunk = split_shape(shard, item, INNER_CHUNK_BYTES)
    else:
        chunk = block_chunks(block, item)
    if shard is not None and any(s % c for s, c in zip(shard, chunk)):
        raise ValueError(f"shards {shard} must be whole multiples of the chunks {chunk}")
    return chunk, shard


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
    before = math.prod(_block_shape(x)) * x.dtype.itemsize
    y = x.rechunk(tuple(new))
    after = math.prod(_block_shape(y)) * x.dtype.itemsize
    warnings.warn(
        f"{name}: dask blocks {_block_shape(x)} are not whole multiples of the stored "
        f"{what} shape {unit}; rechunking to blocks of {_block_shape(y)} "
        f"({format_bytes(after)} per block, was {format_bytes(before)}): each write task holds one such "
        "block, and the rechunk moves data between tasks. Pass chunks=/shards= that divide the blocks to avoid it.",
        stacklevel=4,
    )
    return y


# --------------------------------------------------------------------------- targets


@dataclass
class _Target:
    store: Any  # a zarr-python store (for the metadata)
    path: str  # the array's path inside it
    name: str  # for messages (no credentials)
    local_root: str | None  # the store's folder on a local disk, or None
    scrub: Any = None  # credentials out of the store's error texts (object stores), or None

    def writer(self, array: str) -> ObjectWriter:
        if self.local_root is not None:
            return LocalObjectWriter(os.path.join(self.local_root, *[p for p in self.path.split("/") if p]), array)
        return ZarrStoreWriter(self.store, self.path, array, self.scrub)


def _join(*parts: str | None) -> str:
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


def _open_target(target: Any, component: str | None, storage_options: dict | None) -> _Target:
    from zarr.abc.store import Store

    if component and any(p in ("..", ".") for p in component.split("/")):
        raise ValueError(f"component {component!r} may not contain '.' or '..' parts")
    if isinstance(target, os.PathLike):
        target = os.fspath(target)
    if isinstance(target, str):
        url = urlparse(target)
        if url.scheme in ("", "file"):
            root = os.path.abspath(os.path.expanduser(url.path if url.scheme == "file" else target))
            store = zarr.storage.LocalStore(root)
            return _Target(store, _join(component), os.path.join(root, _join(component)) if component else root, root)
        shown = f"{url.scheme}://{url.hostname or ''}{url.path}"  # no credentials from the URL
        name = f"{shown.rstrip('/')}/{component}" if component else shown
        if url.scheme in OBJECT_WRITE_SCHEMES:  # the reads' obstore client: same options, environment and messages
            from gpuzarr_dist.stores.remote import ObjectChunkStore

            root = ObjectChunkStore(target, name, storage_options)
            return _Target(zarr.storage.ObjectStore(root.store, read_only=False), _join(component), name, None,
                           root.scrub)
        store = zarr.storage.FsspecStore.from_url(target, storage_options=storage_options, read_only=False)
        return _Target(store, _join(component), name, None)
    if isinstance(target, zarr.Group):
        if not component:
            raise ValueError("to_zarr_gpu into a zarr.Group needs component= naming the new array")
        target, component = target.store, _join(target.path, component)
    if isinstance(target, Store):
        root = str(target.root) if isinstance(target, zarr.storage.LocalStore) else None
        name = f"{target}/{component}" if component else str(target)
        return _Target(target, _join(component), name, root)
    raise TypeError(f"target must be a path, URL, zarr.Group or zarr store, not {type(target).__name__}")


def _codec_objects(codec: str, level: int | None, crc32c: bool) -> list[Any]:
    import zarr.codecs as zc

    if codec not in CODECS:
        raise ValueError(f"codec must be one of {CODECS}, got {codec!r}")
    level = DEFAULT_LEVELS.get(codec) if level is None else int(level)
    out: list[Any] = []
    if codec == "zstd":
        out.append(zc.ZstdCodec(level=level))
    elif codec == "gzip":
        out.append(zc.GzipCodec(level=level))
    if crc32c:
        out.append(zc.Crc32cCodec())
    return out


def _existing(target: _Target) -> Any:
    """The array or group at the target, or None."""
    try:
        return zarr.open(store=target.store, path=target.path, mode="r")
    except (FileNotFoundError, KeyError):
        return None
    except Exception as e:  # zarr-python's own "not found" errors
        if "NotFound" in type(e).__name__:
            return None
        raise


def _comparable(meta: Any) -> dict:
    d = dict(meta.to_dict())
    d.pop("attributes", None)
    return d


def create_metadata(
    target: _Target,
    *,
    shape: tuple[int, ...],
    dtype: np.dtype,
    chunk: tuple[int, ...],
    shard: tuple[int, ...] | None,
    compressors: list[Any],
    fill_value: Any,
    attributes: dict | None,
    dimension_names: Any,
    overwrite: bool,
    resume: bool,
) -> zarr.Array:
    """Write (or, with ``resume``, check) the array's ``zarr.json`` through zarr-python; return the array."""
    kwargs = dict(
        shape=shape,
        dtype=dtype,
        chunks=chunk,
        shards=shard,
        filters=None,
        compressors=compressors or None,
        serializer="auto",
        zarr_format=3,
        attributes=attributes,
        dimension_names=dimension_names,
        **({} if fill_value is None else {"fill_value": fill_value}),
    )
    existing = None if overwrite else _existing(target)
    if existing is not None:
        if not resume or not isinstance(existing, zarr.Array):
            kind = "array" if isinstance(existing, zarr.Array) else "group"
            hint = "overwrite=True replaces it" + (", resume=True completes an interrupted write of the same array"
                                                   if kind == "array" else "")
            raise ArrayExistsError(f"{target.name}: a Zarr {kind} exists there already ({hint})")
        wanted = zarr.create_array(zarr.storage.MemoryStore(), **kwargs)
        a, b = _comparable(existing.metadata), _comparable(wanted.metadata)
        if a != b:
            diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            raise MetadataError(
                f"{target.name}: resume=True, but the array there differs from the one to write in zarr.json "
                f"field(s) {diff}: existing {[a.get(k) for k in diff]}, wanted {[b.get(k) for k in diff]}"
            )
        return existing
    return zarr.create_array(target.store, name=target.path or None, overwrite=overwrite, **kwargs)


# --------------------------------------------------------------------------- the task


def chunk_grid(block: Any, chunk: tuple[int, ...], fill: Any, xp: Any) -> Any:
    """The chunks of ``block`` as one contiguous ``(n, *chunk)`` array, in C order of their grid positions.

    Edge chunks are padded with ``fill`` to the full chunk shape (Zarr stores
    edge chunks whole). Works for numpy and cupy (one copy kernel on the GPU).
    """
    grid = [-(-b // c) for b, c in zip(block.shape, chunk)]
    full = tuple(g * c for g, c in zip(grid, chunk))
    if full != tuple(block.shape):
        padded = xp.full(full, fill, dtype=block.dtype)
        padded[tuple(slice(0, b) for b in block.shape)] = block
        block = padded
    nd = len(chunk)
    tiles = block.reshape([v for g, c in zip(grid, chunk) for v in (g, c)])
    tiles = tiles.transpose(list(range(0, 2 * nd, 2)) + list(range(1, 2 * nd, 2)))
    return xp.ascontiguousarray(tiles).reshape((math.prod(grid), *chunk))


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
        first, grid, coords = self._chunk_layout(tuple(block.shape), start)
        return self.run_batches(encoder, self.sub_batches(first, grid, coords))

    def run_batches(self, encoder: "BlockEncoder", batches: list["SubBatch"]) -> int:
        """Encode and write ``batches`` in order, launching each encode before the previous batch's writes."""
        total = 0
        # the objects' folders are made (on a few background threads) while the block is encoded
        self.writer.prepare([k for b in batches for k in b.object_keys])
        pending = encoder.launch(batches[0].sel, batches[0].keys) if batches else None
        try:
            for k, batch in enumerate(batches):
                encoded = encoder.finish(pending)
                pending = None
                if k + 1 < len(batches):  # runs on the GPU (or the encode threads) while this thread writes
                    pending = encoder.launch(batches[k + 1].sel, batches[k + 1].keys)
                total += self.writer.put_many(batch.objects(self, encoded))
                del encoded
        finally:
            if pending is not None:  # a write failed: let the launched encode finish before its buffers go
                encoder.abandon(pending)
        return total

    def _chunk_layout(self, shape: tuple[int, ...], start: tuple[int, ...]) -> tuple[tuple[int, ...], list[int], list[tuple[int, ...]]]:
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

        first, grid, coords = self._chunk_layout(block.shape, start)
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

    def sub_batches(self, first: tuple[int, ...], grid: list[int], coords: list[tuple[int, ...]]) -> list["SubBatch"]:
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
            parts = _even_runs(n, n * chunk_bytes, limit)
            return [SubBatch(slice(lo, hi), keys[lo:hi], [spec.store_key(c) for c in coords[lo:hi]], None)
                    for lo, hi in parts]
        shards = self._shards(first, grid)
        present = [pos[pos >= 0] for _, pos in shards]
        out = []
        for lo, hi in _even_runs(len(shards), n * chunk_bytes, limit):
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


def _even_runs(count: int, nbytes: int, limit: int | None) -> list[tuple[int, int]]:
    """``count`` objects of ``nbytes`` in all cut into as few equal ``(lo, hi)`` runs as keep each under ``limit``."""
    if count == 0:
        return []
    k = 1 if not limit or limit <= 0 else min(count, max(1, -(-nbytes // limit)))
    bounds = [count * i // k for i in range(k + 1)]
    return [(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo]


@dataclass
class SubBatch:
    """Some chunks of one block, encoded together, and the whole objects they make.

    ``sel`` picks the chunks from the block's chunk list (a slice, or positions
    when the shards' chunks are not contiguous there); ``keys`` are their chunk
    keys (for errors). Unsharded, ``objects`` are the chunks themselves;
    sharded, ``shards`` holds each shard's inner-chunk positions (-1: absent).
    """

    sel: Any
    keys: list[str]
    object_keys: list[str]
    shards: list[np.ndarray] | None

    def objects(self, writer: BlockWriter, encoded: list[Any]) -> list[tuple[str, Any]]:
        """``(store key, data)`` of each object from this sub-batch's encoded chunks (in ``sel`` order)."""
        if self.shards is None:
            return list(zip(self.object_keys, encoded))
        out, it = [], iter(encoded)
        for key, pos in zip(self.object_keys, self.shards):
            parts = [next(it) if p >= 0 else None for p in pos.tolist()]
            out.append((key, writer.index.build_parts(parts, key)))
        return out


class BlockEncoder:
    """Encodes sub-batches of one block's chunks: ``launch`` starts the work, ``finish`` waits for the bytes.

    ``launch`` returns quickly where the work runs elsewhere (the GPU, the CPU
    encode threads), so the caller can write the previous sub-batch meanwhile;
    ``abandon`` waits for launched work whose result is no longer wanted (its
    buffers must outlive it).
    """

    def launch(self, sel: Any, keys: list[str]) -> Any:
        raise NotImplementedError

    def finish(self, pending: Any) -> list[Any]:
        raise NotImplementedError

    def abandon(self, pending: Any) -> None:
        raise NotImplementedError


class CpuBlockEncoder(BlockEncoder):
    """numcodecs encoders on the shared CPU encode threads (``decode_pool``), one future per chunk."""

    def __init__(self, writer: BlockWriter, block: np.ndarray):
        self.pipeline = writer.pipeline
        self.chunks = writer.host_chunks(block)

    def launch(self, sel: Any, keys: list[str]) -> list[Any]:
        from gpuzarr_dist.runtime.threads import decode_pool

        rows = list(self.chunks[sel]) if isinstance(sel, slice) else [self.chunks[i] for i in sel.tolist()]
        if len(rows) == 1:  # one chunk: no thread hand-off
            return [_Done(self.pipeline.encode_chunk, rows[0], keys[0])]
        pool = decode_pool()
        return [pool.submit(self.pipeline.encode_chunk, r, k) for r, k in zip(rows, keys)]

    def finish(self, pending: list[Any]) -> list[Any]:
        from concurrent.futures import wait

        wait([f for f in pending if not isinstance(f, _Done)])  # none left running when one failed
        return [f.result() for f in pending]

    def abandon(self, pending: list[Any]) -> None:
        from concurrent.futures import wait

        for f in pending:
            f.cancel()
        wait([f for f in pending if not isinstance(f, _Done)])


class _Done:
    """A call run when its result is asked for (a future without a thread)."""

    def __init__(self, fn: Any, *args: Any):
        self.fn, self.args = fn, args

    def result(self) -> Any:
        return self.fn(*self.args)

    def cancel(self) -> bool:
        return True


def _total(*parts: Any) -> np.ndarray:
    return np.asarray(sum(int(np.sum(p)) for p in parts), dtype=np.int64)


# --------------------------------------------------------------------------- graph


def write_array_graph(
    x: da.Array,
    arr: zarr.Array,
    target: _Target,
    *,
    device: str = "auto",
    resume: bool = False,
) -> da.Array:
    """The write graph of ``x`` into the existing Zarr array ``arr``: a 0-d dask array of the bytes stored.

    One task per (aligned) block: compute, encode in one batch, write. With
    ``resume``, blocks whose stored objects all exist already are left out.
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
    _prefetch_folders(writer.writer, spec, x.chunks, keys)
    if resume:
        keys = [k for k in keys if not all(writer.writer.existing(_block_objects(spec, x.chunks, k)))]
    final = "to-zarr-gpu-done-" + tokenize(name, keys)
    layer = {(final,): Task((final,), _total, *(TaskRef((name, *k)) for k in keys))}
    graph = HighLevelGraph.from_collections(final, layer, dependencies=[written])
    return da.Array(graph, final, chunks=(), dtype=np.int64, meta=np.empty((), dtype=np.int64))


#: the most objects whose folders :func:`_prefetch_folders` starts making when the graph is built
PREFETCH_FOLDERS_MAX = 100_000


def _prefetch_folders(writer: Any, spec: ArraySpec, chunks: tuple[tuple[int, ...], ...], blocks: list) -> None:
    """Start making every object's folder now, in block order, on background threads (local stores only).

    ``mkdir`` in one parent folder runs one at a time, so a write that first
    makes its own folder waits behind the others' (about three times slower
    on ext4 than writing into folders made beforehand). Made from the start, the folders
    are ready before most blocks are encoded. Best effort, as each block's own
    :meth:`prepare`: a write whose folder is not there yet makes it.
    """
    if type(writer).prepare is ObjectWriter.prepare or not blocks:
        return
    n = math.prod(-(-sum(c) // u) for c, u in zip(chunks, spec.read_unit)) if chunks else 1
    if n > PREFETCH_FOLDERS_MAX:
        return
    writer.prepare([k for b in blocks for k in _block_objects(spec, chunks, b)])


def _block_objects(spec: ArraySpec, chunks: tuple[tuple[int, ...], ...], block: tuple[int, ...]) -> list[str]:
    """Store keys of the objects (chunks or shards) block ``block`` writes."""
    unit = spec.read_unit
    ranges = []
    for ax, i in enumerate(block):
        lo = sum(chunks[ax][:i])
        hi = lo + chunks[ax][i]
        ranges.append(range(lo // unit[ax], -(-hi // unit[ax])))
    return [spec.store_key(c) for c in itertools.product(*ranges)]


#: ``to_zarr_gpu``'s keywords that it hands on to :func:`~gpuzarr_dist.xarray.write.dataset_to_zarr_gpu`
#: for an ``xr.Dataset`` (one list for both signatures; ``tests/test_write_folders.py`` checks them)
DATASET_KEYWORDS = ("codec", "level", "chunks", "shards", "overwrite", "compute", "storage_options", "crc32c", "device")
#: ``to_zarr_gpu``'s keywords that apply to one array only (refused with a Dataset)
ARRAY_ONLY_KEYWORDS = ("resume", "fill_value", "attributes", "dimension_names")


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
    """Write ``x`` as a Zarr v3 array that zarr-python and tensorstore read unchanged.

    Each dask block is one task that computes it, encodes all its chunks in
    one batch (nvCOMP on the GPU for cupy blocks, numcodecs threads for numpy
    blocks) and writes each chunk or shard atomically. Metadata is written
    first, through zarr-python.

    Parameters
    ----------
    x
        A dask array with cupy or numpy chunks (other arrays go through ``da.asarray``), or an
        ``xr.Dataset``: then ``component`` is the group, ``chunks``/``shards`` may be
        ``{dim: size}`` mappings, and the data variables are CF-encoded as xarray would
        (see :func:`gpuzarr_dist.xarray.write.dataset_to_zarr_gpu`).
    target
        A local path or ``file://`` URL, a remote URL (``s3://...``, through fsspec with
        ``storage_options``), a zarr store, or a ``zarr.Group`` (with ``component``).
    component
        The array's path inside the store or group (parent groups are created).
    codec
        ``"zstd"`` (default), ``"gzip"`` or ``"none"``.
    level
        Compression level for CPU encoding, recorded in the metadata. Default:
        zstd's own default (metadata level 0, i.e. 3), gzip 5. nvCOMP's zstd
        encoder on the GPU takes no level.
    chunks
        The Zarr chunk shape (inner chunks when sharded). Default: the dask
        block shape when a block is at most 16 MiB, else that block split into
        chunks of at most about 4 MiB that divide it; with ``shards``, inner
        chunks of at most about 1 MiB dividing the shard.
    shards
        ``None`` (not sharded), a shard shape, or ``True``/``"auto"``: one shard
        per dask block. The shard index (bytes + crc32c, at the end) is written
        by gpuzarr-dist.
    overwrite
        Replace whatever is at the target. Without it (and without ``resume``)
        an existing array or group raises :class:`~gpuzarr_dist.errors.ArrayExistsError`.
    compute
        ``True``: write now and return the ``zarr.Array``. ``False``: write the
        metadata now and return a 0-d dask array whose ``compute()`` writes
        the data and gives the bytes stored.
    storage_options
        For URLs: passed to fsspec (e.g. ``endpoint_url``, ``key``, ``secret``).
    crc32c
        Add a crc32c checksum codec after the compressor.
    resume
        Complete an interrupted write: the array at the target must have the
        metadata this call would write (else :class:`MetadataError` naming the
        fields); blocks whose objects all exist already are skipped, the others
        rewritten. Objects are written atomically, so an existing one is whole.
    device
        ``"auto"`` (GPU encode for cupy blocks, CPU for numpy), ``"cpu"`` or ``"gpu"``.
    fill_value, attributes, dimension_names
        Passed to zarr-python's ``create_array`` (for the xarray writer).
    """
    from gpuzarr_dist.cuda.device import resolve_device

    if type(x).__name__ == "Dataset" and type(x).__module__.startswith("xarray"):
        from gpuzarr_dist.xarray.write import dataset_to_zarr_gpu  # the Dataset writer builds on this module

        given = locals()
        if resume or fill_value is not None or attributes is not None or dimension_names is not None:
            raise TypeError(f"{', '.join(ARRAY_ONLY_KEYWORDS[:-1])} and {ARRAY_ONLY_KEYWORDS[-1]} apply to arrays, "
                            "not to a Dataset (xarray writes a Dataset's attributes and fill values from its encoding)")
        return dataset_to_zarr_gpu(x, target, component, **{k: given[k] for k in DATASET_KEYWORDS})
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
                      "compute and write run as separate tasks", stacklevel=2)
    t = _open_target(target, component, storage_options)
    chunk, shard = plan_layout(x, chunks, shards)
    arr = create_metadata(
        t, shape=tuple(x.shape), dtype=dtype.newbyteorder("=") if dtype.byteorder in "<>" else dtype,
        chunk=chunk, shard=shard, compressors=_codec_objects(codec, level, crc32c), fill_value=fill_value,
        attributes=attributes, dimension_names=dimension_names, overwrite=overwrite, resume=resume,
    )
    result = write_array_graph(x, arr, t, device=device, resume=resume)
    if not compute:
        return result
    result.compute()
    return zarr.open_array(store=t.store, path=t.path, mode="r")
