"""nvCOMP's batched C API through ctypes: decode calls that let other threads run and do not wait for the GPU.

nvCOMP's Python ``Codec.decode`` holds the GIL until its GPU work is done.
Measured on one H200 (session 15, ``tools/gpu_probe_nvcomp_calls.py``): a
Python thread counting beside a 56-frame zstd decode ran at 26% of its idle
rate, and 4, 8 and 16 threads each calling ``decode`` reached 11.6-12.2 GB/s
in all, no more than one thread. A ctypes call releases the GIL, and
``nvcompBatched<Algorithm>DecompressAsync`` only queues kernels on the
caller's stream, so the decodes of several threads run on the GPU side by
side, and the thread itself waits (stream synchronisation, GIL released) only
when it needs the decoded sizes.

The library is the one nvCOMP's Python package loads (``nvidia.libnvcomp``),
or a system ``libnvcomp.so.6``. Scratch space comes from CuPy's pool on the
caller's stream, so it is reused and counted with the task's other buffers.
"""
from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import cupy

#: nvCOMP's C names of the algorithms (``nvcomp.Codec``'s names, as in ``gpu.NVCOMP_FRAMING``)
ALGORITHMS = ("Zstd", "LZ4", "Deflate", "Gzip")

#: ``nvcompStatus_t`` values and their names in nvCOMP's headers
STATUS = {0: "nvcompSuccess", 10: "nvcompErrorInvalidValue", 11: "nvcompErrorNotSupported",
          12: "nvcompErrorCannotDecompress", 13: "nvcompErrorBadChecksum",
          14: "nvcompErrorCannotVerifyChecksums", 15: "nvcompErrorOutputBufferTooSmall",
          16: "nvcompErrorWrongHeaderLength", 17: "nvcompErrorAlignment", 18: "nvcompErrorChunkSizeTooLarge",
          19: "nvcompErrorCannotCompress", 20: "nvcompErrorWrongInputLength", 21: "nvcompErrorBatchSizeTooLarge",
          22: "nvcompErrorSubChunkCountTooLarge", 23: "nvcompErrorSubChunkCountTooSmall",
          24: "nvcompErrorOutputBufferAlignmentTooSmall", 1000: "nvcompErrorCudaError", 10000: "nvcompErrorInternal"}


class _DecompressOpts(ctypes.Structure):
    """Any ``nvcompBatched<Algorithm>DecompressOpts_t``: 64 bytes, all zero in each algorithm's default options
    (backend ``NVCOMP_DECOMPRESS_BACKEND_DEFAULT``, gzip's naive algorithm, lz4's char data, no bitshuffle)."""

    _fields_ = [("raw", ctypes.c_char * 64)]


class _Alignments(ctypes.Structure):
    """``nvcompAlignmentRequirements_t``."""

    _fields_ = [("input", ctypes.c_size_t), ("output", ctypes.c_size_t), ("temp", ctypes.c_size_t)]


class NvcompCallError(RuntimeError):
    """An nvCOMP C call that returned an error, or frames it reported it could not decode."""


class _Api:
    """The three decode functions of one algorithm, with their argument types, and its alignments."""

    def __init__(self, lib: ctypes.CDLL, algorithm: str) -> None:
        p, sz, vp = ctypes.POINTER, ctypes.c_size_t, ctypes.c_void_p
        self.temp_size = getattr(lib, f"nvcompBatched{algorithm}DecompressGetTempSize")
        self.temp_size.argtypes = [sz, sz, _DecompressOpts, p(sz), sz, vp]
        self.decompress = getattr(lib, f"nvcompBatched{algorithm}DecompressAsync")
        self.decompress.argtypes = [vp, vp, vp, vp, sz, vp, sz, vp, _DecompressOpts, vp, vp]
        aligns = getattr(lib, f"nvcompBatched{algorithm}DecompressGetRequiredAlignments")
        aligns.argtypes = [_DecompressOpts, p(_Alignments)]
        for f in (self.temp_size, self.decompress, aligns):
            f.restype = ctypes.c_int
        a = _Alignments()
        _check(aligns(_DecompressOpts(), ctypes.byref(a)), f"nvcompBatched{algorithm}DecompressGetRequiredAlignments")
        self.alignments = (int(a.input), int(a.output), int(a.temp))


_lock = threading.Lock()
_apis: dict[str, _Api] = {}
_lib: list[ctypes.CDLL] = []


def _library() -> ctypes.CDLL:
    """The libnvcomp nvCOMP's Python package uses (loaded once)."""
    if not _lib:
        lib = None
        try:
            import nvidia.libnvcomp as wheel

            lib = wheel.load_library()
        except ImportError:
            pass
        _lib.append(lib if lib is not None else ctypes.CDLL("libnvcomp.so.6", mode=ctypes.RTLD_LOCAL))
    return _lib[0]


