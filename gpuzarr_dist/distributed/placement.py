"""``BlockPlacement``: the scheduler plugin that keeps consecutive blocks of an array on one worker.

:func:`gpuzarr_dist.array.optimize.optimize` marks the first tasks of a graph
that reads ``from_zarr_gpu`` arrays with ``(position, count)``
(:data:`~gpuzarr_dist.array.optimize.PLACE_ANNOTATION`). When such a graph
reaches the scheduler, this plugin gives each marked task a loose restriction
to one worker: the workers, in address order, take consecutive runs of
blocks in proportion to their threads. The tasks run where they are placed
unless work stealing moves them to an idle worker (a loose restriction allows
it). Tasks that already carry restrictions (``workers=``, resources) are left
alone.

Why: dask's tree reductions combine consecutive blocks. With blocks spread
over the workers as they free up, nearly every combine step pulls partial
results from other workers; with consecutive runs per worker, only the steps
that straddle two runs do.
"""

from __future__ import annotations

from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from gpuzarr_dist.array.optimize import PLACE_ANNOTATION, thread_shares, worker_for

PLUGIN_NAME = "gpuzarr-placement"


class BlockPlacement(SchedulerPlugin):
    """Turn ``gpuzarr-place`` annotations into loose worker restrictions (see the module)."""

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self) -> None:
        self.placed = 0  # tasks given a worker so far (for tests and diagnostics)

    def update_graph(self, scheduler: Any, *, annotations: dict | None = None, **kwargs: Any) -> None:
        hints = (annotations or {}).get(PLACE_ANNOTATION)
        if not hints:
            return
        running = {addr: ws.nthreads for addr, ws in scheduler.workers.items()
                   if getattr(getattr(ws, "status", None), "name", "running") == "running"}
        if len(running) < 2:
            return
        workers, bounds = thread_shares(running)
        for key, hint in hints.items():
            ts = scheduler.tasks.get(key)
            if ts is None or ts.state not in ("released", "waiting") or ts.worker_restrictions \
                    or ts.host_restrictions or ts.resource_restrictions:
                continue
            position, count = hint
            ts.worker_restrictions = {worker_for(position, count, bounds, workers)}
            ts.loose_restrictions = True
            self.placed += 1
