"""nvCOMP decode calls of the GPU decode path: one batched call per batch (or a share of one joined with other
threads' calls), through nvCOMP's C API where it applies and its Python ``Codec`` otherwise.

Only imported on the GPU path: importing it imports cupy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import cupy
import numpy as np

from gpuzarr_dist.config import gpu_decode_combine, nvcomp_api
from gpuzarr_dist.cuda.streams import settle, upload


def nvcomp_codec(algorithm: str, stream: cupy.cuda.Stream) -> Any:
    """This thread's nvCOMP codec for ``algorithm`` on ``stream`` (see :func:`.streams.thread_nvcomp_codec`)."""
    from gpuzarr_dist.cuda.streams import thread_nvcomp_codec

    return thread_nvcomp_codec(algorithm, stream)


class Tables(NamedTuple):
    """A batch's small tables on the device, copied up in one copy ahead of its chunks (:func:`small_tables`)."""

    frames: cupy.ndarray  # (2, n) int64: each frame's offset and size in the chunk buffer (the walks')
    nvcomp: cupy.ndarray | None  # (4, n) uint64: nvCOMP's C call's pointer and size tables, or None


def frame_ptrs(dev: cupy.ndarray, in_offs: Sequence[int] | np.ndarray, out: cupy.ndarray, stride: int,
               n: int) -> tuple[np.ndarray, np.ndarray]:
    """The device addresses (uint64 arrays) of ``n`` frames at ``in_offs`` of ``dev`` and of their output slots,
    ``stride`` bytes apart in ``out``: numpy over the batch, no Python int per frame (a sharded block decodes
    thousands of frames, and every moment a block holds the GIL delays every other block's reads)."""
    in_ptrs = np.asarray(in_offs, dtype=np.uint64) + np.uint64(dev.data.ptr)
    out_ptrs = np.arange(n, dtype=np.uint64) * np.uint64(stride) + np.uint64(out.data.ptr)
    return in_ptrs, out_ptrs


def small_tables(algorithm: str, dev: cupy.ndarray, in_offs: np.ndarray, in_sizes: np.ndarray, out: cupy.ndarray,
                 stride: int, stream: cupy.cuda.Stream) -> Tables:
    """Queue the frame tables of the walks and of nvCOMP's C call on ``stream``, in one copy.

    Called before the batch's chunks are copied up. Copies from many threads'
    streams share the copy engine in the order they were queued, so a table
    copied up after the chunks (by the walk, then by nvCOMP's call after the
    walk) waits behind every other batch's chunks queued in the meantime, and
    the kernels that need it with it.
    """
    from gpuzarr_dist.cuda import nvcomp as nvcomp_c

    n = len(in_offs)
    in_ptrs, out_ptrs = frame_ptrs(dev, in_offs, out, stride, n)
    c = nvcomp_api() == "c" and nvcomp_c.available() and nvcomp_c.aligned(algorithm, in_ptrs, out_ptrs)
    host = np.empty((6 if c else 2, n), dtype=np.int64)
    host[0], host[1] = in_offs, in_sizes
    if c:
        nvcomp_c.decode_tables(in_ptrs, in_sizes, out_ptrs, np.full(n, stride, dtype=np.uint64), host[2:].view(np.uint64))
    up = upload(host, stream)  # queued on ``stream``, not waited for
    return Tables(up[:2], up[2:].view(cupy.uint64) if c else None)


class Frames(NamedTuple):
    """One batch's frames for an nvCOMP call: ``n`` frames of ``dev`` into ``out``'s slots of ``stride``
    bytes; ``ready`` (joined calls only) recorded on the stream that uploaded and checked them."""

    algorithm: str
    ready: cupy.cuda.Event | None
    dev: cupy.ndarray
    in_offs: np.ndarray  # int64
    in_sizes: np.ndarray  # int64
    out: cupy.ndarray
    stride: int
    n: int
    tables: cupy.ndarray | None = None  # nvCOMP's C call's tables already on the device (small_tables)


def nvcomp_decode(algorithm: str, stream: cupy.cuda.Stream, dev: cupy.ndarray, in_offs: np.ndarray,
                  in_sizes: np.ndarray, out: cupy.ndarray, stride: int, n: int,
                  tables: cupy.ndarray | None = None) -> list[int]:
    """Decode ``n`` frames of ``dev`` into the slots of ``out``; their decoded sizes.

    One nvCOMP call on ``stream`` (:func:`decode_frames`), or, under
    ``gpuzarr.gpu.decode-combine``, a share of a call joined with other
    threads' (:mod:`.combine`); a joined call that failed is made again for
    this batch alone.
    """
    frames = Frames(algorithm, None, dev, in_offs, in_sizes, out, stride, n, tables)
    if gpu_decode_combine():
        from gpuzarr_dist.cuda.combine import Request, combiner

        ready = cupy.cuda.Event(block=False, disable_timing=True)
        ready.record(stream)  # the upload and the frame checks queued before it
        req = combiner((cupy.cuda.Device().id, algorithm)).run(Request(frames._replace(ready=ready, tables=None)),
                                                               execute_joined)
        if req.error is not None:
            raise req.error
        if not req.alone:
            return req.result
    return decode_frames(stream, [frames])


