"""``gpuzarr-dist bench climate``: a monthly climatology and its anomaly, written back to Zarr, end to end,
on 1, 2 (and 4) GPUs against the same pipeline in plain dask on all of the machine's CPU cores.

The workload, as an xarray user writes it::

    ds = gz.open_dataset(store)                                    # CPU row: xr.open_zarr(store, chunks="auto")
    t2m = ds.t2m
    clim = groupby(t2m, "time.month").mean("time").persist()        # CPU row: t2m.groupby("time.month") (flox)
    anom = groupby(t2m, "time.month") - clim
    gz.to_zarr_gpu(anom.to_dataset(name="t2m_anomaly"), out)        # CPU row: .to_zarr(out)

``groupby`` is :func:`gpuzarr_dist.xarray.groupby.groupby`, a stand-in for
``t2m.groupby`` that runs the mean and the subtraction as a fixed number of
tasks per block on the block's device (flox, xarray's engine for grouped
reductions, cannot reduce cupy blocks; see docs/performance.md). The
climatology is persisted on the workers before the anomaly is built, as a dask
user does, so the data is read twice: GB/s are of the decompressed bytes read
(twice the dataset), over the whole pipeline.

Data: one ERA5-like group (:func:`gpuzarr_dist.synthetic.make_era5_dataset`),
float32 ``(time, 721, 1440)``, daily, one chunk per step, zstd; 40 GB by
default on a machine with two GPUs or more (20 GB with one). Rows:

- ``dask on the CPU``: ``xr.open_zarr`` (zarr-python reads), numpy blocks,
  xarray's groupby (through flox when installed), ``to_zarr``, on a
  ``LocalCluster`` using every CPU core, over the first ``--cpu-gb`` GB of the
  time axis (the same pipeline on less data: its GB/s are comparable, its
  seconds are not). Its output is the reference.
- ``gpuzarr-dist, N GPU(s)``: the workload above on ``start_cluster(N)``, over
  the whole dataset. Each row first runs the workload on the CPU row's time
  range (the warm-up), and that output is compared with the CPU row's
  (maximum absolute error, and that error relative to the largest value);
  three time steps of the full output are checked against the input minus the
  row's climatology.
- ``--xarray-row``: xarray's own ``t2m.groupby`` on one GPU (without flox),
  over the CPU row's time range, to show what the stand-in saves.

Each row is warmed, then timed ``--repeats`` times (best and median). Each
GPU row then runs once more with the stages of :mod:`gpuzarr_dist.runtime.stages`
recorded in every worker (:func:`staged_run`): per phase, how many of a
worker's threads were in file reads, encodes and object writes, and the
bytes they moved; every row is then compared with the first.
``--quick`` (or no GPU) runs a small grid on 1 and 2 CPU worker processes.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import shutil
import statistics
import time
import warnings
from typing import Any

import numpy as np

from gpuzarr_dist.bench.files import data_folder
from gpuzarr_dist.bench.report import Row, save
from gpuzarr_dist.runtime.stages import READ_STAGES, summed

OUT_NAME = "t2m_anomaly"
#: largest error allowed, in float32 roundings of the climatology's largest value: float32 means differ by a few
#: (xarray's on numpy by up to 3 at 300 K, the rows here sum in float64); a wrong group is off by kelvins
TOLERANCE_ULPS = 64
#: the target of the 4-GPU row: at least this many times the 1-GPU row's rate
TARGET_4 = 3.4
#: what a row's staged run reports, in this order: a name and the stages (:mod:`gpuzarr_dist.runtime.stages`)
#: it sums
STAGE_GROUPS = (("file reads", READ_STAGES), ("encode", ("write: encode",)), ("object writes", ("write: object writes",)))
#: the grid of --quick: 2.5 degrees
QUICK_GRID = (73, 144)
#: daily steps of --quick: a year and a month, so that every month is there
QUICK_STEPS = 396


# -- the workloads -------------------------------------------------------------------------------------


def _wait(obj: Any) -> None:
    from distributed import futures_of, wait

    wait(futures_of(obj))


def _persisted_keys(result: Any) -> set:
    """The keys of ``result``'s data persisted on the cluster."""
    from distributed import futures_of

    return {f.key for f in futures_of(result)} if result is not None else set()


