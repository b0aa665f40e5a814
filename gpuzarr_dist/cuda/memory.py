"""Recognising GPU out-of-memory errors and turning them into advice the user can act on.

Importable without a GPU: errors are recognised by name and message, not by
importing cupy or nvCOMP.
"""

from __future__ import annotations

import math
import sys

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
