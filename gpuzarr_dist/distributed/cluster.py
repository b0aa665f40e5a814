"""``start_cluster``: a dask cluster set up for gpuzarr-dist, one worker per GPU (or a CPU cluster).

With GPUs it starts a dask-cuda ``LocalCUDACluster``: one worker process per
GPU, ``threads_per_gpu`` threads in each (every thread gets its own CUDA stream
the first time it reads, see :mod:`gpuzarr_dist.cuda.streams`), device memory
limits with spilling to host memory, and RMM's stream-ordered pool
(``cudaMallocAsync``) behind CuPy's allocator and nvCOMP's scratch space, so the
decoders and the user's kernels draw from one pool. Without GPUs (or with
``device="cpu"``) it starts a ``LocalCluster`` of worker processes with the
same arguments. With ``address=`` or ``scheduler_file=`` it connects to a
running cluster instead (one started by dask-jobqueue, ``dask cuda worker`` or
``gpuzarr-dist cluster``).

Every worker gets the :class:`WorkerSetup` plugin: the client's ``gpuzarr.*``
settings, and on GPU workers the shared pool. Environment variables for the
worker processes go through dask's ``distributed.nanny.pre-spawn-environ``
(dask-cuda sets each worker's own ``env`` to ``CUDA_VISIBLE_DEVICES`` alone).

Importing this module imports distributed but neither cupy nor dask-cuda.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

import dask
import distributed
from distributed.diagnostics.plugin import WorkerPlugin

from gpuzarr_dist.config import cluster_warm
from gpuzarr_dist.cuda.device import DEVICES, device_count, gpu_status, share_device_pool
from gpuzarr_dist.distributed.placement import BlockPlacement
from gpuzarr_dist.errors import GPU_INSTALL_HINT, DeviceUnavailableError

#: threads per GPU worker: the decode stage scales up to 8-16 threads, and each thread holds about 6 blocks
#: of device memory (1.5 GB with 256 MiB blocks, 5.6 GB with the ~890 MiB auto blocks of a 139 GiB GPU),
#: so 8 threads use 12-45 GB
DEFAULT_THREADS_PER_GPU = 8
#: fraction of each GPU's memory a worker may hold results in before it spills them to host memory
DEFAULT_DEVICE_MEMORY_LIMIT = 0.8
#: at most this many threads per CPU worker process by default (the rest become more processes)
DEFAULT_CPU_THREADS = 4
PLUGIN_NAME = "gpuzarr-setup"
#: jupyter-server-proxy's address of a port of the user's server, as dask-labextension expects it
JUPYTERHUB_DASHBOARD_LINK = "{JUPYTERHUB_SERVICE_PREFIX}proxy/{port}/status"
_DASK_DEFAULT_LINK = "{scheme}://{host}:{port}/status"


# -- the worker plugin ---------------------------------------------------------------


class WorkerSetup(WorkerPlugin):
    """Set every worker up for gpuzarr-dist: the client's ``gpuzarr.*`` config and, on GPUs, one pool.

    ``device``: ``"gpu"``, ``"cpu"`` or ``"auto"`` (decided in each worker by
    whether it has a usable GPU). ``share_pool``: route CuPy's and nvCOMP's
    allocations to RMM (:func:`share_device_pool`). ``warm``: on GPU
    workers, run :func:`gpuzarr_dist.distributed.warm.warm_dask_worker`
    before the worker takes tasks (default: ``gpuzarr.cluster.warm``).
    """

    name = PLUGIN_NAME
    idempotent = False

    def __init__(self, config: dict | None = None, device: str = "auto", share_pool: bool = True,
                 warm: bool | None = None):
        self.config = dict(config or {})
        self.device = device
        self.share_pool = share_pool
        self.warm = warm
        self.state: dict[str, Any] = {}

    def setup(self, worker: Any = None) -> Any:
        if self.config:
            dask.config.update(dask.config.config, {"gpuzarr": self.config}, priority="new")
        device = self.device
        if device == "auto":
            device = "gpu" if gpu_status()[0] else "cpu"
        self.state["device"] = device
        if device == "gpu" and self.share_pool:
            self.state["pool"] = share_device_pool()
        warm = cluster_warm() if self.warm is None else self.warm
        if device == "gpu" and warm and worker is not None:
            return self._warm(worker)  # a coroutine: the worker awaits it before it takes tasks
        return None

    async def _warm(self, worker: Any) -> None:
        from gpuzarr_dist.distributed.warm import warm_dask_worker

        self.state["warm"] = await warm_dask_worker(worker)


def worker_state(dask_worker: Any) -> dict[str, str]:
    """What :class:`WorkerSetup` did in this worker (for ``client.run``); empty without the plugin."""
    plugin = dask_worker.plugins.get(PLUGIN_NAME)
    return dict(getattr(plugin, "state", {}) or {})


# -- helpers ---------------------------------------------------------------------------


def configure_dashboard_link() -> str:
    """Under JupyterHub, point dask's dashboard links through jupyter-server-proxy; return the template.

    Only when ``JUPYTERHUB_SERVICE_PREFIX`` is set and the user has not set
    ``distributed.dashboard.link`` themselves.
    """
    link = dask.config.get("distributed.dashboard.link", _DASK_DEFAULT_LINK)
    if os.environ.get("JUPYTERHUB_SERVICE_PREFIX") and link == _DASK_DEFAULT_LINK:
        dask.config.set({"distributed.dashboard.link": JUPYTERHUB_DASHBOARD_LINK})
        return JUPYTERHUB_DASHBOARD_LINK
    return link


def _gpuzarr_config() -> dict:
    return dict(dask.config.get("gpuzarr", {}) or {})


def _gpu_devices() -> list[str]:
    """The CUDA devices this process may use, as ``CUDA_VISIBLE_DEVICES`` entries."""
    from gpuzarr_dist.distributed.gpus import visible_devices

    listed = visible_devices()
    if listed is not None:
        return listed
    return [str(i) for i in range(device_count())]


def _check_count(n: int | None, what: str, available: int | None = None) -> None:
    if n is None:
        return
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"{what} must be a whole number of at least 1, got {n!r}")
    if available is not None and n > available:
        raise ValueError(f"{what}={n} asked for, but only {available} GPU(s) are visible to this process")


#: where the dashboard listens by default: this machine only (JupyterHub's proxy and ssh tunnels reach it there)
DEFAULT_DASHBOARD_ADDRESS = "localhost:8787"
#: with ``dashboard_address=None``, the scheduler's HTTP routes (health, metrics) listen here: localhost, any free port
NO_DASHBOARD_HTTP_ADDRESS = "localhost:0"


def _scheduler_kwargs(dashboard_address: str | None, kwargs: dict) -> dict:
    """``scheduler_kwargs`` for the local cluster: the block placement plugin and, without a dashboard, the
    scheduler's other HTTP routes on a free port of localhost (dask would serve them on port 8787)."""
    out = dict(kwargs.get("scheduler_kwargs") or {})
    out["plugins"] = [*out.get("plugins", []), BlockPlacement()]
    if dashboard_address is None:
        out.setdefault("dashboard", False)
        out.setdefault("dashboard_address", NO_DASHBOARD_HTTP_ADDRESS)
    return out


