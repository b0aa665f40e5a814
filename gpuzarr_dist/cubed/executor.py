"""Cubed executors: tasks on local threads (a CUDA stream per thread, several GPUs) or on a dask cluster.

Both are small :class:`cubed.runtime.types.DagExecutor` classes behind one
interface: visit the plan's operations in topological order, run each
operation's tasks through :func:`gpuzarr_dist.cubed.tasks.run_task`, and send
cubed's callbacks a ``TaskEndEvent`` per task whose ``peak_measured_mem_end``
is the task's measured peak (device memory on the GPU), so cubed's memory
reports and :class:`cubed.diagnostics.mem_warn.MemoryWarningCallback` are about the GPU.

Cubed's own dask executor asks the scheduler for its worker list through an
API that, with distributed 2026.7 and newer, reports none; ours counts
workers with ``Client.nthreads()`` and runs with any ``distributed.Client``
(``start_cluster``'s, a ``LocalCluster``'s, or the current default client).

Importing this module imports cubed: do it after the backend is chosen
(:func:`gpuzarr_dist.cubed.use_backend`); the package's lazy attributes do.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

import cloudpickle
import networkx as nx
from cubed.runtime import types as ctypes
from cubed.runtime.types import DagExecutor

from gpuzarr_dist.cubed.backend import check_backend, loaded, worker_check
from gpuzarr_dist.cubed.memory import decode_limit
from gpuzarr_dist.cubed.storage import prepare_process, wrap_config
from gpuzarr_dist.cubed.tasks import run_task, run_task_payload
from gpuzarr_dist.cuda.device import resolve_device


def _device(device: str) -> str:
    """Resolve ``"auto"`` against both the GPU stack and the backend cubed was imported with."""
    from gpuzarr_dist.cubed.backend import CUPY, _same

    if device == "auto":
        dev = resolve_device("auto")
        have = loaded()
        if dev == "gpu" and have is not None and not _same(have, CUPY):
            return "cpu"
        return dev
    dev = resolve_device(device)
    check_backend(dev)
    return dev


def _operations(dag: nx.MultiDiGraph) -> Iterator[tuple[str, dict]]:
    """The plan's operations that still need running, in topological order (as cubed's visit_nodes)."""
    nodes = dict(dag.nodes(data=True))
    for name in nx.topological_sort(dag):
        node = nodes[name]
        if node.get("pipeline") is None or node.get("computed", False):
            continue
        yield name, node


def _event(cls_name: str, **fields: Any) -> Any:
    cls = getattr(ctypes, cls_name, None)
    if cls is None:
        return None
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in fields.items() if k in known})


def _notify(callbacks: Sequence[Any] | None, method: str, event: Any) -> None:
    if not callbacks or event is None:
        return
    for cb in callbacks:
        fn = getattr(cb, method, None)
        if fn is not None:
            fn(event)


def _task_end(callbacks: Sequence[Any] | None, name: str, result: Any, stats: dict, created: float) -> None:
    if callbacks:
        _notify(callbacks, "on_task_end", _event("TaskEndEvent", name=name, result=result, task_create_tstamp=created,
                                                 task_result_tstamp=time.time(), **stats))


def _annotate(e: BaseException, name: str, item: Any) -> None:
    if hasattr(e, "add_note"):
        e.add_note(f"in cubed operation {name!r}, task {item!r}")


def _finish(callbacks: Sequence[Any] | None, name: str, item: Any, future: Any, created: float) -> None:
    """A finished task: its error raised (noting the operation and task), or cubed's TaskEndEvent sent."""
    try:
        result, stats = future.result()
    except BaseException as e:
        _annotate(e, name, item)
        raise
    _task_end(callbacks, name, result, stats, created)


