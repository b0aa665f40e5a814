"""GPU batch decoding of a codec chain: all chunks of a block in one nvCOMP call per stage.

The compressed chunks arrive in one pinned host buffer at aligned offsets
(see :meth:`gpuzarr_dist.stores.base.ChunkStore.read_into`). They are checked
on the host where that is cheap (crc32c of the stored bytes, framing headers),
copied to the device in one transfer on the thread's stream, decoded by one
batched nvCOMP call per compressor, and the array codecs (byte order,
transpose, delta) run as CuPy kernels on the same stream.

Each compressor's module registers what it does on the device (checks
before nvCOMP, nvCOMP's algorithm and framing, checksums after; see
:mod:`.steps`), and this driver runs the registered steps of a chain's
compressor; importing it registers them all (:mod:`.codecs`). Codec classes
that are decoded here set ``gpu_decode = True``; :func:`gpu_unsupported`
names the first codec of a chain that cannot be decoded here, and the reader
then decodes that array on the CPU and copies each block up once.

Only imported on the GPU path: importing it imports cupy and nvCOMP.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from typing import Any

import cupy
import numpy as np

from gpuzarr_dist.codecs import host_checks
from gpuzarr_dist.codecs.pipeline import CodecPipeline
from gpuzarr_dist.config import gpu_min_batch_bytes, gpu_min_batch_chunks
from gpuzarr_dist.cuda import codecs as _codecs  # noqa: F401 - registers every compressor's device steps
from gpuzarr_dist.cuda.fallback import decode_on_cpu, judge_on_cpu
from gpuzarr_dist.cuda.memory import is_out_of_memory
from gpuzarr_dist.cuda.nvcomp_calls import nvcomp_decode, small_tables
from gpuzarr_dist.cuda.steps import Batch, DeviceSteps, device_steps
from gpuzarr_dist.cuda.streams import on_stream, settle
from gpuzarr_dist.errors import ChunkDecodeError
from gpuzarr_dist.runtime.stages import enabled as _stages_enabled
from gpuzarr_dist.runtime.stages import stage_timer

#: bytes kept free before and after nvCOMP's output slots (deflate reaches back at most 32 KiB)
OUTPUT_GUARD = 1 << 16


def gpu_unsupported(pipeline: CodecPipeline) -> str | None:
    """The name of the first codec in the chain the GPU path cannot decode, or ``None``.

    The GPU path decodes: crc32c as the outermost codec(s) (checked on the
    host, on the stored bytes, before upload), at most one compressor with
    device steps (:mod:`.steps`), then the array codecs on the device.
    """
    for c in pipeline.codecs:
        if not c.gpu_decode:
            return c.name
    for c, layout in zip(pipeline.array_array, pipeline.layouts):
        if c.name == "delta" and layout.dtype.kind not in "biu":
            return "delta (floating point: its running sums must be summed in order, as numcodecs does)"
    inner = _strip_outer_crc(pipeline.bytes_bytes)
    if any(c.name == "crc32c" for c in inner):
        return "crc32c (inside a compressor)"
    if len(inner) > 1:
        return f"{inner[0].name} (more than one compressor)"
    if inner:
        steps = device_steps(inner[0].name)
        if steps is None:
            return inner[0].name
        if steps.unsupported is not None:
            return steps.unsupported(inner[0])
    return None


def framing_lead(pipeline: CodecPipeline) -> int:
    """Bytes of framing before the compressed payload of a stored chunk (aligns the payload)."""
    inner = _strip_outer_crc(pipeline.bytes_bytes)
    steps = device_steps(inner[0].name) if inner else None
    return steps.head if steps is not None else 0


def _compressor_steps(inner: list[Any]) -> DeviceSteps | None:
    """The device steps of the chain's compressor (``inner``: the chain's bytes codecs inside its crc32c), or None."""
    if not inner:
        return None
    steps = device_steps(inner[0].name)
    if steps is None:  # gpu_unsupported() keeps such chains off this path
        raise KeyError(inner[0].name)
    return steps


def _strip_outer_crc(bytes_bytes: Sequence[Any]) -> list[Any]:
    bb = list(bytes_bytes)
    while bb and bb[-1].name == "crc32c":
        bb.pop()
    return bb


def _verify_crc32c(pipeline: CodecPipeline, host: np.ndarray, offsets: Sequence[int], sizes: list[int],
                   keys: Sequence[str]) -> None:
    """Check and strip the outer crc32c checksums on the host, in place of ``sizes``."""
    from gpuzarr_dist.codecs.compressors import Crc32c

    n_crc = len(pipeline.bytes_bytes) - len(_strip_outer_crc(pipeline.bytes_bytes))
    if not n_crc:  # the usual chain: no per-chunk loop at all
        return
    check = Crc32c()
    for i, (off, key) in enumerate(zip(offsets, keys)):
        for _ in range(n_crc):
            try:
                check.decode(host[off : off + sizes[i]])
            except ValueError as e:
                raise ChunkDecodeError(pipeline.array, key, str(e), "crc32c") from None
            sizes[i] -= 4


def decode_batch_gpu(
    pipeline: CodecPipeline,
    host: np.ndarray,
    offsets: Sequence[int],
    sizes: Sequence[int],
    keys: Sequence[str],
    stream: cupy.cuda.Stream,
) -> cupy.ndarray:
    """Decode stored chunks (in pinned ``host`` at ``offsets``) into a device array ``(n, *chunk_shape)``.

    One host-to-device copy, one nvCOMP call for all chunks, array codecs as
    CuPy kernels; everything on ``stream``. Returns once the decoded sizes are
    known and checked (the decode itself may still be finishing on ``stream``,
    which every later use of the result is ordered after). Raises only after
    ``stream`` is idle (:func:`settle`): no copy still reads ``host`` then.

    ``stream`` is made current for the batch: the checking kernels (zstd, lz4
    walks, checksums) and their copies back run on CuPy's current stream, and
    on another stream than the upload's (a non-blocking one is not ordered
    with it) a walk could read the chunks before they have arrived.
    """
    try:
        with on_stream(stream):  # every allocation, walk kernel and copy back on ``stream``, whatever the caller's current one
            return _decode_batch(pipeline, host, offsets, sizes, keys, stream)
    except BaseException:
        settle(stream)
        raise


def _decode_batch(pipeline: CodecPipeline, host: np.ndarray, offsets: Sequence[int], sizes: Sequence[int],
                  keys: Sequence[str], stream: cupy.cuda.Stream) -> cupy.ndarray:
    from gpuzarr_dist.cuda.streams import align

    timed = stage_timer()  # sub-stages of the reader's "H2D + decode" (opt-in, see ..stages)
    n = len(keys)
    if n < gpu_min_batch_chunks() or n * pipeline.layouts[-1].nbytes < gpu_min_batch_bytes():
        # a small batch: nvCOMP's per-call cost, or its slow way with a few large chunks, outweighs its speed
        out = decode_on_cpu(pipeline, host, offsets, sizes, keys, stream)
        timed("decode: small batch on the CPU")
        return out
    stored_sizes, sizes = sizes, list(sizes)
    _verify_crc32c(pipeline, host, offsets, sizes, keys)
    timed("decode: crc32c on host")
    layout = pipeline.layouts[-1]
    expected = layout.nbytes
    stride = align(max(expected, 1))
    inner = _strip_outer_crc(pipeline.bytes_bytes)
    steps = _compressor_steps(inner)
    if steps is not None and steps.decode is not None:  # a decode of its own (Blosc: frames taken apart on the host)
        own = steps.decode(pipeline, host, offsets, sizes, stored_sizes, keys, expected, stride, stream)
        timed(f"decode: {steps.name}")
        if own is None:
            return decode_on_cpu(pipeline, host, offsets, stored_sizes, keys, stream)
        return _array_stage(pipeline, own, np.arange(n, dtype=np.int64) * stride, n)
    if steps is not None:  # the host-only checks first: a batch they reject never queues its copy
        codec = inner[0]
        algorithm, head, tail = steps.algorithm, steps.head, steps.tail
        in_offs = np.asarray(offsets, dtype=np.int64) + head
        in_sizes = np.asarray(sizes, dtype=np.int64) - (head + tail)
        if in_sizes.min() <= 0:
            i = int(np.argmin(in_sizes))
            raise ChunkDecodeError(pipeline.array, keys[i], f"stored chunk of {sizes[i]} bytes is too short", codec.name)
        if steps.check_host is not None:
            steps.check_host(pipeline.array, host, offsets, sizes, keys, expected)
        timed("decode: stated sizes (host)")
    total = int(np.max(np.add(offsets, sizes)))
    dev = cupy.empty(total, dtype=cupy.uint8)
    if steps is not None:  # the output and the small tables first: they go up ahead of the chunks (see small_tables)
        # guard bytes around the output slots: nvCOMP trusts the streams, and a damaged back-reference
        # (deflate distance or zstd offset reaching before the output) then reads our own memory instead of
        # faulting the context; whatever it produced fails the size and checksum checks below
        guarded = cupy.empty(n * stride + 2 * OUTPUT_GUARD, dtype=cupy.uint8)
        out = guarded[OUTPUT_GUARD : OUTPUT_GUARD + n * stride]
        tables = small_tables(algorithm, dev, in_offs, in_sizes, out, stride, stream)
    dev.set(host[:total], stream=stream)
    if _stages_enabled():  # only when timing: the copy's own time, not the next stage's wait
        stream.synchronize()
    timed("decode: H2D")
    if steps is not None:
        batch = Batch(pipeline.array, host, offsets, sizes, keys, expected, dev, in_offs, in_sizes, tables.frames, out,
                      stride, stream)
        suspects = steps.check_frames(batch) if steps.check_frames is not None else None
        if suspects is not None:  # never handed to nvCOMP: bad ones are reported, the rest (if any) decode on the CPU
            judge_on_cpu(pipeline, host, offsets, stored_sizes, keys, suspects, codec.name)
            if steps.warn_fallback is not None:
                steps.warn_fallback(pipeline.array, suspects)
            return decode_on_cpu(pipeline, host, offsets, stored_sizes, keys, stream)
        timed("decode: frame checks")
        try:
            actual = nvcomp_decode(algorithm, stream, dev, in_offs, in_sizes, out, stride, n, tables.nvcomp)
        except (RuntimeError, ValueError, MemoryError) as e:
            if is_out_of_memory(e):  # not the chunks' fault: the reader reports the block size to lower
                raise
            judge_on_cpu(pipeline, host, offsets, stored_sizes, keys, [(i, f"nvCOMP: {e}") for i in range(n)], codec.name)
            warnings.warn(f"{pipeline.array}: nvCOMP failed on a batch the CPU decodes ({e}); decoded on the CPU",
                          RuntimeWarning, stacklevel=2)
            return decode_on_cpu(pipeline, host, offsets, stored_sizes, keys, stream)
        timed("decode: nvCOMP")
        # after the decode: each chunk's size, and the checksums nvCOMP does not verify
        bad = [(i, f"decoded to {actual[i]} bytes, expected {expected}") for i in host_checks.size_mismatches(actual, expected)]
        if not bad and steps.verify is not None:
            bad = steps.verify(batch)
        timed("decode: checksums")
        if bad:  # named when the CPU decoder rejects them too; otherwise the CPU decodes the batch
            judge_on_cpu(pipeline, host, offsets, stored_sizes, keys, bad, codec.name)
            return decode_on_cpu(pipeline, host, offsets, stored_sizes, keys, stream)
        base = out
    else:
        bad = host_checks.size_mismatches(sizes, expected)
        if bad:
            raise ChunkDecodeError(pipeline.array, keys[bad[0]], f"stored {sizes[bad[0]]} bytes, expected {expected}", "bytes")
        base, stride = dev, None
    arr = _array_stage(pipeline, base, offsets if stride is None else np.arange(n, dtype=np.int64) * stride, n)
    timed("decode: array codecs (launch)")
    return arr


def _array_stage(pipeline: CodecPipeline, buf: cupy.ndarray, starts: Sequence[int], n: int) -> cupy.ndarray:
    """View decoded bytes as ``(n, *layout)`` arrays and undo the array codecs, on the device."""
    layout = pipeline.layouts[-1]
    item = layout.dtype.itemsize
    c_strides = tuple(int(np.prod(layout.shape[k + 1 :], dtype=np.int64)) * item for k in range(len(layout.shape)))
    starts = np.asarray(starts, dtype=np.int64)
    steps = np.diff(starts)
    if not len(steps) or (steps == steps[0]).all():  # evenly spaced: one strided view over all chunks
        step = int(steps[0]) if len(steps) else layout.nbytes
        raw = cupy.ndarray((n, layout.nbytes), dtype=cupy.uint8, memptr=buf.data + int(starts[0]), strides=(step, 1))
    else:
        raw = cupy.stack([buf[s : s + layout.nbytes] for s in starts.tolist()])
    endian = getattr(pipeline.array_bytes, "endian", sys.byteorder)
    unit = item // 2 if layout.dtype.kind == "c" else item  # complex: each part swaps on its own
    if unit > 1 and endian != sys.byteorder:  # swap bytes on the device
        raw = cupy.ascontiguousarray(raw.reshape(n, -1, unit)[:, :, ::-1]).reshape(n, -1)
    if raw.flags.c_contiguous:
        arr = raw.view(layout.dtype).reshape((n, *layout.shape))
    else:
        arr = cupy.ndarray((n, *layout.shape), dtype=layout.dtype, memptr=raw.data, strides=(raw.strides[0], *c_strides))
    for codec, lay in zip(reversed(pipeline.array_array), reversed(pipeline.layouts[:-1])):
        if codec.name == "transpose":
            inv = np.argsort(codec.order)
            arr = arr.transpose(0, *(1 + inv))
        elif codec.name == "delta":
            flat = cupy.ascontiguousarray(arr).reshape(n, -1)
            arr = cupy.cumsum(flat, axis=1, dtype=lay.dtype).reshape((n, *lay.shape))
        else:  # gpu_unsupported() keeps other codecs off this path
            raise NotImplementedError(codec.name)
    return arr
