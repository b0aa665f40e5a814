"""Batch-system clusters: PBS and Slurm job scripts as generated, and a real one-node Slurm on this
machine running dask-jobqueue workers that compute a reduction of a Zarr array.

The Slurm test installs Debian's slurm-wlm and munge when they are missing (root with apt-get) and
skips, saying why, where that cannot be done (see ``helpers/slurm_local.py``).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time

import dask
import numpy as np
import pytest
from conftest import make_data, reference, write_array

import gpuzarr_dist as gz

dask_jobqueue = pytest.importorskip("dask_jobqueue")
from gpuzarr_dist.distributed import cluster as cluster_mod  # noqa: E402
from gpuzarr_dist.distributed.jobqueue import jobqueue_cluster, jobqueue_options  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NO_DASHBOARD = {"dashboard_address": ":0"}


def _worker_command(script: str) -> list[str]:
    line = [ln for ln in script.splitlines() if " -m " in ln and "tcp://" in ln]
    assert len(line) == 1, script
    return shlex.split(line[0])


def _last(args: list[str], flag: str) -> str:
    """The value a click/argparse command line takes for ``flag``: its last occurrence."""
    return [args[i + 1] for i, a in enumerate(args) if a == flag][-1]


def test_pbs_job_script_derecho_gpu_node():
    with dask.config.set({"gpuzarr.io-threads": 32}):
        cluster = jobqueue_cluster("pbs", account="NCAR0001", queue="main", walltime="02:00:00",
                                   setup=["module load conda", "conda activate gz"], python="python3",
                                   scheduler_options=NO_DASHBOARD)
    try:
        script = cluster.job_script()
    finally:
        cluster.close()
    lines = script.splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    assert "#PBS -l select=1:ncpus=64:ngpus=4:mem=480GB" in lines
    assert "#PBS -q main" in lines and "#PBS -A NCAR0001" in lines and "#PBS -l walltime=02:00:00" in lines
    # the environment comes first, then the gpuzarr settings, then the worker
    setup = lines.index("module load conda")
    assert lines[setup + 1] == "conda activate gz"
    io = lines.index("export DASK_GPUZARR__IO_THREADS=32")
    assert "export DASK_GPUZARR__BLOCK_SIZE__GPU=auto" in lines  # resolved on the worker, for its own GPU
    args = _worker_command(script)
    assert lines.index(" ".join(shlex.quote(a) for a in args)) > io > setup
    # one dask-cuda worker command per job: dask-cuda starts one process per GPU of the node
    assert args[:3] == ["python3", "-m", "dask_cuda.cli"]
    assert re.fullmatch(r"tcp://[\d.]+:\d+", args[3])
    assert _last(args, "--nthreads") == "8"
    assert _last(args, "--memory-limit") == "120GB"  # 480 GB shared by 4 GPU workers
    assert _last(args, "--device-memory-limit") == "0.8"
    assert _last(args, "--preload") == "gpuzarr_dist.distributed.preload"
    assert "--rmm-async" in args and _last(args, "--set-rmm-allocator-for-libs") == "cupy"
    assert "--nworkers" not in args


def test_pbs_cpu_nodes_and_slurm_gpu_directives():
    opts = jobqueue_options("pbs", device="cpu", cores=32, memory="128GB", threads_per_gpu=4)
    assert opts["resource_spec"] == "select=1:ncpus=32:mem=128GB" and opts["processes"] == 8
    assert "worker_command" not in opts
    cluster = dask_jobqueue.PBSCluster(**opts, scheduler_options=NO_DASHBOARD)
    try:
        args = _worker_command(cluster.job_script())
    finally:
        cluster.close()
    assert args[1:3] == ["-m", "distributed.cli.dask_worker"]
    assert _last(args, "--nworkers") == "8" and _last(args, "--nthreads") == "4"

    cluster = jobqueue_cluster("slurm", gpus_per_node=2, cores=16, memory="64GB", account="proj", queue="gpu",
                               scheduler_options=NO_DASHBOARD)
    try:
        script = cluster.job_script()
    finally:
        cluster.close()
    assert "#SBATCH --gres=gpu:2" in script and "#SBATCH -A proj" in script and "#SBATCH -p gpu" in script
    assert "#SBATCH --cpus-per-task=16" in script
    assert _last(_worker_command(script), "--memory-limit") == "32GB"
    with pytest.raises(ValueError, match="system must be"):
        jobqueue_options("lsf")
    with pytest.raises(ValueError, match="gpus_per_node"):
        jobqueue_options("slurm", gpus_per_node=0)


def test_job_script_runs_through_bash(tmp_path):
    """The generated prologue is valid shell that sets the settings the workers read."""
    with dask.config.set({"gpuzarr.block-size.gpu": "1 GiB"}):
        opts = jobqueue_options("slurm", device="cpu", cores=1, memory="1GB")
    script = "\n".join(opts["job_script_prologue"]) + (
        f"\n{shlex.quote(sys.executable)} -c 'import dask, gpuzarr_dist; print(dask.config.get(\"gpuzarr.block-size.gpu\"))'")
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1 GiB"


# -- a real Slurm -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    from tests.helpers.slurm_local import SlurmUnavailable, local_slurm

    root = str(tmp_path_factory.mktemp("slurm"))
    try:
        ctx = local_slurm(root)
        env = ctx.__enter__()
    except SlurmUnavailable as e:
        pytest.skip(f"no local Slurm: {e}")
    try:
        yield env
    finally:
        ctx.__exit__(None, None, None)


@pytest.mark.slow
def test_slurm_cluster_reduces_a_zarr_array(slurm, tmp_path, monkeypatch):
    for k, v in slurm.items():
        monkeypatch.setenv(k, v)
    path = str(tmp_path / "t.zarr")
    data = make_data("float32", (24, 40, 30), seed=11, specials=False)
    write_array(path, data, (2, 40, 30))
    ref = reference(path)

    cluster = jobqueue_cluster(
        "slurm", device="cpu", jobs=2, cores=1, memory="1GB", threads_per_gpu=1, walltime="00:10:00",
        setup=[f"export PYTHONPATH={shlex.quote(ROOT)}"], local_directory=str(tmp_path / "work"),
        log_directory=str(tmp_path / "logs"), python=sys.executable, scheduler_options=NO_DASHBOARD,
    )
    try:
        with gz.start_cluster(address=cluster.scheduler_address, quiet=True) as client:
            try:
                client.wait_for_workers(2, timeout=120)
            except Exception:
                logs = "".join(open(os.path.join(tmp_path / "logs", f)).read()[-1500:]
                               for f in os.listdir(tmp_path / "logs"))
                pytest.fail(f"Slurm workers did not start: {logs}")
            # the workers run inside Slurm jobs, set up by the preload
            jobs = client.run(lambda: os.environ.get("SLURM_JOB_ID"))
            assert len(jobs) == 2 and all(jobs.values()) and len(set(jobs.values())) == 2, jobs
            states = client.run(cluster_mod.worker_state)
            assert all(s.get("device") == "cpu" for s in states.values()), states

            x = gz.from_zarr_gpu(path, device="cpu", chunks=(4, 40, 30))
            mean, total = client.compute([x.mean(axis=0, dtype="float64"), x.sum(dtype="float64")], sync=True)
            np.testing.assert_allclose(mean, ref.mean(axis=0, dtype="float64"), rtol=1e-12)
            np.testing.assert_allclose(total, ref.sum(dtype="float64"), rtol=1e-12)
            # both jobs did work
            done = client.run(lambda dask_worker: len(dask_worker.state.log) > 0)
            assert all(done.values())
    finally:
        cluster.close()
    # the jobs are gone from the queue once the cluster is closed
    deadline = time.monotonic() + 30
    while True:
        q = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=30)
        if not q.stdout.strip() or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not q.stdout.strip(), q.stdout


@pytest.mark.parametrize("system", ["pbs", "slurm"])
def test_ready_configuration_files(system):
    """cluster/<system>/jobqueue.yaml gives the same worker command as jobqueue_cluster."""
    import yaml

    with open(os.path.join(ROOT, "cluster", system, "jobqueue.yaml")) as f:
        conf = yaml.safe_load(f)
    cls = dask_jobqueue.PBSCluster if system == "pbs" else dask_jobqueue.SLURMCluster
    # as a file in ~/.config/dask would: merged over dask-jobqueue's defaults
    with dask.config.set({f"jobqueue.{system}.{k}": v for k, v in conf["jobqueue"][system].items()}):
        cluster = cls(scheduler_options=NO_DASHBOARD, account="proj")
        try:
            script = cluster.job_script()  # jobs read the config when they are made
        finally:
            cluster.close()
    args = _worker_command(script)
    assert args[1:3] == ["-m", "dask_cuda.cli"]
    assert _last(args, "--nthreads") == "8" and _last(args, "--memory-limit") == "120GB"
    assert _last(args, "--preload") == "gpuzarr_dist.distributed.preload" and "--rmm-async" in args
    assert "conda activate gpuzarr" in script
    assert ("#PBS -l select=1:ncpus=64:ngpus=4:mem=480GB" in script if system == "pbs"
            else "#SBATCH --gres=gpu:4" in script)
