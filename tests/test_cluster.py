"""start_cluster on the CPU end to end (real worker processes), connecting to running clusters,
locality of reductions (from the workers' transfer logs), a worker killed mid-computation, and the
arguments the GPU path hands to dask-cuda (checked with a stand-in LocalCUDACluster).

Results are compared with numpy applied to zarr-python's read of the same store.
"""

from __future__ import annotations

import os
import re
import signal
import time

import dask
import numpy as np
import pytest
from conftest import make_data, reference, write_array

import gpuzarr_dist as gz

distributed = pytest.importorskip("distributed")
from gpuzarr_dist.distributed import cluster as cluster_mod  # noqa: E402

pytestmark = pytest.mark.slow

QUIET = dict(dashboard_address=None, silence_logs=40)


@pytest.fixture
def store(tmp_path):
    """A float64 (16, 64, 50) array in Zarr v3, chunks (1, 32, 50), one chunk left unwritten."""
    path = str(tmp_path / "t.zarr")
    data = make_data("float64", (16, 64, 50), seed=7, specials=False)
    write_array(path, data, (1, 32, 50), which=[c for c in np.ndindex(16, 2, 1) if c != (5, 1, 0)],
                fill_value=-1.5)
    return path, reference(path)


def _worker_pids(client) -> dict:
    return client.run(os.getpid)