class ThreadsExecutor(DagExecutor):
    """Runs cubed's tasks on a thread pool in this process; on the GPU, threads spread over the local GPUs.

    Parameters
    ----------
    max_workers
        Threads. Default: on the GPU, per device as many as fit ``allowed_mem``
        in 90% of its free memory, at most 8; on the CPU, the CPU count.
    device
        ``"auto"``, ``"gpu"`` or ``"cpu"``.
    devices
        GPU ids to use (default: all visible). Thread ``i`` uses ``devices[i % len(devices)]``.
    measure
        Per-task peak memory: ``"auto"`` (device pool on the GPU, cubed's rss on
        the CPU), ``"tracemalloc"`` (exact per task on the CPU with one thread), ``"none"``.
    retries
        Retries of a task that failed with an I/O error (decode errors are not retried).
    """

    def __init__(self, max_workers: int | None = None, *, device: str = "auto", devices: Sequence[int] | None = None,
                 measure: str = "auto", retries: int = 2, **kwargs: Any) -> None:
        super().__init__(max_workers=max_workers, device=device, devices=devices, measure=measure,
                         retries=retries, **kwargs)
        self.max_workers = max_workers
        self.device = device
        self.devices = list(devices) if devices is not None else None
        self.measure = measure
        self.retries = retries

    @property
    def name(self) -> str:
        return "gpuzarr-threads"

    def _plan_threads(self, dev: str, spec: Any) -> tuple[int, list[int]]:
        allowed = int(getattr(spec, "allowed_mem", 0) or 0)
        if dev == "cpu":
            n = self.max_workers or (os.cpu_count() or 1)
            try:
                import psutil

                total = psutil.virtual_memory().total
                if allowed and allowed * n > total:
                    raise ValueError(f"allowed_mem x threads ({allowed} x {n}) is more than this machine's memory "
                                     f"({total}); lower allowed_mem or max_workers")
            except ImportError:  # pragma: no cover
                pass
            return n, []
        from gpuzarr_dist.cuda.device import device_count, device_memory_info

        ids = self.devices if self.devices is not None else list(range(device_count()))
        if not ids:
            raise ValueError("no CUDA device to run on")
        fit = []
        for d in ids:
            free, total = device_memory_info(d)
            if allowed and allowed > total:
                raise ValueError(f"allowed_mem ({allowed}) is more than GPU {d}'s memory ({total})")
            fit.append(max(1, int(0.9 * free // allowed)) if allowed else 8)
        per = min(8, min(fit))
        n = self.max_workers or per * len(ids)
        per_device = -(-n // len(ids))
        if allowed and any(per_device > f for f in fit):
            raise ValueError(f"{per_device} threads per GPU x allowed_mem ({allowed}) do not fit the GPUs' free memory; "
                             "lower max_workers or allowed_mem")
        return n, ids

    def execute_dag(self, dag: nx.MultiDiGraph, callbacks: Sequence[Any] | None = None, spec: Any = None,
                    compute_id: str | None = None, **kwargs: Any) -> None:
        dev = _device(self.device)
        prepare_process(dev)
        n, ids = self._plan_threads(dev, spec)
        counter = iter(range(1 << 30))
        lock = threading.Lock()

        def init() -> None:
            if ids:
                from gpuzarr_dist.cuda.device import use_device

                with lock:
                    i = next(counter)
                use_device(ids[i % len(ids)])

        window = 4 * n
        with ThreadPoolExecutor(n, thread_name_prefix="gpuzarr-cubed", initializer=init) as pool:
            for name, node in _operations(dag):
                _notify(callbacks, "on_operation_start", _event("OperationStartEvent", name=name))
                pipeline = node["pipeline"]
                config = wrap_config(pipeline.config, dev, decode_limit(spec, dev))
                created = time.time()
                items = iter(pipeline.mappable)
                pending: dict[Future, Any] = {}
                try:
                    while True:
                        while len(pending) < window:
                            item = next(items, _END)
                            if item is _END:
                                break
                            pending[pool.submit(run_task, item, pipeline.function, config, dev, self.measure,
                                                self.retries)] = item
                        if not pending:
                            break
                        done, _ = wait(pending, return_when=FIRST_COMPLETED)
                        for f in done:
                            _finish(callbacks, name, pending.pop(f), f, created)
                except BaseException:
                    for f in pending:
                        f.cancel()
                    raise
                _notify(callbacks, "on_operation_end", _event("OperationEndEvent", name=name))


_END = object()


class DistributedExecutor(DagExecutor):
    """Runs cubed's tasks on a dask cluster through a ``distributed.Client``.

    Parameters
    ----------
    client
        The client (default: the current one, ``distributed.get_client()``).
    device
        ``"auto"`` (the GPU when this process has one), ``"gpu"`` or ``"cpu"``:
        the device the workers run on. Each worker gets cubed's backend for it
        (a worker plugin) and is asked for it before any task is sent.
    measure, retries
        As for :class:`ThreadsExecutor`.
    batch_size
        Tasks in flight per operation (default: 4 x the cluster's threads).
    """

    def __init__(self, client: Any = None, *, device: str = "auto", measure: str = "auto", retries: int = 2,
                 batch_size: int | None = None, **kwargs: Any) -> None:
        super().__init__(device=device, measure=measure, retries=retries, batch_size=batch_size, **kwargs)
        self.client = client
        self.device = device
        self.measure = measure
        self.retries = retries
        self.batch_size = batch_size

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DistributedExecutor) and other.client is self.client and other.kwargs == self.kwargs

    __hash__ = object.__hash__

    def __getstate__(self) -> dict:
        # task functions can close over arrays, whose spec holds this executor: travel without the client
        state = self.__dict__.copy()
        state["client"] = None
        return state

    @property
    def name(self) -> str:
        return "gpuzarr-distributed"

    def _client(self) -> Any:
        if self.client is not None:
            return self.client
        import distributed

        try:
            return distributed.get_client()
        except ValueError:
            raise ValueError("DistributedExecutor needs a dask client: pass client=, or create one first "
                             "(distributed.Client(...) or gpuzarr_dist.start_cluster())") from None

    def _prepare_workers(self, client: Any, dev: str, spec: Any) -> int:
        from gpuzarr_dist.cubed.backend import BackendPlugin

        nthreads = client.nthreads()
        if not nthreads:
            raise ValueError(f"the dask cluster at {client.scheduler.address} has no workers")
        client.register_plugin(BackendPlugin(dev), name=BackendPlugin.name)
        problems = {w: p for w, p in client.run(worker_check, dev).items() if p}
        if problems:
            w, p = next(iter(sorted(problems.items())))
            from gpuzarr_dist.cubed.backend import CubedBackendError

            raise CubedBackendError(f"worker {w}: {p} (restart the workers, e.g. client.restart(), after "
                                    "gpuzarr_dist.cubed has set the backend)")
        allowed = int(getattr(spec, "allowed_mem", 0) or 0)
        if allowed:
            if dev == "gpu":
                per = client.run(_device_memory)
                for w, total in per.items():
                    if total and allowed * nthreads[w] > total:
                        raise ValueError(f"worker {w}: {nthreads[w]} threads x allowed_mem ({allowed}) is more than "
                                         f"its GPU's memory ({total})")
            else:
                info = client.scheduler_info(n_workers=-1) if _accepts_n_workers(client) else client.scheduler_info()
                for w, meta in info.get("workers", {}).items():
                    limit = meta.get("memory_limit") or 0
                    if limit and w in nthreads and limit // max(nthreads[w], 1) < allowed:
                        raise ValueError(f"worker {w}: memory per thread ({limit // nthreads[w]}) is less than "
                                         f"allowed_mem ({allowed})")
        return sum(nthreads.values())

    def execute_dag(self, dag: nx.MultiDiGraph, callbacks: Sequence[Any] | None = None, spec: Any = None,
                    compute_id: str | None = None, **kwargs: Any) -> None:
        import distributed

        client = self._client()
        dev = self.device if self.device != "auto" else _device("auto")
        if dev not in ("cpu", "gpu"):
            raise ValueError(f"device must be 'auto', 'gpu' or 'cpu', got {self.device!r}")
        threads = self._prepare_workers(client, dev, spec)
        window = self.batch_size or 4 * threads
        for name, node in _operations(dag):
            _notify(callbacks, "on_operation_start", _event("OperationStartEvent", name=name))
            pipeline = node["pipeline"]
            # cubed's configs hold local closures: cloudpickle them once, send the bytes to workers once
            payload = cloudpickle.dumps((pipeline.function, wrap_config(pipeline.config, dev, decode_limit(spec, dev)),
                                         dev, self.measure, self.retries))
            scattered = client.scatter([payload], hash=False)[0]
            created = time.time()
            items = iter(enumerate(pipeline.mappable))
            futures: dict[Any, Any] = {}
            ac = distributed.as_completed()

            def submit(k: int) -> None:
                for _ in range(k):
                    nxt = next(items, None)
                    if nxt is None:
                        return
                    i, item = nxt
                    f = client.submit(run_task_payload, item, scattered, key=f"{name}-{i}-{compute_id}", pure=False)
                    futures[f] = item
                    ac.add(f)

            submit(window)
            try:
                for f in ac:
                    _finish(callbacks, name, futures.pop(f), f, created)
                    submit(1)
            except BaseException:
                client.cancel(list(futures))
                raise
            finally:
                scattered = None  # the payload is released with its last future
            _notify(callbacks, "on_operation_end", _event("OperationEndEvent", name=name))


def _device_memory() -> int:
    """Run in a worker: its current GPU's total memory (0 without one)."""
    try:
        from gpuzarr_dist.cuda.device import device_memory_info

        return device_memory_info()[1]
    except Exception:
        return 0


def _accepts_n_workers(client: Any) -> bool:
    import inspect

    try:
        return "n_workers" in inspect.signature(client.scheduler_info).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return False