def _released(keys: set, timeout: float = 30.0) -> None:
    """Wait until the client has let go of ``keys`` (their last reference dropped by the caller).

    The runs build the same keys: data still held when the next run persists would stand in for its
    computation. The release goes out on the client's event loop, ahead of the next run's graph.
    """
    import gc

    from distributed import get_client

    if not keys:
        return
    gc.collect()  # a persisted graph can sit in a reference cycle that keeps its futures alive
    client, deadline = get_client(), time.monotonic() + timeout
    while held := keys & set(client.futures):
        if time.monotonic() > deadline:
            raise RuntimeError(f"bench climate: {len(held)} persisted results of the previous run are still referenced")
        time.sleep(0.01)


def _to_host(block: Any) -> np.ndarray:
    return block.get() if hasattr(block, "get") else np.asarray(block)


def _host_values(arr: Any) -> np.ndarray:
    """A (persisted) DataArray's values as numpy, copied off the device on the workers."""
    data = arr.data
    if hasattr(data, "map_blocks"):
        return np.asarray(data.map_blocks(_to_host, meta=np.empty((0,) * data.ndim, dtype=data.dtype)).compute())
    return _to_host(data)


def _output_chunks(ds: Any) -> dict:
    return {"time": 1, "latitude": ds.sizes["latitude"], "longitude": ds.sizes["longitude"]}


def gpuzarr_workload(store: str, out: str, device: str, steps: int | None = None,
                     xarray_groupby: bool = False, between: Any = None) -> tuple[float, float, Any]:
    """The gpuzarr rows' pipeline on the connected cluster; ``(climatology s, anomaly s, climatology)``.

    ``steps``: only the first ``steps`` time steps. ``xarray_groupby``: xarray's
    own ``groupby`` (without flox on the GPU) instead of the stand-in.
    ``between``: called (untimed) once the climatology is persisted, before the anomaly starts.
    """
    import xarray as xr

    import gpuzarr_dist as gz
    from gpuzarr_dist.xarray.groupby import groupby

    t0 = time.perf_counter()
    ds = gz.open_dataset(store, device=device)  # dask arrays of gpuzarr blocks (the engine reads lazily into numpy)
    if steps is not None:
        ds = ds.isel(time=slice(0, steps))
    t2m = ds.t2m

    def grouped() -> Any:
        return t2m.groupby("time.month") if xarray_groupby else groupby(t2m, "time.month")

    # flox's engines cannot reduce cupy blocks: xarray's own groupby runs without it on the GPU
    with xr.set_options(use_flox=device != "gpu") if xarray_groupby else contextlib.nullcontext():
        clim = grouped().mean("time").persist()
        _wait(clim)
        t1 = time.perf_counter()
        if between is not None:
            between()
        t2 = time.perf_counter()
        anom = grouped() - clim
    result = anom.to_dataset(name=OUT_NAME).drop_encoding()
    gz.to_zarr_gpu(result, out, chunks=_output_chunks(result), overwrite=True, device=device)
    return t1 - t0, time.perf_counter() - t2, clim


