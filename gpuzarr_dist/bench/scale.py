"""``gpuzarr-dist bench scale``: read + time mean on 1, 2 and 4 GPUs of one machine (one worker per GPU),
beside the aggregate read ceiling measured in the same run, a fresh cluster's first computation, and one
reduction over more data than one GPU holds.

Data: one ERA5-like store per GPU (float32 (t, 721, 1440), zstd), written once at the largest
``--gb-per-gpu`` size; smaller sizes read the first time steps of each store. N workers read N stores.
Every row is run once untimed, then timed ``--repeats`` times (best and median). Rows, per size:

- ``ceiling, N``: N worker processes at once, each reading its own store's files on
  ``gpuzarr.io-threads`` threads into pinned buffers and copying them to its GPU, no decode
  (``bench.files.read_ceiling`` through ``client.run``): the shared host read path's limit.
- ``time mean, N``: ``da.concatenate`` of the N stores' ``from_zarr_gpu`` arrays, ``.mean(axis=0)``
  on a ``start_cluster(N)`` cluster, as a user writes it; with N > 1 also with
  ``gpuzarr.cluster.placement`` off (dask places every block). Each prints the transfers between
  workers and each worker's busy fraction (task seconds / (span x threads)) of its median repeat,
  from dask's task stream; the largest N saves a dask performance report (HTML) beside the JSON.
  One more run with the read stages on gives each worker's file reads (their share of the span, the
  stored GB/s while reading) and, against one worker alone, the bound they set (:func:`read_bound`).

Then ``first compute``: a fresh ``start_cluster`` (with and without ``gpuzarr.cluster.warm``), its
first ``.mean`` and the warm median after it; and ``larger than one GPU``: the stores, repeated as
often as needed to exceed 1.1x the GPU's memory, reduced on one worker, warmed, with the peak device
memory it used (sampled) against the worker's memory limit.

``--quick`` (or no GPU) runs a small version on 1 and 2 CPU worker processes.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import threading
import time
from typing import Any

from gpuzarr_dist.bench.files import chunk_files, data_folder
from gpuzarr_dist.bench.report import Row, save, timed
from gpuzarr_dist.runtime import stages
from gpuzarr_dist.runtime.stages import READ_STAGES

STEP_BYTES = 721 * 1440 * 4
_sampler: dict[str, Any] = {}


# -- in the workers ----------------------------------------------------------------------------


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


# -- helpers ---------------------------------------------------------------------------------

#: the scaling targets of the GPU rows: N GPUs at least this many times one GPU (and 85% of the read ceiling)
TARGETS = {2: 1.9, 4: 3.6}


def read_stats(snapshot: dict[str, tuple[float, int, int]], wall: float) -> dict[str, float]:
    """One worker's file reads in one computation of ``wall`` seconds, from its stages (:func:`stages.take`):
    the seconds its blocks spent reading files (``files: reads``, summed over blocks: with one read turn per
    process, blocks read one after another), that as a share of ``wall``, the blocks, and the stored bytes
    read per second while reading. A share near 1 means the worker waits for its reads: what bounds it is
    the host's read path, and the rate says how fast the host gave it bytes."""
    seconds, blocks, nbytes = stages.summed(snapshot, READ_STAGES)
    return {"read_s": seconds, "share": seconds / wall if wall > 0 else 0.0, "blocks": blocks,
            "stored_gbps": nbytes / seconds / 1e9 if seconds > 0 else 0.0}


def read_bound(n: int, share: float, shared: float) -> float:
    """How many times one worker's rate ``n`` workers reach, by the read model, when one worker spends ``share``
    of its time reading files and the host gives ``n`` readers at once ``shared`` times what it gives one: the
    reads of ``n`` workers' data take ``n / shared`` times one worker's and the rest runs side by side,
    ``n / (n * share / shared + 1 - share)`` (docs/design.md, "Scaling over GPUs"). A model, not a strict
    bound: a worker's other threads can work while one of them reads."""
    if shared <= 0:
        return 0.0
    return n / (n * share / shared + max(0.0, 1.0 - share))


