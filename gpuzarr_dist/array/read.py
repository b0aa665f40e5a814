"""``from_zarr_gpu``: a dask array whose blocks are read, decoded and assembled in one task each.

The graph is dask's own data-producer Blockwise layer (``dask.array.from_array``
with the reader inlined into every task), so dask's blockwise fusion merges the
read with the elementwise operations and the first step of a reduction that
follow it: ``(x * 2 + 1).mean(axis=0)`` optimises to one task per block plus
the reduction tree.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.array.core import normalize_chunks
from dask.base import tokenize

from gpuzarr_dist import config
from gpuzarr_dist.array.optimize import CPU_LAYER_PREFIX, GPU_LAYER_PREFIX
from gpuzarr_dist.array.optimize import install as install_optimize
from gpuzarr_dist.array.reader import BlockReader
from gpuzarr_dist.core.metadata import ArraySpec
from gpuzarr_dist.cuda.device import gpu_memory_bytes, resolve_device
from gpuzarr_dist.stores.source import open_source


def auto_block_shape(spec: ArraySpec, target_bytes: int, balance: bool = False) -> tuple[int, ...]:
    """A block shape that is a whole multiple of the stored objects' shape, about ``target_bytes`` big.

    The unit is the chunk, or the shard for sharded arrays (so each shard is read by one task).
    Sizes count only what lies inside the array: a shard of (4, 1024, 1536)
    over a (T, 721, 1440) array holds 4 x 721 x 1440 elements of the block,
    not its padded extent (counted padded, blocks of such shards came out
    two thirds of the asked size, and a time mean ran 12 blocks instead of 8).

    Axes grow in order, the first (slowest-varying, often time) first: each
    axis takes as many chunks as fit, up to its whole extent, before the next
    one grows. At least one chunk per block, whatever its size.

    ``balance``: the axis where the blocks stop growing is cut into blocks of
    as equal a number of chunks as can be, instead of full blocks and a short
    last one (300 chunks that fit 67 at a time: 5 blocks of 60, not 4 of 67
    and one of 32), so no task is a small remainder.
    """
    unit = spec.read_unit
    block = list(unit)
    item = spec.dtype.itemsize
    shape = [max(n, 1) for n in spec.shape]
    for ax, n in enumerate(spec.shape):
        size = math.prod(min(b, m) for b, m in zip(block, shape)) * item  # the block's bytes inside the array
        if size >= target_bytes:
            break
        units_on_axis = math.ceil(n / unit[ax]) if unit[ax] else 1
        fit = min(units_on_axis, max(1, int(target_bytes // max(size, 1))))
        if balance:
            fit = math.ceil(units_on_axis / math.ceil(units_on_axis / fit))
        block[ax] = unit[ax] * fit
    return tuple(min(b, max(n, 1)) for b, n in zip(block, spec.shape))


def block_count(spec: ArraySpec, block: tuple[int, ...]) -> int:
    """How many blocks of shape ``block`` cover the array."""
    return math.prod(math.ceil(max(n, 1) / b) for n, b in zip(spec.shape, block))


#: whole waves: a block may grow to this many times the asked size, or shrink to this fraction of it
WAVE_GROW, WAVE_SHRINK = 1.25, 0.7


def whole_wave_block_shape(spec: ArraySpec, target_bytes: int, threads: int) -> tuple[int, ...]:
    """:func:`auto_block_shape` with a block count that is a multiple of ``threads``, where one is near.

    With ``n`` blocks of about ``target_bytes`` on ``threads`` threads, the last
    ``n % threads`` run alone at the end (9 blocks on 8 threads: the ninth after
    the other eight). The count goes down to the multiple below (blocks up to
    :data:`WAVE_GROW` times larger) or else up to the multiple above (blocks
    down to :data:`WAVE_SHRINK` times), and the blocks are balanced. Unchanged
    where no multiple gives blocks in that range or ``n`` is at most ``threads``
    (one wave; smaller blocks would only add calls).
    """
    shape = auto_block_shape(spec, target_bytes)
    n = block_count(spec, shape)
    if threads < 2 or n <= threads or n % threads == 0:
        return shape
    below = n - n % threads
    for m in (below, below + threads):
        if not WAVE_SHRINK <= n / m <= WAVE_GROW:
            continue
        for step in range(32):  # the smallest size (in 1% steps) whose balanced blocks number exactly m
            size = int(target_bytes * n / m * (1 + step / 100))
            candidate = auto_block_shape(spec, size, balance=True)
            count = block_count(spec, candidate)
            if count == m:
                return candidate
            if count < m:
                break
    return shape


def cluster_nthreads() -> dict[str, int]:
    """Each worker's threads, by address, of the distributed client this process uses; empty without one
    (dask's local schedulers, or an asynchronous client)."""
    try:
        from distributed import default_client
    except ImportError:
        return {}
    try:
        client = default_client()
    except ValueError:  # no client: dask's local schedulers
        return {}
    if client.asynchronous:
        return {}
    workers = client.scheduler_info(n_workers=-1).get("workers", {})
    return {addr: int(w.get("nthreads", 0)) for addr, w in workers.items()}


def _cluster_threads() -> int | None:
    """The fewest threads of a worker of the distributed client this process uses, or None without one."""
    threads = list(cluster_nthreads().values())
    return min(threads) if threads and min(threads) > 0 else None


def _block_chunks(spec: ArraySpec, chunks: Any, device: str, object_store: bool = False) -> tuple[tuple[int, ...], ...]:
    if chunks is None or (isinstance(chunks, str) and chunks == "auto"):
        target, cap = config.block_size_bytes(device, gpu_memory_bytes), config.remote_block_bytes() if object_store else 0
        if cap:  # an object store: several blocks, so that each decodes while others' requests are in flight
            target = min(target, cap)
        threads = _cluster_threads() if config.cluster_whole_waves() else None
        if threads:
            return normalize_chunks(whole_wave_block_shape(spec, target, threads), spec.shape)
        return normalize_chunks(auto_block_shape(spec, target), spec.shape)
    if isinstance(chunks, str):  # e.g. "512 MiB": a block size to aim for, still chunk-aligned
        from dask.utils import parse_bytes

        try:
            size = int(parse_bytes(chunks))
        except (ValueError, TypeError) as e:
            raise ValueError(f"{spec.name}: from_zarr_gpu chunks={chunks!r} is neither 'auto' nor a byte size "
                             f"such as '512 MiB': {e}") from e
        return normalize_chunks(auto_block_shape(spec, size), spec.shape)
    _check_chunks(spec, chunks)
    # "auto" entries inside explicit chunks (e.g. {0: "auto"}) size by our block size, not dask's chunk-size
    try:
        out = normalize_chunks(chunks, spec.shape, dtype=spec.dtype, previous_chunks=spec.read_unit,
                               limit=config.block_size_bytes(device, gpu_memory_bytes))
    except (ValueError, TypeError, ZeroDivisionError) as e:
        raise ValueError(f"{spec.name}: from_zarr_gpu chunks={chunks!r} does not fit the array's shape "
                         f"{spec.shape}: {e}") from e
    what = "shard" if spec.shard_shape else "chunk"
    for ax, (bs, c) in enumerate(zip(out, spec.read_unit)):
        if any(b % c for b in bs[:-1]):
            warnings.warn(
                f"{spec.name}: blocks {bs[:3]}... on axis {ax} are not multiples of the Zarr {what} size {c}; "
                f"{what}s on block boundaries will be read more than once",
                stacklevel=3,
            )
            break
    return out


def _check_chunks(spec: ArraySpec, chunks: Any) -> None:
    """A ``ValueError`` naming the array, the axis and the argument for a block size dask would misread
    (``-3`` gives dask's "Empty tuples are not allowed", ``0`` a ``ZeroDivisionError``)."""
    import numbers

    if isinstance(chunks, dict):
        per_axis = [(ax, v) for ax, v in chunks.items() if isinstance(ax, int) and -spec.ndim <= ax < spec.ndim]
    elif isinstance(chunks, (tuple, list)):
        per_axis = list(enumerate(chunks))
    else:
        per_axis = [(ax, chunks) for ax in range(spec.ndim)]
    for ax, v in per_axis:
        if ax >= spec.ndim:  # more entries than axes: normalize_chunks says so
            break
        n = spec.shape[ax]
        sizes = v if isinstance(v, (tuple, list)) else [v]
        for b in sizes:
            if isinstance(b, numbers.Integral) and not isinstance(b, bool) and (b < -1 or (b == 0 and n > 0)):
                raise ValueError(
                    f"{spec.name}: from_zarr_gpu chunks={chunks!r}: block size {int(b)} on axis {ax} (length {n}) "
                    "is not valid; give a positive block size, -1 or None for the whole axis, 'auto', or a tuple "
                    f"of block sizes that add up to {n}"
                )


def _meta(dtype: np.dtype, ndim: int, device: str) -> Any:
    if device == "gpu":
        from gpuzarr_dist.cuda.device import device_empty

        return device_empty((0,) * ndim, dtype)
    return np.empty((0,) * ndim, dtype=dtype)


def _warn_if_array_expr() -> None:
    if dask.config.get("array.query-planning", None):
        warnings.warn(
            "dask's array query planning ('array.query-planning') is on: it does not fuse blockwise "
            "layers, so each block's read and compute run as separate tasks",
            stacklevel=3,
        )


def from_zarr_gpu(
    source: Any,
    component: str | None = None,
    *,
    chunks: Any = "auto",
    device: str = "auto",
    storage_options: dict | None = None,
) -> da.Array:
    """A dask array over a Zarr array, each block read and decoded in one batched task.

    Parameters
    ----------
    source
        A local path or ``file://`` URL, a remote URL, a ``zarr.Array``, a
        ``zarr.Group`` or a zarr store. Zarr formats 2 and 3.
    component
        The array's path inside a group or store.
    chunks
        ``"auto"`` (default): blocks are whole multiples of the Zarr chunks of
        about ``gpuzarr.block-size.{cpu,gpu}`` bytes (128 MiB / ``auto`` by
        default). A byte string (``"1 GiB"``) sets that size for this call.
        Anything else is passed to dask's ``normalize_chunks`` and honoured as
        given.
    device
        ``"auto"`` (GPU when usable, else CPU), ``"gpu"`` (cupy chunks) or
        ``"cpu"`` (numpy chunks).
    storage_options
        Passed to the store for remote URLs.
    """
    dev = resolve_device(device)
    store, spec = open_source(source, component, storage_options)
    reader = BlockReader(store, spec, dev)
    try:
        block_chunks = _block_chunks(spec, chunks, dev, getattr(store, "object_store", False))
    except (MemoryError, OverflowError) as e:  # e.g. shape (2**62, 3) in chunks of 2: billions of blocks to list
        raise ValueError(
            f"{spec.name}: shape {spec.shape} in blocks of {spec.read_unit} chunks or more gives too many dask "
            f"blocks to list ({type(e).__name__}); pass larger chunks= or open a region of the array"
        ) from e
    _warn_if_array_expr()
    prefix = GPU_LAYER_PREFIX if dev == "gpu" else CPU_LAYER_PREFIX
    name = prefix + tokenize(store.token(), spec, dev, block_chunks)
    install_optimize()
    return da.from_array(
        reader,
        chunks=block_chunks,
        name=name,
        asarray=False,
        fancy=True,  # dask 2026.8 fuses no slices into getter_nofancy: let slices reach the reader
        inline_array=True,
        meta=_meta(spec.dtype, spec.ndim, dev),
    )
