"""Chunk and shard shapes for writing: what divides what, and how many bytes each piece holds.

Device-free and dask-free arithmetic on shapes. :func:`plan_layout` takes
anything with dask's ``chunks``, ``shape``, ``ndim`` and ``dtype`` (a dask
array, in practice).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: chunks=None: a dask block up to this size becomes one Zarr chunk; larger blocks are split
MAX_CHUNK_FROM_BLOCK = 16 * 2**20
#: chunks=None and a larger block: Zarr chunks of about this size (many per block: one big nvCOMP batch)
SPLIT_CHUNK_BYTES = 4 * 2**20
#: shards=... and chunks=None: inner chunks of about this size. nvCOMP zstd decodes 50-55 GB/s on one
#: H200 for 64 KiB - 1 MiB chunks in large batches (shared GPU notes); 1 MiB keeps the index small.
INNER_CHUNK_BYTES = 2**20


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


def block_shape(chunks: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    """The largest block along each axis of dask ``chunks`` (0 for an axis without blocks)."""
    return tuple(max(c) if c else 0 for c in chunks)


def as_shape(value: Any, ndim: int, what: str, array_shape: tuple[int, ...]) -> tuple[int, ...]:
    """``value`` (an int for every axis, or one entry per axis; -1/None: the whole axis) as a shape.

    Raises ``ValueError`` naming ``what`` for a wrong number of entries or an
    entry that is not a positive whole number.
    """
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


def plan_layout(x: Any, chunks: Any, shards: Any) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """``(chunk_shape, shard_shape or None)`` for writing ``x``; see :func:`gpuzarr_dist.to_zarr_gpu` for the rules."""
    item = x.dtype.itemsize
    block = tuple(max(b, 1) for b in block_shape(x.chunks))
    shard = None
    if shards is not None and shards is not False:
        shard = block if shards is True or shards == "auto" else as_shape(shards, x.ndim, "shards", x.shape)
    if chunks is not None:
        chunk = as_shape(chunks, x.ndim, "chunks", x.shape)
        if shards is True or shards == "auto":  # one shard per block: the block rounded up to whole chunks
            shard = tuple(-(-s // c) * c for s, c in zip(shard, chunk))
    elif shard is not None:
        chunk = split_shape(shard, item, INNER_CHUNK_BYTES)
    else:
        chunk = block_chunks(block, item)
    if shard is not None and any(s % c for s, c in zip(shard, chunk)):
        raise ValueError(f"shards {shard} must be whole multiples of the chunks {chunk}")
    return chunk, shard


def even_runs(count: int, nbytes: int, limit: int | None) -> list[tuple[int, int]]:
    """``count`` objects of ``nbytes`` in all cut into as few equal ``(lo, hi)`` runs as keep each under ``limit``."""
    if count == 0:
        return []
    k = 1 if not limit or limit <= 0 else min(count, max(1, -(-nbytes // limit)))
    bounds = [count * i // k for i in range(k + 1)]
    return [(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo]


def host_memory_available() -> int:
    """The bytes of host memory available to a new allocation without swapping (Linux ``MemAvailable``, through
    psutil), or the machine's physical memory where that is not known."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # no psutil, or a system it cannot read
        import os

        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
