"""A dask worker preload that sets the worker up for gpuzarr-dist as it starts.

Used by the worker command lines :mod:`gpuzarr_dist.distributed.jobqueue` writes
(``--preload gpuzarr_dist.distributed.preload``), so workers that a batch system
starts, or that a nanny restarts, share one device pool from their first task
without a client having to register anything. The ``gpuzarr.*`` settings
reach such workers through ``DASK_GPUZARR__*`` environment variables in the job
script. The device is decided in each worker (a GPU when one is usable).
"""

from __future__ import annotations

from typing import Any

from gpuzarr_dist.distributed.cluster import PLUGIN_NAME, WorkerSetup


async def dask_setup(worker: Any) -> None:
    await worker.plugin_add(WorkerSetup(None, "auto"), name=PLUGIN_NAME)