def _gpu_count() -> int:
    from gpuzarr_dist.distributed.gpus import visible_devices

    listed = visible_devices()
    if listed is not None:
        return len(listed)
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


def stream_stats(records: list[dict], nthreads: dict[str, int]) -> dict[str, Any]:
    """Transfers between workers and each worker's busy fraction from dask task-stream ``records``."""
    computes: dict[str, float] = {w: 0.0 for w in nthreads}
    first, last, transfers = math.inf, -math.inf, 0
    for rec in records:
        for ss in rec.get("startstops", ()):
            if ss["action"] == "transfer":
                transfers += 1
            elif ss["action"] == "compute":
                computes[rec["worker"]] = computes.get(rec["worker"], 0.0) + ss["stop"] - ss["start"]
                first, last = min(first, ss["start"]), max(last, ss["stop"])
    span = max(last - first, 1e-9) if records else 0.0
    busy = {w: (computes.get(w, 0.0) / (span * max(1, n)) if span else 0.0) for w, n in nthreads.items()}
    return {"transfers": transfers, "busy": busy, "span": span}


def _have_bokeh() -> bool:
    """dask's performance report needs bokeh; without it the run goes on without a report, and says so."""
    import importlib.util

    if importlib.util.find_spec("bokeh") is not None:
        return True
    print("no dask performance report: it needs bokeh (pip install bokeh)")
    return False


def task_seconds(records: list[dict], submitted: float) -> dict[str, float]:
    """From task-stream ``records`` of one computation submitted at ``submitted`` (``time.perf_counter``
    clock): the summed compute seconds, the longest task, and when the first task started after submission."""
    computes = [ss for rec in records for ss in rec.get("startstops", ()) if ss["action"] == "compute"]
    if not computes:
        return {"compute": 0.0, "longest": 0.0, "first_start": 0.0, "last_stop": 0.0}
    offset = time.time() - time.perf_counter()  # task streams use the wall clock
    return {"compute": sum(ss["stop"] - ss["start"] for ss in computes),
            "longest": max(ss["stop"] - ss["start"] for ss in computes),
            "first_start": min(ss["start"] for ss in computes) - (submitted + offset),
            "last_stop": max(ss["stop"] for ss in computes) - (submitted + offset)}


def _summary(times: list[float]) -> tuple[float, float]:
    return min(times), statistics.median(times)


def _fmt_busy(busy: dict[str, float]) -> str:
    return "/".join(f"{v:.0%}" for _, v in sorted(busy.items()))


