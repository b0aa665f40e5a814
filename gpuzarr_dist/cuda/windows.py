"""The GPU half of :mod:`gpuzarr_dist.array.windows`: chunk keys -> pinned staging -> one copy -> one nvCOMP call,
then one kernel that cuts the windows out of the decoded chunks.

Only imported on the GPU path (imports cupy). The same steps as
:func:`gpuzarr_dist.cuda.blocks.read_plan_gpu`, for an arbitrary set of chunk
keys instead of a block's plan; the stream is synchronised before returning so
the pinned staging buffer can be reused and the chunks are complete.
"""

from __future__ import annotations

from typing import Any

import cupy
import numpy as np

from gpuzarr_dist.core.plan_reader import PlanReader
from gpuzarr_dist.cuda.decode import decode_batch_gpu, framing_lead, gpu_unsupported
from gpuzarr_dist.cuda.sources import source
from gpuzarr_dist.cuda.streams import ALIGN, pinned_staging, thread_stream, upload
from gpuzarr_dist.runtime.threads import decode_pool


def decode_keys_gpu(reader: PlanReader, keys: list[str]) -> tuple[Any, list[int]]:
    """Decoded chunks ``(n_present, *chunk_shape)`` on the device, and the positions of the keys present."""
    spec, pipeline = reader.spec, reader.pipeline
    stream = thread_stream()
    if not keys:
        return cupy.empty((0, *spec.chunk_shape), dtype=spec.dtype), []
    if gpu_unsupported(pipeline) is not None:  # decode on the CPU, one copy up
        raw = reader.store.read_many(keys)
        present = [i for i, b in enumerate(raw) if b is not None]
        host = np.empty((len(present), *spec.chunk_shape), dtype=spec.dtype)
        if present:
            decoded = pipeline.decode_batch([raw[i] for i in present], [keys[i] for i in present], decode_pool())
            for j, arr in enumerate(decoded or []):
                host[j] = arr
        out = cupy.asarray(host)
        stream.synchronize()
        return out, present
    host, offsets, sizes = reader.store.read_into(keys, pinned_staging, ALIGN, framing_lead(pipeline))
    present = [i for i, n in enumerate(sizes) if n >= 0]
    if not present:
        return cupy.empty((0, *spec.chunk_shape), dtype=spec.dtype), []
    chunks = decode_batch_gpu(pipeline, host, [offsets[i] for i in present], [sizes[i] for i in present],
                              [keys[i] for i in present], stream)
    chunks = chunks.reshape((len(present), *spec.chunk_shape))
    stream.synchronize()
    return chunks, present


def join_parts(parts: list[tuple[Any, list[int]]], firsts: list[int]) -> tuple[Any, list[int]]:
    """One call's result from :func:`decode_keys_gpu`'s results for its parts (part ``j`` holding the keys from ``firsts[j]`` on).

    The parts' chunks are copied into one array on this thread's stream, which
    is then waited for: each part's chunks were made on its own thread's
    stream and go back to that stream's memory pool when dropped here, where
    that thread's next part could reuse them while a copy still read them.
    """
    present = [first + i for (_, got), first in zip(parts, firsts) for i in got]
    stream = thread_stream()
    chunks = cupy.concatenate([c for c, _ in parts], axis=0)
    stream.synchronize()
    return chunks, present


#: one thread per element of the windows: which window, where in it, so which chunk of the window's grid and
#: where in that chunk (C order); the fill value where the grid names no decoded chunk (``k == m``)
_CUT_SOURCE = source("cut_windows.cu")

_cut_kernel: list[Any] = []


def cut_windows_gpu(chunks: cupy.ndarray, idx: np.ndarray, offsets: np.ndarray, window: tuple[int, ...],
                    fill: Any) -> cupy.ndarray:
    """:func:`gpuzarr_dist.array.windows._cut_windows` on the device: one kernel, on the current stream.

    Each element of the ``(n, *window)`` result is read once from the decoded
    chunks: no index arrays the size of the result (CuPy's advanced indexing
    makes several, and is several times slower).
    """
    n, nd = idx.shape[0], idx.ndim - 1
    out = cupy.empty((n, *window), dtype=chunks.dtype)
    if out.size == 0:
        return out
    if not _cut_kernel:
        _cut_kernel.append(cupy.ElementwiseKernel(
            "raw T chunks, raw int64 idx, raw int64 offsets, raw int64 dims, int32 nd, int64 wsize, int64 gsize, "
            "int64 csize, int64 m, T fill", "T out", _CUT_SOURCE, "gpuzarr_cut_windows"))
    cshape, grid = tuple(chunks.shape[1:]), tuple(idx.shape[1:])
    dims = np.array([*window, *cshape, *grid], dtype=np.int64)
    tables = upload(np.concatenate([dims, np.asarray(offsets, dtype=np.int64).reshape(-1),
                                    np.asarray(idx, dtype=np.int64).reshape(-1)]))  # one copy up
    k = len(dims) + n * nd
    m = len(chunks)
    flat = cupy.ascontiguousarray(chunks).reshape(-1) if m else cupy.empty(1, dtype=chunks.dtype)
    _cut_kernel[0](flat, tables[k:], tables[len(dims) : k], tables[: len(dims)], np.int32(nd),
                   np.int64(np.prod(window)), np.int64(np.prod(grid)), np.int64(np.prod(cshape)), np.int64(m),
                   chunks.dtype.type(fill), out)
    return out
