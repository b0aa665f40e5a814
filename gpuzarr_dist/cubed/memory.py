"""Memory: the per-task budget split (``reserved_mem`` and read blocks) and the measured peak of each task.

Budget (documented in the Cubed guide): cubed projects a task that reads
an input chunk of ``B`` bytes as ``reserved_mem`` + ``B`` (its read buffer:
here the compressed bytes on the device, at most ``B`` for incompressible
data) + ``B`` (the array) + 2 x its output chunk. What cubed does not see is
the decoder's workspace, so it goes into ``reserved_mem``: nvCOMP's zstd
scratch space, 3.05 bytes per decoded byte of one call
(``nvcompBatchedZstdDecompressGetTempSize`` of nvCOMP 6.0, for 8 to
4096 frames of 256 KiB and 8 to 256 of 2 MB: the same ratio). A GPU read
decodes its block in :data:`DECODE_SPLIT` calls, slabs of its chunk grid of
at most ``read_block / 2`` decoded bytes each (:func:`decode_limit`,
``BlockReader.decode_bytes``), so it holds the compressed bytes (at most
``B``), the block (``B``), one slab's decoded chunks (``B / 2``) and its
scratch (``1.525 B``) at once: at most ``4.03 B``, within the projection
``reserved_mem + 4 B = 5.525 B``.

    reserved_mem = WORKSPACE[device] * read_block + POOL_SLACK[device]
    WORKSPACE = {"gpu": 3.05 / 2 (zstd scratch of a half-block call), "cpu": 1.0 (compressed bytes)}
    read_block  = allowed_mem / (4 + 1.525) on the GPU, allowed_mem // 8 on the CPU, unless given

and ``from_zarr_gpu`` reads blocks of at most ``min(read_block, (allowed_mem -
reserved_mem) / 4)`` bytes (0.181 x allowed_mem on the GPU, 0.125 x on the CPU),
split evenly along the axis that is split, so cubed's projection fits
``allowed_mem``. The GPU decodes a block in two calls (half the zstd scratch
of one call), so blocks are larger than with one: the benchmark's 2400 steps
read in 4 blocks along time, not 5, and cubed's mean (``split_every`` 4)
combines them in the operation that reads them instead of a second one.

Measured peak per task: on the GPU, the bytes a task's thread holds from
CuPy's memory pool (a thread-local CuPy memory hook: allocations made in the
task, minus those freed in it, at their highest). Through nvCOMP's C functions
(``gpuzarr.gpu.nvcomp-api`` ``c``, the default) the decode scratch is taken
from that pool, so it is in the measurement, and ``reserved_mem`` holds its
room back. The encode scratch is the process's (one buffer per GPU and codec,
``gpuzarr.gpu.encode-scratch``, shared by every task's writes; see
``codecs.gpu_encode._encode_joined``), so a GPU holds threads x
``allowed_mem`` plus that buffer. With ``nvcomp-api`` ``python`` nvCOMP
allocates both itself, outside the pool and the measurement. On the CPU the default is cubed's own
measure (the process's peak resident set, ``ru_maxrss``), or, with
``measure="tracemalloc"``, the peak of Python and numpy allocations during the
task (exact per task when one task runs at a time).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

#: nvCOMP's zstd decode scratch per decoded byte (nvCOMP 6.0; the same for 8 to 4096 frames)
ZSTD_SCRATCH = 3.05
#: a GPU read decodes its block in calls of at most 1 / this of the read block (rows of its chunk grid)
DECODE_SPLIT = 2
WORKSPACE = {"gpu": ZSTD_SCRATCH / DECODE_SPLIT, "cpu": 1.0}
POOL_SLACK = {"gpu": 2 << 20, "cpu": 0}  # CuPy pool rounding (512-byte units, 1 MiB staging round-up) and kernels
#: allowed_mem / read_block: on the GPU the largest block cubed's projection (reserved + 4 x the block) allows
READ_BLOCK_FRACTION = {"gpu": 4 + WORKSPACE["gpu"], "cpu": 8}


def decode_limit(spec: Any, device: str) -> int | None:
    """Decoded bytes a GPU read may decode in one nvCOMP call under ``spec`` (``None`` on the CPU): the read
    block (``spec()``'s ``read_block``, else what cubed's projection leaves a block) / :data:`DECODE_SPLIT`."""
    if device != "gpu" or spec is None:
        return None
    rb = getattr(spec, "gpuzarr_read_block", None)
    if not rb:
        allowed, reserved = int(getattr(spec, "allowed_mem", 0) or 0), int(getattr(spec, "reserved_mem", 0) or 0)
        rb = (allowed - reserved) // 4 if allowed > reserved else None
    return max(1, math.ceil(rb / DECODE_SPLIT)) if rb else None


def default_read_block(allowed_mem: int, device: str = "cpu") -> int:
    """The decompressed size of the read blocks from_zarr_gpu aims for under ``allowed_mem`` on ``device``."""
    return max(1, int(allowed_mem // READ_BLOCK_FRACTION[device]))


def default_reserved_mem(allowed_mem: int, device: str, read_block: int | None = None) -> int:
    """``reserved_mem`` covering the decoders' and pools' workspace (see the module docstring)."""
    rb = default_read_block(allowed_mem, device) if read_block is None else read_block
    return int(math.ceil(WORKSPACE[device] * rb)) + POOL_SLACK[device]


def min_allowed(chunk_bytes: int, device: str) -> int:
    """The smallest ``allowed_mem`` under which spec()'s defaults read blocks of one ``chunk_bytes`` chunk."""
    frac = READ_BLOCK_FRACTION[device]
    free = 1 - WORKSPACE[device] / frac
    return int(math.ceil(max(frac * chunk_bytes, (4 * chunk_bytes + POOL_SLACK[device]) / free)))


