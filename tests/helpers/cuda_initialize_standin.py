"""A worker preload standing in for ``dask_cuda.initialize``, which dask-cuda's ``LocalCUDACluster`` adds after the
preloads it is given: it creates the worker's CUDA context and warns when one exists already. This stand-in notes
whether gpuzarr-dist's worker set-up (which touches the GPU) ran before it."""

from __future__ import annotations

from typing import Any

SETUP_PLUGIN = "gpuzarr-setup"


def dask_setup(worker: Any) -> None:
    worker.gpuzarr_setup_before_cuda_init = SETUP_PLUGIN in worker.plugins
