"""``gpuzarr-dist bench scale``: read + time mean on 1, 2 and 4 GPUs of one machine (one worker per GPU),
beside the aggregate read ceiling measured in the same run, and one reduction over a dataset larger
than one GPU's memory with the device memory it used.

Data: one ERA5-like store per GPU (``--gb-per-gpu`` GB decompressed each, float32 (t, 721, 1440),
zstd), so N workers read N stores' worth of files. Rows:

- ``ceiling, N GPUs``: N worker processes at once, each reading its own store's files with its
  threads into pinned buffers and copying them to its GPU, no decode (``bench.files.read_ceiling``
  run in the workers through ``client.run``); the shared host read path is the limit it shows.
- ``time mean, N GPUs``: ``da.concatenate`` of the N stores, ``.mean(axis=0)`` on a
  ``start_cluster(N)`` cluster.
- ``larger than one GPU``: the time mean over every store on one GPU worker, with the peak device
  memory that worker used (sampled), which must stay below the GPU's memory.

``--quick`` (or no GPU) runs a small version on 1 and 2 CPU worker processes.
"""

from __future__ import annotations

import os
import platform
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

from gpuzarr_dist.bench.files import chunk_files
from gpuzarr_dist.bench.report import Row, save

STEP_BYTES = 721 * 1440 * 4
_sampler: dict[str, Any] = {}


def _start_sampler(interval: float = 0.02) -> None:
    """In a worker: sample this process's GPU memory in use (device total - free) until stopped."""
    import cupy

    stop = threading.Event()
    peak = [0]

    def loop() -> None:
        while not stop.is_set():
            free, total = cupy.cuda.runtime.memGetInfo()
            peak[0] = max(peak[0], total - free)
            stop.wait(interval)

    t = threading.Thread(target=loop, daemon=True, name="gpuzarr-memory-sampler")
    _sampler.update(stop=stop, peak=peak, thread=t)
    t.start()


def _stop_sampler() -> tuple[int, int]:
    """``(peak bytes in use, device total)`` since :func:`_start_sampler`."""
    import cupy

    _sampler["stop"].set()
    _sampler["thread"].join()
    return int(_sampler["peak"][0]), int(cupy.cuda.runtime.memGetInfo()[1])


def _ceiling_in_worker(files_by_worker: dict, threads: int, device: str, dask_worker: Any = None) -> tuple[float, int]:
    from gpuzarr_dist.bench.files import read_ceiling

    files = files_by_worker.get(dask_worker.address, [])
    return read_ceiling(files, threads, device) if files else (0.0, 0)


def _gpu_count() -> int:
    from gpuzarr_dist.distributed.gpus import visible_devices

    listed = visible_devices()
    if listed is not None:
        return len(listed)
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


def _make_store(path: str, steps: int, seed: int) -> Any:
    from gpuzarr_dist.synthetic import make_era5_like

    return make_era5_like(path, steps, seed=seed)


