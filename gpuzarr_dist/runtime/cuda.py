"""Per-thread CUDA resources: a stream for each worker thread; pinned staging buffers from a shared pool.

Each thread that reads on the GPU gets, on first use, its own non-blocking
CuPy stream, made the thread's current stream so that the user's fused
kernels run on it too, and kept for the life of the process (so no work, and
no nvCOMP codec bound to it, ever outlives its stream). Large temporaries come
from CuPy's memory pools (device and pinned), not fresh allocations per chunk.

Only imported on the GPU path: importing it imports cupy.
"""

from __future__ import annotations

import threading

import cupy
import numpy as np

_local = threading.local()
_keep: list = []  # streams live as long as the process: never destroyed under pending work
_keep_lock = threading.Lock()

ALIGN = 256  # nvCOMP needs aligned sub-buffers; 256 bytes matches cudaMalloc's alignment


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def thread_stream() -> cupy.cuda.Stream:
    """This thread's CUDA stream, created once and made current for CuPy in this thread."""
    s = getattr(_local, "stream", None)
    if s is None:
        s = cupy.cuda.Stream(non_blocking=True)
        _local.stream = s
        with _keep_lock:
            _keep.append(s)
    if cupy.cuda.get_current_stream() is not s:
        s.use()
    return s


def thread_nvcomp_codec(algorithm: str, stream: cupy.cuda.Stream) -> object:
    """This thread's nvCOMP codec for ``algorithm`` on ``stream`` (for decoding and encoding alike).

    Created in the thread that uses it (measured: a codec created in another
    thread ran 5x slower) and kept with the thread; the stream outlives it,
    since streams are kept for the life of the process (a stream destroyed
    before its codec is what crashed the process in the shared notes).
    """
    from nvidia import nvcomp

    codecs = getattr(_local, "codecs", None)
    if codecs is None:
        codecs = _local.codecs = {}
    key = (algorithm, stream.ptr)
    codec = codecs.get(key)
    if codec is None:
        codec = codecs[key] = nvcomp.Codec(
            algorithm=algorithm,
            bitstream_kind=nvcomp.BitstreamKind.RAW,
            device_id=cupy.cuda.Device().id,
            cuda_stream=stream.ptr,
        )
    return codec


def pinned_staging(nbytes: int) -> np.ndarray:
    """A pinned host buffer of at least ``nbytes`` as a uint8 array, from CuPy's pinned memory pool.

    Sizes are rounded up to a power of two so that freed buffers are reused by
    the next block of about the same size, on any thread; the memory goes back
    to the pool when the array is garbage collected. The caller synchronises
    its stream before dropping the array (no copy may still read it).
    """
    size = 1 << max(20, (max(nbytes, 1) - 1).bit_length())
    mem = cupy.cuda.alloc_pinned_memory(size)
    return np.frombuffer(mem, dtype=np.uint8, count=size)[:nbytes]


def sync_thread_stream() -> None:
    """Wait for all work on this thread's stream (a no-op on threads without one)."""
    s = getattr(_local, "stream", None)
    if s is not None:
        s.synchronize()


def settle(stream: cupy.cuda.Stream) -> None:
    """Wait for everything queued on ``stream``, on a path that is already raising (its own errors are dropped).

    A batch that fails after its host-to-device copy (or a kernel, or nvCOMP)
    was queued must not hand its pinned staging buffer back to the shared pool
    (:func:`pinned_staging`), nor its device buffers, while that
    work may still read or write them: the next block, on any thread, may be
    given the same pinned buffer and refill it under the copy.
    """
    try:
        stream.synchronize()
    except Exception:  # noqa: BLE001 - a lost context: the error being raised says more
        pass


def pinned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised numpy array in pinned host memory (see :func:`pinned_staging`)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return pinned_staging(n).view(dtype).reshape(shape)

