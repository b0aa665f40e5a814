"""zstd on the device: every frame walked before nvCOMP decodes it, content checksums checked after.

Registers the codec's device steps (:mod:`.steps`). Only imported on the GPU
path: importing it imports cupy.
"""

from __future__ import annotations

from collections.abc import Sequence

import cupy
import numpy as np

from gpuzarr_dist.codecs import host_checks
from gpuzarr_dist.cuda.launch import frame_table, kernel, walk_launch
from gpuzarr_dist.cuda.steps import Batch, DeviceSteps, Suspects, register
from gpuzarr_dist.cuda.streams import on_stream, upload
from gpuzarr_dist.errors import ChunkDecodeError


class NoStatedSize(Exception):
    """A frame that does not state its decoded size: the batch is decoded on the CPU instead."""


def zstd_walk(dev: cupy.ndarray, offs: cupy.ndarray, lens: cupy.ndarray, n: int, fcs: cupy.ndarray,
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
    from gpuzarr_dist.cuda.kernels import (
        ZSTD_BLOCK_THREADS,
        ZSTD_FRAMES_SRC,
        ZSTD_LANE_SHARED,
        ZSTD_LIT_SLOTS,
        ZSTD_SLOT_BYTES,
        zstd_block_slots,
    )
    from gpuzarr_dist.cuda.streams import thread_side_stream

    if mode == 0:
        kernel("zstd_frames", ZSTD_FRAMES_SRC)(*walk_launch(n), (dev, offs, lens, np.int32(n), fcs, length, deep,
                                                                 np.int32(mode)))
        return
    cap = zstd_block_slots(expected)
    slots = cupy.empty(n * cap * ZSTD_SLOT_BYTES, dtype=cupy.uint8)
    nslots = cupy.empty(n, dtype=cupy.int32)
    kernel("zstd_plan", ZSTD_FRAMES_SRC)(*walk_launch(n), (dev, offs, lens, np.int32(n), slots, np.int32(cap), nslots,
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
            kernel("zstd_literals", ZSTD_FRAMES_SRC, (f"-DGZ_LIT_SLOTS={t}",))(
                ((total + t - 1) // t,), (4 * t,), (dev, offs, np.int32(n), slots, np.int32(cap), nslots))
    t = ZSTD_BLOCK_THREADS
    try:
        kernel("zstd_blocks", ZSTD_FRAMES_SRC, (f"-DGZ_LANE_SHARED={ZSTD_LANE_SHARED}",))(
            ((total + t - 1) // t,), (t,), (dev, offs, np.int32(n), slots, np.int32(cap), nslots, np.int32(mode)))
    finally:  # joined even when the launch fails: waiting for the thread's stream then waits for both
        if side is not None and side is not main:
            walked = cupy.cuda.Event(block=False, disable_timing=True)
            walked.record(side)
            main.wait_event(walked)
    kernel("zstd_combine", ZSTD_FRAMES_SRC)(*walk_launch(n), (dev, offs, lens, np.int32(n), slots, np.int32(cap),
                                                              nslots, fcs, length, deep, np.int32(mode)))


def zstd_frames(array: str, dev: cupy.ndarray, offsets: Sequence[int], sizes: Sequence[int],
                keys: Sequence[str], expected: int, dev_table: cupy.ndarray | None = None) -> list[tuple[int, str]]:
    """Check every zstd frame on the device, one thread each, before nvCOMP sees any of them.

    Definite errors raise :class:`ChunkDecodeError`: a bad magic number, a
    cut header, a stated size other than the chunk's, blocks running past the
    chunk (nvCOMP 6 decodes a truncated frame whose header still states the
    right size without an error, and a frame larger than its slot overwrites
    the next one). Raises :class:`NoStatedSize` for frames the CPU decoder
    must handle (no stated size, or several frames in one chunk).

    Returns the frames whose block structure is impossible (see
    :data:`.kernels.ZSTD_DEEP_REASONS`) as ``(index, reason)``: these are kept
    from nvCOMP, which has faulted the CUDA context and hung on such input,
    and the caller lets the CPU decoder judge them. How deep the walk goes
    (headers and tables, or every sequence too) is ``gpuzarr.gpu.zstd-check``.
    ``dev_table``: ``offsets`` and ``sizes`` already queued for the device (see
    :func:`.nvcomp_calls.small_tables`).
    """
    from gpuzarr_dist.config import zstd_check
    from gpuzarr_dist.cuda.kernels import ZSTD_CHECK_MODES, ZSTD_DEEP_REASONS

    mode = ZSTD_CHECK_MODES[zstd_check()]
    n = len(offsets)
    offs, lens = frame_table(offsets, sizes, dev_table)
    found = cupy.empty(3 * n, dtype=cupy.int64)  # stated sizes, lengths, walk codes (int32): one copy back
    zstd_walk(dev, offs, lens, n, found[:n], found[n : 2 * n], found[2 * n :].view(cupy.int32), mode, expected)
    found = found.get()
    fcs, length, deep = found[:n], found[n : 2 * n], found[2 * n :].view(np.int32)[:n]
    verdicts = host_checks.zstd_verdicts(fcs, length, deep, sizes, expected)  # numpy over all frames
    i = host_checks.zstd_first_error(verdicts)
    if i >= 0:
        if verdicts[i] == host_checks.ZSTD_NO_SIZE:
            raise NoStatedSize(keys[i])
        raise ChunkDecodeError(array, keys[i], host_checks.zstd_reason(int(verdicts[i]), int(fcs[i]), int(length[i]),
                                                                       int(sizes[i]), expected), "zstd")
    return [(i, ZSTD_DEEP_REASONS.get(int(deep[i]), f"zstd frame structure check {int(deep[i])}"))
            for i in np.flatnonzero(verdicts == host_checks.ZSTD_DEEP).tolist()]


def xxh64_mismatches(out: cupy.ndarray, stride: int, nbytes: int, host: np.ndarray, offsets: Sequence[int],
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
    kernel("xxh64_low32", XXH64_SRC)(((n + 63) // 64,), (64,), (
        out, np.int64(stride), np.int64(nbytes), np.int32(n), upload(wanted), got))
    actual = got.get()
    return host_checks.trailer_mismatches(actual, host, np.add(offsets, sizes) - 4, wanted=wanted)


def _check_frames(b: Batch) -> Suspects | None:
    """The walk before nvCOMP: None when every frame may go to nvCOMP; frames it keeps from nvCOMP otherwise
    (none listed for frames without a stated size, which the CPU decodes)."""
    try:
        suspects = zstd_frames(b.array, b.dev, b.in_offs, b.in_sizes, b.keys, b.expected, b.frames)
    except NoStatedSize:
        return []
    return suspects or None


def _verify(b: Batch) -> Suspects:
    return [(i, "zstd content checksum does not match the decoded data")
            for i in xxh64_mismatches(b.out, b.stride, b.expected, b.host, b.in_offs, b.in_sizes)]


STEPS = register(DeviceSteps("zstd", "Zstd", 0, 0, kernels=("zstd_frames.cu", "xxh64.cu"), check_frames=_check_frames,
                             verify=_verify))
