"""Block placement on a cluster (``gpuzarr.cluster.placement``), worker warm-up and the dashboard's address.

The placement hints come from the graph optimisation (``array/optimize.py``); the
scheduler plugin (``distributed/placement.py``) turns them into loose worker
restrictions. Values are compared with numpy applied to zarr-python's read.
"""

from __future__ import annotations

import dask
import numpy as np
import pytest
from conftest import make_data, reference, write_array

import gpuzarr_dist as gz
from gpuzarr_dist.array.optimize import PLACE_ANNOTATION, optimize, placement_hints, thread_shares, worker_for

distributed = pytest.importorskip("distributed")
from gpuzarr_dist.distributed import cluster as cluster_mod  # noqa: E402

QUIET = dict(dashboard_address=None, silence_logs=40)


@pytest.fixture
def store(tmp_path):
    path = str(tmp_path / "p.zarr")
    write_array(path, make_data("float64", (32, 16, 20), seed=5, specials=False), (1, 16, 20))
    return path, reference(path)


def test_hints_mark_the_first_tasks_in_block_order(store):
    path, _ = store
    x = gz.from_zarr_gpu(path, device="cpu", chunks=(4, 16, 20))
    y = gz.from_zarr_gpu(path, device="cpu", chunks=(4, 16, 20)) * 2
    graph = optimize((x - y).mean(axis=0).__dask_graph__(), [])
    annotated = [layer for layer in graph.layers.values() if layer.annotations]
    assert len(annotated) == 1
    hints = {k: annotated[0].annotations[PLACE_ANNOTATION](k) for k in annotated[0]}
    # one fused task per block (read of both arrays, subtraction, partial mean), positions in block order
    assert sorted(k[1] for k in hints) == list(range(8))
    assert all(hints[k] == (k[1], 8) for k in hints)
    # the tasks that depend on others (the reduction tree) carry no hint
    rest = [k for layer in graph.layers.values() if not layer.annotations for k in layer]
    assert rest and not set(rest) & set(hints)


def test_hints_only_for_our_arrays_and_switchable(store):
    path, _ = store
    plain = dask.array.ones((8, 8), chunks=2).sum(axis=0)
    assert isinstance(optimize(plain.__dask_graph__(), plain.__dask_keys__()), dict)
    x = gz.from_zarr_gpu(path, device="cpu", chunks=(4, 16, 20)).sum(axis=0)
    with dask.config.set({"gpuzarr.cluster.placement": False}):
        assert isinstance(optimize(x.__dask_graph__(), x.__dask_keys__()), dict)
    assert placement_hints({}) == {}


def test_shares_are_consecutive_and_weighted_by_threads():
    workers, bounds = thread_shares({"tcp://b": 8, "tcp://a": 8})
    assert workers == ["tcp://a", "tcp://b"] and bounds == [0.5, 1.0]
    placed = [worker_for(i, 10, bounds, workers) for i in range(10)]
    assert placed == ["tcp://a"] * 5 + ["tcp://b"] * 5
    workers, bounds = thread_shares({"tcp://a": 2, "tcp://b": 6})
    placed = [worker_for(i, 8, bounds, workers) for i in range(8)]
    assert placed == ["tcp://a"] * 2 + ["tcp://b"] * 6


@pytest.mark.slow
def test_cluster_places_runs_of_blocks_and_partials_stay_local(store):
    path, ref = store
    with gz.start_cluster(2, threads_per_gpu=1, device="cpu", quiet=True, **QUIET) as client:
        x = gz.from_zarr_gpu(path, device="cpu", chunks=(2, 16, 20))
        assert x.numblocks[0] == 16
        with distributed.get_task_stream(client) as ts:
            mean = (x * 2).mean(axis=0).compute()
        np.testing.assert_allclose(mean, (ref * 2).mean(axis=0), rtol=1e-12)
        where = {t["key"][1]: t["worker"] for t in ts.data
                 if isinstance(t["key"], tuple) and str(t["key"][0]).startswith("mean_chunk")}
        assert len(where) == 16
        workers = sorted(set(where.values()))
        assert [where[i] for i in range(16)] == [workers[0]] * 8 + [workers[1]] * 8
        transfers = sum(1 for t in ts.data for s in t["startstops"] if s["action"] == "transfer")
        assert transfers <= 2, ts.data  # one partial crosses; dask's own placement moves about one per block
        placed = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins["gpuzarr-placement"].placed)
        assert placed == 16
        # the restriction is loose: the scheduler may still run a block elsewhere
        loose = client.run_on_scheduler(
            lambda dask_scheduler: all(ts.loose_restrictions for ts in dask_scheduler.tasks.values()
                                       if ts.worker_restrictions))
        assert loose

        with dask.config.set({"gpuzarr.cluster.placement": False}):
            np.testing.assert_allclose(x.sum(axis=0).compute(), ref.sum(axis=0), rtol=1e-12)
        assert client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins["gpuzarr-placement"].placed) == 16