def test_cpu_cluster_end_to_end(store, capsys):
    path, ref = store
    client = gz.start_cluster(2, threads_per_gpu=1, device="cpu", **QUIET)
    try:
        out = capsys.readouterr().out
        assert "LocalCluster (CPU)" in out and "2 worker process(es), 1 thread(s) each" in out
        assert "scheduler tcp://" in out and "dashboard " in out
        pids = _worker_pids(client)
        assert len(set(pids.values())) == 2 and os.getpid() not in pids.values()
        # the plugin ran in every worker: device, and the CPU decode pool sized to the worker's share
        states = client.run(cluster_mod.worker_state)
        assert all(s.get("device") == "cpu" for s in states.values()), states
        decode = client.run(lambda: dask.config.get("gpuzarr.decode-threads"))
        assert set(decode.values()) == {max(1, (os.cpu_count() or 1) // 2)}

        x = gz.from_zarr_gpu(path, device="cpu", chunks=(4, 64, 50))
        mean, std, total = client.compute([x.mean(axis=0), x.std(axis=(1, 2)), (x * 2 - 1).sum()], sync=True)
        np.testing.assert_allclose(mean, ref.mean(axis=0), rtol=1e-12)
        np.testing.assert_allclose(std, ref.std(axis=(1, 2)), rtol=1e-10)
        np.testing.assert_allclose(total, (ref * 2 - 1).sum(), rtol=1e-12)
        cluster = client.cluster
    finally:
        client.close()
    # the client owned the cluster it started: closing it stopped the workers
    assert cluster.status.name == "closed"


def test_connect_by_address_and_scheduler_file(store, tmp_path, capsys):
    path, ref = store
    sched_file = str(tmp_path / "scheduler.json")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=True,
                                  scheduler_kwargs={"scheduler_file": sched_file}, **QUIET) as cluster:
        for how in ({"address": cluster.scheduler_address}, {"scheduler_file": sched_file}):
            with gz.start_cluster(**how) as client:
                out = capsys.readouterr().out
                assert f"connected to {cluster.scheduler_address}, 1 worker(s), 2 thread(s)" in out
                assert client.scheduler.address == cluster.scheduler_address
                x = gz.from_zarr_gpu(path, device="cpu")
                np.testing.assert_allclose(x.sum(axis=0).compute(), ref.sum(axis=0), rtol=1e-12)
                assert list(client.run(cluster_mod.worker_state).values()) == [{"device": "cpu"}]
        # the connected client does not own the cluster: it is still there
        assert cluster.status.name == "running"

        # a CPU-only cluster cannot serve device="gpu": the error names the workers
        if not gz.gpu_available():
            with pytest.raises(gz.DeviceUnavailableError, match="no usable GPU: tcp://"):
                gz.start_cluster(address=cluster.scheduler_address, device="gpu", quiet=True)
    with pytest.raises(ValueError, match="not both"):
        gz.start_cluster(address="tcp://127.0.0.1:1", scheduler_file=sched_file)
    with pytest.raises(ValueError, match="cannot be used with address"):
        gz.start_cluster(2, address="tcp://127.0.0.1:1")
    with pytest.raises(FileNotFoundError, match="scheduler file"):
        gz.start_cluster(scheduler_file=str(tmp_path / "missing.json"))


def _transfers(client) -> list[tuple[str, int]]:
    """Every (key, nbytes) that moved between workers, from the workers' incoming transfer logs."""
    logs = client.run(lambda dask_worker: list(dask_worker.transfer_incoming_log))
    return [(str(k), int(n)) for log in logs.values() for entry in log for k, n in entry["keys"].items()]


def _clear_transfer_logs(client) -> None:
    client.run(lambda dask_worker: dask_worker.transfer_incoming_log.clear())


def test_locality_only_partial_results_travel(tmp_path):
    """Blocks are read and reduced where they are; only the partial sums cross between workers."""
    path = str(tmp_path / "big.zarr")
    data = make_data("float64", (32, 64, 64), seed=3, specials=False)
    write_array(path, data, (2, 64, 64))
    ref = reference(path)
    block = (8, 64, 64)
    block_nbytes = int(np.prod(block)) * 8  # 256 kB

    with gz.start_cluster(2, threads_per_gpu=1, device="cpu", quiet=True, **QUIET) as client:
        x = gz.from_zarr_gpu(path, device="cpu", chunks=block)
        assert x.numblocks == (4, 1, 1)
        _clear_transfer_logs(client)
        with distributed.get_task_stream(client) as ts:
            mean = x.mean(axis=0).compute()
        np.testing.assert_allclose(mean, ref.mean(axis=0), rtol=1e-12)
        names = [str(t["key"][0] if isinstance(t["key"], tuple) else t["key"]) for t in ts.data]
        # the read is fused into the per-block partial: no task hands on a raw block
        assert not [n for n in names if n.startswith("from-zarr")], names
        # both workers read and reduced blocks (else nothing would need to travel and the check proves nothing)
        readers = {t["worker"] for t, n in zip(ts.data, names) if n.startswith("mean_chunk")}
        assert len(readers) == 2, ts.data
        moved = _transfers(client)
        assert moved, "the partial results of one worker must have travelled to the other"
        for key, nbytes in moved:
            assert "from-zarr" not in key, key  # a raw block never moved
            # a partial of mean over 8 time steps (sum + count of one step) is a quarter of a block
            assert nbytes <= block_nbytes // 4 + 1024, (key, nbytes)

        # control: the same log does record whole blocks when a computation moves them
        _clear_transfer_logs(client)
        merged = x.rechunk((32, 64, 64)).sum(axis=0).compute()
        np.testing.assert_allclose(merged, ref.sum(axis=0), rtol=1e-12)
        assert max(n for _, n in _transfers(client)) >= block_nbytes


def _slow_double(block: np.ndarray) -> np.ndarray:
    time.sleep(0.4)
    return block * 2


def test_worker_killed_mid_computation(store):
    """A worker process killed while a reduction runs: dask reschedules its work, the result is right."""
    path, ref = store
    with gz.start_cluster(2, threads_per_gpu=1, device="cpu", quiet=True, **QUIET) as client:
        x = gz.from_zarr_gpu(path, device="cpu", chunks=(1, 64, 50))
        fut = client.compute(x.map_blocks(_slow_double, dtype=x.dtype).sum(axis=0))
        before = _worker_pids(client)
        victim = sorted(before)[0]

        # wait until the victim holds results (so they must be recomputed), then kill it hard
        def held(dask_scheduler, addr=victim):
            ws = dask_scheduler.workers.get(addr)
            return len(ws.has_what) if ws else 0

        deadline = time.monotonic() + 60
        while client.run_on_scheduler(held) < 2:
            assert time.monotonic() < deadline, "the victim never held a result"
            assert not fut.done(), "finished before the worker could be killed: make the tasks slower"
            time.sleep(0.05)
        os.kill(before[victim], signal.SIGKILL)

        result = fut.result(timeout=120)
        np.testing.assert_allclose(result, (ref * 2).sum(axis=0), rtol=1e-12)
        # the process really died (the nanny started a new one)
        after = _worker_pids(client)
        assert before[victim] not in after.values()


def test_device_gpu_without_gpu_is_a_clear_error():
    if gz.gpu_available():
        pytest.skip("a GPU is usable here")
    with pytest.raises(gz.DeviceUnavailableError, match=r"start_cluster\(device='gpu'\).*device='cpu'"):
        gz.start_cluster(device="gpu")
    with pytest.raises(ValueError, match="device must be one of"):
        gz.start_cluster(device="cuda")
    with pytest.raises(ValueError, match="n_gpus must be"):
        gz.start_cluster(0, device="cpu")


def test_jupyterhub_dashboard_link(monkeypatch):
    from distributed.utils import format_dashboard_link

    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/ana/")
    with dask.config.set({"distributed.dashboard.link": cluster_mod._DASK_DEFAULT_LINK}):
        assert cluster_mod.configure_dashboard_link() == cluster_mod.JUPYTERHUB_DASHBOARD_LINK
        assert format_dashboard_link("10.1.2.3", 8787) == "/user/ana/proxy/8787/status"
    # a link the user configured is left alone
    with dask.config.set({"distributed.dashboard.link": "https://example.org/{port}"}):
        assert cluster_mod.configure_dashboard_link() == "https://example.org/{port}"
    monkeypatch.delenv("JUPYTERHUB_SERVICE_PREFIX")
    with dask.config.set({"distributed.dashboard.link": cluster_mod._DASK_DEFAULT_LINK}):
        assert cluster_mod.configure_dashboard_link() == cluster_mod._DASK_DEFAULT_LINK


# -- the GPU path, with a stand-in for dask-cuda's LocalCUDACluster -------------------------


class _Recorder:
    calls: list[dict] = []
    pool_shared: list[int] = []


class FakeLocalCUDACluster(distributed.LocalCluster):
    """Records the arguments dask-cuda would get, then runs a threads-only LocalCluster."""

    def __init__(self, CUDA_VISIBLE_DEVICES, n_workers, threads_per_worker, memory_limit, device_memory_limit,
                 rmm_async=False, rmm_pool_size=None, rmm_allocator_external_lib_list=None, **kwargs):
        _Recorder.calls.append(dict(
            CUDA_VISIBLE_DEVICES=CUDA_VISIBLE_DEVICES, n_workers=n_workers, threads_per_worker=threads_per_worker,
            memory_limit=memory_limit, device_memory_limit=device_memory_limit, rmm_async=rmm_async,
            rmm_pool_size=rmm_pool_size, rmm_allocator_external_lib_list=rmm_allocator_external_lib_list,
            spawn_env=dict(dask.config.get("distributed.nanny.pre-spawn-environ")), **kwargs))
        # dask-cuda puts its own preload, which creates the CUDA context, after the preloads it is given
        super().__init__(n_workers=n_workers, threads_per_worker=threads_per_worker, processes=False,
                         dashboard_address=None, preload=[*kwargs.get("preload", []), "tests.helpers.cuda_initialize_standin"])


@pytest.fixture
def fake_gpus(monkeypatch):
    monkeypatch.setattr(cluster_mod, "gpu_status", lambda: (True, "4 CUDA device(s) (fake)"))
    monkeypatch.setattr(cluster_mod, "_local_cuda_cluster_class", lambda: FakeLocalCUDACluster)
    monkeypatch.setattr(cluster_mod, "share_device_pool", lambda: _Recorder.pool_shared.append(1) or "fake pool")
    monkeypatch.setattr(cluster_mod, "cluster_warm", lambda: False)  # the warm-up reads on a real GPU
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1,2,0")
    _Recorder.calls.clear()
    _Recorder.pool_shared.clear()
    return _Recorder


def test_gpu_path_one_worker_per_gpu(fake_gpus, store, capsys):
    path, ref = store
    with gz.start_cluster(2, env={"MY_SETTING": "1"}, rmm=True, quiet=False) as client:
        out = capsys.readouterr().out
        assert "one per GPU (CUDA_VISIBLE_DEVICES 3,1)" in out and "8 thread(s) each" in out
        call = fake_gpus.calls[-1]
        assert call["CUDA_VISIBLE_DEVICES"] == ["3", "1"]  # the first n of the visible devices, in order
        assert call["n_workers"] == 2
        assert call["threads_per_worker"] == cluster_mod.DEFAULT_THREADS_PER_GPU
        assert call["device_memory_limit"] == 0.8 and call["memory_limit"] == "auto"
        assert call["rmm_async"] is True and call["rmm_pool_size"] is None
        assert call["rmm_allocator_external_lib_list"] == ["cupy"]
        assert call["spawn_env"]["MY_SETTING"] == "1"
        # the plugin set every worker up for the GPU and shared the pool
        states = client.run(cluster_mod.worker_state)
        assert [s["device"] for s in states.values()] == ["gpu", "gpu"]
        assert len(fake_gpus.pool_shared) == 2  # once per worker, not again by a preload
        # and nothing touched the GPU before dask-cuda's preload made the CUDA context
        before = client.run(lambda dask_worker: dask_worker.gpuzarr_setup_before_cuda_init)
        assert list(before.values()) == [False, False]
        x = gz.from_zarr_gpu(path, device="cpu")
        np.testing.assert_allclose(x.max(axis=0).compute(), ref.max(axis=0))


def test_gpu_path_arguments(fake_gpus):
    devices = ["0", "1", "2", "3"]
    kw = cluster_mod.gpu_cluster_kwargs(devices, None, 4, "auto", "30GB", True, ":0", {})
    assert kw["CUDA_VISIBLE_DEVICES"] == devices and kw["n_workers"] == 4 and kw["threads_per_worker"] == 4
    assert kw["device_memory_limit"] == "30GB"
    # a fixed pool asked for by the user replaces the async pool; user arguments win
    kw = cluster_mod.gpu_cluster_kwargs(devices, 1, None, "auto", 0.8, True, None,
                                        {"rmm_pool_size": "10GB", "threads_per_worker": 3})
    assert "rmm_async" not in kw and kw["rmm_pool_size"] == "10GB" and kw["threads_per_worker"] == 3
    kw = cluster_mod.gpu_cluster_kwargs(devices, 1, None, "auto", 0.8, False, None, {})
    assert "rmm_async" not in kw and "rmm_allocator_external_lib_list" not in kw
    with pytest.raises(ValueError, match="n_gpus=5 asked for, but only 4 GPU"):
        gz.start_cluster(5)
    assert fake_gpus.calls == []
    assert cluster_mod._gpu_devices() == ["3", "1", "2", "0"]


def test_gpu_asked_without_dask_cuda(monkeypatch):
    monkeypatch.setattr(cluster_mod, "gpu_status", lambda: (True, "1 CUDA device(s) (fake)"))

    def missing():
        raise gz.DeviceUnavailableError("a GPU cluster needs dask-cuda, which could not be imported (fake)")

    monkeypatch.setattr(cluster_mod, "_local_cuda_cluster_class", missing)
    with pytest.raises(gz.DeviceUnavailableError, match="dask-cuda"):
        gz.start_cluster(device="gpu")
    # "auto" falls back to a CPU cluster, with a warning that says why
    with pytest.warns(RuntimeWarning, match="dask-cuda"):
        client = gz.start_cluster(1, threads_per_gpu=1, quiet=True, **QUIET)
    with client:
        assert set(s["device"] for s in client.run(cluster_mod.worker_state).values()) == {"cpu"}


# -- the command line ---------------------------------------------------------------------


def test_cli_cluster_serves_until_interrupted(store, tmp_path):
    import subprocess
    import sys

    path, ref = store
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sched = str(tmp_path / "sched.json")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuzarr_dist", "cluster", "--device", "cpu", "--n-gpus", "2",
         "--threads-per-gpu", "1", "--scheduler-file", sched, "--dashboard-address", "none"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=root)
    try:
        lines = []
        while not lines or "Ctrl-C" not in lines[-1]:
            line = proc.stdout.readline()
            assert line, f"exited early: {''.join(lines)} {proc.stderr.read()[-2000:]}"
            lines.append(line)
        out = "".join(lines)
        assert "2 worker process(es), 1 thread(s) each" in out
        address = re.search(r"scheduler (tcp://\S+)", out).group(1)
        assert f"start_cluster(address='{address}')" in out
        with gz.start_cluster(scheduler_file=sched, quiet=True) as client:
            assert client.scheduler.address == address
            x = gz.from_zarr_gpu(path, device="cpu")
            np.testing.assert_allclose(x.min(axis=(1, 2)).compute(), ref.min(axis=(1, 2)))
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-2000:]
        assert "cluster stopped" in rest
    finally:
        if proc.poll() is None:
            proc.kill()


