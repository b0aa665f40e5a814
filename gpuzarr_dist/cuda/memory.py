"""Recognising GPU out-of-memory errors and turning them into advice the user can act on; CuPy's memory pool.

Importable without a GPU: errors are recognised by name and message, not by
importing cupy or nvCOMP; the pool's functions import cupy only when called.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from gpuzarr_dist.errors import GpuOutOfMemoryError

_OOM_TEXT = ("out of memory", "cudaerrormemoryallocation", "cuda_error_out_of_memory", "failed to allocate")


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is a device allocation failure (cupy's ``OutOfMemoryError``, or nvCOMP/CUDA saying so)."""
    if isinstance(error, GpuOutOfMemoryError):
        return True
    if any(t.__name__ == "OutOfMemoryError" for t in type(error).__mro__):
        return True
    return isinstance(error, (MemoryError, RuntimeError)) and any(t in str(error).lower() for t in _OOM_TEXT)


def release_cached_device_memory() -> int:
    """Hand the blocks CuPy's default pool keeps cached (free, but held) back to CUDA; the bytes released.

    nvCOMP allocates its scratch outside that pool, so a pool grown by earlier
    blocks of other sizes can leave too little for it although little is in
    use, as after reading one array in blocks of 64, 128 and 200 chunks one
    after the other. Only blocks no array uses are released.
    """
    cupy = sys.modules.get("cupy")
    if cupy is None:  # never imported in this process: no pool to release
        return 0
    pool = cupy.get_default_memory_pool()
    before = pool.total_bytes()
    pool.free_all_blocks()
    return before - pool.total_bytes()


def out_of_memory_error(array: str, shape: tuple[int, ...], dtype: np.dtype, n_chunks: int,
                        error: BaseException) -> GpuOutOfMemoryError:
    """The error to raise for an out-of-memory ``error`` while reading a block of ``shape``."""
    from dask.utils import format_bytes

    from gpuzarr_dist import config
    from gpuzarr_dist.cuda.device import gpu_memory_bytes

    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    setting = format_bytes(config.block_size_bytes("gpu", gpu_memory_bytes))
    return GpuOutOfMemoryError(
        array,
        f"{array}: the GPU ran out of memory reading a block of shape {tuple(shape)} "
        f"({format_bytes(nbytes)} decoded, {dtype}, {n_chunks} chunk(s); decoding needs about twice that on the "
        f"device, plus what other tasks on this GPU hold). Use smaller blocks: from_zarr_gpu(..., chunks=...) "
        f"or dask.config.set({{'gpuzarr.block-size.gpu': ...}}) (now {setting}), or fewer worker threads per GPU. "
        f"({type(error).__name__}: {error})",
    )


_hook_cls: Any = None


def _thread_peak_hook_class() -> Any:
    global _hook_cls
    if _hook_cls is None:
        from cupy.cuda import memory_hook

        class ThreadPeakHook(memory_hook.MemoryHook):
            """Counts what this thread takes from and gives back to CuPy's pool (hooks are thread-local)."""

            name = "gpuzarr-cubed-peak"

            def __init__(self) -> None:
                self.live: dict[int, int] = {}
                self.current = 0
                self.peak = 0

            def malloc_postprocess(self, device_id: int, size: int, mem_size: int, mem_ptr: int,
                                   pmem_id: int) -> None:
                self.live[mem_ptr] = mem_size
                self.current += mem_size
                if self.current > self.peak:
                    self.peak = self.current

            def free_postprocess(self, device_id: int, mem_size: int, mem_ptr: int, pmem_id: int) -> None:
                n = self.live.pop(mem_ptr, None)
                if n is not None:
                    self.current -= n

        _hook_cls = ThreadPeakHook
    return _hook_cls


def thread_peak_hook() -> Any:
    """A new CuPy memory hook: a context manager whose ``peak`` is the most bytes the entering thread held
    from CuPy's memory pool at once inside it (imports cupy)."""
    return _thread_peak_hook_class()()
