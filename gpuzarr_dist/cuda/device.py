"""Which device a read runs on: ``"cpu"`` or ``"gpu"``, and whether a GPU is usable.

The check imports cupy and nvCOMP only when asked, never at import time, so the
package imports on machines without CUDA and the scheduler never needs a GPU.
"""

from __future__ import annotations

import functools
import importlib.util

from gpuzarr_dist.errors import DeviceUnavailableError

DEVICES = ("auto", "gpu", "cpu")


@functools.lru_cache(maxsize=1)
def gpu_status() -> tuple[bool, str]:
    """``(usable, reason)``: whether cupy, nvCOMP and a CUDA device are all there."""
    for mod, pkg in (("cupy", "cupy-cuda13x"), ("nvidia.nvcomp", "nvidia-nvcomp-cu13")):
        try:
            if importlib.util.find_spec(mod) is None:
                return False, f"{mod} is not installed (pip install 'gpuzarr-dist[gpu]' or {pkg})"
        except (ImportError, ValueError):
            return False, f"{mod} is not installed (pip install 'gpuzarr-dist[gpu]' or {pkg})"
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


@functools.lru_cache(maxsize=None)
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
