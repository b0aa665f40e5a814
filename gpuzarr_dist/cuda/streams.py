"""Per-thread CUDA resources: a stream for each worker thread; pinned staging buffers from a shared pool.

Each thread that reads on the GPU gets, on first use, its own non-blocking
CuPy stream, made the thread's current stream so that the user's fused
kernels run on it too, and kept for the life of the process (so no work, and
no nvCOMP codec bound to it, ever outlives its stream). Our code switches
streams with :func:`on_stream`, never ``with stream:`` (which would leave the
thread on the legacy null stream afterwards: see there). Large temporaries come
from CuPy's device memory pool and our pinned staging pool (:mod:`.pinned`),
not fresh allocations per chunk.

Only imported on the GPU path: importing it imports cupy.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import cupy
import numpy as np

from gpuzarr_dist.config import SYNC_WAITS, gpu_sync_wait
from gpuzarr_dist.cuda.pinned import PinnedPool
from gpuzarr_dist.errors import GpuZarrError

_local = threading.local()
_keep: list = []  # streams live as long as the process: never destroyed under pending work
_keep_lock = threading.Lock()

ALIGN = 256  # nvCOMP needs aligned sub-buffers; 256 bytes matches cudaMalloc's alignment


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def thread_stream() -> cupy.cuda.Stream:
    """This thread's CUDA stream, created once and made current for CuPy in this thread.

    Also applies ``gpuzarr.gpu.sync-wait`` to the current GPU when it changed (:func:`apply_sync_wait`).
    """
    s = _kept_stream("stream")
    if cupy.cuda.get_current_stream() is not s:
        s.use()
    apply_sync_wait()  # after the stream: the GPU's context is current in this thread by now
    return s


@contextmanager
def on_stream(stream: cupy.cuda.Stream) -> Iterator[cupy.cuda.Stream]:
    """Make ``stream`` CuPy's current stream for the ``with`` block, then make current again the stream that was.

    Used instead of ``with stream:``. CuPy's own context manager restores, on
    exit, the top of a stack that only ``with`` pushes; :func:`thread_stream`
    makes a thread's stream current with ``Stream.use()``, which does not push.
    So a ``with stream:`` would leave the thread on the legacy null stream:
    the block's placement kernel and the user's computation would then run
    there, outside the stream the read synchronises, and memory the null
    stream still read would go back to the thread stream's pool (wrong tiles
    when the read's block is allocated after its decode).
    """
    prev = cupy.cuda.get_current_stream()
    if prev is stream:
        yield stream
        return
    stream.use()
    try:
        yield stream
    finally:
        prev.use()


def thread_side_stream() -> cupy.cuda.Stream:
    """This thread's second CUDA stream, for work that runs beside the thread's own stream's (forked and
    joined with events by the caller); created once, kept for the life of the process like the first."""
    return _kept_stream("side")


def _kept_stream(name: str) -> cupy.cuda.Stream:
    """This thread's non-blocking stream ``name``, made on first use and kept for the life of the process."""
    s = getattr(_local, name, None)
    if s is None:
        s = cupy.cuda.Stream(non_blocking=True)
        setattr(_local, name, s)
        with _keep_lock:
            _keep.append(s)
    return s


_sync_applied: dict[int, str] = {}  # device id -> the gpuzarr.gpu.sync-wait value its context has
_SCHED_MASK = 0x7  # CU_CTX_SCHED_MASK: the scheduling bits of a context's flags


def apply_sync_wait() -> str:
    """Give the current GPU's context the wait of ``gpuzarr.gpu.sync-wait``; returns the value in force.

    A no-op while the setting is the one applied (a config lookup per call),
    and ``auto`` on a context this process never changed is left as CUDA made
    it: no driver call. Otherwise the scheduling bits of the primary context's
    flags are replaced (its other flags kept): for contexts made later
    (``cuDevicePrimaryCtxSetFlags``) and for the live one, current in this
    thread (``cuCtxSetFlags``, CUDA 12.1 and newer). A failing driver call
    raises :class:`~gpuzarr_dist.errors.GpuZarrError` with the call and its error.
    """
    mode = gpu_sync_wait()
    dev = cupy.cuda.Device().id
    if _sync_applied.get(dev, "auto") == mode:
        return mode
    with _keep_lock:
        if _sync_applied.get(dev, "auto") != mode:
            _set_sync_wait(dev, SYNC_WAITS[mode])
            _sync_applied[dev] = mode
    return mode


def _driver() -> ctypes.CDLL:
    lib = getattr(_driver, "lib", None)
    if lib is None:
        lib = _driver.lib = ctypes.CDLL("libcuda.so.1")  # type: ignore[attr-defined]
    return lib


def _check(rc: int, what: str, doing: str = "setting gpuzarr.gpu.sync-wait") -> None:
    if rc != 0:
        raise GpuZarrError(f"CUDA driver call {what} failed with error {rc} ({doing})")