def test_cli_info_lists_gpus(capsys, monkeypatch):
    from gpuzarr_dist.cli import main
    from gpuzarr_dist.distributed import gpus

    fake = gpus.parse_nvidia_smi("0, NVIDIA H200, 143771, 580.95.05, GPU-aaa\n"
                                 "1, NVIDIA H200, 143771, 580.95.05, GPU-bbb\n")
    assert fake[1] == gpus.GpuInfo(1, "NVIDIA H200", 143771 * 2**20, "580.95.05", "GPU-bbb")
    monkeypatch.setattr(gpus, "list_gpus", lambda: fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "GPUs: 2 (CUDA_VISIBLE_DEVICES=1)" in out
    assert "GPU 1: NVIDIA H200, 140.4 GiB, driver 580.95.05" in out
    assert "start_cluster:" in out


def test_labextension_factory_config():
    """cluster/jupyterhub/labextension.yaml names a factory that starts our cluster, with preloaded workers."""
    import importlib

    import yaml

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "cluster", "jupyterhub", "labextension.yaml")) as f:
        conf = yaml.safe_load(f)
    factory = conf["labextension"]["factory"]
    make = getattr(importlib.import_module(factory["module"]), factory["class"])
    assert conf["distributed"]["dashboard"]["link"] == cluster_mod.JUPYTERHUB_DASHBOARD_LINK
    kwargs = dict(factory["kwargs"], device="cpu", n_gpus=1, threads_per_gpu=1, dashboard_address=None)
    cluster = make(*factory["args"], **kwargs)
    try:
        with distributed.Client(cluster) as client:
            client.wait_for_workers(1, timeout=60)
            # the preload set the worker up although no client registered anything
            assert list(client.run(cluster_mod.worker_state).values()) == [{"device": "cpu"}]
            assert client.submit(sum, [1, 2]).result() == 3
    finally:
        cluster.close()


@pytest.mark.gpu
def test_gpu_cluster_time_mean(tmp_path):
    """On GPUs: one dask-cuda worker per GPU, the pool shared, a time mean right (needs dask-cuda)."""
    pytest.importorskip("dask_cuda")
    from gpuzarr_dist.demo import make_era5_like

    store = make_era5_like(str(tmp_path / "era5.zarr"), 16)
    with gz.start_cluster(device="gpu", threads_per_gpu=4, dashboard_address=None, quiet=True) as client:
        states = client.run(cluster_mod.worker_state)
        assert all(s["device"] == "gpu" and ("RMM" in s["pool"] or "CuPy" in s["pool"]) for s in states.values()), states
        m = gz.from_zarr_gpu(store.path, chunks=(4, 721, 1440)).mean(axis=0).compute().get()
    np.testing.assert_allclose(m, store.reference_mean(), rtol=1e-5)
