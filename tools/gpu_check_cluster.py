"""GPU check of start_cluster (run on a machine with 1+ GPUs, dask-cuda, rmm, pynvml installed).

    python tools/gpu_check_cluster.py [--gpus N] [--time-steps T]

1. start_cluster(device="gpu"): one dask-cuda worker per GPU, each on its own device, the shared pool
   set up (CuPy allocator = RMM);
2. a from_zarr_gpu time mean of an ERA5-like store on that cluster equals the float64 reference, and
   every worker ran blocks; partial results only travelled between workers;
3. the peak device memory per worker stays below the device.
Prints what it saw; exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--gpus", type=int, default=None)
    p.add_argument("--time-steps", type=int, default=240)
    a = p.parse_args()
    import distributed

    import gpuzarr_dist as gz
    from gpuzarr_dist.demo import make_era5_like
    from gpuzarr_dist.distributed import cluster as cm

    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        store = make_era5_like(os.path.join(tmp, "era5.zarr"), a.time_steps)
        with gz.start_cluster(a.gpus, device="gpu", dashboard_address=None) as client:
            states = client.run(cm.worker_state)
            print("worker setup:", states)
            devices = client.run(lambda: (os.environ.get("CUDA_VISIBLE_DEVICES"),
                                          __import__("cupy").cuda.get_allocator().__module__))
            print("CUDA_VISIBLE_DEVICES, cupy allocator per worker:", devices)
            firsts = {v[0].split(",")[0] for v in devices.values()}
            if len(firsts) != len(devices):
                failures.append(f"workers share a first device: {devices}")
            if not all(s.get("device") == "gpu" and ("RMM" in s.get("pool", "") or "CuPy" in s.get("pool", "")) for s in states.values()):
                failures.append(f"pool not shared in every worker: {states}")
            from gpuzarr_dist.bench.scale import _start_sampler, _stop_sampler

            x = gz.from_zarr_gpu(store.path)
            x.mean(axis=0).compute()
            client.run(_start_sampler)
            client.run(lambda dask_worker: dask_worker.transfer_incoming_log.clear())
            with distributed.get_task_stream(client) as ts:
                t0 = time.perf_counter()
                m = x.mean(axis=0).compute()
                dt = time.perf_counter() - t0
            peaks = client.run(_stop_sampler)
            m = m.get()
            err = float(np.max(np.abs(m - store.reference_mean()) / np.abs(store.reference_mean())))
            print(f"time mean of {x.nbytes / 1e9:.2f} GB in {dt:.2f} s ({x.nbytes / dt / 1e9:.1f} GB/s), "
                  f"max rel error {err:.1e}")
            if err > 1e-5:
                failures.append(f"wrong mean (rel error {err:.1e})")
            ran = {t["worker"] for t in ts.data if str(t["key"]).find("mean_chunk") >= 0}
            print(f"workers that read blocks: {len(ran)} of {len(states)}")
            if len(ran) != len(states):
                failures.append("not every GPU worker read blocks")
            moved = client.run(lambda dask_worker: [n for e in dask_worker.transfer_incoming_log
                                                    for n in e["keys"].values()])
            block = x.nbytes / x.numblocks[0]
            biggest = max((n for v in moved.values() for n in v), default=0)
            print(f"largest transfer between workers {biggest / 1e6:.1f} MB (one block {block / 1e6:.1f} MB)")
            if biggest >= block / 2:
                failures.append("a transfer as large as a block")
            for w, (peak, total) in peaks.items():
                print(f"{w}: peak device memory {peak / 1e9:.1f} of {total / 1e9:.1f} GB")
                if peak >= total:
                    failures.append(f"{w}: device memory not bounded")
    for f in failures:
        print("FAIL:", f)
    print("OK" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
