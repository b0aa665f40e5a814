"""Graph optimisation for arrays read by ``from_zarr_gpu``: stream hygiene and block placement hints.

**Stream hygiene.** On the GPU each worker thread reads, decodes and runs the
user's kernels on its own CUDA stream (:mod:`gpuzarr_dist.cuda.streams`). A
task's result may be consumed by a task on another thread, i.e. on another
stream, so each task must finish its stream's work before it hands the result
on. Dask gives no per-task hook on the worker thread, so the array
optimisation step does it: after dask's own optimisation (blockwise fusion,
culling, slice fusion, unchanged), each task of a graph that reads GPU arrays
is wrapped so that it synchronises the stream of the thread that ran it.
Tasks on threads that never touched the GPU pay one dictionary lookup.

**Placement hints.** Every task that depends on nothing in a graph that reads
``from_zarr_gpu`` arrays (on either device) gets the annotation
:data:`PLACE_ANNOTATION`: ``(position, count)`` of its block among the
blocks of its layer, in block order. On a cluster started by
:func:`gpuzarr_dist.start_cluster`, the scheduler plugin
:class:`gpuzarr_dist.distributed.placement.BlockPlacement` turns it into a
loose worker restriction: consecutive blocks go to the same worker, in equal
shares, so that a reduction's partial results are combined where they were
made and cross workers only near the top of the tree. Without that plugin the
annotation is ignored.

Installed as dask's ``array_optimize`` the first time a ``from_zarr_gpu``
array is made, unless the user has set their own. Dask runs it where the graph
is materialised: on the distributed scheduler, or in the calling process.
"""

from __future__ import annotations

import bisect
import itertools
import sys
from collections import defaultdict
from typing import Any

import dask
from dask._task_spec import Task
from dask.array.optimization import optimize as dask_optimize
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

from gpuzarr_dist.config import cluster_placement

GPU_LAYER_PREFIX = "from-zarr-gpu-cuda-"
CPU_LAYER_PREFIX = "from-zarr-gpu-cpu-"
#: the annotation that carries a root task's ``(position, count)`` among its layer's blocks
PLACE_ANNOTATION = "gpuzarr-place"


def _then_sync(value: Any) -> Any:
    cuda = sys.modules.get("gpuzarr_dist.cuda.streams")
    if cuda is not None:
        cuda.sync_thread_stream()
    return value


def _layer_names(dsk: Any) -> list[str]:
    layers = getattr(dsk, "layers", None)
    return [str(n) for n in (layers.keys() if layers is not None else ())]


def _reads(dsk: Any) -> tuple[bool, bool]:
    """``(reads GPU arrays, reads from_zarr_gpu arrays on any device)``."""
    names = _layer_names(dsk)
    gpu = any(n.startswith(GPU_LAYER_PREFIX) for n in names)
    return gpu, gpu or any(n.startswith(CPU_LAYER_PREFIX) for n in names)


def _block_order(key: Any) -> tuple:
    return tuple(key[1:]) if isinstance(key, tuple) else ()


def placement_hints(dsk: dict) -> dict:
    """``{key: (position, count)}`` for the tasks of ``dsk`` that depend on nothing (reads and what is fused into them).

    Grouped by key name (the layer), ordered by block index: block ``i`` of
    two arrays of the same chunking get the same hint, so they are placed
    together.
    """
    by_name: dict[str, list] = defaultdict(list)
    for k, node in dsk.items():
        deps = getattr(node, "dependencies", None)
        if deps is None or deps:  # data already on the workers (persisted, scattered) is placed where it is
            continue
        name = k[0] if isinstance(k, tuple) else k
        by_name[str(name)].append(k)
    hints = {}
    for keys in by_name.values():
        if len(keys) < 2:
            continue
        keys.sort(key=_block_order)
        n = len(keys)
        for i, k in enumerate(keys):
            hints[k] = (i, n)
    return hints


def worker_for(position: int, count: int, bounds: list[float], workers: list[str]) -> str:
    """The worker of block ``position`` of ``count``: ``bounds`` are the workers' cumulative thread shares."""
    return workers[min(bisect.bisect_right(bounds, (position + 0.5) / count), len(workers) - 1)]


def thread_shares(nthreads: dict[str, int]) -> tuple[list[str], list[float]]:
    """Workers in address order and the upper bound of each one's share of the blocks (cumulative, ends at 1)."""
    workers = sorted(nthreads)
    total = sum(max(1, nthreads[w]) for w in workers)
    bounds = [c / total for c in itertools.accumulate(max(1, nthreads[w]) for w in workers)]
    return workers, bounds


def optimize(dsk: Any, keys: Any, **kwargs: Any) -> Any:
    """dask's array optimisation; for graphs that read ``from_zarr_gpu`` arrays, placement hints, and on the
    GPU a stream synchronisation at the end of every task."""
    gpu, ours = _reads(dsk)
    out = dask_optimize(dsk, keys, **kwargs)
    if not ours:
        return out
    out = dict(out)
    if gpu:
        for k, node in out.items():
            if isinstance(node, Task):
                out[k] = Task(k, _then_sync, node)
    hints = placement_hints(out) if cluster_placement() else {}
    if not hints:
        return out
    roots = {k: out.pop(k) for k in hints}
    name = "gpuzarr-blocks"
    layers = {
        name: MaterializedLayer(roots, annotations={PLACE_ANNOTATION: hints.__getitem__}),
        name + "-rest": MaterializedLayer(out),
    }
    return HighLevelGraph(layers, {name: set(), name + "-rest": {name}})


def install() -> None:
    """Make :func:`optimize` dask's array optimisation, unless something else is configured."""
    if dask.config.get("array_optimize", None) is None:
        dask.config.set({"array_optimize": optimize})