def gpu_cluster_kwargs(devices: list[str], n_gpus: int | None, threads_per_gpu: int | None,
                       memory_limit: Any, device_memory_limit: Any, rmm: bool | None,
                       dashboard_address: str | None, kwargs: dict) -> dict:
    """The ``LocalCUDACluster`` arguments :func:`start_cluster` passes (user ``kwargs`` win)."""
    _check_count(n_gpus, "n_gpus", len(devices))
    _check_count(threads_per_gpu, "threads_per_gpu")
    chosen = devices[: n_gpus or len(devices)]
    out: dict[str, Any] = {
        "CUDA_VISIBLE_DEVICES": chosen,
        "n_workers": len(chosen),
        "threads_per_worker": threads_per_gpu or DEFAULT_THREADS_PER_GPU,
        "memory_limit": memory_limit,
        "device_memory_limit": device_memory_limit,
        "dashboard_address": dashboard_address,
    }
    out["scheduler_kwargs"] = _scheduler_kwargs(dashboard_address, kwargs)
    kwargs = {k: v for k, v in kwargs.items() if k != "scheduler_kwargs"}
    if rmm is None:
        import importlib.util

        rmm = importlib.util.find_spec("rmm") is not None
    user_rmm = any(k in kwargs for k in ("rmm_pool_size", "rmm_managed_memory", "rmm_async"))
    if rmm and not user_rmm:
        out["rmm_async"] = True
    if rmm:
        out["rmm_allocator_external_lib_list"] = ["cupy"]
    out.update(kwargs)
    return out