# -- measurement -----------------------------------------------------------------


class _Measure:
    """Context manager measuring one task's peak memory in the running thread; ``peak`` in bytes after exit."""

    start: int = 0
    peak: int = 0

    def __enter__(self) -> _Measure:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class _RssMeasure(_Measure):
    """Cubed's own measure: the process's peak resident set size (start and end of the task)."""

    def __enter__(self) -> _RssMeasure:
        self.start = _rss()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.peak = _rss()


def _rss() -> int:
    try:
        from cubed.utils import peak_measured_mem

        return int(peak_measured_mem())
    except Exception:  # Windows, or cubed missing
        return 0


_tracemalloc_lock = threading.Lock()


class _TracemallocMeasure(_Measure):
    """Peak of traced allocations (numpy reports its buffers to tracemalloc) during the task."""

    def __enter__(self) -> _TracemallocMeasure:
        import tracemalloc

        with _tracemalloc_lock:
            if not tracemalloc.is_tracing():
                tracemalloc.start()
            tracemalloc.reset_peak()
            self._base = tracemalloc.get_traced_memory()[0]
        self.start = 0
        return self

    def __exit__(self, *exc: Any) -> None:
        import tracemalloc

        self.peak = max(0, tracemalloc.get_traced_memory()[1] - self._base)


class _GpuMeasure(_Measure):
    """Peak bytes the task's thread held from CuPy's device memory pool."""

    def __enter__(self) -> _GpuMeasure:
        from gpuzarr_dist.cuda.memory import thread_peak_hook

        self._hook = thread_peak_hook()
        self._hook.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hook.__exit__(*exc)
        self.peak = int(self._hook.peak)


def measurer(device: str, measure: str = "auto") -> Callable[[], _Measure]:
    """A factory of per-task measurements: ``"auto"`` (device pool on the GPU, rss on the CPU),
    ``"device"``, ``"rss"``, ``"tracemalloc"`` or ``"none"``."""
    if measure == "auto":
        measure = "device" if device == "gpu" else "rss"
    table: dict[str, Callable[[], _Measure]] = {
        "device": _GpuMeasure if device == "gpu" else _TracemallocMeasure,
        "rss": _RssMeasure,
        "tracemalloc": _TracemallocMeasure,
        "none": _Measure,
    }
    if measure not in table:
        raise ValueError(f"measure must be one of {sorted(table) + ['auto']}, got {measure!r}")
    return table[measure]


def timestamp() -> float:
    return time.time()
