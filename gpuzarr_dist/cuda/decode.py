"""GPU batch decoding of a codec chain: all chunks of a block in one nvCOMP call per stage.

The compressed chunks arrive in one pinned host buffer at aligned offsets
(see :meth:`gpuzarr_dist.stores.base.ChunkStore.read_into`). They are checked
on the host where that is cheap (crc32c of the stored bytes, framing headers),
copied to the device in one transfer on the thread's stream, decoded by one
batched nvCOMP call per compressor, and the array codecs (byte order,
transpose, delta) run as CuPy kernels on the same stream.

Codec classes that this module decodes set ``gpu_decode = True``;
:func:`gpu_unsupported` names the first codec of a chain that cannot be
decoded here, and the reader then decodes that array on the CPU and copies
each block up once.

Only imported on the GPU path: importing it imports cupy and nvCOMP.
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import cupy
import numpy as np

from gpuzarr_dist.codecs import host_checks
from gpuzarr_dist.codecs.pipeline import CodecPipeline
from gpuzarr_dist.config import deflate_check, gpu_decode_combine, gpu_min_batch_bytes, gpu_min_batch_chunks, nvcomp_api
from gpuzarr_dist.errors import ChunkDecodeError
from gpuzarr_dist.cuda.streams import on_stream, pinned_empty, settle, upload
from gpuzarr_dist.cuda.memory import is_out_of_memory
from gpuzarr_dist.runtime.stages import enabled as _stages_enabled, stage_timer

#: codec name -> (nvCOMP algorithm, bytes to strip before the payload, bytes to strip after it)
NVCOMP_FRAMING: dict[str, tuple[str, int, int]] = {
    "zstd": ("Zstd", 0, 0),
    "gzip": ("Gzip", 0, 0),
    "zlib": ("Deflate", 2, 4),  # RFC 1950: 2-byte header, raw deflate, 4-byte adler32
    "lz4": ("LZ4", 4, 0),  # numcodecs: 4-byte little-endian decoded size, then an LZ4 block
}

_local = threading.local()

#: bytes kept free before and after nvCOMP's output slots (deflate reaches back at most 32 KiB)
OUTPUT_GUARD = 1 << 16


def gpu_unsupported(pipeline: CodecPipeline) -> str | None:
    """The name of the first codec in the chain the GPU path cannot decode, or ``None``.

    The GPU path decodes: crc32c as the outermost codec(s) (checked on the
    host, on the stored bytes, before upload), at most one compressor with an
    nvCOMP decoder, then the array codecs on the device.
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
    if inner and inner[0].name == "blosc":
        from gpuzarr_dist.codecs.blosc_frames import GPU_CNAMES

        cname = inner[0].config.get("cname", "lz4")
        if cname not in GPU_CNAMES:  # blosclz, snappy: no GPU decoder
            return f"blosc ({cname})"
    return None


def framing_lead(pipeline: CodecPipeline) -> int:
    """Bytes of framing before the compressed payload of a stored chunk (aligns the payload)."""
    inner = _strip_outer_crc(pipeline.bytes_bytes)
    return NVCOMP_FRAMING.get(inner[0].name, ("", 0, 0))[1] if inner else 0


def _is_blosc(pipeline: CodecPipeline) -> bool:
    inner = _strip_outer_crc(pipeline.bytes_bytes)
    return bool(inner) and inner[0].name == "blosc"


def _strip_outer_crc(bytes_bytes: Sequence[Any]) -> list[Any]:
    bb = list(bytes_bytes)
    while bb and bb[-1].name == "crc32c":
        bb.pop()
    return bb


def _nvcomp_codec(algorithm: str, stream: cupy.cuda.Stream) -> Any:
    """This thread's nvCOMP codec for ``algorithm`` on ``stream`` (see :func:`..runtime.cuda.thread_nvcomp_codec`)."""
    from gpuzarr_dist.cuda.streams import thread_nvcomp_codec

    return thread_nvcomp_codec(algorithm, stream)


def _cpu_diagnose(pipeline: CodecPipeline, host: np.ndarray, offsets: Sequence[int], sizes: Sequence[int],
                  keys: Sequence[str], reason: str, codec: str) -> ChunkDecodeError:
    """Find the chunk the GPU could not decode by decoding the batch on the CPU; name it."""
    for off, n, key in zip(offsets, sizes, keys):
        try:
            pipeline.decode_chunk(bytes(host[off : off + n]), key)
        except ChunkDecodeError as e:
            return e
    return ChunkDecodeError(pipeline.array, keys[0] if len(keys) == 1 else f"{keys[0]} .. {keys[-1]}", reason, codec)