def _set_sync_wait(dev: int, sched: int) -> None:
    lib = _driver()
    handle = ctypes.c_int()
    _check(lib.cuDeviceGet(ctypes.byref(handle), int(dev)), f"cuDeviceGet({dev})")
    flags, active = ctypes.c_uint(), ctypes.c_int()
    _check(lib.cuDevicePrimaryCtxGetState(handle, ctypes.byref(flags), ctypes.byref(active)),
           f"cuDevicePrimaryCtxGetState({dev})")
    new = (flags.value & ~_SCHED_MASK) | sched
    # the _v2 entry point (CUDA 11+) takes an active context's flags too; the first one refused them
    set_primary = getattr(lib, "cuDevicePrimaryCtxSetFlags_v2", None) or lib.cuDevicePrimaryCtxSetFlags
    _check(set_primary(handle, ctypes.c_uint(new)), f"cuDevicePrimaryCtxSetFlags({dev}, {new:#x})")
    current = ctypes.c_void_p()
    set_current = getattr(lib, "cuCtxSetFlags", None)
    if active.value and set_current is not None:
        _check(lib.cuCtxGetCurrent(ctypes.byref(current)), "cuCtxGetCurrent")
        if current.value:
            now = ctypes.c_uint()
            _check(lib.cuCtxGetFlags(ctypes.byref(now)), "cuCtxGetFlags")
            _check(set_current(ctypes.c_uint((now.value & ~_SCHED_MASK) | sched)), f"cuCtxSetFlags({sched:#x})")


def _memcpy_htod() -> ctypes._CFuncPtr:
    fn = getattr(_memcpy_htod, "fn", None)
    if fn is None:
        lib = _driver()
        fn = getattr(lib, "cuMemcpyHtoDAsync_v2", None) or lib.cuMemcpyHtoDAsync
        fn.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        fn.restype = ctypes.c_int
        _memcpy_htod.fn = fn  # type: ignore[attr-defined]
    return fn


def upload(host: np.ndarray, stream: cupy.cuda.Stream | None = None) -> cupy.ndarray:
    """A device copy of the small host array ``host`` (a table of offsets, sizes, shapes), queued on ``stream``
    (CuPy's current stream by default) behind the work already there.

    One driver call, ``cuMemcpyHtoDAsync`` through ctypes, which releases the GIL. From pageable memory
    it returns once ``host``'s bytes are staged for the copy, so ``host`` may be dropped at once.
    ``cupy.asarray`` went through CuPy's pinned pool, an event recorded per copy and a watch list of them,
    with the GIL held: under many threads reading object-store shards it is the largest single holder of
    the GIL, and every held moment delays the event loop that completes the object-store requests. Raises
    :class:`~gpuzarr_dist.errors.GpuZarrError` if the driver refuses the copy.
    """
    host = np.ascontiguousarray(host)
    stream = cupy.cuda.get_current_stream() if stream is None else stream
    with on_stream(stream):
        dev = cupy.empty(host.shape, dtype=host.dtype)
    if host.nbytes:
        _check(_memcpy_htod()(dev.data.ptr, host.ctypes.data, host.nbytes, stream.ptr), "cuMemcpyHtoDAsync",
               f"copying {host.nbytes} bytes of a table to the GPU")
    return dev


def context_sync_wait() -> str:
    """The wait the current GPU context has, read back from the driver (``auto``, ``spin``, ``yield``, ``blocking``)."""
    lib = _driver()
    now = ctypes.c_uint()
    _check(lib.cuCtxGetFlags(ctypes.byref(now)), "cuCtxGetFlags")
    bits = now.value & _SCHED_MASK
    return next((k for k, v in SYNC_WAITS.items() if v == bits), hex(bits))


def thread_nvcomp_codec(algorithm: str, stream: cupy.cuda.Stream) -> object:
    """This thread's nvCOMP codec for ``algorithm`` on ``stream`` (for decoding and encoding alike).

    Created in the thread that uses it (a codec created in another thread
    runs several times slower) and kept with the thread; the stream outlives
    it, since streams are kept for the life of the process (a stream
    destroyed before its codec crashes the process).
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


_staging: PinnedPool | None = None
_staging_lock = threading.Lock()


def staging_pool() -> PinnedPool:
    """The process's pool of pinned staging buffers (:mod:`.pinned`), pinning through CuPy's pinned pool."""
    global _staging
    if _staging is None:
        with _staging_lock:
            if _staging is None:
                _staging = PinnedPool(cupy.cuda.alloc_pinned_memory)
    return _staging


def pinned_staging(nbytes: int) -> np.ndarray:
    """A pinned host buffer of at least ``nbytes`` as a uint8 array, from the process's staging pool.

    Any free buffer that holds the request (and is not far larger) is reused,
    on any thread, whatever size it was pinned for (:class:`.pinned.PinnedPool`);
    the memory goes back to the pool when the array and every view of it are
    garbage collected. The caller synchronises its stream before dropping the
    array (no copy may still read it).
    """
    return staging_pool().take(nbytes)


def reserve_staging(count: int, nbytes: int) -> int:
    """Pin ``count`` staging buffers of ``nbytes`` ahead of the reads that will take them (see
    :meth:`.pinned.PinnedPool.reserve`); the bytes newly pinned."""
    return staging_pool().reserve(count, nbytes)


def reserve_device_memory(nbytes: int) -> None:
    """Grow the device memory pool by ``nbytes`` for this thread's stream, ahead of the reads that allocate it.

    CuPy's pool keeps freed memory per stream and splits a free chunk to serve
    smaller requests: a block's allocations on this thread then come from the
    pool instead of ``cudaMalloc`` inside the task.
    """
    thread_stream()
    buf = cupy.empty(int(nbytes), dtype=cupy.uint8)
    del buf


def sync_thread_stream() -> None:
    """Wait for all work on this thread's stream, and on CuPy's current stream where that is another one.

    A task on a thread that never read (a tree reduction's combine, say) ran
    its kernels on the current stream, the legacy null stream unless the
    caller chose one; its result may go to another thread, whose own stream
    is not ordered with that one.
    """
    s = getattr(_local, "stream", None)
    if s is not None:
        s.synchronize()
    current = cupy.cuda.get_current_stream()
    if current is not s:
        current.synchronize()


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