def run(args: Any) -> int:
    import dask.array as da

    from gpuzarr_dist.array.read import from_zarr_gpu
    from gpuzarr_dist.cuda.device import gpu_status, resolve_device
    from gpuzarr_dist.distributed.cluster import start_cluster

    device = resolve_device(getattr(args, "device", "auto") or "auto")
    quick = bool(getattr(args, "quick", False)) or device == "cpu"
    if device == "cpu" and not getattr(args, "quick", False):
        print("no GPU: running the quick CPU version (1 and 2 worker processes)")
    available = _gpu_count() if device == "gpu" else 2
    counts = sorted(set(getattr(args, "gpus", None) or ([1, 2] if quick else [1, 2, 4])))
    counts = [n for n in counts if n <= available] or [1]
    gb = getattr(args, "gb_per_gpu", None) or (0.05 if quick else 40.0)
    threads = getattr(args, "threads", None) or (1 if device == "cpu" else 8)
    steps = max(2, int(gb * 1e9 // STEP_BYTES))
    tmp = None
    root = getattr(args, "path", None)
    if root is None:
        tmp = tempfile.TemporaryDirectory(prefix="gpuzarr-scale-")
        root = tmp.name
    nstores = max(counts)
    # one process per store: tens of GB per GPU are generated and compressed in parallel
    paths = [os.path.join(root, f"era5-{i}.zarr") for i in range(nstores)]
    with ProcessPoolExecutor(min(nstores, os.cpu_count() or 1), mp_context=get_context("spawn")) as pool:
        stores = list(pool.map(_make_store, paths, [steps] * nstores, range(nstores)))
    files = [chunk_files(s.path) for s in stores]
    stored = [sum(os.path.getsize(p) for p in f) for f in files]
    nbytes = steps * STEP_BYTES
    print(f"{nstores} store(s) of float32 ({steps}, 721, 1440), zstd: {nbytes / 1e9:.2f} GB decompressed, "
          f"{stored[0] / 1e9:.2f} GB stored each")
    print(f"device: {device} ({gpu_status()[1]}); {threads} threads per worker; {platform.node()}")

    rows: list[Row] = []
    results: dict[int, dict[str, float]] = {}
    for n in counts:
        with start_cluster(n, threads_per_gpu=threads, device=device, quiet=True, dashboard_address=None) as client:
            workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
            by_worker = {w: files[i] for i, w in enumerate(workers)}
            client.run(_ceiling_in_worker, by_worker, threads, device)  # warm: buffers, page cache
            t0 = time.perf_counter()
            client.run(_ceiling_in_worker, by_worker, threads, device)
            t_ceil = time.perf_counter() - t0
            comp = sum(stored[:n])
            rows.append(Row(f"ceiling: {n} process(es) read own files" + (" + copy to GPU" if device == "gpu" else ""),
                            "warm", t_ceil, n * nbytes, note=f"{comp / t_ceil / 1e9:.2f} GB/s stored bytes"))
            x = da.concatenate([from_zarr_gpu(s.path, device=device) for s in stores[:n]], axis=0)
            x.mean(axis=0).compute()  # warm-up: imports, CUDA contexts, nvCOMP handles
            t0 = time.perf_counter()
            float(x.mean(axis=0).compute()[0, 0])
            t_mean = time.perf_counter() - t0
            rows.append(Row(f"time mean, {n} {'GPU' if device == 'gpu' else 'worker'}(s)", "warm", t_mean,
                            n * nbytes, note=f"{comp / t_mean / 1e9:.2f} GB/s stored bytes"))
            results[n] = {"mean": comp / t_mean, "ceiling": comp / t_ceil}

    large = None
    if not getattr(args, "no_large", False):
        with start_cluster(1, threads_per_gpu=threads, device=device, quiet=True, dashboard_address=None) as client:
            x = da.concatenate([from_zarr_gpu(s.path, device=device) for s in stores], axis=0)
            if device == "gpu":
                client.run(_start_sampler)
            t0 = time.perf_counter()
            m = x.mean(axis=0).compute()
            t_large = time.perf_counter() - t0
            m = m.get() if hasattr(m, "get") else m
            peak, total = next(iter(client.run(_stop_sampler).values())) if device == "gpu" else (0, 0)
        import numpy as np

        ref = sum(s.reference_mean() for s in stores) / len(stores)
        err = float(np.max(np.abs(m - ref) / np.abs(ref)))
        note = f"max rel. error {err:.1e}"
        if device == "gpu":
            note += f"; peak device memory {peak / 1e9:.1f} of {total / 1e9:.1f} GB"
            if x.nbytes <= total:
                note += " (dataset not larger than the GPU: raise --gb-per-gpu)"
        rows.append(Row(f"larger than one GPU: {x.nbytes / 1e9:.0f} GB on 1 worker", "warm", t_large, x.nbytes,
                        note=note))
        large = {"nbytes": x.nbytes, "peak": peak, "total": total, "error": err}

    print(f"{'row':<52} {'seconds':>8} {'GB/s':>7}  note")
    for r in rows:
        print(f"{r.name:<52} {r.seconds:8.2f} {r.gbps:7.2f}  {r.note}")
    base = results.get(1, {}).get("mean")
    for n, res in results.items():
        speed = f", {res['mean'] / base:.2f}x one" if base and n > 1 else ""
        print(f"{n} worker(s): time mean at {res['mean'] / res['ceiling']:.0%} of the aggregate ceiling{speed}")
    if device == "gpu":
        if 4 in results:
            print(f"target 4 GPUs >= 75% of the ceiling: {'met' if results[4]['mean'] >= 0.75 * results[4]['ceiling'] else 'NOT met'}")
        if 2 in results and base:
            print(f"target 2 GPUs >= 1.8x one: {'met' if results[2]['mean'] >= 1.8 * base else 'NOT met'}")
        if large:
            ok = large["peak"] < large["total"] and large["error"] < 1e-5
            print(f"larger-than-GPU reduction: {'completed, bounded' if ok else 'PROBLEM'} "
                  f"(peak {large['peak'] / 1e9:.1f} GB of {large['total'] / 1e9:.1f} GB)")
    meta = {"device": device, "threads": threads, "time_steps": steps, "stores": nstores, "counts": counts,
            "host": platform.node(), "quick": quick, "large": large}
    out_dir = getattr(args, "out", None) or "bench-results"
    print("saved:", ", ".join(save(rows, out_dir, "bench-scale", f"read + time mean on 1..{max(counts)} workers", meta)))
    if tmp is not None:
        tmp.cleanup()
    if large and large["error"] >= 1e-5:
        return 1
    return 0