class _NoStatedSize(Exception):
    """A frame that does not state its decoded size: the batch is decoded on the CPU instead."""


def _check_stated_sizes(codec: str, array: str, host: np.ndarray, offsets: Sequence[int], sizes: Sequence[int],
                        keys: Sequence[str], expected: int) -> None:
    """Check on the host, before launching, the decoded size that gzip and lz4 frames state.

    nvCOMP trusts the frames: a frame larger than its output slot was seen
    writing into the next slot. gzip members state their size in their last
    four bytes (mod 2**32), numcodecs lz4 in a 4-byte prefix; zstd frames are
    checked on the device (:func:`_zstd_frames`); zlib states none (nvCOMP
    bounds it by the slot). Vectorised over the batch (:mod:`.host_checks`).
    """
    host_checks.check_stated_sizes(codec, array, host, offsets, sizes, keys, expected, _bad_deflate_header)


def _bad_deflate_header(codec: str, host: np.ndarray, o: int, n: int) -> str | None:
    """Why the gzip (RFC 1952) or zlib (RFC 1950) header at ``host[o:]`` is invalid, or None."""
    if codec == "gzip":
        if n < 18 or host[o] != 0x1F or host[o + 1] != 0x8B:
            return "not a gzip member (bad magic bytes or shorter than a gzip header and trailer)"
        if host[o + 2] != 8:
            return f"gzip compression method {int(host[o + 2])}, not deflate (8)"
        return None  # reserved flag bits: Python's gzip (the CPU decoder) ignores them; the deflate walk defers to it
    if n < 6:
        return "zlib stream shorter than its header and checksum"
    cmf, flg = int(host[o]), int(host[o + 1])
    if cmf & 0x0F != 8 or cmf >> 4 > 7:
        return f"zlib header: compression method {cmf & 0x0F} / window {cmf >> 4}, not deflate with at most 32 KiB"
    if (cmf * 256 + flg) % 31:
        return "zlib header check bits are wrong (FCHECK)"
    if flg & 0x20:
        return "zlib stream needs a preset dictionary"
    return None


#: threads per CUDA block of the walks that check streams before nvCOMP (one thread per stream); see
#: :func:`walk_launch`. One: each stream's walk gets a multiprocessor slot of its own instead of sharing a
#: warp with 31 others that diverge from it (Blosc-lz4 reads about 12% faster than with 64; zstd the same).
WALK_THREADS = 1


