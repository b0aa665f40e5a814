"""Deflate data checked on the device before nvCOMP decodes it, and adler32 checked after.

nvCOMP 6.0's Deflate decoder hangs on some damaged streams (truncated, or
with overwritten runs), and nothing stops a hang inside nvCOMP. So every
gzip, zlib and Blosc zlib stream is walked first (:data:`.deflate_walk.DEFLATE_WALK_SRC`,
one thread per stream, always on): a stream whose structure is invalid, that
decodes to another size, or whose deflate data does not end exactly at its
trailer is a *suspect* and never reaches nvCOMP; the caller lets the CPU
decoder judge the suspects (it names the bad chunk, or decodes the batch
when it accepts them all, e.g. bytes after the end that zlib ignores).

After the decode, :func:`adler32_mismatches` checks each decoded stream's
adler32 (zlib chunks and Blosc's zlib streams, whose checksums nvCOMP never
sees) with a segmented kernel that takes streams of any length, and
:func:`crc32_mismatches` each gzip chunk's CRC-32.

Registers the device steps of gzip and zlib (:mod:`.steps`).

Only imported on the GPU path: importing it imports cupy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import cupy
import numpy as np

from gpuzarr_dist.codecs import host_checks
from gpuzarr_dist.config import deflate_check
from gpuzarr_dist.cuda.deflate_walk import (
    ADLER32_SEGMENT,
    ADLER32_SRC,
    DEFLATE_GZIP,
    DEFLATE_WALK_SRC,
    DEFLATE_ZLIB,
    walk_reason,
)
from gpuzarr_dist.cuda.launch import kernel
from gpuzarr_dist.cuda.steps import Batch, DeviceSteps, Suspects, register
from gpuzarr_dist.cuda.streams import on_stream, upload
from gpuzarr_dist.runtime.once import warn_once

_warned: set[str] = set()
_sm_count: dict[int, int] = {}
_sm_lock = threading.Lock()


def _sms() -> int:
    dev = cupy.cuda.Device().id
    n = _sm_count.get(dev)
    if n is None:
        with _sm_lock:
            n = _sm_count.setdefault(dev, int(cupy.cuda.Device(dev).attributes["MultiProcessorCount"]))
    return n


def walk_threads(n: int, threads: int | None = None) -> int:
    """Threads per block for walking ``n`` streams: ``threads``, else ``gpuzarr.gpu.deflate-walk-threads``.

    ``auto`` (the default) spreads the streams over the GPU's SMs: one stream
    per block while there are fewer than two blocks per SM, doubling up to 32
    per block for large batches. Each thread walks its own stream with its own
    branches, so threads of one warp mostly wait for each other.
    """
    if threads is None:
        from gpuzarr_dist.config import deflate_walk_threads

        threads = deflate_walk_threads()
    if threads:
        return max(1, min(int(threads), 1024))
    t, sms = 1, _sms()
    while t < 32 and -(-n // (2 * t)) >= 2 * sms:
        t *= 2
    return t


def deflate_walk(buf: cupy.ndarray, offsets: Sequence[int], sizes: Sequence[int], limits: Sequence[int] | int,
                 wrap: int, stream: cupy.cuda.Stream, threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Walk the streams ``buf[offsets[i] : offsets[i] + sizes[i]]`` on ``stream``; wait for the result.

    Returns ``(lengths, ends)`` on the host: each stream's decoded length
    (negative: a code of :data:`.deflate_walk.DEFLATE_WALK_REASONS`) and where
    its deflate data ended. ``wrap`` is one of ``DEFLATE_RAW``, ``DEFLATE_ZLIB``,
    ``DEFLATE_GZIP``; ``limits`` bounds each stream's decoded length.
    """
    n = len(offsets)
    if isinstance(limits, (int, np.integer)):
        limits = [int(limits)] * n
    t = walk_threads(n, threads)
    with on_stream(stream):
        table = upload(np.concatenate([np.asarray(offsets, np.int64), np.asarray(sizes, np.int64),
                                       np.asarray(limits, np.int64)]))
        res = cupy.empty(2 * n, dtype=cupy.int64)
        kernel("deflate_walk", DEFLATE_WALK_SRC)(((n + t - 1) // t,), (t,), (
            buf, table[:n], table[n : 2 * n], table[2 * n :], np.int32(n), np.int32(wrap), res[:n], res[n:]))
        out = res.get(stream=stream)  # waits for the walk
    return out[:n], out[n:]


def deflate_suspects(buf: cupy.ndarray, offsets: Sequence[int], sizes: Sequence[int], expected: Sequence[int] | int,
                     wrap: int, stream: cupy.cuda.Stream) -> list[tuple[int, str]]:
    """The streams to keep from nvCOMP, as ``(index, reason)``: all whose walk did not end at ``expected`` bytes."""
    lengths, _ = deflate_walk(buf, offsets, sizes, expected, wrap, stream)
    want = np.broadcast_to(np.asarray(expected, dtype=np.int64), lengths.shape)
    return [(i, walk_reason(int(lengths[i]), int(want[i]))) for i in np.flatnonzero(lengths != want).tolist()]


def warn_cpu_fallback(array: str, suspects: list[tuple[int, str]]) -> None:
    """Warn once per array that a batch was decoded on the CPU because the CPU accepted every deflate suspect.

    Valid but unusual streams (bytes after a zlib stream, gzip padding or a
    second member, gzip reserved flags) are kept from nvCOMP and decoded on
    the CPU, which is correct but slower; the user should know why.
    """
    warn_once(_warned, array, f"{array}: deflate streams the GPU path does not hand to nvCOMP ({suspects[0][1]}) "
              "decode on the CPU; such batches are decoded on the CPU (warned once per array)", stacklevel=4)


