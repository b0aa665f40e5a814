"""GPU batch encoding: all chunks of a block compressed by one nvCOMP call, on the thread's stream.

The write side of :mod:`.gpu`. The chunks of a block arrive as one device
array ``(n, *chunk_shape)``; their bytes (C order, little-endian; byte-swapped
on the device for a big-endian ``bytes`` codec) go to nvCOMP in one batched
``encode`` call, the compressed chunks are packed into one device buffer at
256-byte aligned offsets, copied to pinned host memory once, and framed and
checksummed on the host where that is cheap:

- ``zstd``: nvCOMP ``Zstd`` with ``BitstreamKind.RAW`` writes standard zstd
  frames (numcodecs decodes them). nvCOMP's zstd encoder
  takes no compression level: ``level`` applies to CPU writes and is recorded
  in the metadata, where decoders ignore it.
- ``gzip``: nvCOMP ``Deflate`` (raw deflate, RFC 1951) inside a gzip member
  (RFC 1952) built here: a 10-byte header, then the CRC-32 and size of the
  uncompressed chunk. The CRC-32 is computed on the host (``zlib.crc32`` on a
  pinned copy of the chunks, on the decode threads).
- ``crc32c``: computed on the host over the stored bytes, as the outermost codec.

Under ``gpuzarr.gpu.nvcomp-api c`` (the default) the call is nvCOMP's batched
C function (:mod:`.nvcomp_c`: queued on the stream with the GIL released, the
compressed sizes written by nvCOMP into device memory), into slots of
nvCOMP's bound, packed by the gather kernel below. Otherwise (``python``)
nvCOMP writes into one CuPy buffer of fixed slots (``encode(..., out=)``, slot
= the codec's maximum compressed size, asked once per chunk size and cached),
so no allocations by nvCOMP per chunk and no per-chunk Python on the device;
one gather kernel packs the compressed chunks at 256-byte aligned offsets and
one copy brings the packed buffer to pinned host memory. Where nvCOMP does not
take ``out=`` (or states no bound) the batch falls back to nvCOMP's own output
buffers, packed chunk by chunk.

Only imported on the GPU path: importing it imports cupy and nvCOMP.
"""

from __future__ import annotations

import sys
import threading
import time
import zlib
from collections.abc import Sequence
from typing import Any, NamedTuple

import cupy
import numpy as np

from gpuzarr_dist.codecs.compressors import crc32c_value
from gpuzarr_dist.codecs.pipeline import CodecPipeline
from gpuzarr_dist.config import nvcomp_api
from gpuzarr_dist.cuda.sources import source
from gpuzarr_dist.cuda.streams import on_stream, thread_nvcomp_codec, upload
from gpuzarr_dist.errors import ChunkEncodeError

#: codec name -> nvCOMP algorithm that produces its payload
NVCOMP_ENCODERS: dict[str, str] = {"zstd": "Zstd", "gzip": "Deflate"}

GZIP_HEADER = bytes([0x1F, 0x8B, 8, 0, 0, 0, 0, 0, 0, 0xFF])  # deflate, no flags, no mtime, unknown OS


#: (algorithm, chunk bytes) -> nvCOMP's maximum compressed size, or None where encode(out=) is not usable
_max_sizes: dict[tuple[str, int], int | None] = {}
_max_sizes_lock = threading.Lock()

_GATHER_SRC = source("gather_chunks.cu")


#: set once nvCOMP refuses encode(out=) (it does in nvCOMP 6.0: sizes come back as the capacities)
_out_refused = False


def _refuse_out() -> None:
    global _out_refused
    _out_refused = True

def _max_compressed(codec: Any, algorithm: str, sample: cupy.ndarray) -> int | None:
    """nvCOMP's bound on the compressed size of a chunk of ``sample.nbytes`` bytes (cached), or None."""
    key = (algorithm, int(sample.nbytes))
    if key in _max_sizes:
        return _max_sizes[key]
    from nvidia import nvcomp

    try:
        cap = int(codec.get_max_comp_buffer_size(nvcomp.as_array(sample)))
        cap = cap if cap >= 1 else None
    except Exception:  # an nvCOMP without the query: nvCOMP allocates the outputs itself
        cap = None
    with _max_sizes_lock:
        _max_sizes[key] = cap
    return cap


def _forget_max(algorithm: str, nbytes: int) -> None:
    with _max_sizes_lock:
        _max_sizes[(algorithm, nbytes)] = None