def walk_launch(n: int) -> tuple[tuple[int], tuple[int]]:
    """Grid and block of a walk over ``n`` streams, one thread each, :data:`WALK_THREADS` to a CUDA block."""
    t = WALK_THREADS
    return ((n + t - 1) // t,), (t,)


_kernels: dict[tuple[str, ...], cupy.RawKernel] = {}
_kernels_lock = threading.Lock()


def _kernel(name: str, src: str, options: tuple[str, ...] = ()) -> cupy.RawKernel:
    """A checking kernel, compiled once per process (and set of compiler ``options``) and launched from any thread."""
    key = (name, *options)
    kernel = _kernels.get(key)
    if kernel is None:
        with _kernels_lock:
            kernel = _kernels.setdefault(key, cupy.RawKernel(src, name, options=options))
    return kernel


def _frame_table(offsets: Sequence[int], sizes: Sequence[int],
                 dev_table: cupy.ndarray | None) -> tuple[cupy.ndarray, cupy.ndarray]:
    """The frames' offsets and sizes on the device as int64 (``dev_table``'s two rows, or copied up now)."""
    if dev_table is None:
        dev_table = upload(np.asarray([offsets, sizes], dtype=np.int64).reshape(2, len(offsets)))
    return dev_table[0], dev_table[1]


class _Tables(NamedTuple):
    """A batch's small tables on the device, copied up in one copy ahead of its chunks (:func:`_small_tables`)."""

    frames: cupy.ndarray  # (2, n) int64: each frame's offset and size in the chunk buffer (the walks')
    nvcomp: cupy.ndarray | None  # (4, n) uint64: nvCOMP's C call's pointer and size tables, or None


def _frame_ptrs(dev: cupy.ndarray, in_offs: Sequence[int] | np.ndarray, out: cupy.ndarray, stride: int,
                n: int) -> tuple[np.ndarray, np.ndarray]:
    """The device addresses (uint64 arrays) of ``n`` frames at ``in_offs`` of ``dev`` and of their output slots,
    ``stride`` bytes apart in ``out``: numpy over the batch, no Python int per frame (a sharded block decodes
    thousands of frames, and every moment a block holds the GIL delays every other block's reads)."""
    in_ptrs = np.asarray(in_offs, dtype=np.uint64) + np.uint64(dev.data.ptr)
    out_ptrs = np.arange(n, dtype=np.uint64) * np.uint64(stride) + np.uint64(out.data.ptr)
    return in_ptrs, out_ptrs


def _small_tables(algorithm: str, dev: cupy.ndarray, in_offs: np.ndarray, in_sizes: np.ndarray, out: cupy.ndarray,
                  stride: int, stream: cupy.cuda.Stream) -> _Tables:
    """Queue the frame tables of the walks and of nvCOMP's C call on ``stream``, in one copy.

    Called before the batch's chunks are copied up. Copies from many threads'
    streams share the copy engine in the order they were queued, so a table
    copied up after the chunks (by the walk, then by nvCOMP's call after the
    walk) waits behind every other batch's chunks queued in the meantime, and
    the kernels that need it with it.
    """
    from gpuzarr_dist.cuda import nvcomp as nvcomp_c

    n = len(in_offs)
    in_ptrs, out_ptrs = _frame_ptrs(dev, in_offs, out, stride, n)
    c = nvcomp_api() == "c" and nvcomp_c.available() and nvcomp_c.aligned(algorithm, in_ptrs, out_ptrs)
    host = np.empty((6 if c else 2, n), dtype=np.int64)
    host[0], host[1] = in_offs, in_sizes
    if c:
        nvcomp_c.decode_tables(in_ptrs, in_sizes, out_ptrs, np.full(n, stride, dtype=np.uint64), host[2:].view(np.uint64))
    up = upload(host, stream)  # queued on ``stream``, not waited for
    return _Tables(up[:2], up[2:].view(cupy.uint64) if c else None)


def _zstd_walk(dev: cupy.ndarray, offs: cupy.ndarray, lens: cupy.ndarray, n: int, fcs: cupy.ndarray,
               length: cupy.ndarray, deep: cupy.ndarray, mode: int, expected: int) -> None:
    """Queue the zstd walk of ``n`` frames on the current stream: its verdicts land in ``fcs``, ``length``, ``deep``.

    Mode 0 (headers) is one thread per frame. Modes 1 and 2 walk every
    block's sequences in a thread of its own, and in mode 2 every Huffman
    stream too (four threads a block sharing its table), between a plan and
    a combine that run a thread per frame (see
    :data:`.kernels.ZSTD_FRAMES_SRC`): same verdicts, a frame's blocks
    walked side by side instead of in turn.
    """
    from gpuzarr_dist.cuda import kernels
    from gpuzarr_dist.cuda.kernels import (ZSTD_BLOCK_THREADS, ZSTD_FRAMES_SRC, ZSTD_LANE_SHARED, ZSTD_LIT_SLOTS, ZSTD_SLOT_BYTES,
                          zstd_block_slots)
    from gpuzarr_dist.cuda.streams import thread_side_stream

    if mode == 0:
        _kernel("zstd_frames", ZSTD_FRAMES_SRC)(*walk_launch(n), (dev, offs, lens, np.int32(n), fcs, length, deep,
                                                                  np.int32(mode)))
        return
    cap = zstd_block_slots(expected)
    slots = cupy.empty(n * cap * ZSTD_SLOT_BYTES, dtype=cupy.uint8)
    nslots = cupy.empty(n, dtype=cupy.int32)
    _kernel("zstd_plan", ZSTD_FRAMES_SRC)(*walk_launch(n), (dev, offs, lens, np.int32(n), slots, np.int32(cap), nslots,
                                                            fcs, length, deep))
    total = n * cap
    side = None
    if mode >= 2:
        # the literals walk needs only the plan: on the thread's second stream it runs beside the sequences
        # walk (both are a few long serial walks per thread, far from filling the GPU), joined before the combine
        main = cupy.cuda.get_current_stream()
        side = thread_side_stream() if kernels.ZSTD_WALK_FORK else main
        if side is not main:
            planned = cupy.cuda.Event(block=False, disable_timing=True)
            planned.record(main)
            side.wait_event(planned)
        t = ZSTD_LIT_SLOTS
        with on_stream(side):
            _kernel("zstd_literals", ZSTD_FRAMES_SRC, (f"-DGZ_LIT_SLOTS={t}",))(
                ((total + t - 1) // t,), (4 * t,), (dev, offs, np.int32(n), slots, np.int32(cap), nslots))
    t = ZSTD_BLOCK_THREADS
    try:
        _kernel("zstd_blocks", ZSTD_FRAMES_SRC, (f"-DGZ_LANE_SHARED={ZSTD_LANE_SHARED}",))(
            ((total + t - 1) // t,), (t,), (dev, offs, np.int32(n), slots, np.int32(cap), nslots, np.int32(mode)))
    finally:  # joined even when the launch fails: waiting for the thread's stream then waits for both
        if side is not None and side is not main:
            walked = cupy.cuda.Event(block=False, disable_timing=True)
            walked.record(side)
            main.wait_event(walked)
    _kernel("zstd_combine", ZSTD_FRAMES_SRC)(*walk_launch(n), (dev, offs, lens, np.int32(n), slots, np.int32(cap),
                                                               nslots, fcs, length, deep, np.int32(mode)))


def _zstd_frames(array: str, dev: cupy.ndarray, offsets: Sequence[int], sizes: Sequence[int],
                 keys: Sequence[str], expected: int, dev_table: cupy.ndarray | None = None) -> list[tuple[int, str]]:
    """Check every zstd frame on the device, one thread each, before nvCOMP sees any of them.

    Definite errors raise :class:`ChunkDecodeError`: a bad magic number, a
    cut header, a stated size other than the chunk's, blocks running past the
    chunk (nvCOMP 6 decodes a truncated frame whose header still states the
    right size without an error, and a frame larger than its slot overwrites
    the next one). Raises :class:`_NoStatedSize` for frames the CPU decoder
    must handle (no stated size, or several frames in one chunk).

    Returns the frames whose block structure is impossible (see
    :data:`.kernels.ZSTD_DEEP_REASONS`) as ``(index, reason)``: these are kept
    from nvCOMP, which has faulted the CUDA context and hung on such input,
    and the caller lets the CPU decoder judge them. How deep the walk goes
    (headers and tables, or every sequence too) is ``gpuzarr.gpu.zstd-check``.
    ``dev_table``: ``offsets`` and ``sizes`` already queued for the device (see
    :func:`_small_tables`).
    """
    from gpuzarr_dist.config import zstd_check
    from gpuzarr_dist.cuda.kernels import ZSTD_CHECK_MODES, ZSTD_DEEP_REASONS

    mode = ZSTD_CHECK_MODES[zstd_check()]
    n = len(offsets)
    offs, lens = _frame_table(offsets, sizes, dev_table)
    found = cupy.empty(3 * n, dtype=cupy.int64)  # stated sizes, lengths, walk codes (int32): one copy back
    _zstd_walk(dev, offs, lens, n, found[:n], found[n : 2 * n], found[2 * n :].view(cupy.int32), mode, expected)
    found = found.get()
    fcs, length, deep = found[:n], found[n : 2 * n], found[2 * n :].view(np.int32)[:n]
    verdicts = host_checks.zstd_verdicts(fcs, length, deep, sizes, expected)  # numpy over all frames
    i = host_checks.zstd_first_error(verdicts)
    if i >= 0:
        if verdicts[i] == host_checks.ZSTD_NO_SIZE:
            raise _NoStatedSize(keys[i])
        raise ChunkDecodeError(array, keys[i], host_checks.zstd_reason(int(verdicts[i]), int(fcs[i]), int(length[i]),
                                                                       int(sizes[i]), expected), "zstd")
    return [(i, ZSTD_DEEP_REASONS.get(int(deep[i]), f"zstd frame structure check {int(deep[i])}"))
            for i in np.flatnonzero(verdicts == host_checks.ZSTD_DEEP).tolist()]


def _judge_on_cpu(pipeline: CodecPipeline, host: np.ndarray, offsets: Sequence[int], sizes: Sequence[int],
                  keys: Sequence[str], suspects: list[tuple[int, str]], codec: str = "zstd") -> None:
    """Decode the ``suspects`` (index, reason) on the CPU; raise for the first the CPU rejects, naming all of them.

    Returns when the CPU decodes every suspect: the device check was stricter
    than the format, and the caller decodes the batch on the CPU instead.
    """
    errors = []
    for i, reason in suspects:
        try:
            pipeline.decode_chunk(bytes(host[offsets[i] : offsets[i] + sizes[i]]), keys[i])
        except ChunkDecodeError as e:
            errors.append((keys[i], f"{reason} (the CPU decoder agrees: {e.reason})"))
    if errors:
        more = f"; {len(errors) - 1} more bad chunk(s) in this block: {', '.join(k for k, _ in errors[1:6])}" if len(errors) > 1 else ""
        raise ChunkDecodeError(pipeline.array, errors[0][0], errors[0][1] + more, codec)


_LZ4_CHECK_SRC = r"""
extern "C" __global__ void lz4_block_length(const unsigned char* src, const long long* offs,
                                            const long long* sizes, long long limit, int n, long long* result) {
    // One thread walks one LZ4 block's sequences (no decoding): the decoded length it
    // describes, or a negative code where it is malformed (truncated, bad match offset,
    // longer than ``limit``).
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const unsigned char* p = src + offs[i];
    long long len = sizes[i], ip = 0, op = 0, code = 0;
    while (code == 0) {
        if (ip >= len) { code = -1; break; }
        unsigned int token = p[ip++];
        long long lit = token >> 4;
        if (lit == 15) {
            unsigned int b;
            do { if (ip >= len) { code = -2; break; } b = p[ip++]; lit += b; } while (b == 255);
            if (code) break;
        }
        if (ip + lit > len) { code = -3; break; }
        ip += lit; op += lit;
        if (ip == len) break;
        if (ip + 2 > len) { code = -4; break; }
        long long off = p[ip] | (p[ip + 1] << 8);
        ip += 2;
        if (off == 0 || off > op) { code = -5; break; }
        long long ml = token & 15;
        if (ml == 15) {
            unsigned int b;
            do { if (ip >= len) { code = -6; break; } b = p[ip++]; ml += b; } while (b == 255);
            if (code) break;
        }
        op += ml + 4;
        if (op > limit) { code = -7; break; }
    }
    result[i] = code ? code : op;
}
"""


def _lz4_lengths(dev: cupy.ndarray, offsets: Sequence[int], sizes: Sequence[int], limit: int,
                 dev_table: cupy.ndarray | None = None) -> np.ndarray:
    """The decoded length each LZ4 block on the device describes (negative: malformed), one kernel for all.

    nvCOMP 6 decodes a truncated or corrupted LZ4 block without an error and
    may write past its output slot; walking the sequences first catches both.
    ``dev_table`` as in :func:`_zstd_frames`.
    """
    kernel = _kernel("lz4_block_length", _LZ4_CHECK_SRC)
    n = len(offsets)
    offs, lens = _frame_table(offsets, sizes, dev_table)
    out = cupy.empty(n, dtype=cupy.int64)
    kernel(*walk_launch(n), (dev, offs, lens, np.int64(limit), np.int32(n), out))
    return out.get()


def _crc32_mismatches(out: cupy.ndarray, stride: int, nbytes: int, host: np.ndarray, offsets: Sequence[int],
                      sizes: Sequence[int]) -> list[int]:
    """Indexes of decoded gzip chunks whose CRC-32 (computed on the device) differs from the member's trailer.

    One thread per 4 KiB segment of every chunk, then one per chunk joins its
    segments' CRCs (:data:`.kernels.CRC32_SRC`). The stored CRC-32 is the
    first half (little-endian) of each member's 8-byte trailer, in the host buffer.
    """
    from gpuzarr_dist.cuda.kernels import CRC32_SEGMENT, CRC32_SRC

    n = len(offsets)
    seg = CRC32_SEGMENT
    nseg = max(1, -(-nbytes // seg))
    total = n * nseg
    segs = cupy.empty(total, dtype=cupy.uint32)
    _kernel("crc32_segments", CRC32_SRC)(((total + 255) // 256,), (256,), (
        out, np.int64(stride), np.int64(nbytes), np.int64(seg), np.int64(nseg), np.int64(total), segs))
    crc = cupy.empty(n, dtype=cupy.uint32)
    _kernel("crc32_combine", CRC32_SRC)(((n + 63) // 64,), (64,), (
        segs, np.int64(nseg), np.int64(seg), np.int64(nbytes), np.int32(n), crc))
    actual = crc.get()
    return host_checks.trailer_mismatches(actual, host, np.add(offsets, sizes) - 8)


def _xxh64_mismatches(out: cupy.ndarray, stride: int, nbytes: int, host: np.ndarray, offsets: Sequence[int],
                      sizes: Sequence[int]) -> list[int]:
    """Indexes of decoded zstd frames written with a content checksum whose checksum does not match.

    nvCOMP does not verify it. Only frames whose header sets the checksum flag
    are hashed (XXH64 on the device, one thread per chunk; see
    :data:`.kernels.XXH64_SRC`); the stored value is the frame's last 4 bytes.
    """
    from gpuzarr_dist.cuda.kernels import XXH64_SRC

    wanted = (host[np.asarray(offsets, dtype=np.int64) + 4] & 4).astype(np.uint8)  # the frame's checksum flag
    if not wanted.any():
        return []
    n = len(offsets)
    got = cupy.zeros(n, dtype=cupy.uint32)
    _kernel("xxh64_low32", XXH64_SRC)(((n + 63) // 64,), (64,), (
        out, np.int64(stride), np.int64(nbytes), np.int32(n), upload(wanted), got))
    actual = got.get()
    return host_checks.trailer_mismatches(actual, host, np.add(offsets, sizes) - 4, wanted=wanted)


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
        out = _decode_on_cpu(pipeline, host, offsets, sizes, keys, stream)
        timed("decode: small batch on the CPU")
        return out
    stored_sizes, sizes = sizes, list(sizes)
    _verify_crc32c(pipeline, host, offsets, sizes, keys)
    timed("decode: crc32c on host")
    layout = pipeline.layouts[-1]
    expected = layout.nbytes
    stride = align(max(expected, 1))
    if _is_blosc(pipeline):  # frames taken apart on the host, streams decoded in one call per codec
        from gpuzarr_dist.cuda.blosc import decode_blosc_batch

        blosc_out = decode_blosc_batch(pipeline, host, offsets, sizes, stored_sizes, keys, expected, stride, stream)
        timed("decode: blosc")
        if blosc_out is None:
            return _decode_on_cpu(pipeline, host, offsets, stored_sizes, keys, stream)
        return _array_stage(pipeline, blosc_out, np.arange(n, dtype=np.int64) * stride, n)
    inner = _strip_outer_crc(pipeline.bytes_bytes)
    if inner:  # the host-only checks first: a batch they reject never queues its copy
        codec = inner[0]
        algorithm, head, tail = NVCOMP_FRAMING[codec.name]
        in_offs = np.asarray(offsets, dtype=np.int64) + head
        in_sizes = np.asarray(sizes, dtype=np.int64) - (head + tail)
        if in_sizes.min() <= 0:
            i = int(np.argmin(in_sizes))
            raise ChunkDecodeError(pipeline.array, keys[i], f"stored chunk of {sizes[i]} bytes is too short", codec.name)
        _check_stated_sizes(codec.name, pipeline.array, host, offsets, sizes, keys, expected)
        timed("decode: stated sizes (host)")
    total = int(np.max(np.add(offsets, sizes)))
    dev = cupy.empty(total, dtype=cupy.uint8)
    if inner:  # the output and the small tables first: they go up ahead of the chunks (see _small_tables)
        # guard bytes around the output slots: nvCOMP trusts the streams, and a damaged back-reference
        # (deflate distance or zstd offset reaching before the output) then reads our own memory instead of
        # faulting the context; whatever it produced fails the size and checksum checks below
        guarded = cupy.empty(n * stride + 2 * OUTPUT_GUARD, dtype=cupy.uint8)
        out = guarded[OUTPUT_GUARD : OUTPUT_GUARD + n * stride]
        tables = _small_tables(algorithm, dev, in_offs, in_sizes, out, stride, stream)
    dev.set(host[:total], stream=stream)
    if _stages_enabled():  # only when timing: the copy's own time, not the next stage's wait
        stream.synchronize()
    timed("decode: H2D")
    if inner:
        if codec.name == "zstd":
            try:
                suspects = _zstd_frames(pipeline.array, dev, in_offs, in_sizes, keys, expected, tables.frames)
            except _NoStatedSize:
                return _decode_on_cpu(pipeline, host, offsets, stored_sizes, keys, stream)
            if suspects:  # never handed to nvCOMP: bad ones are reported, the rest (if any) decode on the CPU
                _judge_on_cpu(pipeline, host, offsets, stored_sizes, keys, suspects)
                return _decode_on_cpu(pipeline, host, offsets, stored_sizes, keys, stream)
        if codec.name in ("gzip", "zlib") and deflate_check() == "walk":  # nvCOMP's Deflate hangs on some damage
            from gpuzarr_dist.cuda.deflate_walk import DEFLATE_GZIP, DEFLATE_ZLIB
            from gpuzarr_dist.cuda.deflate import deflate_suspects, warn_cpu_fallback

            suspects = deflate_suspects(dev, offsets, sizes, expected,
                                        DEFLATE_GZIP if codec.name == "gzip" else DEFLATE_ZLIB, stream)
            if suspects:  # never handed to nvCOMP: bad ones are reported, the rest (if any) decode on the CPU
                _judge_on_cpu(pipeline, host, offsets, stored_sizes, keys, suspects, codec.name)
                warn_cpu_fallback(pipeline.array, suspects)
                return _decode_on_cpu(pipeline, host, offsets, stored_sizes, keys, stream)
        if codec.name == "lz4":
            lengths = _lz4_lengths(dev, in_offs, in_sizes, expected, tables.frames)
            bad = host_checks.size_mismatches(lengths, expected)
            if bad:
                _judge_on_cpu(pipeline, host, offsets, stored_sizes, keys,
                              [(i, f"malformed lz4 block (code {lengths[i]})") for i in bad], "lz4")
                return _decode_on_cpu(pipeline, host, offsets, stored_sizes, keys, stream)
        timed("decode: frame checks")
        try:
            actual = _nvcomp_decode(algorithm, stream, dev, in_offs, in_sizes, out, stride, n, tables.nvcomp)
        except (RuntimeError, ValueError, MemoryError) as e:
            if is_out_of_memory(e):  # not the chunks' fault: the reader reports the block size to lower
                raise
            _judge_on_cpu(pipeline, host, offsets, stored_sizes, keys, [(i, f"nvCOMP: {e}") for i in range(n)], codec.name)
            warnings.warn(f"{pipeline.array}: nvCOMP failed on a batch the CPU decodes ({e}); decoded on the CPU",
                          RuntimeWarning, stacklevel=2)
            return _decode_on_cpu(pipeline, host, offsets, stored_sizes, keys, stream)
        timed("decode: nvCOMP")
        # after the decode: each chunk's size, and the checksums nvCOMP does not verify
        bad = [(i, f"decoded to {actual[i]} bytes, expected {expected}") for i in host_checks.size_mismatches(actual, expected)]
        if not bad and codec.name == "gzip":
            bad = [(i, "gzip CRC-32 does not match the decoded data")
                   for i in _crc32_mismatches(out, stride, expected, host, offsets, sizes)]
        if not bad and codec.name == "zstd":
            bad = [(i, "zstd content checksum does not match the decoded data")
                   for i in _xxh64_mismatches(out, stride, expected, host, in_offs, in_sizes)]
        if not bad and codec.name == "zlib":
            from gpuzarr_dist.cuda.deflate import adler32_mismatches

            bad = [(i, "zlib adler32 checksum does not match the decoded data")
                   for i in adler32_mismatches(out, [i * stride for i in range(n)], [expected] * n, host,
                                               np.add(offsets, sizes) - 4, stream)]
        timed("decode: checksums")
        if bad:  # named when the CPU decoder rejects them too; otherwise the CPU decodes the batch
            _judge_on_cpu(pipeline, host, offsets, stored_sizes, keys, bad, codec.name)
            return _decode_on_cpu(pipeline, host, offsets, stored_sizes, keys, stream)
        base = out
    else:
        bad = host_checks.size_mismatches(sizes, expected)
        if bad:
            raise ChunkDecodeError(pipeline.array, keys[bad[0]], f"stored {sizes[bad[0]]} bytes, expected {expected}", "bytes")
        base, stride = dev, None
    arr = _array_stage(pipeline, base, offsets if stride is None else np.arange(n, dtype=np.int64) * stride, n)
    timed("decode: array codecs (launch)")
    return arr


class _Frames(NamedTuple):
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
    tables: cupy.ndarray | None = None  # nvCOMP's C call's tables already on the device (_small_tables)


def _nvcomp_decode(algorithm: str, stream: cupy.cuda.Stream, dev: cupy.ndarray, in_offs: np.ndarray,
                   in_sizes: np.ndarray, out: cupy.ndarray, stride: int, n: int,
                   tables: cupy.ndarray | None = None) -> list[int]:
    """Decode ``n`` frames of ``dev`` into the slots of ``out``; their decoded sizes.

    One nvCOMP call on ``stream`` (:func:`_decode_frames`), or, under
    ``gpuzarr.gpu.decode-combine``, a share of a call joined with other
    threads' (:mod:`.combine`); a joined call that failed is made again for
    this batch alone.
    """
    frames = _Frames(algorithm, None, dev, in_offs, in_sizes, out, stride, n, tables)
    if gpu_decode_combine():
        from gpuzarr_dist.cuda.combine import Request, combiner

        ready = cupy.cuda.Event(block=False, disable_timing=True)
        ready.record(stream)  # the upload and the frame checks queued before it
        req = combiner((cupy.cuda.Device().id, algorithm)).run(Request(frames._replace(ready=ready, tables=None)),
                                                               _execute_joined)
        if req.error is not None:
            raise req.error
        if not req.alone:
            return req.result
    return _decode_frames(stream, [frames])


def _decode_frames(stream: cupy.cuda.Stream, parts: list[_Frames]) -> list[int]:
    """One nvCOMP call for the frames of ``parts`` (one algorithm) on ``stream``, waited for; their decoded sizes
    (see :func:`decode_spans`)."""
    ptrs = [_frame_ptrs(p.dev, p.in_offs, p.out, p.stride, p.n) for p in parts]
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

    return _decode_ptrs(parts[0].algorithm, stream, in_ptrs, np.concatenate([np.asarray(p.in_sizes, dtype=np.int64) for p in parts]),
                        out_ptrs, np.concatenate([np.full(p.n, p.stride, dtype=np.int64) for p in parts]), arrays,
                        parts[0].tables if len(parts) == 1 else None)


def decode_spans(algorithm: str, stream: cupy.cuda.Stream, src: cupy.ndarray, in_offs: Sequence[int],
                 in_sizes: Sequence[int], dst: cupy.ndarray, out_offs: Sequence[int], out_sizes: Sequence[int]) -> list[int]:
    """One nvCOMP call decoding the spans of ``src`` at ``in_offs`` into the slots of ``dst`` at ``out_offs``
    (``out_sizes`` bytes each) on ``stream``, waited for; their decoded sizes (Blosc's gathered streams).

    See :func:`_decode_ptrs`: nvCOMP's C function where it applies, its Python ``Codec`` otherwise.
    """
    from nvidia import nvcomp

    return _decode_ptrs(algorithm, stream, [src.data.ptr + o for o in in_offs], in_sizes,
                        [dst.data.ptr + o for o in out_offs], out_sizes,
                        lambda: (nvcomp.as_arrays(src, list(in_offs), list(in_sizes)),
                                 nvcomp.as_arrays(dst, list(out_offs), list(out_sizes))))


def _decode_ptrs(algorithm: str, stream: cupy.cuda.Stream, in_ptrs: Sequence[int], in_sizes: Sequence[int],
                 out_ptrs: Sequence[int], out_sizes: Sequence[int], arrays: Callable[[], tuple[Any, Any]],
                 tables: cupy.ndarray | None = None) -> list[int]:
    """Decode frames at device addresses on ``stream`` and wait; their decoded sizes.

    Through nvCOMP's C API (:mod:`.nvcomp_c`: the GIL released, nothing
    waited for until the sizes are needed) under ``gpuzarr.gpu.nvcomp-api``
    ``c`` (the default) when the addresses meet its alignment, otherwise
    through its Python ``Codec.decode`` on the ``(inputs, outputs)`` that
    ``arrays()`` makes. ``tables``: the C call's tables already on the device.
    """
    from gpuzarr_dist.cuda import nvcomp as nvcomp_c

    if nvcomp_api() == "c" and nvcomp_c.available() and nvcomp_c.aligned(algorithm, in_ptrs, out_ptrs):
        return nvcomp_c.decode(algorithm, stream, in_ptrs, in_sizes, out_ptrs, out_sizes, tables)
    ins, outs = arrays()
    res = _nvcomp_codec(algorithm, stream).decode(ins, out=outs)
    stream.synchronize()  # wait here, where CuPy releases the GIL (reading sizes waits holding it)
    return list(res.buffer_sizes)


def _execute_joined(batch: list[Any]) -> None:
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
        sizes = _decode_frames(stream, [r.payload for r in batch])
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


def _decode_on_cpu(pipeline: CodecPipeline, host: np.ndarray, offsets: Sequence[int], sizes: Sequence[int],
                   keys: Sequence[str], stream: cupy.cuda.Stream) -> cupy.ndarray:
    """Decode a batch on the CPU (thread pool) and copy it up once: for frames nvCOMP cannot size safely."""
    from gpuzarr_dist.runtime.threads import decode_pool

    layout0 = pipeline.layouts[0]
    chunks = pinned_empty((len(keys), *layout0.shape), layout0.dtype)  # the copy up runs at DMA speed

    def put(i: int, arr: np.ndarray) -> None:
        chunks[i] = arr

    pipeline.decode_batch([host[o : o + n] for o, n in zip(offsets, sizes)], keys, decode_pool(), sink=put)
    dev = cupy.empty(chunks.shape, dtype=chunks.dtype)
    dev.set(chunks, stream=stream)
    stream.synchronize()  # ``chunks`` goes back to the pinned pool on return: the copy must be done
    return dev


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
