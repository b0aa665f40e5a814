"""``jobqueue_cluster``: a dask-jobqueue cluster of GPU nodes (PBS or Slurm), one dask-cuda worker per GPU.

Each batch job asks for one node's worth of GPUs, cores and memory and runs
``python -m dask_cuda.cli`` (the ``dask cuda worker`` command), which starts
one worker process per GPU of the job with ``threads_per_gpu`` threads each,
RMM's stream-ordered pool behind CuPy, and device memory spilling.
Every worker preloads :mod:`gpuzarr_dist.distributed.preload`; the client's
``gpuzarr.*`` settings are exported as ``DASK_GPUZARR__*`` variables in the job
script. With ``device="cpu"`` the jobs run plain ``dask worker`` processes.

dask-jobqueue is imported when the function is called (``pip install dask-jobqueue``).
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from typing import Any

import dask
from dask.utils import parse_bytes

from gpuzarr_dist.distributed.cluster import DEFAULT_DEVICE_MEMORY_LIMIT, DEFAULT_THREADS_PER_GPU

SYSTEMS = ("slurm", "pbs")
PRELOAD = "gpuzarr_dist.distributed.preload"
DASK_CUDA_WORKER = "dask_cuda.cli"


def config_exports(config: dict | None = None, prefix: str = "DASK_GPUZARR") -> list[str]:
    """``export DASK_GPUZARR__...=value`` lines for the set ``gpuzarr.*`` values (None values left out)."""
    config = dask.config.get("gpuzarr", {}) if config is None else config
    lines = []
    for key, value in sorted(config.items()):
        name = f"{prefix}__{key.upper().replace('-', '_')}"
        if isinstance(value, dict):
            lines += config_exports(value, name)
        elif value is not None:
            lines.append(f"export {name}={shlex.quote(str(value))}")
    return lines


def _gb(memory: str | int) -> int:
    return max(1, int(parse_bytes(memory) // 10**9)) if isinstance(memory, str) else max(1, int(memory) // 10**9)


def jobqueue_options(
    system: str = "slurm",
    *,
    gpus_per_node: int = 4,
    cores: int = 64,
    memory: str = "480GB",
    walltime: str = "01:00:00",
    account: str | None = None,
    queue: str | None = None,
    setup: Sequence[str] = (),
    threads_per_gpu: int | None = None,
    device: str = "gpu",
    device_memory_limit: Any = DEFAULT_DEVICE_MEMORY_LIMIT,
    rmm: bool = True,
    python: str | None = None,
    job_extra: Sequence[str] = (),
    **kwargs: Any,
) -> dict:
    """The keyword arguments :func:`jobqueue_cluster` gives ``SLURMCluster`` / ``PBSCluster``."""
    if system not in SYSTEMS:
        raise ValueError(f"system must be one of {SYSTEMS}, got {system!r}")
    if device not in ("gpu", "cpu"):
        raise ValueError(f"device must be 'gpu' or 'cpu' for batch jobs, got {device!r}")
    for name, n in (("gpus_per_node", gpus_per_node), ("cores", cores)):
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be a whole number of at least 1, got {n!r}")
    gpus = gpus_per_node if device == "gpu" else 0
    prologue = [*setup, *config_exports()]
    extra_directives = list(job_extra)
    opts: dict[str, Any] = {
        "cores": cores,
        "memory": memory,
        "walltime": walltime,
        "python": python or sys.executable,
        "job_script_prologue": prologue,
    }
    if account:
        opts["account"] = account
    if queue:
        opts["queue"] = queue
    worker_args = ["--preload", PRELOAD]
    if device == "gpu":
        threads = threads_per_gpu or DEFAULT_THREADS_PER_GPU
        per_gpu_memory = f"{_gb(memory) // gpus_per_node or 1}GB"
        opts["processes"] = 1  # dask-cuda starts the processes: one per GPU of the job
        opts["worker_command"] = DASK_CUDA_WORKER
        # jobqueue writes --nthreads/--memory-limit for the whole job; the later, per-GPU values win
        worker_args += ["--nthreads", str(threads), "--memory-limit", per_gpu_memory,
                        "--device-memory-limit", str(device_memory_limit)]
        if rmm:
            worker_args += ["--rmm-async", "--set-rmm-allocator-for-libs", "cupy"]
        if system == "slurm":
            extra_directives.append(f"--gres=gpu:{gpus}")
        else:
            opts["resource_spec"] = f"select=1:ncpus={cores}:ngpus={gpus}:mem={_gb(memory)}GB"
    else:
        threads = threads_per_gpu or min(4, cores)
        opts["processes"] = max(1, cores // threads)
        if system == "pbs":
            opts["resource_spec"] = f"select=1:ncpus={cores}:mem={_gb(memory)}GB"
    opts["worker_extra_args"] = worker_args
    if extra_directives:
        opts["job_extra_directives"] = extra_directives
    opts.update(kwargs)
    return opts


def jobqueue_cluster(system: str = "slurm", *, jobs: int = 0, **options: Any) -> Any:
    """A dask-jobqueue ``SLURMCluster`` or ``PBSCluster`` of GPU nodes, one dask-cuda worker per GPU.

    ``system``: ``"slurm"`` or ``"pbs"``. Node shape: ``gpus_per_node`` (4),
    ``cores`` (64) and ``memory`` ("480GB") per job, as on NCAR's Derecho;
    ``walltime``, ``account``, ``queue``; ``setup``: shell lines run before the
    worker starts (``module load ...``, ``conda activate ...``);
    ``threads_per_gpu`` (8); ``device="cpu"`` for CPU nodes; ``job_extra``:
    more ``#SBATCH``/``#PBS`` directives. Other keywords go to dask-jobqueue.
    ``jobs``: submit that many jobs now (else call ``cluster.scale(jobs=N)``).

    Connect with ``gz.start_cluster(address=cluster.scheduler_address)`` or
    ``distributed.Client(cluster)``; print ``cluster.job_script()`` to see the job.
    """
    try:
        import dask_jobqueue
    except ImportError as e:
        raise ImportError(f"jobqueue_cluster needs dask-jobqueue ({e}): pip install dask-jobqueue") from e
    opts = jobqueue_options(system, **options)
    cls = dask_jobqueue.SLURMCluster if system == "slurm" else dask_jobqueue.PBSCluster
    cluster = cls(**opts)
    if jobs:
        cluster.scale(jobs=jobs)
    return cluster