def decode_frames(stream: cupy.cuda.Stream, parts: list[Frames]) -> list[int]:
    """One nvCOMP call for the frames of ``parts`` (one algorithm) on ``stream``, waited for; their decoded sizes
    (see :func:`decode_spans`)."""
    ptrs = [frame_ptrs(p.dev, p.in_offs, p.out, p.stride, p.n) for p in parts]
    in_ptrs = np.concatenate([i for i, _ in ptrs])
    out_ptrs = np.concatenate([o for _, o in ptrs])

    def arrays() -> tuple[Any, Any]:
        from nvidia import nvcomp

        if len(parts) == 1:
            p = parts[0]
            return (nvcomp.as_arrays(p.dev, np.asarray(p.in_offs).tolist(), np.asarray(p.in_sizes).tolist()),
                    nvcomp.as_arrays(p.out, [i * p.stride for i in range(p.n)], [p.stride] * p.n))
        # several buffers: a BatchArray from views of each (the batch overloads take nothing else)
        return (nvcomp.as_arrays([p.dev[o : o + s] for p in parts
                                  for o, s in zip(np.asarray(p.in_offs).tolist(), np.asarray(p.in_sizes).tolist())]),
                nvcomp.as_arrays([p.out[i * p.stride : (i + 1) * p.stride] for p in parts for i in range(p.n)]))

    return decode_ptrs(parts[0].algorithm, stream, in_ptrs, np.concatenate([np.asarray(p.in_sizes, dtype=np.int64) for p in parts]),
                       out_ptrs, np.concatenate([np.full(p.n, p.stride, dtype=np.int64) for p in parts]), arrays,
                       parts[0].tables if len(parts) == 1 else None)


def decode_spans(algorithm: str, stream: cupy.cuda.Stream, src: cupy.ndarray, in_offs: Sequence[int],
                 in_sizes: Sequence[int], dst: cupy.ndarray, out_offs: Sequence[int], out_sizes: Sequence[int]) -> list[int]:
    """One nvCOMP call decoding the spans of ``src`` at ``in_offs`` into the slots of ``dst`` at ``out_offs``
    (``out_sizes`` bytes each) on ``stream``, waited for; their decoded sizes (Blosc's gathered streams).

    See :func:`decode_ptrs`: nvCOMP's C function where it applies, its Python ``Codec`` otherwise.
    """
    from nvidia import nvcomp

    return decode_ptrs(algorithm, stream, [src.data.ptr + o for o in in_offs], in_sizes,
                       [dst.data.ptr + o for o in out_offs], out_sizes,
                       lambda: (nvcomp.as_arrays(src, list(in_offs), list(in_sizes)),
                                nvcomp.as_arrays(dst, list(out_offs), list(out_sizes))))


def decode_ptrs(algorithm: str, stream: cupy.cuda.Stream, in_ptrs: Sequence[int], in_sizes: Sequence[int],
                out_ptrs: Sequence[int], out_sizes: Sequence[int], arrays: Callable[[], tuple[Any, Any]],
                tables: cupy.ndarray | None = None) -> list[int]:
    """Decode frames at device addresses on ``stream`` and wait; their decoded sizes.

    Through nvCOMP's C API (:mod:`.nvcomp`: the GIL released, nothing
    waited for until the sizes are needed) under ``gpuzarr.gpu.nvcomp-api``
    ``c`` (the default) when the addresses meet its alignment, otherwise
    through its Python ``Codec.decode`` on the ``(inputs, outputs)`` that
    ``arrays()`` makes. ``tables``: the C call's tables already on the device.
    """
    from gpuzarr_dist.cuda import nvcomp as nvcomp_c

    if nvcomp_api() == "c" and nvcomp_c.available() and nvcomp_c.aligned(algorithm, in_ptrs, out_ptrs):
        return nvcomp_c.decode(algorithm, stream, in_ptrs, in_sizes, out_ptrs, out_sizes, tables)
    ins, outs = arrays()
    res = nvcomp_codec(algorithm, stream).decode(ins, out=outs)
    stream.synchronize()  # wait here, where CuPy releases the GIL (reading sizes waits holding it)
    return list(res.buffer_sizes)


def execute_joined(batch: list[Any]) -> None:
    """One nvCOMP call for every request of ``batch`` (see :class:`.combine.Combiner`), on this thread's stream.

    The stream first waits for each request's ``ready`` event (their uploads
    and checks ran on their own streams), and is idle again before any
    request is handed back: the other threads then own their buffers again.
    """
    from gpuzarr_dist.cuda.streams import thread_stream

    stream = thread_stream()
    try:
        for r in batch:
            stream.wait_event(r.payload.ready)
        sizes = decode_frames(stream, [r.payload for r in batch])
    except Exception as e:  # noqa: BLE001 - handed to the requests, none of which may be left waiting
        settle(stream)  # nothing of this call still writes into another thread's buffers
        for r in batch:
            if len(batch) > 1:
                r.alone = True  # each block decodes again on its own, so its own error names its chunks
            else:
                r.error = e
        return
    pos = 0
    for r in batch:
        r.result = sizes[pos : pos + r.payload.n]
        pos += r.payload.n
