"""Run a GPU time mean on PBS nodes of 4 GPUs (NCAR Derecho style) from a login node or JupyterHub.

    python cluster/pbs/derecho.py /glade/derecho/scratch/$USER/era5.zarr --component t2m --account NCAR0001 --nodes 2

Submits NODES jobs of one node each (4 dask-cuda workers per job, one per GPU), reads the array with
from_zarr_gpu and prints its time mean's range. Add --print-job to see the job script without submitting.
"""

from __future__ import annotations

import argparse

import gpuzarr_dist as gz
from gpuzarr_dist.distributed.jobqueue import jobqueue_cluster


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("store")
    p.add_argument("--component")
    p.add_argument("--account", required=True)
    p.add_argument("--queue", default="main")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--walltime", default="01:00:00")
    p.add_argument("--setup", action="append", default=["module load conda", "conda activate gpuzarr"],
                   help="shell lines run before the worker (repeat)")
    p.add_argument("--print-job", action="store_true")
    a = p.parse_args()
    cluster = jobqueue_cluster("pbs", gpus_per_node=4, cores=64, memory="480GB", account=a.account,
                               queue=a.queue, walltime=a.walltime, setup=a.setup)
    if a.print_job:
        print(cluster.job_script())
        cluster.close()
        return
    cluster.scale(jobs=a.nodes)
    with gz.start_cluster(address=cluster.scheduler_address) as client:
        client.wait_for_workers(4 * a.nodes)
        x = gz.from_zarr_gpu(a.store, component=a.component)
        m = x.mean(axis=0).compute()
        m = m.get() if hasattr(m, "get") else m
        print(f"time mean of {x.shape} {x.dtype}: {float(m.min()):.3f} .. {float(m.max()):.3f}")
    cluster.close()


if __name__ == "__main__":
    main()
