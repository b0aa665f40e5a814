"""Stream hygiene for GPU graphs: every task synchronises its thread's CUDA stream before returning.

On the GPU each worker thread reads, decodes and runs the user's kernels on its
own CUDA stream (:mod:`gpuzarr_dist.cuda.streams`). A task's result may be
consumed by a task on another thread, i.e. on another stream, so each task must
finish its stream's work before it hands the result on. Dask gives no per-task
hook on the worker thread, so the array optimisation step does it: after
dask's own optimisation (blockwise fusion, culling, slice fusion, unchanged),
each task of a graph that reads GPU arrays is wrapped so that it synchronises
the stream of the thread that ran it. Tasks on threads that never touched the
GPU pay one dictionary lookup.

Installed as dask's ``array_optimize`` the first time a GPU array is made,
unless the user has set their own.
"""

from __future__ import annotations

import sys
from typing import Any

import dask
from dask._task_spec import Task
from dask.array.optimization import optimize as dask_optimize

GPU_LAYER_PREFIX = "from-zarr-gpu-cuda-"


def _then_sync(value: Any) -> Any:
    cuda = sys.modules.get("gpuzarr_dist.cuda.streams")
    if cuda is not None:
        cuda.sync_thread_stream()
    return value


def _reads_gpu(dsk: Any) -> bool:
    layers = getattr(dsk, "layers", None)
    names = layers.keys() if layers is not None else ()
    return any(str(n).startswith(GPU_LAYER_PREFIX) for n in names)


def optimize(dsk: Any, keys: Any, **kwargs: Any) -> Any:
    """dask's array optimisation, then a stream synchronisation at the end of every task of GPU graphs."""
    gpu = _reads_gpu(dsk)
    out = dask_optimize(dsk, keys, **kwargs)
    if not gpu:
        return out
    out = dict(out)
    for k, node in out.items():
        if isinstance(node, Task):
            out[k] = Task(k, _then_sync, node)
    return out


def install() -> None:
    """Make :func:`optimize` dask's array optimisation, unless something else is configured."""
    if dask.config.get("array_optimize", None) is None:
        dask.config.set({"array_optimize": optimize})