@pytest.mark.slow
def test_no_dashboard_means_no_port_8787(store):
    from distributed.comm.utils import get_tcp_server_addresses

    with gz.start_cluster(1, threads_per_gpu=1, device="cpu", quiet=True, **QUIET) as client:
        bound = client.run_on_scheduler(lambda dask_scheduler: get_tcp_server_addresses(dask_scheduler.http_server))
        assert bound and all(port != 8787 and host in ("127.0.0.1", "::1", "localhost") for host, port in bound), bound


def test_default_dashboard_listens_on_this_machine_only():
    import inspect

    for fn in (gz.start_cluster, cluster_mod.local_cluster):
        assert inspect.signature(fn).parameters["dashboard_address"].default == "localhost:8787"
    kw = cluster_mod.cpu_cluster_kwargs(1, 1, "auto", None, {"scheduler_kwargs": {"idle_timeout": 5}})
    sk = kw["scheduler_kwargs"]
    assert sk["idle_timeout"] == 5 and sk["dashboard"] is False and sk["dashboard_address"] == "localhost:0"
    assert [type(p).__name__ for p in sk["plugins"]] == ["BlockPlacement"]


@pytest.mark.slow
def test_gpu_workers_are_warmed_before_start_cluster_returns(monkeypatch, tmp_path):
    """With (stand-in) GPUs, every worker runs the warm-up on its own threads before it takes tasks."""
    from test_cluster import FakeLocalCUDACluster

    from gpuzarr_dist.distributed import warm

    calls = []

    async def fake_warm(worker):
        calls.append(worker.state.nthreads)
        return {"seconds": 0.0, "pinned_bytes": 0, "threads": worker.state.nthreads}

    monkeypatch.setattr(cluster_mod, "gpu_status", lambda: (True, "2 CUDA device(s) (fake)"))
    monkeypatch.setattr(cluster_mod, "_local_cuda_cluster_class", lambda: FakeLocalCUDACluster)
    monkeypatch.setattr(cluster_mod, "share_device_pool", lambda: "fake pool")
    monkeypatch.setattr(warm, "warm_dask_worker", fake_warm)
    comms = []
    monkeypatch.setattr(warm, "warm_comms", lambda client: comms.append(len(client.scheduler_info()["workers"])))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with gz.start_cluster(2, threads_per_gpu=3, quiet=True) as client:
        states = client.run(cluster_mod.worker_state)
    assert calls == [3, 3] and comms == [2]  # each worker's threads, then the connections between them
    assert all(s["warm"]["threads"] == 3 for s in states.values())
    calls.clear()
    with dask.config.set({"gpuzarr.cluster.warm": False}), gz.start_cluster(1, quiet=True):
        pass
    assert calls == [] and comms == [2]


@pytest.mark.gpu
def test_warm_worker_on_the_gpu():
    """The warm-up reads and checks a small zstd array on every thread and pins one staging buffer per thread."""
    from gpuzarr_dist.cuda.device import device_memory_info
    from gpuzarr_dist.cuda.streams import staging_pool
    from gpuzarr_dist.distributed.warm import device_share, warm_worker

    assert 0 < device_share(64) <= 0.5 * device_memory_info()[0] / 64  # never more than half the free memory

    done = warm_worker(3)
    assert done["threads"] == 3 and staging_pool().free_bytes() >= 3 * (256 << 20)
    again = warm_worker(3)
    assert again["pinned_bytes"] == 0  # the buffers pinned the first time serve the second


@pytest.mark.gpu
def test_start_cluster_warms_the_connections_between_gpu_workers():
    """start_cluster moves a device array between its workers before it returns (one worker per visible GPU)."""
    pytest.importorskip("dask_cuda")
    with gz.start_cluster(device="gpu", threads_per_gpu=2, dashboard_address=None, quiet=True) as client:
        states = client.run(cluster_mod.worker_state)
        assert all(s["warm"]["threads"] == 2 for s in states.values()), states


def test_tasks_on_data_already_computed_get_no_hint(store):
    """Only tasks that depend on nothing (the reads) are placed: a task on persisted data runs where that is."""
    from dask._task_spec import Task, TaskRef

    path, _ = store
    x = gz.from_zarr_gpu(path, device="cpu", chunks=(4, 16, 20)).sum(axis=0)
    graph = dict(dask.optimize(x)[0].__dask_graph__())
    graph[("on-persisted", 0)] = Task(("on-persisted", 0), sum, TaskRef(("elsewhere", 0)))
    graph[("on-persisted", 1)] = Task(("on-persisted", 1), sum, TaskRef(("elsewhere", 1)))
    hints = placement_hints(graph)
    assert hints and not [k for k in hints if k[0] == "on-persisted"]
