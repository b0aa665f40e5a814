"""Which device a read runs on: ``"cpu"`` or ``"gpu"``, whether a GPU is usable, and the few device calls
the layers above the seam need (device count and memory, the current device, an array's module).

The check imports cupy and nvCOMP only when asked, never at import time, so the
package imports on machines without CUDA and the scheduler never needs a GPU.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

import numpy as np

from gpuzarr_dist.core.layout import host_memory_available
from gpuzarr_dist.errors import GPU_INSTALL_HINT, DeviceUnavailableError

DEVICES = ("auto", "gpu", "cpu")


@functools.lru_cache(maxsize=1)
def gpu_status() -> tuple[bool, str]:
    """``(usable, reason)``: whether cupy, nvCOMP and a CUDA device are all there."""
    for mod in ("cupy", "nvidia.nvcomp"):
        try:
            if importlib.util.find_spec(mod) is None:
                return False, f"{mod} is not installed ({GPU_INSTALL_HINT})"
        except (ImportError, ValueError):
            return False, f"{mod} is not installed ({GPU_INSTALL_HINT})"
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver, no device, or a broken CUDA install
        return False, f"no usable CUDA device ({type(e).__name__}: {e})"
    if n < 1:
        return False, "no CUDA device is visible"
    return True, f"{n} CUDA device(s)"


def gpu_available() -> bool:
    return gpu_status()[0]


def gpu_memory_bytes() -> int:
    """Total memory of this process's current CUDA device in bytes, or 0 where no GPU is usable.

    Reads the device's properties (no context, no allocation), so the client
    that builds a graph can size GPU blocks without holding GPU memory.
    """
    if not gpu_status()[0]:
        return 0
    import cupy

    return _total_memory(cupy.cuda.runtime.getDevice())


@functools.cache
def _total_memory(device: int) -> int:
    """Device ``device``'s total memory (asked once: reading every property took about 2 ms per graph built)."""
    import cupy

    return int(cupy.cuda.runtime.getDeviceProperties(device)["totalGlobalMem"])


def resolve_device(device: str) -> str:
    """Turn ``"auto"``/``"gpu"``/``"cpu"`` into ``"gpu"`` or ``"cpu"``.

    ``"gpu"`` without a usable GPU raises :class:`DeviceUnavailableError` saying why.
    """
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    if device == "cpu":
        return "cpu"
    ok, why = gpu_status()
    if device == "auto":
        return "gpu" if ok else "cpu"
    if not ok:
        raise DeviceUnavailableError(f"device='gpu' was asked for, but {why}. Use device='cpu' or 'auto'.")
    return "gpu"


# --------------------------------------------------------------------------- for the layers above the seam
# (each imports cupy only when called, and only on a path that has chosen the GPU)


def array_module(block: Any) -> Any:
    """numpy, or cupy for a cupy block (already imported then: the block came from it)."""
    if type(block).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def device_empty(shape: tuple[int, ...], dtype: Any) -> Any:
    """An uninitialised cupy array of ``shape`` on the current device (e.g. a dask ``meta`` of shape ``(0, ...)``)."""
    import cupy

    return cupy.empty(shape, dtype=dtype)


def device_count() -> int:
    """The number of CUDA devices this process sees (raises where CUDA is not usable)."""
    import cupy

    return int(cupy.cuda.runtime.getDeviceCount())


def device_memory_info(device: int | None = None) -> tuple[int, int]:
    """``(free, total)`` bytes of memory of CUDA device ``device`` (the current device where ``None``)."""
    import cupy

    if device is None:
        free, total = cupy.cuda.runtime.memGetInfo()
    else:
        with cupy.cuda.Device(device):
            free, total = cupy.cuda.runtime.memGetInfo()
    return int(free), int(total)


def use_device(device: int) -> None:
    """Make CUDA device ``device`` the calling thread's current device."""
    import cupy

    cupy.cuda.Device(device).use()


def share_device_pool() -> str:
    """Make CuPy allocate from RMM's current memory resource in this process (CuPy's own pool without rmm).

    Returns a short description of the allocator now in use. nvCOMP keeps its
    own allocator: routing its workspace through CuPy's pool gains no decode
    speed, grows the pool to 60-90 GiB, and crashes the process at exit
    (nvCOMP freeing pool memory during interpreter shutdown).
    """
    import cupy

    try:
        from rmm.allocators.cupy import rmm_cupy_allocator
    except ImportError:
        return "CuPy's memory pool (rmm is not installed)"
    cupy.cuda.set_allocator(rmm_cupy_allocator)
    return "RMM"


def block_memory(device: str) -> tuple[int, str] | None:
    """``(bytes, what)``: the memory a block read on ``device`` must fit in, for
    :func:`gpuzarr_dist.core.selection.plan_selection`; ``None`` where it is not known.

    ``"cpu"``: the host memory available now (:func:`gpuzarr_dist.core.layout.host_memory_available`);
    ``"gpu"``: the GPU's total memory (:func:`gpu_memory_bytes`, which reads the
    device's properties, no context). A block larger than that cannot be read however the work is spread.
    """
    if device == "gpu":
        total = gpu_memory_bytes()
        return (total, "the GPU's memory") if total else None
    return host_memory_available(), "the host's available memory"