class _Bench:
    """State of one ``bench scale`` run: stores, sizes, device, rows."""

    def __init__(self, args: Any):
        from gpuzarr_dist.cuda.device import resolve_device

        self.device = resolve_device(getattr(args, "device", "auto") or "auto")
        self.quick = bool(getattr(args, "quick", False)) or self.device == "cpu"
        if self.device == "cpu" and not getattr(args, "quick", False):
            print("no GPU: running the quick CPU version (1 and 2 worker processes)")
        available = _gpu_count() if self.device == "gpu" else 2
        counts = sorted(set(getattr(args, "gpus", None) or ([1, 2] if self.quick else [1, 2, 4])))
        self.counts = [n for n in counts if n <= available] or [1]
        sizes = getattr(args, "gb_per_gpu", None) or ([0.05] if self.quick else [8.0, 40.0])
        self.sizes = sorted(set(sizes if isinstance(sizes, list) else [sizes]))
        self.threads = getattr(args, "threads", None) or (1 if self.device == "cpu" else 8)
        self.repeats = max(1, getattr(args, "repeats", None) or 3)
        self.report = not getattr(args, "no_report", False)
        self.out_dir = getattr(args, "out", None) or "bench-results"
        self.rows: list[Row] = []
        self.results: dict[tuple[float, int], dict[str, float]] = {}

    def steps(self, gb: float) -> int:
        return max(2, int(gb * 1e9 // STEP_BYTES))

    def make_stores(self, root: str) -> None:
        from gpuzarr_dist.synthetic import make_era5_like

        nstores = max(self.counts)
        steps = self.steps(max(self.sizes))
        procs = max(1, (os.cpu_count() or 1) - 1)
        t0 = time.perf_counter()
        self.stores = [make_era5_like(os.path.join(root, f"era5-{i}.zarr"), steps, seed=i, processes=procs)
                       for i in range(nstores)]
        self.files = [chunk_files(s.path) for s in self.stores]  # chunk files in time order ("c/<t>/0/0")
        self.files = [sorted(f, key=lambda p: int(p.split(os.sep)[-3])) for f in self.files]
        stored = sum(os.path.getsize(p) for p in self.files[0])
        print(f"{nstores} store(s) of float32 ({steps}, 721, 1440), zstd: {steps * STEP_BYTES / 1e9:.2f} GB "
              f"decompressed, {stored / 1e9:.2f} GB stored each ({time.perf_counter() - t0:.0f} s to write)")

    def arrays(self, n: int, gb: float) -> Any:
        import dask.array as da

        from gpuzarr_dist.array.read import from_zarr_gpu

        steps = self.steps(gb)
        return da.concatenate([from_zarr_gpu(s.path, device=self.device)[:steps] for s in self.stores[:n]], axis=0)

    def stored(self, n: int, gb: float) -> int:
        """Stored bytes that the first ``n`` stores hold in their first ``gb`` per GPU."""
        steps = self.steps(gb)
        return sum(os.path.getsize(p) for f in self.files[:n] for p in f[:steps])

    def cluster(self, n: int, **config: Any) -> Any:
        import dask

        from gpuzarr_dist.distributed.cluster import start_cluster

        with dask.config.set({f"gpuzarr.cluster.{k}": v for k, v in config.items()}):
            return start_cluster(n, threads_per_gpu=self.threads, device=self.device, quiet=True,
                                 dashboard_address=None)

    # -- rows --------------------------------------------------------------------------------

    def ceiling(self, client: Any, n: int, gb: float) -> None:
        from gpuzarr_dist.config import io_threads

        steps = self.steps(gb)
        workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
        by_worker = {w: self.files[i][:steps] for i, w in enumerate(workers)}
        threads = io_threads()
        times = timed(lambda: client.run(_ceiling_in_worker, by_worker, threads, self.device), self.repeats)
        best, med = _summary(times)
        comp = self.stored(n, gb)
        what = " + copy to GPU" if self.device == "gpu" else ""
        self.rows.append(Row(f"{gb:g} GB/GPU ceiling: {n} process(es) read own files{what}", "warm", best,
                             n * steps * STEP_BYTES, note=f"median {med:.3f} s; {comp / best / 1e9:.2f} GB/s stored bytes; "
                             f"{threads} threads each",
                             extra={"median_s": med, "times": times, "gb_per_gpu": gb, "workers": n}))
        self.results.setdefault((gb, n), {})["ceiling"] = n * steps * STEP_BYTES / best

    def mean(self, client: Any, n: int, gb: float, placement: bool) -> None:
        import dask
        from distributed import get_task_stream, performance_report

        steps = self.steps(gb)
        x = self.arrays(n, gb)
        nthreads = dict(client.nthreads())
        stats = []

        def once() -> None:
            with get_task_stream(client) as ts:
                float(x.mean(axis=0).compute()[0, 0])
            stats.append(stream_stats(ts.data, nthreads))

        with dask.config.set({"gpuzarr.cluster.placement": placement}):
            times = timed(once, self.repeats)
            stats = stats[1:]  # the untimed run's
            report = None
            if self.report and n == max(self.counts) and placement and _have_bokeh():
                report = os.path.join(self.out_dir, f"bench-scale-{gb:g}gb-{n}workers.html")
                os.makedirs(self.out_dir, exist_ok=True)
                with performance_report(filename=report):
                    x.mean(axis=0).compute()
        best, med = _summary(times)
        st = stats[times.index(sorted(times)[len(times) // 2])]
        reads = self.read_stages(client, x, n, gb) if placement else None
        unit = "GPU" if self.device == "gpu" else "worker"
        name = f"{gb:g} GB/GPU time mean: {n} {unit}(s)" + ("" if placement or n == 1 else ", dask placement")
        note = (f"median {med:.3f} s; {st['transfers']} transfers; busy {_fmt_busy(st['busy'])}; "
                f"{x.npartitions} blocks")
        if reads:
            note += ("; file reads " + " / ".join(f"{r['share']:.0%} of the span" for r in reads.values())
                     + ", " + " / ".join(f"{r['stored_gbps']:.1f}" for r in reads.values()) + " GB/s stored while reading")
        self.rows.append(Row(name, "warm", best, n * steps * STEP_BYTES, note=note,
                             extra={"median_s": med, "times": times, "gb_per_gpu": gb, "workers": n,
                                    "placement": placement, "transfers": st["transfers"], "busy": st["busy"],
                                    "report": report, "reads": reads}))
        key = "mean" if placement else "mean_dask_placement"
        self.results.setdefault((gb, n), {})[key] = n * steps * STEP_BYTES / best
        if reads:
            self.results[(gb, n)]["reads"] = reads
        self.results[(gb, n)][key + "_median"] = n * steps * STEP_BYTES / med

    def read_stages(self, client: Any, x: Any, n: int, gb: float) -> dict[str, dict[str, float]]:
        """One more, untimed, computation of ``x.mean`` with the read stages timed in the workers: each
        worker's :func:`read_stats`, by address."""
        client.run(stages.take, True)
        t0 = time.perf_counter()
        x.mean(axis=0).compute()
        wall = time.perf_counter() - t0
        snaps = client.run(stages.take, False)
        return {w: read_stats(snaps[w], wall) for w in sorted(snaps)}

    def first_compute(self, n: int, gb: float, warm: bool) -> None:
        steps = self.steps(gb)
        x = self.arrays(n, gb)
        from distributed import get_task_stream

        t0 = time.perf_counter()
        with self.cluster(n, warm=warm) as client:
            started = time.perf_counter() - t0
            with get_task_stream(client) as ts:
                t0 = time.perf_counter()
                float(x.mean(axis=0).compute()[0, 0])
                first = time.perf_counter() - t0
            first_tasks = task_seconds(ts.data, t0)
            with get_task_stream(client) as ts:
                t0 = time.perf_counter()
                x.mean(axis=0).compute()
                second = time.perf_counter() - t0
            second_tasks = task_seconds(ts.data, t0)
            times = [second, *timed(lambda: x.mean(axis=0).compute(), self.repeats - 1, warm=False)]
        med = statistics.median(times)
        where = (f"task seconds {first_tasks['compute']:.2f} vs {second_tasks['compute']:.2f} warm, "
                 f"first task started {first_tasks['first_start']:.3f} vs {second_tasks['first_start']:.3f} s "
                 f"after submit, last ended {first_tasks['last_stop']:.3f} vs {second_tasks['last_stop']:.3f} s after "
                 f"submit, longest task {first_tasks['longest']:.3f} vs {second_tasks['longest']:.3f} s")
        self.rows.append(Row(f"{gb:g} GB/GPU first compute, fresh cluster of {n} ({'warm' if warm else 'no warm'}-up)",
                             "warm", first, n * steps * STEP_BYTES,
                             note=f"{first / med:.2f}x the warm median {med:.3f} s; start_cluster {started:.1f} s; {where}",
                             extra={"first_s": first, "warm_median_s": med, "start_s": started, "warm_up": warm,
                                    "first_tasks": first_tasks, "warm_tasks": second_tasks}))
        self.results.setdefault((gb, n), {})[f"first_ratio_{'warm' if warm else 'cold'}"] = first / med

    def larger_than_gpu(self) -> dict[str, Any]:
        import dask.array as da
        import numpy as np

        from gpuzarr_dist.array.read import from_zarr_gpu
        from gpuzarr_dist.cuda.device import gpu_memory_bytes
        from gpuzarr_dist.distributed.cluster import DEFAULT_DEVICE_MEMORY_LIMIT

        steps = self.steps(max(self.sizes))
        one = len(self.stores) * steps * STEP_BYTES
        total = gpu_memory_bytes() if self.device == "gpu" else 0
        times_over = max(1, math.ceil(1.1 * total / one)) if total else 1
        # each repeat of a store in blocks of its own length (one step shorter each time): distinct tasks that
        # read the files again (the same array twice is one set of tasks, read once and used twice)
        base = from_zarr_gpu(self.stores[0].path, device=self.device).chunks[0][0]
        parts = [from_zarr_gpu(s.path, device=self.device, chunks=(max(1, base - k), *s.shape[1:]))
                 for k in range(times_over) for s in self.stores]
        x = da.concatenate(parts, axis=0)
        limit = int(DEFAULT_DEVICE_MEMORY_LIMIT * total)  # the worker's device_memory_limit (start_cluster's default)
        with self.cluster(1) as client:
            if self.device == "gpu":
                client.run(_start_sampler)
            results = []
            times = timed(lambda: results.append(x.mean(axis=0).compute()), self.repeats)
            peak, total = next(iter(client.run(_stop_sampler).values())) if self.device == "gpu" else (0, 0)
        m = results[-1]
        m = m.get() if hasattr(m, "get") else np.asarray(m)
        ref = sum(s.reference_mean() for s in self.stores) / len(self.stores)
        err = float(np.max(np.abs(m - ref) / np.abs(ref)))
        best, med = _summary(times)
        note = f"median {med:.3f} s; max rel. error {err:.1e}"
        if times_over > 1:
            note += f"; the {len(self.stores)} store(s) read {times_over}x"
        if self.device == "gpu":
            note += f"; peak device memory {peak / 1e9:.1f} GB, worker limit {limit / 1e9:.1f} of {total / 1e9:.1f} GB"
        what = "larger than one GPU" if self.device == "gpu" else "every store"
        self.rows.append(Row(f"{what}: {x.nbytes / 1e9:.0f} GB on 1 worker", "warm", best, x.nbytes,
                             note=note, extra={"median_s": med, "times": times, "peak": peak, "limit": limit,
                                               "total": total, "error": err}))
        return {"nbytes": x.nbytes, "peak": peak, "limit": limit, "total": total, "error": err,
                "gbps": x.nbytes / best, "gbps_median": x.nbytes / med}

    # -- the run -----------------------------------------------------------------------------

    def print_rows(self) -> None:
        print(f"{'row':<60} {'best s':>7} {'GB/s':>7}  note")
        for r in self.rows:
            print(f"{r.name:<60} {r.seconds:7.3f} {r.gbps:7.2f}  {r.note}")

    def verdicts(self, large: dict | None) -> list[str]:
        out = []
        top = max(self.counts)
        for gb in self.sizes:
            base = self.results.get((gb, 1), {}).get("mean")
            for n in self.counts:
                res = self.results.get((gb, n), {})
                if "mean" not in res or "ceiling" not in res:
                    continue
                line = f"{gb:g} GB/GPU, {n} worker(s): {res['mean'] / 1e9:.1f} GB/s, {res['mean'] / res['ceiling']:.0%} of the ceiling"
                if base and n > 1:
                    line += f", {res['mean'] / base:.2f}x one"
                    if "mean_dask_placement" in res:
                        line += f" (dask placement: {res['mean_dask_placement'] / base:.2f}x one)"
                    if self.device == "gpu" and n in TARGETS:
                        ok = res["mean"] >= TARGETS[n] * base and res["mean"] >= 0.85 * res["ceiling"]
                        line += f"; target >= {TARGETS[n]}x and >= 85%: {'met' if ok else 'NOT met'}"
                out.append(line)
                alone = self.results.get((gb, 1), {}).get("reads")
                if n > 1 and alone and res.get("reads"):
                    one = next(iter(alone.values()))
                    each = [r["stored_gbps"] for r in res["reads"].values()]
                    if one["stored_gbps"] > 0:
                        shared = sum(each) / one["stored_gbps"]
                        out.append(f"  file reads: {n} workers read {sum(each):.1f} GB/s stored together while reading "
                                   f"({' / '.join(f'{e:.1f}' for e in each)}), one alone {one['stored_gbps']:.1f}: the "
                                   f"host gives {n} readers {shared:.2f}x one; reads fill "
                                   + " / ".join(f"{r['share']:.0%}" for r in res["reads"].values()) + " of the span, "
                                   f"{one['share']:.0%} of one worker's: by the read model {n} workers reach "
                                   f"{read_bound(n, one['share'], shared):.2f}x one")
            res = self.results.get((gb, top), {})
            for kind in ("warm", "cold"):
                if f"first_ratio_{kind}" in res:
                    r = res[f"first_ratio_{kind}"]
                    target = f"; target <= 1.5x: {'met' if r <= 1.5 else 'NOT met'}" if kind == "warm" else ""
                    out.append(f"{gb:g} GB/GPU first compute on a fresh cluster ({kind}): {r:.2f}x the warm median{target}")
        if large:
            base = self.results.get((max(self.sizes), 1), {}).get("mean")
            within = (not large["limit"] or large["peak"] <= large["limit"]) and large["error"] < 1e-5
            line = f"larger than one GPU: {large['gbps'] / 1e9:.1f} GB/s"
            if base:
                rate = large["gbps"] / base
                line += f", {rate:.0%} of the warm one-worker rate"
                if self.device == "gpu":
                    line += f"; target >= 80% within the memory limit: {'met' if rate >= 0.8 and within else 'NOT met'}"
            out.append(line + ("" if within else " (PROBLEM: memory or values)"))
        return out


def run(args: Any) -> int:
    from gpuzarr_dist.cuda.device import gpu_status

    b = _Bench(args)
    with data_folder(getattr(args, "path", None), "gpuzarr-scale-") as root:
        b.make_stores(root)
        print(f"device: {b.device} ({gpu_status()[1]}); {b.threads} threads per worker; {b.repeats} repeats; "
              f"{platform.node()}", flush=True)
        for n in b.counts:
            with b.cluster(n) as client:
                for gb in b.sizes:
                    b.ceiling(client, n, gb)
                    b.mean(client, n, gb, placement=True)
                    if n > 1:
                        b.mean(client, n, gb, placement=False)
            print(f"{n} worker(s) done", flush=True)
        for warm in (True, False):
            b.first_compute(max(b.counts), b.sizes[0], warm)
        large = None if getattr(args, "no_large", False) else b.larger_than_gpu()
        b.print_rows()
        for line in b.verdicts(large):
            print(line)
        meta = {"device": b.device, "threads": b.threads, "sizes_gb_per_gpu": b.sizes, "counts": b.counts,
                "repeats": b.repeats, "host": platform.node(), "quick": b.quick, "large": large,
                "results": {f"{gb:g}GB/{n}": v for (gb, n), v in b.results.items()}}
        saved = save(b.rows, b.out_dir, "bench-scale", f"read + time mean on 1..{max(b.counts)} workers", meta)
        reports = [r.extra["report"] for r in b.rows if r.extra.get("report")]
        print("saved:", ", ".join(saved + reports))
        return 1 if large and large["error"] >= 1e-5 else 0