def dask_cpu_workload(store: str, out: str, steps: int | None = None) -> tuple[float, float, Any]:
    """The CPU row's pipeline (zarr-python, numpy, xarray's groupby, ``to_zarr``) on the connected cluster."""
    import xarray as xr

    t0 = time.perf_counter()
    ds = xr.open_zarr(store, chunks="auto")
    if steps is not None:
        ds = ds.isel(time=slice(0, steps))
    t2m = ds.t2m
    clim = t2m.groupby("time.month").mean("time").persist()
    _wait(clim)
    t1 = time.perf_counter()
    anom = t2m.groupby("time.month") - clim
    result = anom.to_dataset(name=OUT_NAME).drop_encoding()
    chunks = _output_chunks(result)
    with warnings.catch_warnings():  # zarr-python notes that consolidated metadata is not in the v3 spec yet
        warnings.filterwarnings("ignore", "Consolidated metadata", UserWarning)
        result.to_zarr(out, mode="w", zarr_format=3, consolidated=True,
                       encoding={OUT_NAME: {"chunks": tuple(chunks[d] for d in result[OUT_NAME].dims)}})
    return t1 - t0, time.perf_counter() - t1, clim


# -- checks ---------------------------------------------------------------------------------------------


def compare_outputs(got: str, ref: str, slab: int = 64) -> tuple[float, float]:
    """``(max |got - ref|, max |ref|)`` over two anomaly stores (read with zarr-python); NaNs must match."""
    import zarr

    a = zarr.open_array(got, path=OUT_NAME, mode="r")
    b = zarr.open_array(ref, path=OUT_NAME, mode="r")
    if a.shape != b.shape:
        raise AssertionError(f"{got}: shape {a.shape}, the reference {ref} has {b.shape}")
    err = scale = 0.0
    for t in range(0, a.shape[0], slab):
        x, y = a[t:t + slab], b[t:t + slab]
        nx, ny = np.isnan(x), np.isnan(y)
        if not np.array_equal(nx, ny):
            raise AssertionError(f"{got}: NaNs where the reference has none (or the other way) in steps {t}..")
        if (~ny).any():
            err = max(err, float(np.max(np.abs(x[~nx].astype(np.float64) - y[~ny]))))
            scale = max(scale, float(np.max(np.abs(y[~ny]))))
    return err, scale