def gather(src_ptrs: np.ndarray, sizes: Sequence[int], stream: cupy.cuda.Stream) -> tuple[cupy.ndarray, list[int]]:
    """Pack device buffers (``src_ptrs``, ``sizes``) into one device buffer at 256-byte aligned offsets: one kernel."""
    from gpuzarr_dist.cuda.launch import kernel
    from gpuzarr_dist.cuda.streams import align

    offsets, total = [], 0
    for s in sizes:
        offsets.append(total)
        total += align(max(int(s), 1))
    n = len(offsets)
    packed = cupy.empty(max(total, 1), dtype=cupy.uint8)
    if n:
        with on_stream(stream):
            meta = upload(np.concatenate([np.asarray(src_ptrs, dtype=np.uint64).view(np.int64),
                                          np.asarray(offsets, dtype=np.int64), np.asarray(sizes, dtype=np.int64)]))
            split = max(1, min(64, 1024 // n))  # few large chunks: several thread blocks per chunk
            kernel("gather_chunks", _GATHER_SRC)((n, split), (256,), (meta[:n], meta[n : 2 * n], meta[2 * n :], packed))
    return packed, offsets


def gpu_encode_unsupported(pipeline: CodecPipeline) -> str | None:
    """The first codec of the chain the GPU encoder cannot run, or ``None``.

    Supported: no array->array codecs, ``bytes``, at most one compressor with an
    nvCOMP encoder (zstd, gzip), then crc32c codecs as the outermost ones.
    """
    if pipeline.array_array:
        return pipeline.array_array[0].name
    if pipeline.array_bytes.name != "bytes":
        return pipeline.array_bytes.name
    bb = [c.name for c in pipeline.bytes_bytes]
    while bb and bb[-1] == "crc32c":
        bb.pop()
    if len(bb) > 1:
        return f"{bb[0]} (more than one compressor)"
    if bb and bb[0] not in NVCOMP_ENCODERS:
        return bb[0]
    return None


def _as_bytes_rows(pipeline: CodecPipeline, chunks: cupy.ndarray) -> cupy.ndarray:
    """``(n, nbytes)`` uint8 rows of each chunk's bytes as the ``bytes`` codec stores them."""
    n = chunks.shape[0]
    arr = cupy.ascontiguousarray(chunks)
    item = arr.dtype.itemsize
    unit = item // 2 if arr.dtype.kind == "c" else item
    endian = getattr(pipeline.array_bytes, "endian", sys.byteorder)
    raw = arr.reshape(n, -1).view(cupy.uint8).reshape(n, -1)
    if unit > 1 and endian != sys.byteorder:
        raw = cupy.ascontiguousarray(raw.reshape(n, -1, unit)[:, :, ::-1]).reshape(n, -1)
    return raw


def encode_batch_gpu(
    pipeline: CodecPipeline, chunks: cupy.ndarray, keys: Sequence[str], stream: cupy.cuda.Stream,
    timings: dict[str, float] | None = None,
) -> list[Any]:
    """Encode ``chunks`` (a device array ``(n, *chunk_shape)``) into the stored bytes of each chunk.

    Returns one bytes-like object per chunk (views into one pinned host buffer,
    or ``bytes`` where the host added framing). The caller's fused compute ran
    on ``stream``; everything here is ordered after it on the same stream, and
    the stream is synchronised before the host reads the results. The same as
    :func:`launch_encode_gpu` then :func:`finish_encode_gpu`.

    ``timings`` (for benchmarks): when given, the stream is synchronised after
    each stage and its seconds are added under ``"encode"`` (nvCOMP, with the
    sizes read back), ``"pack"`` (gathering the compressed chunks on the
    device), ``"d2h"`` (the copy to pinned host memory) and ``"host"`` (framing
    and checksums on the host).
    """
    return finish_encode_gpu(launch_encode_gpu(pipeline, chunks, keys, stream, _Clock(timings, stream)))


class PendingEncode:
    """An encode launched on a stream and not yet read back: holds every buffer the stream work uses.

    Dropping it before :func:`finish_encode_gpu` (or a synchronise of its
    stream) could free memory the GPU still reads or writes.
    """

    def __init__(self, pipeline: CodecPipeline, keys: Sequence[str], stream: cupy.cuda.Stream, clock: _Clock):
        self.pipeline, self.keys, self.stream, self.clock = pipeline, list(keys), stream, clock
        self.n = self.nbytes = self.n_crc = 0
        self.compressor: str | None = None
        self.algorithm = ""
        self.raw = self.flat = self.src = self.plain = self.host = None
        self.codec: Any = None
        self.res: Any = None
        self.cap: int | None = None  # encode(out=) slots: nvCOMP's bound, the slot stride and the buffer
        self.slot = 0
        self.dev_out = None
        self.c_sizes: list[int] | None = None  # the nvCOMP C API's compressed sizes (gpuzarr.gpu.nvcomp-api c)

    def where(self) -> str:
        keys = self.keys
        return keys[0] if len(keys) == 1 else f"{keys[0]} .. {keys[-1]}" if keys else "(no chunks)"


class _EncodeChunks(NamedTuple):
    """One thread's chunks for a joined encode: ``ready`` recorded on its stream after their bytes were made."""

    algorithm: str
    ready: cupy.cuda.Event
    in_ptrs: list[int]
    nbytes: int
    out_ptrs: list[int]


#: (GPU, algorithm) -> [device memory, bytes]: the process's nvCOMP encode scratch, one call at a time (the lock)
_workspaces: dict[tuple[int, str], list[Any]] = {}
_workspace_lock = threading.Lock()


def _encode_joined(algorithm: str, stream: cupy.cuda.Stream, in_ptrs: list[int], nbytes: int,
                   out_ptrs: list[int]) -> list[int]:
    """Encode chunks through nvCOMP's C API, in one call with the encodes other threads ask for at the same time.

    nvCOMP's zstd encoder asks 1.13 GB of scratch for any call and encodes
    many chunks a call far faster than few, and threads' calls do not add up.
    So the process
    keeps one scratch buffer per GPU and codec, outside CuPy's pool and
    outside any task's memory, of at most ``gpuzarr.gpu.encode-scratch``, and
    the encodes of the moment go in one call on it (:mod:`.combine`, as for
    decodes): the thread leading makes the call for all of them. A joined call
    that fails is made again for each thread's chunks alone.
    """
    from gpuzarr_dist.cuda.combine import Request, combiner

    ready = cupy.cuda.Event(block=False, disable_timing=True)
    ready.record(stream)  # the chunk bytes (and padding) queued before it
    req = Request(_EncodeChunks(algorithm, ready, in_ptrs, nbytes, out_ptrs))
    combiner(("encode", cupy.cuda.Device().id, algorithm)).run(req, _execute_encodes)
    if req.alone:
        req.alone = False
        _execute_encodes([req])
    if req.error is not None:
        raise req.error
    return req.result


def _execute_encodes(batch: list[Any]) -> None:
    """One encode for every request of ``batch`` on this thread's stream, in the process's scratch (see above)."""
    from gpuzarr_dist.config import encode_scratch_bytes
    from gpuzarr_dist.cuda import nvcomp as nvcomp_c
    from gpuzarr_dist.cuda.streams import settle, thread_stream

    stream = thread_stream()
    parts: list[_EncodeChunks] = [r.payload for r in batch]
    algorithm = parts[0].algorithm
    try:
        for part in parts:
            stream.wait_event(part.ready)
        in_ptrs = [q for part in parts for q in part.in_ptrs]
        in_sizes = [part.nbytes for part in parts for _ in part.in_ptrs]
        largest = max(in_sizes)
        limit = encode_scratch_bytes()
        per_call = len(in_ptrs) if limit is None else min(len(in_ptrs), nvcomp_c.chunks_per_call(algorithm, largest, limit))
        need = max(1, nvcomp_c.encode_scratch_size(algorithm, per_call, largest))
        key = (cupy.cuda.Device().id, algorithm)
        with _workspace_lock:  # one call at a time in the scratch (a failed joined call's retries too)
            ws = _workspaces.get(key)
            if ws is None or ws[1] < need:
                _workspaces.pop(key, None)  # the last call on it has been waited for
                ws = _workspaces[key] = [cupy.cuda.Memory(need), need]  # not from the pool: no task's memory
            sizes = nvcomp_c.encode(algorithm, stream, in_ptrs, in_sizes, [q for part in parts for q in part.out_ptrs],
                                    ws[0].ptr, ws[1], per_call)
    except Exception as e:  # noqa: BLE001 - handed to the requests, none of which may be left waiting
        settle(stream)
        for r in batch:
            if len(batch) > 1:
                r.alone = True  # each thread's chunks again on their own, so an error names that block's chunks
            else:
                r.error = e
        return
    pos = 0
    for r in batch:
        k = len(r.payload.in_ptrs)
        r.result, pos = sizes[pos : pos + k], pos + k


def workspace_bytes() -> int:
    """Bytes of device memory this process holds as nvCOMP encode scratch (all GPUs and codecs)."""
    with _workspace_lock:
        return sum(ws[1] for ws in _workspaces.values())


def launch_encode_gpu(
    pipeline: CodecPipeline, chunks: cupy.ndarray, keys: Sequence[str], stream: cupy.cuda.Stream,
    clock: _Clock | None = None,
) -> PendingEncode:
    """Enqueue the encode of ``chunks`` on ``stream`` and return without waiting for the GPU.

    The host can do other work (write the previous sub-batch) while nvCOMP
    runs; :func:`finish_encode_gpu` waits and returns the stored bytes.
    Through nvCOMP's C functions (the default) the encode is done when this
    returns, joined with other threads' (:func:`_encode_joined`); only the
    packing and the copy back are left to :func:`finish_encode_gpu`.
    """
    from gpuzarr_dist.cuda.streams import align, pinned_staging

    p = PendingEncode(pipeline, keys, stream, clock or _Clock(None, stream))
    n = p.n = chunks.shape[0]
    raw = p.raw = _as_bytes_rows(pipeline, chunks)
    nbytes = p.nbytes = raw.shape[1]
    bb = [c.name for c in pipeline.bytes_bytes]
    while bb and bb[-1] == "crc32c":
        bb.pop()
        p.n_crc += 1
    compressor = p.compressor = bb[0] if bb else None
    if compressor is None:  # stored as is: one copy to pinned memory
        p.host = pinned_staging(n * nbytes)
        raw.reshape(-1).get(out=p.host, stream=stream)
        return p
    from nvidia import nvcomp

    from gpuzarr_dist.cuda import nvcomp as nvcomp_c

    algorithm = p.algorithm = NVCOMP_ENCODERS[compressor]
    stride = align(max(nbytes, 1))
    if stride != nbytes and n > 1:  # nvCOMP wants aligned sub-buffers: pad the rows
        padded = cupy.empty((n, stride), dtype=cupy.uint8)
        padded[:, :nbytes] = raw
        flat = padded.reshape(-1)
    else:
        flat = raw.reshape(-1)
    p.flat = flat
    if compressor == "gzip":  # the gzip trailer needs the CRC-32 of the uncompressed bytes
        p.plain = pinned_staging(n * nbytes)
        raw.reshape(-1).get(out=p.plain, stream=stream)
    p.clock.lap("prepare")
    in_ptrs = [flat.data.ptr + i * stride for i in range(n)]
    if n and nvcomp_api() == "c" and nvcomp_c.available() and nvcomp_c.encode_aligned(algorithm, in_ptrs):
        try:  # joined with other threads' encodes, the GIL released; done on return (see _encode_joined)
            cap = nvcomp_c.max_compressed_size(algorithm, nbytes)
            slot = align(cap)
            dev_out = cupy.empty(n * slot, dtype=cupy.uint8)
            p.c_sizes = _encode_joined(algorithm, stream, in_ptrs, nbytes, [dev_out.data.ptr + i * slot for i in range(n)])
        except (RuntimeError, ValueError, MemoryError) as e:
            raise ChunkEncodeError(pipeline.array, p.where(), f"nvCOMP: {e}", compressor) from e
        p.cap, p.slot, p.dev_out = cap, slot, dev_out
        return p
    codec = p.codec = thread_nvcomp_codec(algorithm, stream)
    p.src = nvcomp.as_arrays(flat, [i * stride for i in range(n)], [nbytes] * n)
    cap = _max_compressed(codec, algorithm, flat[:nbytes]) if n and not _out_refused else None
    if cap is not None:  # nvCOMP writes into our slots; one kernel packs them
        slot = align(cap)
        dev_out = cupy.empty(n * slot, dtype=cupy.uint8)
        try:
            p.res = codec.encode(p.src, out=nvcomp.as_arrays(dev_out, [i * slot for i in range(n)], [cap] * n))
            p.cap, p.slot, p.dev_out = cap, slot, dev_out
        except (TypeError, ValueError):  # out= refused: nvCOMP's own buffers, for this process
            _refuse_out()
            _forget_max(algorithm, nbytes)
        except (RuntimeError, MemoryError) as e:
            raise ChunkEncodeError(pipeline.array, p.where(), f"nvCOMP: {e}", compressor) from e
    if p.res is None:
        try:
            p.res = codec.encode(p.src)
        except (RuntimeError, ValueError, MemoryError) as e:
            raise ChunkEncodeError(pipeline.array, p.where(), f"nvCOMP: {e}", compressor) from e
    return p


def finish_encode_gpu(p: PendingEncode) -> list[Any]:
    """Wait for a launched encode and return each chunk's stored bytes (see :func:`encode_batch_gpu`)."""
    from gpuzarr_dist.cuda.streams import align, pinned_staging
    from gpuzarr_dist.runtime.threads import decode_pool

    stream, clock, n, nbytes, compressor = p.stream, p.clock, p.n, p.nbytes, p.compressor
    if compressor is None:
        stream.synchronize()
        clock.lap("d2h")
        out: list[Any] = [p.host[i * nbytes : (i + 1) * nbytes] for i in range(n)]
    else:
        packed = None
        if p.c_sizes is not None:
            sizes = p.c_sizes
            if any(s > p.cap or s <= 0 for s in sizes):  # never seen; a wrong size must not pass silently
                raise ChunkEncodeError(p.pipeline.array, p.where(),
                                       f"nvCOMP stated compressed sizes outside (0, {p.cap}]", compressor)
            clock.lap("encode")
            packed, offsets = gather(p.dev_out.data.ptr + p.slot * np.arange(n, dtype=np.uint64), sizes, stream)
            clock.lap("pack")
        elif p.cap is not None:
            cap = p.cap
            try:
                stream.synchronize()  # wait where CuPy releases the GIL, before reading sizes
                sizes = [int(v) for v in p.res.buffer_sizes]
                if sizes and all(v == cap for v in sizes):  # the slots' capacities, not what was written: the bound
                    raise ValueError("encode(out=) reported the slot capacities as sizes")  # is never reached
            except (TypeError, ValueError):  # out= refused: nvCOMP's own buffers, for this process
                # nvCOMP 6.0 reports the slot capacities as the sizes: out= is not usable there
                _refuse_out()
                _forget_max(p.algorithm, nbytes)
                p.res = None
            except (RuntimeError, MemoryError) as e:
                raise ChunkEncodeError(p.pipeline.array, p.where(), f"nvCOMP: {e}", compressor) from e
            else:
                if any(s > cap for s in sizes):  # never seen; a wrong bound must not pass silently
                    raise ChunkEncodeError(p.pipeline.array, p.where(),
                                           f"nvCOMP stated compressed sizes above its bound {cap}", compressor)
                clock.lap("encode")
                packed, offsets = gather(p.dev_out.data.ptr + p.slot * np.arange(n, dtype=np.uint64), sizes, stream)
                clock.lap("pack")
        if packed is None:
            try:
                res = p.res if p.res is not None else p.codec.encode(p.src)
                p.res = res
                stream.synchronize()  # wait where CuPy releases the GIL, before reading sizes
                parts = [cupy.asarray(res[i]).view(cupy.uint8).reshape(-1) for i in range(n)]
                sizes = [int(v) for v in res.buffer_sizes] if hasattr(res, "buffer_sizes") else \
                    [int(res[i].buffer_size) for i in range(n)]
            except (RuntimeError, ValueError, MemoryError) as e:
                raise ChunkEncodeError(p.pipeline.array, p.where(), f"nvCOMP: {e}", compressor) from e
            clock.lap("encode")
            offsets, total = [], 0
            for s in sizes:
                offsets.append(total)
                total += align(max(s, 1))
            packed = cupy.empty(max(total, 1), dtype=cupy.uint8)
            for part, off, s in zip(parts, offsets, sizes):
                packed[off : off + s] = part[:s]
            del parts
            clock.lap("pack")
        host = pinned_staging(int(packed.nbytes))
        packed.get(out=host, stream=stream)
        stream.synchronize()
        clock.lap("d2h")
        p.res = p.dev_out = p.src = p.flat = p.raw = None  # the stream is done with them
        out = [host[o : o + s] for o, s in zip(offsets, sizes)]
        if compressor == "gzip":
            plain = p.plain
            crc32 = list(decode_pool().map(lambda i: zlib.crc32(plain[i * nbytes : (i + 1) * nbytes]), range(n)))
            isize = (nbytes % (1 << 32)).to_bytes(4, "little")
            out = [b"".join((GZIP_HEADER, o, c.to_bytes(4, "little"), isize)) for o, c in zip(out, crc32)]
    for _ in range(p.n_crc):  # crc32c of the stored bytes: one copy per chunk (the join), not three
        out = [b"".join((o, crc32c_value(o).to_bytes(4, "little"))) for o in out]
    clock.lap("host")
    return out


class _Clock:
    """Stage timer for :func:`encode_batch_gpu`'s ``timings``: a no-op without them."""

    def __init__(self, timings: dict[str, float] | None, stream: cupy.cuda.Stream):
        self.timings, self.stream = timings, stream
        self.t = time.perf_counter() if timings is not None else 0.0

    def lap(self, stage: str) -> None:
        if self.timings is None:
            return
        self.stream.synchronize()
        now = time.perf_counter()
        self.timings[stage] = self.timings.get(stage, 0.0) + now - self.t
        self.t = now