def adler32_streams(buf: cupy.ndarray, offsets: Sequence[int], lengths: Sequence[int],
                    stream: cupy.cuda.Stream) -> np.ndarray:
    """adler32 of each ``buf[offsets[i] : offsets[i] + lengths[i]]`` (any lengths), on ``stream``; uint32 on the host.

    One thread per 4 KiB segment of every stream sums it, then one thread per
    stream joins its segments (:data:`.deflate_walk.ADLER32_SRC`).
    """
    n = len(offsets)
    if n == 0:
        return np.zeros(0, np.uint32)
    lens = np.asarray(lengths, np.int64)
    nseg = -(-lens // ADLER32_SEGMENT)
    seg0 = np.concatenate([[0], np.cumsum(nseg)]).astype(np.int64)
    total = int(seg0[-1])
    with on_stream(stream):
        table = upload(np.concatenate([np.asarray(offsets, np.int64), lens, seg0]))
        d_offs, d_lens, d_seg0 = table[:n], table[n : 2 * n], table[2 * n :]
        segs = cupy.empty(max(2 * total, 1), dtype=cupy.uint32)
        if total:
            kernel("adler32_segments", ADLER32_SRC)(((total + 255) // 256,), (256,), (
                buf, d_offs, d_lens, d_seg0, np.int32(n), np.int64(ADLER32_SEGMENT), np.int64(total), segs))
        result = cupy.empty(n, dtype=cupy.uint32)
        kernel("adler32_combine", ADLER32_SRC)(((n + 63) // 64,), (64,), (
            segs, d_lens, d_seg0, np.int32(n), np.int64(ADLER32_SEGMENT), result))
        return result.get(stream=stream)


def adler32_mismatches(buf: cupy.ndarray, offsets: Sequence[int], lengths: Sequence[int], host: np.ndarray,
                       stored_at: Sequence[int] | np.ndarray, stream: cupy.cuda.Stream) -> list[int]:
    """Indexes of decoded streams whose adler32 differs from the big-endian value stored in ``host`` at ``stored_at``."""
    actual = adler32_streams(buf, offsets, lengths, stream)
    return host_checks.trailer_mismatches(actual.astype(np.int64), host, stored_at, big=True)


def crc32_mismatches(out: cupy.ndarray, stride: int, nbytes: int, host: np.ndarray, offsets: Sequence[int],
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
    kernel("crc32_segments", CRC32_SRC)(((total + 255) // 256,), (256,), (
        out, np.int64(stride), np.int64(nbytes), np.int64(seg), np.int64(nseg), np.int64(total), segs))
    crc = cupy.empty(n, dtype=cupy.uint32)
    kernel("crc32_combine", CRC32_SRC)(((n + 63) // 64,), (64,), (
        segs, np.int64(nseg), np.int64(seg), np.int64(nbytes), np.int32(n), crc))
    actual = crc.get()
    return host_checks.trailer_mismatches(actual, host, np.add(offsets, sizes) - 8)


def bad_deflate_header(codec: str, host: np.ndarray, o: int, n: int) -> str | None:
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


def _check_host(codec: str) -> Callable[..., None]:
    def check(array: str, host: np.ndarray, offsets: Sequence[int], sizes: Sequence[int], keys: Sequence[str],
              expected: int) -> None:
        """Check on the host, before launching, each header and the decoded size a gzip member states.

        nvCOMP trusts the frames: a frame larger than its output slot was seen
        writing into the next slot. gzip members state their size in their last
        four bytes (mod 2**32); zlib states none (nvCOMP bounds it by the slot).
        Vectorised over the batch (:func:`..codecs.host_checks.check_stated_sizes`).
        """
        host_checks.check_stated_sizes(codec, array, host, offsets, sizes, keys, expected, bad_deflate_header)

    return check


def _walk(wrap: int) -> Callable[[Batch], Suspects | None]:
    def check_frames(b: Batch) -> Suspects | None:
        """The deflate walk before nvCOMP (``gpuzarr.gpu.deflate-check`` ``walk``): nvCOMP's Deflate hangs on
        some damage. None when every stream may go to nvCOMP; the suspects otherwise."""
        if deflate_check() != "walk":
            return None
        return deflate_suspects(b.dev, b.offsets, b.sizes, b.expected, wrap, b.stream) or None

    return check_frames


def _verify_gzip(b: Batch) -> Suspects:
    return [(i, "gzip CRC-32 does not match the decoded data")
            for i in crc32_mismatches(b.out, b.stride, b.expected, b.host, b.offsets, b.sizes)]


def _verify_zlib(b: Batch) -> Suspects:
    n = len(b.keys)
    return [(i, "zlib adler32 checksum does not match the decoded data")
            for i in adler32_mismatches(b.out, [i * b.stride for i in range(n)], [b.expected] * n, b.host,
                                        np.add(b.offsets, b.sizes) - 4, b.stream)]


GZIP = register(DeviceSteps("gzip", "Gzip", 0, 0, kernels=("deflate_walk.cu", "crc32.cu"), check_host=_check_host("gzip"),
                            check_frames=_walk(DEFLATE_GZIP), warn_fallback=warn_cpu_fallback, verify=_verify_gzip))
#: RFC 1950: a 2-byte header, raw deflate, a 4-byte adler32
ZLIB = register(DeviceSteps("zlib", "Deflate", 2, 4, kernels=("deflate_walk.cu", "adler32.cu"),
                            check_host=_check_host("zlib"), check_frames=_walk(DEFLATE_ZLIB),
                            warn_fallback=warn_cpu_fallback, verify=_verify_zlib))