def spot_check(store: str, out: str, clim: np.ndarray, months: np.ndarray) -> tuple[float, float]:
    """``(max error, max |expected|)`` of three steps of an anomaly against input minus climatology (numpy)."""
    import zarr

    src = zarr.open_array(store, path="t2m", mode="r")
    dst = zarr.open_array(out, path=OUT_NAME, mode="r")
    err = scale = 0.0
    for t in sorted({0, src.shape[0] // 2, src.shape[0] - 1}):
        expected = src[t].astype(np.float64) - clim[int(months[t])]
        err = max(err, float(np.nanmax(np.abs(dst[t] - expected))))
        scale = max(scale, float(np.nanmax(np.abs(expected))))
    return err, scale


def _month_index(store: str, name: str = "t2m") -> np.ndarray:
    """Each time step's position in the sorted months (the climatology's order)."""
    import xarray as xr

    with xr.open_zarr(store) as ds:
        months = ds.time.dt.month.values
    return np.searchsorted(np.unique(months), months)


# -- where the time goes -----------------------------------------------------------------------------------


def stage_load(snap: dict[str, tuple[float, int, int]], wall: float) -> dict[str, dict[str, float]]:
    """One worker's stages over one phase of ``wall`` seconds, per group of :data:`STAGE_GROUPS`: ``threads``,
    the seconds summed over the worker's threads over ``wall`` (how many of its threads were in the stage at
    once, on average; a worker's blocks take turns to read, so reads are at most 1), ``bytes`` the stage
    moved, and ``gbps``, those bytes per second spent in it (per reading turn, per writing thread)."""
    out = {}
    for name, names in STAGE_GROUPS:
        sec, _, nbytes = summed(snap, names)
        out[name] = {"seconds": sec, "threads": sec / wall if wall > 0 else 0.0, "bytes": nbytes,
                     "gbps": nbytes / sec / 1e9 if sec > 0 else 0.0}
    return out


def staged_run(client: Any, store: str, out: str, device: str) -> dict[str, dict[str, Any]]:
    """One more, untimed run of the workload with the stages recorded in every worker: per phase
    (``climatology``, ``anomaly``) its seconds, each worker's :func:`stage_load` and each worker's every
    stage (``stages``: ``{stage: (seconds, calls, bytes)}``), by address."""
    from gpuzarr_dist.runtime import stages

    snaps: dict[str, dict] = {}

    def between() -> None:
        snaps["climatology"] = client.run(stages.take, True)

    client.run(stages.take, True)
    try:
        clim_s, anom_s, clim = gpuzarr_workload(store, out, device, between=between)
    finally:
        snaps["anomaly"] = client.run(stages.take, False)
    keys, clim = _persisted_keys(clim), None
    _released(keys)
    _rm(out)
    walls = {"climatology": clim_s, "anomaly": anom_s}
    return {phase: {"seconds": walls[phase],
                    "workers": {w: stage_load(snap, walls[phase]) for w, snap in sorted(got.items())},
                    "stages": dict(sorted(got.items()))}
            for phase, got in snaps.items()}


def _mean_load(phase: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The workers' mean of each group's ``threads`` and ``gbps`` (over the workers that moved bytes), and the
    bytes of all workers together."""
    workers = list(phase["workers"].values())
    out = {}
    for name, _ in STAGE_GROUPS:
        each = [w[name] for w in workers]
        moving = [e["gbps"] for e in each if e["bytes"]]
        out[name] = {"threads": statistics.fmean(e["threads"] for e in each) if each else 0.0,
                     "gbps": statistics.fmean(moving) if moving else 0.0,
                     "bytes": sum(e["bytes"] for e in each)}
    return out


def stage_lines(rows: list[Row]) -> list[str]:
    """Each row's staged run (the workers' means), then every row against the first: how the host's reads
    and writes slowed down per worker while the encodes (GPU) kept their share."""
    staged = [r for r in rows if r.extra.get("stages")]
    if not staged:
        return []
    lines = ["stages of one more run per row, per worker (mean of the workers): threads in the stage on average, "
             "and the stage's bytes per second spent in it (stored bytes)"]
    for r in staged:
        for phase, got in r.extra["stages"].items():
            load = _mean_load(got)
            parts = []
            for name, _ in STAGE_GROUPS:
                g = load[name]
                if g["threads"] or g["bytes"]:
                    parts.append(f"{name} {g['threads']:.2f}" + (f" at {g['gbps']:.2f} GB/s" if g["bytes"] else ""))
            lines.append(f"  {r.name}, {phase} ({got['seconds']:.2f} s): " + ", ".join(parts))
    base = staged[0]
    for r in staged[1:]:
        for phase in r.extra["stages"]:
            one, many = _mean_load(base.extra["stages"][phase]), _mean_load(r.extra["stages"][phase])
            parts = [f"{name} {one[name]['gbps']:.2f} -> {many[name]['gbps']:.2f} GB/s "
                     f"({many[name]['gbps'] / one[name]['gbps']:.2f}x)"
                     for name, _ in STAGE_GROUPS if one[name]["gbps"] > 0 and many[name]["gbps"] > 0]
            if parts:
                lines.append(f"  {r.name} against {base.name}, {phase}, per worker: " + ", ".join(parts))
    return lines


# -- the benchmark ----------------------------------------------------------------------------------------


def _timed(fn: Any, repeats: int, before: Any = None) -> tuple[list[float], list[tuple[float, float]], Any]:
    """Run ``fn`` ``repeats`` times (``before`` each, untimed); the totals, the parts and the last result.

    Each run starts with the previous run's result released, so that every run computes its persisted
    climatology instead of finding it on the workers under the same keys.
    """
    totals, parts, last = [], [], None
    for _ in range(repeats):
        keys, last = _persisted_keys(last), None
        _released(keys)
        if before is not None:
            before()
        a, b, last = fn()
        totals.append(a + b)
        parts.append((a, b))
    return totals, parts, last


def _rm(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _gpu_count() -> int:
    from gpuzarr_dist.distributed.gpus import visible_devices

    listed = visible_devices()
    if listed is not None:
        return len(listed)
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


def check_disk(path: str, nbytes: int, have_data: bool, free: int | None = None) -> None:
    """Refuse to start when ``path`` lacks room for the dataset (unless written) and one full-size anomaly."""
    from dask.utils import format_bytes

    need = int(0.85 * nbytes) * (1 if have_data else 2)  # zstd keeps the noisy float32 at about 3/4 of its size
    free = shutil.disk_usage(path).free if free is None else free
    if free < need:
        raise SystemExit(f"bench climate: needs about {format_bytes(need)} free in {path}, but {format_bytes(free)} "
                         "is free; pass --path with a folder on a larger disk, or a smaller --gb")


def _cpu_layout(cores: int) -> tuple[int, int]:
    """``(processes, threads each)`` of the CPU row's LocalCluster: every core, at most 4 threads a process."""
    procs = max(1, cores // 4)
    return procs, max(1, cores // procs)


def run(args: Any) -> int:
    import distributed

    from gpuzarr_dist.cuda.device import gpu_status, resolve_device
    from gpuzarr_dist.distributed.cluster import start_cluster
    from gpuzarr_dist.synthetic import NLAT, NLON, _existing_dataset, make_era5_dataset

    device = resolve_device(getattr(args, "device", "auto") or "auto")
    quick = bool(getattr(args, "quick", False)) or device == "cpu"
    if device == "cpu" and not getattr(args, "quick", False):
        print("no GPU: running the quick CPU version (1 and 2 worker processes)")
    repeats = max(1, getattr(args, "repeats", None) or 3)
    available = _gpu_count() if device == "gpu" else 2
    counts = sorted(set(getattr(args, "gpus", None) or [1, 2, 4]))
    counts = [n for n in counts if n <= available] or [1]
    nlat, nlon = QUICK_GRID if quick else (NLAT, NLON)
    step_bytes = nlat * nlon * 4
    cores = os.cpu_count() or 1
    gb = getattr(args, "gb", None)
    if getattr(args, "time_steps", None):
        steps = args.time_steps
    elif quick and gb is None:
        steps = QUICK_STEPS
    else:
        steps = max(24, int((gb or (40.0 if max(counts) >= 2 else 20.0)) * 1e9 // step_bytes))
    cpu_gb = getattr(args, "cpu_gb", None)
    if cpu_gb is None and quick:
        cpu_steps = steps
    else:
        cpu_steps = min(steps, max(24, int((cpu_gb or max(0.5, 0.1 * cores)) * 1e9 // step_bytes)))
    threads = getattr(args, "threads", None) or (1 if device == "cpu" else 8)

    given = getattr(args, "path", None)
    with data_folder(given, "gpuzarr-climate-") as root:
        store = os.path.join(root, "era5-daily.zarr")
        have = _existing_dataset(store, "t2m", steps, nlat, nlon, 0) is not None
        check_disk(root, steps * step_bytes, have)
        t0 = time.perf_counter()
        data = make_era5_dataset(store, steps, nlat=nlat, nlon=nlon)
        made = time.perf_counter() - t0
        nbytes, cpu_nbytes = steps * step_bytes, cpu_steps * step_bytes
        print(f"dataset: t2m float32 ({steps}, {nlat}, {nlon}), daily from 2000-01-01, zstd: {nbytes / 1e9:.2f} GB "
              f"decompressed, {data.stored_bytes() / 1e9:.2f} GB stored "
              f"({'reused' if data.reused else f'written in {made:.1f} s'}) at {store}")
        print(f"device: {device} ({gpu_status()[1]}); {threads} threads per worker; {cores} CPU cores; {platform.node()}")
        months = _month_index(store)

        rows: list[Row] = []
        failures: list[str] = []
        outs = {"cpu": os.path.join(root, "anomaly-cpu.zarr")}

        # the CPU row: plain dask on every core, over the first cpu_steps steps; its output is the reference
        procs, per = _cpu_layout(cores)
        subset = None if cpu_steps == steps else cpu_steps
        with distributed.LocalCluster(n_workers=procs, threads_per_worker=per, processes=True,
                                      dashboard_address=None) as cluster, distributed.Client(cluster):
            _released(_persisted_keys(dask_cpu_workload(store, outs["cpu"], subset)[2]))  # warm-up
            totals, parts, clim = _timed(lambda: dask_cpu_workload(store, outs["cpu"], subset), repeats,
                                         lambda: _rm(outs["cpu"]))
            cpu_clim = _host_values(clim)
        limit = TOLERANCE_ULPS * float(np.finfo(np.float32).eps) * float(np.nanmax(np.abs(cpu_clim)))
        cpu_row = _row("dask on the CPU: zarr-python, numpy, xarray groupby, to_zarr", totals, parts, 2 * cpu_nbytes,
                       f"LocalCluster {procs}x{per} threads; "
                       + (f"first {cpu_steps} steps ({cpu_nbytes / 1e9:.1f} GB)" if subset else "whole dataset"))
        rows.append(cpu_row)

        gpu_clims: dict[int, np.ndarray] = {}
        what = "GPU" if device == "gpu" else "CPU worker"
        for n in counts:
            full = os.path.join(root, f"anomaly-{n}.zarr")
            check = os.path.join(root, f"anomaly-{n}-check.zarr")
            with start_cluster(n, threads_per_gpu=threads, device=device, quiet=True,
                               dashboard_address=None) as client:
                _released(_persisted_keys(gpuzarr_workload(store, check, device, subset)[2]))  # warm-up, its output checked against the CPU row's
                totals, parts, clim = _timed(lambda: gpuzarr_workload(store, full, device), repeats, lambda: _rm(full))
                gpu_clims[n] = _host_values(clim)
                keys, clim = _persisted_keys(clim), None
                _released(keys)
                staged = staged_run(client, store, os.path.join(root, f"anomaly-{n}-staged.zarr"), device)
                extra_row = None
                if getattr(args, "xarray_row", False) and n == 1:
                    xcheck = os.path.join(root, "anomaly-xarray.zarr")
                    _released(_persisted_keys(gpuzarr_workload(store, xcheck, device, subset, xarray_groupby=True)[2]))  # warm-up
                    xt, xp, _ = _timed(lambda: gpuzarr_workload(store, xcheck, device, subset, xarray_groupby=True),
                                       repeats, lambda: _rm(xcheck))
                    extra_row = _row(f"xarray's own groupby{' (no flox)' if device == 'gpu' else ''}, 1 {what}",
                                     xt, xp, 2 * cpu_nbytes, "over the CPU row's steps")
                    failures += _verify(extra_row, xcheck, outs["cpu"], limit)
            row = _row(f"gpuzarr-dist, {n} {what}{'s' if n > 1 else ''}", totals, parts, 2 * nbytes,
                       "whole dataset")
            row.extra["stages"] = staged
            failures += _verify(row, check, outs["cpu"], limit)
            err, _ = spot_check(store, full, gpu_clims[n], months)
            row.extra["spot_error"] = err
            if not err <= limit:
                failures.append(f"{row.name}: three steps of the full output differ from input - climatology by {err:.3g}")
            rows.append(row)
            if extra_row is not None:
                rows.append(extra_row)
            if given is not None and n != max(counts):
                _rm(full)  # keep the last full-size anomaly only (disk)
        for n, c in gpu_clims.items():
            if n != counts[0]:
                d = float(np.nanmax(np.abs(c - gpu_clims[counts[0]])))
                if not d <= limit:
                    failures.append(f"the climatologies of {counts[0]} and {n} {what}(s) differ by {d:.3g}")
        if subset is None:  # the CPU row ran the whole dataset: its climatology is comparable too
            d = float(np.nanmax(np.abs(cpu_clim - gpu_clims[counts[0]])))
            if not d <= limit:
                failures.append(f"the climatology differs from the CPU row's by {d:.3g}")

        _print(rows, cpu_row)
        speedup = {n: r.gbps / cpu_row.gbps for n, r in zip(counts, [r for r in rows if r.name.startswith("gpuzarr")])}
        for line in stage_lines(rows):
            print(line)
        if device == "gpu" and 2 in speedup:
            print(f"target 2 GPUs >= 10x dask on {cores} CPU cores: {'met' if speedup[2] >= 10 else 'NOT met'} "
                  f"({speedup[2]:.1f}x)")
        if device == "gpu" and 4 in speedup and 1 in speedup:
            x4 = speedup[4] / speedup[1]
            print(f"target 4 GPUs >= {TARGET_4}x one GPU: {'met' if x4 >= TARGET_4 else 'NOT met'} ({x4:.2f}x)")
        meta = {"device": device, "threads": threads, "time_steps": steps, "cpu_time_steps": cpu_steps,
                "grid": [nlat, nlon], "counts": counts, "repeats": repeats, "cores": cores, "cpu_cluster": [procs, per],
                "host": platform.node(), "quick": quick, "max_error_allowed": limit, "failures": failures,
                "speedup_over_cpu": {str(n): x for n, x in speedup.items()}}
        out_dir = getattr(args, "out", None) or "bench-results"
        print("saved:", ", ".join(save(rows, out_dir, "bench-climate",
                                       f"monthly climatology + anomaly, 1..{max(counts)} {what}(s) vs dask on the CPU",
                                       meta)))
        with open(os.path.join(out_dir, "bench-climate.txt"), "w") as f:
            f.write(_table(rows, cpu_row) + "\n")
    for line in failures:
        print("WRONG:", line)
    return 1 if failures else 0


def _row(name: str, totals: list[float], parts: list[tuple[float, float]], nbytes: int, note: str) -> Row:
    best = min(range(len(totals)), key=totals.__getitem__)
    clim_s, anom_s = parts[best]
    return Row(name, "warm", totals[best], nbytes, note=note,
               extra={"median_seconds": statistics.median(totals), "seconds": totals,
                      "climatology_seconds": clim_s, "anomaly_seconds": anom_s})


def _verify(row: Row, got: str, ref: str, limit: float) -> list[str]:
    """Compare a row's output with the CPU row's; note the errors on the row; the failure, if any."""
    err, scale = compare_outputs(got, ref)
    rel = err / scale if scale else err
    row.extra.update(max_abs_error=err, max_rel_error=rel)
    row.note += f"; vs CPU row: max abs err {err:.2g}, rel {rel:.2g}"
    return [] if err <= limit else [f"{row.name}: output differs from the CPU row's by {err:.3g} "
                                    f"(allowed {limit:.3g}; largest value {scale:.3g})"]


def _table(rows: list[Row], base: Row) -> str:
    lines = [f"{'row':<58} {'best s':>8} {'median s':>9} {'GB/s':>7} {'median':>7} {'x CPU':>7}  note"]
    lines.append("-" * len(lines[0]))
    for r in rows:
        med = r.extra["median_seconds"]
        med_gbps = r.nbytes / med / 1e9 if med else math.nan
        lines.append(f"{r.name:<58} {r.seconds:8.2f} {med:9.2f} {r.gbps:7.2f} {med_gbps:7.2f} "
                     f"{r.gbps / base.gbps:7.2f}  {r.note} (climatology {r.extra['climatology_seconds']:.2f} s, "
                     f"anomaly {r.extra['anomaly_seconds']:.2f} s)")
    return "\n".join(lines)


def _print(rows: list[Row], base: Row) -> None:
    print("GB/s: decompressed bytes read (the data twice: climatology, then anomaly), best and median; "
          "x CPU: best GB/s over the CPU row's")
    print(_table(rows, base))
