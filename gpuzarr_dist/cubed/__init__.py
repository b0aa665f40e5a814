"""gpuzarr-dist's Cubed variant: bounded-memory plans whose tasks read, decode and compute on the GPU.

```python
import gpuzarr_dist.cubed as gc           # does not import cubed

spec = gc.spec("4 GB", work_dir="/scratch/tmp")   # per-task GPU memory; sets cubed's backend to cupy
x = gc.from_zarr_gpu("era5.zarr", "t2m", spec=spec)  # a cubed.Array read through nvCOMP batches
anomaly = x - x.mean(axis=0)
gc.to_zarr(anomaly, "anomaly.zarr", callbacks=[gc.progress_bar()])   # chunks that batch-encode

```

Cubed reads its array backend from ``CUBED_BACKEND_ARRAY_API_MODULE`` once,
at import: call :func:`spec` (or :func:`use_backend`) before anything imports
cubed. Importing this package does not import cubed; the executors and the
progress bar are loaded on first use, after the backend is set for ``"auto"``.
Where cubed is not installed, importing this package raises
:class:`~gpuzarr_dist.errors.MissingDependencyError` (an ``ImportError``)
saying how to install the ``cubed`` extra.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from gpuzarr_dist.cubed.backend import CubedBackendError, use_backend, worker_environ
from gpuzarr_dist.cubed.memory import default_reserved_mem
from gpuzarr_dist.cubed.output import to_zarr
from gpuzarr_dist.cubed.reader import MemoryBudgetError, from_zarr_gpu
from gpuzarr_dist.cubed.spec import spec
from gpuzarr_dist.errors import MissingDependencyError, extra_hint


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported, found without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


if not _installed("cubed"):
    raise MissingDependencyError(
        f"gpuzarr_dist.cubed needs cubed, which is not installed: {extra_hint('cubed')} "
        "(cubed 0.27 on Python 3.11; 0.28 needs Python 3.12)",
        name="cubed", extra="cubed",
    )


_LAZY = {
    "ThreadsExecutor": "executor",
    "DistributedExecutor": "executor",
    "progress_bar": "progress",
    "TextProgress": "progress",
    "OpTimings": "timing",
    "optimize_dag": "fusion",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    import sys

    if "cubed" not in sys.modules:  # these modules import cubed: choose its backend first
        from gpuzarr_dist.cubed.spec import choose_device

        use_backend(choose_device("auto"))
    return getattr(importlib.import_module(f"{__name__}.{mod}"), name)


__all__ = [
    "CubedBackendError",
    "DistributedExecutor",
    "MemoryBudgetError",
    "OpTimings",
    "TextProgress",
    "ThreadsExecutor",
    "default_reserved_mem",
    "from_zarr_gpu",
    "optimize_dag",
    "progress_bar",
    "spec",
    "to_zarr",
    "use_backend",
    "worker_environ",
]