def cpu_cluster_kwargs(n_workers: int | None, threads: int | None, memory_limit: Any,
                       dashboard_address: str | None, kwargs: dict) -> dict:
    """The ``LocalCluster`` arguments :func:`start_cluster` passes on the CPU (user ``kwargs`` win)."""
    _check_count(n_workers, "n_gpus")
    _check_count(threads, "threads_per_gpu")
    cores = os.cpu_count() or 1
    if threads is None:
        threads = min(DEFAULT_CPU_THREADS, cores) if n_workers is None else max(1, cores // n_workers)
    out: dict[str, Any] = {
        "n_workers": n_workers or max(1, cores // threads),
        "threads_per_worker": threads,
        "processes": True,
        "memory_limit": memory_limit,
        "dashboard_address": dashboard_address,
        "scheduler_kwargs": _scheduler_kwargs(dashboard_address, kwargs),
    }
    out.update({k: v for k, v in kwargs.items() if k != "scheduler_kwargs"})
    return out


def _local_cuda_cluster_class() -> type:
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError as e:
        raise DeviceUnavailableError(
            f"a GPU cluster needs dask-cuda, which could not be imported ({e}); "
            f"{GPU_INSTALL_HINT}; or use device='cpu'"
        ) from e
    return LocalCUDACluster


def _say(quiet: bool, text: str) -> None:
    if not quiet:
        print(text, file=sys.stdout, flush=True)


def dashboard_link(client: distributed.Client) -> str:
    """The client's dashboard link, or why there is none."""
    try:
        link = client.dashboard_link
    except (KeyError, AttributeError, TypeError):
        link = None
    return link or "not running (dask's dashboard needs bokeh>=3.1)"


def _describe(client: distributed.Client) -> str:
    params = _sched_info_params()
    info = client.scheduler_info(n_workers=-1) if "n_workers" in params else client.scheduler_info()
    workers = info.get("workers", {})
    threads = sum(w.get("nthreads", 0) for w in workers.values())
    return f"{len(workers)} worker(s), {threads} thread(s)"


def _sched_info_params() -> tuple[str, ...]:
    import inspect

    return tuple(inspect.signature(distributed.Client.scheduler_info).parameters)


def _local_cluster(n_gpus: int | None, threads_per_gpu: int | None, device: str, memory_limit: Any,
                   device_memory_limit: Any, rmm: bool | None, env: dict | None, dashboard_address: str | None,
                   kwargs: dict, preload: bool = True) -> tuple[Any, WorkerSetup, str]:
    """Start the local cluster :func:`start_cluster` describes; return it, its worker plugin and a description.

    ``preload``: the workers set themselves up through :mod:`gpuzarr_dist.distributed.preload`, for a cluster
    no client will register :class:`WorkerSetup` with. A client that registers it should not ask for the
    preload: each worker would be set up (and warmed) twice, and on GPUs the preload's set-up runs before
    dask-cuda's own preload, which creates the CUDA context and warns when one exists already.
    """
    kind = "cpu"
    if device != "cpu":
        ok, why = gpu_status()
        if not ok:
            if device == "gpu":
                raise DeviceUnavailableError(
                    f"start_cluster(device='gpu') was asked for, but {why}. Use device='cpu' or 'auto'.")
            reason = why
        else:
            try:
                cluster_cls = _local_cuda_cluster_class()
                kind = "gpu"
            except DeviceUnavailableError as e:
                if device == "gpu":
                    raise
                reason = str(e)
                warnings.warn(f"GPUs found but starting a CPU cluster: {e}", RuntimeWarning, stacklevel=4)

    spawn_env = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}) or {})
    spawn_env.update({k: str(v) for k, v in (env or {}).items()})
    gz_config = _gpuzarr_config()
    if kind == "gpu":
        opts = gpu_cluster_kwargs(_gpu_devices(), n_gpus, threads_per_gpu, memory_limit, device_memory_limit,
                                  rmm, dashboard_address, kwargs)
        plugin = WorkerSetup(gz_config, "gpu", share_pool=rmm is not False)
        desc = (f"LocalCUDACluster: {opts['n_workers']} worker(s), one per GPU "
                f"(CUDA_VISIBLE_DEVICES {','.join(map(str, opts['CUDA_VISIBLE_DEVICES']))}), "
                f"{opts['threads_per_worker']} thread(s) each")
    else:
        cluster_cls = distributed.LocalCluster
        opts = cpu_cluster_kwargs(n_gpus, threads_per_gpu, memory_limit, dashboard_address, kwargs)
        if gz_config.get("decode-threads") is None:
            # each process decodes on its own pool: give it its share of the cores, not all of them
            gz_config["decode-threads"] = max(1, (os.cpu_count() or 1) // opts["n_workers"])
        plugin = WorkerSetup(gz_config, "cpu")
        desc = (f"LocalCluster (CPU{'' if device == 'cpu' else ': ' + reason}): "
                f"{opts['n_workers']} worker process(es), {opts['threads_per_worker']} thread(s) each")

    if preload:
        opts["preload"] = [*opts.get("preload", []), "gpuzarr_dist.distributed.preload"]
    with dask.config.set({"distributed.nanny.pre-spawn-environ": spawn_env, "gpuzarr": gz_config}):
        cluster = cluster_cls(**opts)
    return cluster, plugin, desc


def local_cluster(n_gpus: int | None = None, *, threads_per_gpu: int | None = None, device: str = "auto",
                  memory_limit: Any = "auto", device_memory_limit: Any = DEFAULT_DEVICE_MEMORY_LIMIT,
                  rmm: bool | None = None, env: dict[str, str] | None = None,
                  dashboard_address: str | None = DEFAULT_DASHBOARD_ADDRESS, **kwargs: Any) -> Any:
    """The cluster :func:`start_cluster` starts, without a client: for dask-labextension's cluster factory.

    Workers set themselves up through the :mod:`gpuzarr_dist.distributed.preload` preload.
    """
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    configure_dashboard_link()
    return _local_cluster(n_gpus, threads_per_gpu, device, memory_limit, device_memory_limit, rmm, env,
                          dashboard_address, kwargs)[0]


# -- start_cluster -----------------------------------------------------------------------


def start_cluster(
    n_gpus: int | None = None,
    *,
    threads_per_gpu: int | None = None,
    device: str = "auto",
    address: str | None = None,
    scheduler_file: str | None = None,
    memory_limit: Any = "auto",
    device_memory_limit: Any = DEFAULT_DEVICE_MEMORY_LIMIT,
    rmm: bool | None = None,
    env: dict[str, str] | None = None,
    dashboard_address: str | None = DEFAULT_DASHBOARD_ADDRESS,
    quiet: bool = False,
    **kwargs: Any,
) -> distributed.Client:
    """Start (or connect to) a dask cluster for gpuzarr-dist and return a ``distributed.Client``.

    Parameters
    ----------
    n_gpus
        GPUs to use, one worker process each (default: every GPU visible to
        this process, honouring ``CUDA_VISIBLE_DEVICES``). On the CPU: the
        number of worker processes (default: CPU count / threads).
    threads_per_gpu
        Threads per worker; each has its own CUDA stream on a GPU. Default
        8 per GPU; on the CPU at most 4 per process.
    device
        ``"auto"`` (a GPU cluster when GPUs, cupy, nvCOMP and dask-cuda are all
        usable, else a CPU cluster), ``"gpu"`` (raises
        :class:`~gpuzarr_dist.DeviceUnavailableError` saying what is missing)
        or ``"cpu"``.
    address, scheduler_file
        Connect to a running scheduler instead of starting a cluster;
        ``kwargs`` then go to ``distributed.Client``. With ``device="gpu"``
        every worker must have a usable GPU.
    memory_limit
        Host memory per worker (dask's ``"auto"``: an equal share).
    device_memory_limit
        Device memory (bytes, a size string or a fraction) a GPU worker keeps
        results in before spilling them to host memory.
    rmm
        Use RMM's stream-ordered pool (``cudaMallocAsync``) for CuPy
        (default: when rmm is installed). Pass dask-cuda's ``rmm_pool_size``
        in ``kwargs`` for a fixed pool instead.
    env
        Environment variables for the worker processes.
    dashboard_address
        Where the dashboard listens: by default port 8787 of this machine
        only (``":8787"`` listens on every interface); ``None``: no dashboard
        (the scheduler's health and metrics routes then listen on a free port
        of localhost). Under JupyterHub the printed link goes through
        jupyter-server-proxy.
    quiet
        Do not print the cluster, scheduler address and dashboard link.
    **kwargs
        Passed on to ``LocalCUDACluster`` / ``LocalCluster``.

    Notes
    -----
    The returned client owns the cluster it started: ``client.close()`` (or
    leaving ``with start_cluster() as client:``) shuts the workers down.
    """
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    configure_dashboard_link()
    if address is not None or scheduler_file is not None:
        return _connect(address, scheduler_file, n_gpus, threads_per_gpu, device, quiet, kwargs)

    # set up by the registration below, which the scheduler also hands to workers that restart
    cluster, plugin, desc = _local_cluster(n_gpus, threads_per_gpu, device, memory_limit, device_memory_limit,
                                           rmm, env, dashboard_address, kwargs, preload=False)
    n_workers = len(cluster.worker_spec)
    try:
        client = distributed.Client(cluster)
        # the client closes the cluster it was given only when it started it itself: make it so
        client._start_arg = None
        client.register_plugin(plugin, name=PLUGIN_NAME)
        client.wait_for_workers(n_workers, timeout=dask.config.get("distributed.comm.timeouts.connect"))
        if plugin.device == "gpu" and (cluster_warm() if plugin.warm is None else plugin.warm):
            from gpuzarr_dist.distributed.warm import warm_comms

            warm_comms(client)
    except BaseException:
        cluster.close()
        raise
    _say(quiet, f"gpuzarr-dist: {desc}\n  scheduler {cluster.scheduler_address}\n  dashboard {dashboard_link(client)}")
    return client


def _connect(address: str | None, scheduler_file: str | None, n_gpus: int | None, threads_per_gpu: int | None,
             device: str, quiet: bool, kwargs: dict) -> distributed.Client:
    if address is not None and scheduler_file is not None:
        raise ValueError("give address= or scheduler_file=, not both")
    if n_gpus is not None or threads_per_gpu is not None:
        raise ValueError("n_gpus and threads_per_gpu describe a cluster to start; "
                         "they cannot be used with address= or scheduler_file=")
    if scheduler_file is not None and not os.path.exists(scheduler_file):
        raise FileNotFoundError(f"scheduler file {scheduler_file!r} does not exist (is the scheduler running?)")
    if address is not None:
        client = distributed.Client(address, **kwargs)
    else:
        client = distributed.Client(scheduler_file=scheduler_file, **kwargs)
    try:
        if device == "gpu":
            found = client.run(gpu_status)
            missing = {w: why for w, (ok, why) in found.items() if not ok}
            if missing or not found:
                detail = "; ".join(f"{w}: {why}" for w, why in sorted(missing.items())) or "no workers"
                raise DeviceUnavailableError(f"device='gpu' was asked for, but these workers have no usable GPU: "
                                             f"{detail}")
        client.register_plugin(BlockPlacement())
        client.register_plugin(WorkerSetup(_gpuzarr_config(), device), name=PLUGIN_NAME)
    except BaseException:
        client.close()
        raise
    _say(quiet, f"gpuzarr-dist: connected to {client.scheduler.address}, {_describe(client)}\n"
                f"  dashboard {dashboard_link(client)}")
    return client
