"""Cubed's array backend: numpy on the CPU, cupy (through array-api-compat) on the GPU.

Cubed reads the environment variable ``CUBED_BACKEND_ARRAY_API_MODULE`` once,
when ``cubed`` is first imported (``cubed/backend_array_api.py``), and keeps
that namespace for the life of the process. So the backend has to be chosen
before anything imports cubed: :func:`use_backend` sets the variable in this
process, :func:`worker_environ` / :class:`BackendPlugin` hand it to dask
worker processes, and :func:`check_backend` says clearly, with what to do,
when cubed is already loaded with another backend (too late to change it).

Importing this module imports neither cubed nor cupy.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

from gpuzarr_dist.errors import GpuZarrError

ENV = "CUBED_BACKEND_ARRAY_API_MODULE"
CUPY = "array_api_compat.cupy"
NUMPY = "numpy"


class CubedBackendError(GpuZarrError, RuntimeError):
    """Cubed was imported with an array backend other than the device needs; it cannot change in this process."""


def wanted(device: str) -> str:
    """The backend module name the device needs: ``array_api_compat.cupy`` on the GPU, ``numpy`` on the CPU."""
    if device not in ("cpu", "gpu"):
        raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
    return CUPY if device == "gpu" else NUMPY


def _same(a: str, b: str) -> bool:
    norm = {"numpy": NUMPY, "array_api_compat.numpy": NUMPY, "cupy": CUPY, CUPY: CUPY}
    return norm.get(a, a) == norm.get(b, b)


def loaded() -> str | None:
    """The backend cubed was imported with in this process, or ``None`` when cubed is not imported yet."""
    mod = sys.modules.get("cubed.backend_array_api")
    if mod is None:
        return None
    return str(getattr(mod, "xp_name", NUMPY))


def _too_late(have: str, want: str, where: str) -> CubedBackendError:
    return CubedBackendError(
        f"cubed was already imported{where} with array backend {have!r}, but this device needs {want!r}. "
        f"Cubed reads {ENV} once, at import, so it cannot change in this process. Call "
        f"gpuzarr_dist.cubed.use_backend(...) (or set {ENV}={want}) before anything imports cubed, "
        "or restart the Python process / kernel."
    )


def check_backend(device: str, where: str = "") -> None:
    """Raise :class:`CubedBackendError` when cubed is loaded here with a backend the device cannot use."""
    have = loaded()
    want = wanted(device)
    if have is not None and not _same(have, want):
        raise _too_late(have, want, where)


def use_backend(device: str) -> str:
    """Make cubed use the backend ``device`` needs in this process; returns the module name.

    Before cubed is imported this sets ``CUBED_BACKEND_ARRAY_API_MODULE`` (for
    the GPU) or removes a cupy setting (for the CPU). After cubed is imported
    it only checks, raising :class:`CubedBackendError` when it is too late.
    """
    want = wanted(device)
    have = loaded()
    if have is not None:
        check_backend(device)
        return want
    current = os.environ.get(ENV)
    if current is not None and not _same(current, want):
        warnings.warn(f"{ENV} was {current!r}; set to {want!r} for device={device!r}", RuntimeWarning, stacklevel=2)
    if want == NUMPY:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = want
    return want


def worker_environ(device: str) -> dict[str, str]:
    """Environment variables a worker process needs before it imports cubed.

    Give them to ``distributed.nanny.pre-spawn-environ`` (dask config) or to a
    cluster's ``env=`` so that worker processes start with the right backend.
    """
    want = wanted(device)
    return {ENV: want} if want != NUMPY else {}


def worker_check(device: str) -> str | None:
    """Run in a worker: set the backend if cubed is not imported there yet; a message when it is too late."""
    try:
        use_backend(device)
    except CubedBackendError as e:
        return str(e)
    return None


try:  # a worker plugin when distributed is there (it is a base dependency; kept optional for clarity)
    from distributed.diagnostics.plugin import WorkerPlugin as _WorkerPlugin
except ImportError:  # pragma: no cover
    _WorkerPlugin = object  # type: ignore[assignment,misc]


class BackendPlugin(_WorkerPlugin):  # type: ignore[misc]
    """A dask worker plugin that sets cubed's backend in each worker (and each restarted worker) at start-up.

    It runs before the worker takes tasks, so before a task's unpickling imports
    cubed. A worker where cubed was already imported with another backend keeps
    it; :meth:`DistributedExecutor <gpuzarr_dist.cubed.executor.DistributedExecutor>`
    asks each worker and raises naming it.
    """

    name = "gpuzarr-cubed-backend"

    def __init__(self, device: str):
        self.device = device
        self.problem: str | None = None

    def setup(self, worker: Any) -> None:
        self.problem = worker_check(self.device)
