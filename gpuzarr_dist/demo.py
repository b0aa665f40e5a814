"""The demo: write an ERA5-like temperature store, then reduce it over time with gpuzarr-dist.

The store comes from :func:`make_era5_like` (:mod:`gpuzarr_dist.synthetic`,
importable from here too): a group holding the array ``t2m`` (time, latitude,
longitude) and its coordinates, as the examples in the documentation expect.
It sums every value in float64 while writing: the reference :func:`run_demo`
checks its answer against.

:func:`run_demo` reads the store with :func:`gpuzarr_dist.from_zarr_gpu`,
computes ``x.mean(axis=0)`` under a dask progress bar (on a machine with
several GPUs, on a :func:`~gpuzarr_dist.start_cluster` cluster with one worker
per GPU), checks the result, and reports the device, the time and the
throughput in GB/s of decompressed data, in all and per GPU.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from gpuzarr_dist.synthetic import DEFAULT_TIME_STEPS, NLAT, NLON, Era5Store, existing_store, make_era5_like

__all__ = ["COMPONENT", "DEFAULT_TIME_STEPS", "DemoResult", "Era5Store", "RTOL", "device_line", "make_era5_like", "run_demo"]

#: the demo's mean must match the float64 reference to this relative tolerance
RTOL = 1e-5
#: the demo store's array, inside the group the demo writes
COMPONENT = "t2m"


@dataclass(frozen=True)
class DemoResult:
    """What :func:`run_demo` measured."""

    path: str
    device: str
    device_reason: str
    shape: tuple[int, ...]
    nbytes: int
    stored_bytes: int
    seconds: float
    max_rel_error: float
    ok: bool
    global_mean: float
    reused: bool
    workers: int = 1

    @property
    def gb_per_s_per_worker(self) -> float:
        return self.gb_per_s / max(1, self.workers)

    @property
    def gb_per_s(self) -> float:
        return self.nbytes / self.seconds / 1e9 if self.seconds > 0 else float("inf")


def device_line(asked: str) -> tuple[str, str]:
    """``(device, why)`` for ``device=asked``; raises DeviceUnavailableError for an unusable "gpu"."""
    from gpuzarr_dist.cuda.device import gpu_status, resolve_device

    dev = resolve_device(asked)
    ok, why = gpu_status()
    if asked == "cpu":
        return dev, "asked for" + ("" if ok else f"; no usable GPU: {why}")
    if dev == "gpu":
        return dev, why
    return dev, f"no usable GPU: {why}"


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def _to_numpy(a: Any) -> np.ndarray:
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


@contextmanager
def _scheduler(n_gpus: int, out: IO[str]) -> Iterator[Callable[[Any], Any]]:
    """Where the demo computes: dask's threads on one device, else a cluster of one worker per GPU.

    Yields ``compute(collection)``, which computes under a progress bar.
    """
    if n_gpus <= 1:
        from dask.diagnostics import ProgressBar

        def local(c: Any) -> Any:
            with ProgressBar(out=out):
                return c.compute()

        yield local
        return
    from distributed import progress

    from gpuzarr_dist.distributed.cluster import start_cluster

    print(f"  {'cluster':<11}starting one worker per GPU ({n_gpus} GPUs) ...", file=out, flush=True)
    with start_cluster(n_gpus, device="gpu", dashboard_address=None, quiet=True) as client:
        print(f"  {'cluster':<11}{len(client.scheduler_info(n_workers=-1)['workers'])} worker(s) ready", file=out,
              flush=True)

        def on_cluster(c: Any) -> Any:
            future = client.compute(c)
            progress(future, notebook=False)
            return future.result()

        yield on_cluster


def _free_bytes(path: str) -> int:
    probe = path
    while not os.path.exists(probe):
        probe = os.path.dirname(probe) or "."
    return shutil.disk_usage(probe).free


def run_demo(
    path: str | os.PathLike | None = None,
    time_steps: int | None = None,
    device: str = "auto",
    keep: bool = False,
    out: IO[str] | None = None,
    gpus: int | None = None,
) -> DemoResult:
    """Write (or reuse) an ERA5-like store, compute its time mean with gpuzarr-dist and check it.

    ``path``: where the store goes (a group with the array :data:`COMPONENT`,
    kept afterwards); by default a temporary directory, removed at the end
    unless ``keep``. ``time_steps``: by default 600 per GPU (about 2.5 GB
    each) and 48 on a CPU. ``device``: "auto", "gpu" or "cpu". ``gpus``: how
    many GPUs to use (default: all; with more than one, a
    :func:`~gpuzarr_dist.start_cluster` cluster with one worker per GPU).
    Progress and results are printed to ``out`` (default stdout).
    """
    from gpuzarr_dist import config
    from gpuzarr_dist.array.read import from_zarr_gpu
    from gpuzarr_dist.cuda.device import device_count, gpu_memory_bytes

    out = out if out is not None else sys.stdout

    def say(key: str, text: str) -> None:
        print(f"  {key:<11}{text}", file=out, flush=True)

    dev, why = device_line(device)
    n_gpus = (gpus or device_count()) if dev == "gpu" else 1
    if dev == "gpu" and gpus is not None and not 1 <= gpus <= device_count():
        raise ValueError(f"gpus={gpus} asked for, but this process sees {device_count()} GPU(s)")
    tmpdir = None
    if path is None:
        tmpdir = tempfile.mkdtemp(prefix="gpuzarr-demo-")
        store_path = os.path.join(tmpdir, "era5.zarr")
    else:
        store_path = os.path.abspath(os.fspath(path))
    try:
        print("gpuzarr-dist demo: time mean of an ERA5-like temperature field", file=out)
        found = existing_store(store_path, COMPONENT, time_steps) if tmpdir is None else None
        if found is not None:
            store = found
            say("store", f"{store_path} (reused, {store.shape[0]} time steps)")
        else:
            steps = time_steps if time_steps is not None else DEFAULT_TIME_STEPS[dev] * n_gpus
            need = steps * NLAT * NLON * 4
            if _free_bytes(store_path) < need:
                raise OSError(
                    f"not enough free disk space for {_gb(need)} of demo data at {store_path}; "
                    "pass --path on a larger disk or fewer --time-steps"
                )
            say("store", f"{store_path} (new: {steps} time steps, {_gb(need)})")
            store = make_era5_like(store_path, steps, component=COMPONENT, reuse=False, progress=out,
                                   processes=min(8, os.cpu_count() or 1) if steps >= 256 else 1)
        stored = store.stored_bytes()

        say("device", f"{dev} ({why})")
        x = from_zarr_gpu(store.path, component=store.component, device=dev)
        say("array", f"float32 {store.shape}, chunks (1, {NLAT}, {NLON}), zstd level 0: "
                     f"{_gb(store.nbytes)} decompressed, {_gb(stored)} on disk (ratio {store.nbytes / max(stored, 1):.2f})")
        say("blocks", f"{x.npartitions} dask blocks of up to {tuple(c[0] for c in x.chunks)} "
                      f"(gpuzarr.block-size.{dev} = {config.get(f'gpuzarr.block-size.{dev}')}, "
                      f"{_gb(config.block_size_bytes(dev, gpu_memory_bytes))})")
        with _scheduler(n_gpus, out) as progress:
            # one untimed pass first: it pays the start-up of every worker thread (thread pools; on a
            # GPU the CUDA context, each thread's stream, pinned buffers, nvCOMP handles, kernels)
            t0 = time.perf_counter()
            _to_numpy(x.mean(axis=0).compute())
            say("warm-up", f"one untimed pass in {time.perf_counter() - t0:.2f} s (start-up costs, not timed below)")
            print("computing x.mean(axis=0)", file=out, flush=True)
            mean_graph = x.mean(axis=0)
            t0 = time.perf_counter()
            result = progress(mean_graph)
            seconds = time.perf_counter() - t0
            m = _to_numpy(result)

        ref = store.reference_mean()
        rel = np.abs(m.astype(np.float64) - ref) / np.abs(ref)
        max_rel = float(np.nanmax(rel)) if rel.size else 0.0
        ok = bool(m.shape == ref.shape and np.allclose(m, ref, rtol=RTOL, atol=0.0))
        weights = np.cos(np.deg2rad(np.linspace(90.0, -90.0, NLAT)))[:, None]
        global_mean = float((m * weights).sum() / (weights.sum() * NLON))
        gbps = store.nbytes / seconds / 1e9 if seconds > 0 else float("inf")

        say("elapsed", f"{seconds:.2f} s")
        cache = "" if store.reused else "; files just written, so read from the page cache"
        say("throughput", f"{gbps:.2f} GB/s of decompressed data ({_gb(store.nbytes)} in {seconds:.2f} s{cache})")
        if n_gpus > 1:
            say("per GPU", f"{gbps / n_gpus:.2f} GB/s on each of {n_gpus} GPUs")
        if ok:
            say("check", f"matches the float64 mean summed while writing (max relative error {max_rel:.1e}, rtol {RTOL:g})")
        else:
            say("check", f"MISMATCH against the float64 mean summed while writing (max relative error {max_rel:.1e}, rtol {RTOL:g})")
        say("result", f"global mean {global_mean:.2f} K (area-weighted); equator at 0E {m[NLAT // 2, 0]:.2f} K, "
                      f"north pole {m[0, 0]:.2f} K, south pole {m[-1, 0]:.2f} K")
        return DemoResult(store.path, dev, why, store.shape, store.nbytes, stored, seconds, max_rel, ok,
                          global_mean, store.reused, n_gpus)
    finally:
        if tmpdir is not None:
            if keep:
                say("kept", store_path)
            else:
                shutil.rmtree(tmpdir, ignore_errors=True)