def api(algorithm: str) -> _Api:
    """The decode functions of ``algorithm`` (one of :data:`ALGORITHMS`); raises OSError without libnvcomp."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"nvCOMP C decode: unknown algorithm {algorithm!r} (one of {', '.join(ALGORITHMS)})")
    with _lock:
        a = _apis.get(algorithm)
        if a is None:
            a = _apis[algorithm] = _Api(_library(), algorithm)
    return a


_unavailable: list[str] = []


def available() -> bool:
    """Whether libnvcomp's C decode functions load in this process (tried once; :func:`why_unavailable` says why not)."""
    if not _apis and not _unavailable:
        try:
            api("Zstd")
        except (OSError, AttributeError, NvcompCallError) as e:
            _unavailable.append(f"{type(e).__name__}: {e}")
    return not _unavailable


def why_unavailable() -> str | None:
    """Why the C functions did not load, or ``None`` when they did (or were not tried)."""
    return _unavailable[0] if _unavailable else None


def _check(status: int, what: str) -> None:
    if status != 0:
        raise NvcompCallError(f"{what} returned {STATUS.get(status, status)}")


def aligned(algorithm: str, in_ptrs: Sequence[int], out_ptrs: Sequence[int]) -> bool:
    """Whether every input and output address meets ``algorithm``'s alignment (checked before a call)."""
    a_in, a_out, _ = api(algorithm).alignments
    return all(p % a_in == 0 for p in in_ptrs) and all(p % a_out == 0 for p in out_ptrs)


def decode(algorithm: str, stream: cupy.cuda.Stream, in_ptrs: Sequence[int], in_sizes: Sequence[int],
           out_ptrs: Sequence[int], out_sizes: Sequence[int]) -> list[int]:
    """Decode ``len(in_ptrs)`` frames into the slots at ``out_ptrs`` on ``stream``; their decoded sizes.

    The addresses are device pointers into buffers the caller keeps alive
    until this returns; ``out_sizes`` are the slots' sizes. They bound
    nothing: nvCOMP 6.0 reported success and the full decoded size for a zstd
    frame given half the slot it needed (H200), so callers check what frames
    state before the call and guard the output (``gpu._decode_batch``). The
    pointer tables, the scratch space
    and the results are queued on ``stream`` behind the work already there
    (the uploads of the frames), the decode is queued after them, and the
    thread then waits for ``stream`` with the GIL released. Raises
    :class:`NvcompCallError` if nvCOMP refuses the call or reports any frame
    it could not decode (the caller then judges the frames on the CPU).
    """
    import cupy

    from ..runtime.cuda import pinned_staging

    a = api(algorithm)
    n = len(in_ptrs)
    if n == 0:
        return []
    if not aligned(algorithm, in_ptrs, out_ptrs):
        raise NvcompCallError(f"nvCOMP {algorithm} decode: buffers not aligned to {a.alignments[:2]} (input, output)")
    tables = pinned_staging(4 * n * 8).view(np.uint64).reshape(4, n)  # in ptrs, in bytes, out sizes, out ptrs
    tables[0], tables[1], tables[2], tables[3] = in_ptrs, in_sizes, out_sizes, out_ptrs
    largest, total = int(tables[2].max()), int(tables[2].sum())
    try:
        with stream:
            dev_tables = cupy.empty((4, n), dtype=cupy.uint64)
            dev_tables.set(tables, stream=stream)
            results = cupy.empty(2 * n, dtype=cupy.uint64)  # decoded sizes, then the int32 statuses
            temp_bytes = ctypes.c_size_t(0)
            _check(a.temp_size(n, largest, _DecompressOpts(), ctypes.byref(temp_bytes), total, stream.ptr),
                   f"nvcompBatched{algorithm}DecompressGetTempSize")
            temp = cupy.empty(max(int(temp_bytes.value), 1), dtype=cupy.uint8)
            if temp.data.ptr % a.alignments[2]:
                raise NvcompCallError(f"nvCOMP {algorithm} decode: scratch not aligned to {a.alignments[2]}")
            row = dev_tables.data.ptr
            _check(a.decompress(row, row + 8 * n, row + 16 * n, results.data.ptr, n, temp.data.ptr,
                                int(temp_bytes.value), row + 24 * n, _DecompressOpts(), results.data.ptr + 8 * n,
                                stream.ptr), f"nvcompBatched{algorithm}DecompressAsync")
            stream.synchronize()  # the GIL released while waiting
            host = results.get(stream=stream)
    except BaseException:
        stream.synchronize()  # the pinned tables go back to their pool only when no copy reads them
        raise
    statuses = host[n:].view(np.int32)[:n]
    bad = np.flatnonzero(statuses)
    if bad.size:
        i = int(bad[0])
        raise NvcompCallError(f"nvCOMP {algorithm} decode: {bad.size} of {n} frames failed, the first (frame {i}) "
                              f"with {STATUS.get(int(statuses[i]), int(statuses[i]))}")
    return host[:n].astype(np.int64).tolist()
