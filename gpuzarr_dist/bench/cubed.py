"""``gpuzarr-dist bench cubed``: a time mean and a time anomaly over an array at least 10x ``allowed_mem``,
through gpuzarr-dist's Cubed variant, gpuzarr-dist's dask path and plain Cubed on the CPU, in one run.

Each row runs in its own Python process: cubed fixes its array backend (numpy
or cupy) at import, so our GPU Cubed and plain CPU Cubed cannot share one.
Each child computes the mean once untimed (the process's one-time costs:
CUDA context, compiled kernels, pools), then times ``mean(x, axis=0)``
(computed into memory) and ``x - mean(x, axis=0)`` (written to a Zarr store,
so the anomaly never has to fit in memory: by :func:`gpuzarr_dist.cubed.to_zarr` for
our variant, also once by ``cubed.to_zarr`` and once with cubed's own fusion for
comparison), each ``--repeats`` times (best and median; plain Cubed on the CPU
once by default), checks the mean against a float64 numpy mean and
:data:`CHECKED_STEPS` time steps of every written anomaly against numpy, and
prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from gpuzarr_dist.bench.files import data_folder
from gpuzarr_dist.bench.report import selected

ROWS = {
    "ours-cubed": "gpuzarr-dist Cubed variant (from_zarr_gpu + ThreadsExecutor)",
    "ours-dask": "gpuzarr-dist dask path (from_zarr_gpu, to_zarr_gpu, threads)",
    "cubed-cpu": "Cubed on the CPU (cubed.from_zarr, numpy, threads)",
}


# -- data ------------------------------------------------------------------------------------


def write_data(path: str, shape: tuple[int, int, int], chunks: tuple[int, int, int]) -> np.ndarray:
    """Write a float32 (time, y, x) zstd store with zarr-python; return the float64 time mean (kept as mean.npy).

    Each time step is a latitude profile plus noise: rows of a pool of random
    fields drawn once (drawing fresh noise for every step took most of the time
    for the multi-GB arrays), permuted over time and shifted by a small per-step
    offset, so no two steps are equal. zarr-python writes several chunk rows at a
    time, encoding their chunks concurrently.
    """
    import zarr

    ref_path = os.path.join(path, "mean.npy")
    arr_path = os.path.join(path, "x.zarr")
    if data_ready(path, shape, chunks):
        return np.load(ref_path)
    shutil.rmtree(arr_path, ignore_errors=True)
    a = zarr.create_array(arr_path, shape=shape, chunks=chunks, dtype="float32",
                          compressors=zarr.codecs.ZstdCodec(level=0), overwrite=True)
    rng = np.random.default_rng(0)
    pool_steps = min(shape[0], 64)
    pool = (5 * rng.standard_normal((pool_steps,) + shape[1:], dtype=np.float32))
    base = (250 + 30 * np.cos(np.linspace(-np.pi / 2, np.pi / 2, shape[1]))[:, None] * np.ones(shape[2])).astype("f4")
    total = np.zeros(shape[1:], dtype="f8")
    slab = chunks[0] * max(1, 32 // chunks[0])
    with zarr.config.set({"async.concurrency": max(10, 2 * (os.cpu_count() or 1))}):
        for t0 in range(0, shape[0], slab):
            steps = np.arange(t0, min(t0 + slab, shape[0]))
            block = base[None] + pool[(steps * 7) % pool_steps] + (0.01 * steps).astype("f4")[:, None, None]
            a[steps[0]:steps[-1] + 1] = block
            total += block.sum(axis=0, dtype="f8")
    mean = total / shape[0]
    np.save(ref_path, mean)
    return mean


def data_ready(path: str, shape: tuple[int, ...], chunks: tuple[int, ...]) -> bool:
    """Whether ``path`` already holds :func:`write_data`'s array of this shape and chunking, and its mean."""
    import zarr

    if not (os.path.exists(os.path.join(path, "mean.npy")) and os.path.exists(os.path.join(path, "x.zarr"))):
        return False
    a = zarr.open_array(os.path.join(path, "x.zarr"), mode="r")
    return tuple(a.shape) == tuple(shape) and tuple(a.chunks) == tuple(chunks)


def check_disk(path: str, nbytes: int, have_data: bool, free: int | None = None) -> None:
    """Refuse to start when ``path`` lacks room for the array (unless written already) and one anomaly.

    zstd level 0 keeps the noisy float32 data at about its raw size. Each child
    checks an anomaly and deletes it before writing the next, so one at a time
    is on disk beside the source (and Cubed's intermediates, small here).
    """
    from dask.utils import format_bytes

    need = int(1.1 * nbytes) * (1 if have_data else 2)
    free = shutil.disk_usage(path).free if free is None else free
    if free < need:
        raise SystemExit(f"bench cubed: needs about {format_bytes(need)} free in {path} ("
                         f"{'' if have_data else 'the array and '}one anomaly at a time), but {format_bytes(free)} "
                         "is free; pass --path with a folder on a larger disk, or fewer --time-steps")


# -- children ---------------------------------------------------------------------------------


def _host(v: Any) -> np.ndarray:
    return v.get() if hasattr(v, "get") else np.asarray(v)


def _check_and_drop(path: str, out_path: str, mean: Any, res: dict) -> None:
    """Check one written anomaly (and the mean) against numpy, fold the errors into ``res``, delete the anomaly."""
    err_mean, err = _check(path, out_path, mean)
    res["err_mean"] = max(res.get("err_mean", 0.0), err_mean)
    res["err_anomaly"] = max(res.get("err_anomaly", 0.0), err)
    shutil.rmtree(out_path, ignore_errors=True)


def _max_error(got: Any, expect: np.ndarray) -> float:
    """Largest absolute difference; a NaN anywhere is an infinite error (``max()`` and ``>`` would let it pass)."""
    e = float(np.max(np.abs(_host(got).astype("f8") - expect)))
    return e if np.isfinite(e) else float("inf")


#: time steps of each written anomaly that bench cubed compares with numpy
CHECKED_STEPS = 33


def _check(path: str, out_path: str, mean: Any) -> tuple[float, float]:
    import zarr

    ref = np.load(os.path.join(path, "mean.npy"))
    err_mean = _max_error(mean, ref)
    x = zarr.open_array(os.path.join(path, "x.zarr"), mode="r")
    out = zarr.open_array(out_path, mode="r")
    err = 0.0
    for t in checked_steps(x.shape[0]):
        expect = _host(x[t]).astype("f8") - ref
        err = max(err, _max_error(out[t], expect))
    return err_mean, err


def checked_steps(n: int, count: int = CHECKED_STEPS) -> list[int]:
    """The time steps of an anomaly checked against numpy: ``count`` spread evenly, the first and the last.

    Every step would cost as much as the benchmark. A wrong task writes a wrong tile into each step of its
    block, which may miss the first, middle and last steps alone (a past race made 1 to 3 of 80 tasks
    wrong, at none of them). With 33 steps, 2400 steps are checked 75 apart: at least once in
    every block of 75 steps or more, which the benchmark's blocks (400 to 600 steps) are.
    """
    return sorted({int(t) for t in np.linspace(0, n - 1, min(n, count))} | {0, n // 2, n - 1})


def _settle_disk() -> None:
    """Write out the page cache's dirty pages (``os.sync``) before a timed section.

    The data writer and every checked anomaly leave gigabytes of dirty pages;
    the kernel writes them back when it sees fit, and a section that runs
    meanwhile shares the disk with that writeback (the same anomaly's
    writes can take half as long again in back-to-back runs).
    """
    if hasattr(os, "sync"):
        os.sync()


class _Clock:
    """Wall seconds and the cores the process kept busy (CPU seconds of all its threads / wall) from here,
    after the page cache's dirty pages were written out (:func:`_settle_disk`)."""

    def __init__(self) -> None:
        _settle_disk()
        self.wall, self.cpu = time.perf_counter(), time.process_time()  # process_time: all threads

    def stop(self, res: dict, key: str) -> None:
        wall = time.perf_counter() - self.wall
        res[f"{key}_s"] = wall
        res[f"{key}_cores"] = (time.process_time() - self.cpu) / wall if wall > 0 else None


def _warm_up(fn: Any) -> float:
    """Run ``fn`` once, untimed by the rows; its seconds.

    Every row is a fresh process, and its first computation pays one-time
    costs a longer job pays once: the CUDA context, nvCOMP's handles, CuPy's
    kernels compiled (or loaded from its disk cache), thread pools, imports.
    The rows time the second run, on every device alike.
    """
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _encode_joins(before: tuple[int, int] | None = None) -> tuple[int, int]:
    """This process's joined nvCOMP encode ``(calls, requests)`` (since ``before``): the anomaly's write batches
    and how many of them each call took."""
    from gpuzarr_dist.cuda.combine import counts

    calls, requests = counts("encode")
    return (calls - before[0], requests - before[1]) if before else (calls, requests)


def _repeat(res: dict, key: str, fn: Any, repeats: int, after: Any = None) -> Any:
    """Time ``fn()`` ``repeats`` times (each from a :class:`_Clock`); ``after(value)`` runs untimed after each.

    ``res[key + "_s"]`` and ``res[key + "_cores"]`` are the best run's, ``res[key + "_median_s"]`` the median
    and ``res[key + "_times"]`` every run's seconds. Returns the best run's value."""
    runs = []
    for _ in range(max(1, repeats)):
        one: dict = {}
        clock = _Clock()
        value = fn()
        clock.stop(one, key)
        if after is not None:
            after(value)
        runs.append((one[f"{key}_s"], one[f"{key}_cores"], value))
    best = min(runs, key=lambda r: r[0])
    times = [r[0] for r in runs]
    res.update({f"{key}_s": best[0], f"{key}_cores": best[1], f"{key}_median_s": statistics.median(times),
                f"{key}_times": times})
    return best[2]


def child(kind: str, path: str, allowed: int, device: str, threads: int, progress: bool, repeats: int = 1) -> dict:
    src = os.path.join(path, "x.zarr")
    work = tempfile.mkdtemp(prefix=f"bench-cubed-{kind}-", dir=path)
    out_path = os.path.join(work, "anomaly.zarr")
    res: dict[str, Any] = {"kind": kind, "device": device}
    try:
        if kind == "ours-cubed":
            import gpuzarr_dist.cubed as gc

            s = gc.spec(allowed, work, device=device, executor=None)
            s.executor.max_workers = threads  # the same threads as our dask row (the executor's GPU default is 8)
            import cubed
            import cubed.array_api as xp

            peaks: list[int] = []

            class Peaks(cubed.Callback):
                def on_task_end(self, event: Any) -> None:
                    if event.peak_measured_mem_end is not None and event.name != "create-arrays":
                        peaks.append(int(event.peak_measured_mem_end) - int(event.peak_measured_mem_start or 0))

            cbs = [Peaks()] + ([gc.progress_bar()] if progress else [])
            x = gc.from_zarr_gpu(src, spec=s)
            # SourceArray: the source is a plan input; anything else: this cubed got the map_blocks read op
            res["source"] = f"{type(getattr(x, '_zarray', None)).__name__}, cubed {cubed.__version__}"
            res["warmup_s"] = _warm_up(lambda: xp.mean(x, axis=0).compute())
            m = _repeat(res, "mean", lambda: xp.mean(x, axis=0).compute(callbacks=cbs), repeats)

            def anomaly() -> tuple:
                ops = gc.OpTimings()  # per-operation tasks, seconds, bytes: where the anomaly's time goes
                joins = _encode_joins()
                # chunks that batch-encode, and gc.optimize_dag (gc.to_zarr's default: the mean computed once)
                z = gc.to_zarr(x - xp.mean(x, axis=0), out_path, callbacks=cbs + [ops])
                return ops.rows(), _encode_joins(joins), list(z.chunks)

            best = _repeat(res, "anomaly", anomaly, repeats, after=lambda _: _check_and_drop(path, out_path, m, res))
            res["anomaly_ops"], res["anomaly_encode_joins"], res["out_chunks"] = best
            # the same with cubed's own fusion, which fuses the mean's reduction into every subtract task
            from cubed.core.optimization import multiple_inputs_optimize_dag

            fused_path = os.path.join(work, "anomaly-cubed-fusion.zarr")
            ops = gc.OpTimings()
            clock = _Clock()
            gc.to_zarr(x - xp.mean(x, axis=0), fused_path, callbacks=cbs + [ops],
                       optimize_function=multiple_inputs_optimize_dag)
            clock.stop(res, "anomaly_cubed_fusion")
            res["anomaly_cubed_fusion_ops"] = ops.rows()
            _check_and_drop(path, fused_path, m, res)
            # and with optimize_dag through cubed.to_zarr: one Zarr chunk per block, each task encodes one chunk
            one_path = os.path.join(work, "anomaly-one-chunk.zarr")
            clock = _Clock()
            cubed.to_zarr(x - xp.mean(x, axis=0), one_path, callbacks=cbs, optimize_function=gc.optimize_dag)
            clock.stop(res, "anomaly_one_chunk")
            _check_and_drop(path, one_path, m, res)
            res["peak_task_bytes"] = max(peaks) if peaks else None
            res["reserved_mem"] = s.reserved_mem
            if device == "gpu":
                from gpuzarr_dist.cuda.encode import workspace_bytes

                res["encode_workspace_bytes"] = workspace_bytes()  # the process's, shared by its tasks
            res["blocks"] = [list(c[:2]) for c in x.chunks]
            from gpuzarr_dist.cubed.storage import write_stats

            res["intermediate_writes"] = write_stats()  # blocks encoded by our write path vs by zarr-python
        elif kind == "ours-dask":
            import dask

            import gpuzarr_dist as gz

            x = gz.from_zarr_gpu(src, device=device)
            with dask.config.set(scheduler="threads", num_workers=threads):
                res["warmup_s"] = _warm_up(lambda: x.mean(axis=0).compute())
                m = _repeat(res, "mean", lambda: x.mean(axis=0).compute(), repeats)

                def anomaly() -> tuple:
                    y = x - x.mean(axis=0)
                    joins = _encode_joins()
                    gz.to_zarr_gpu(y, out_path)  # our dask path's writer (GPU encode of cupy blocks)
                    return len(y.__dask_graph__()), _encode_joins(joins)

                best = _repeat(res, "anomaly", anomaly, repeats, after=lambda _: _check_and_drop(path, out_path, m, res))
                res["anomaly_tasks"], res["anomaly_encode_joins"] = best
                res["blocks"] = [list(c[:2]) for c in x.chunks]
        elif kind == "cubed-cpu":
            import cubed
            import cubed.array_api as xp
            from cubed.runtime.executors.local import ThreadsExecutor

            s = cubed.Spec(work, allowed_mem=allowed, reserved_mem=0, executor=ThreadsExecutor(max_workers=threads))
            x = cubed.from_zarr(src, spec=s)
            cbs = []
            if progress:
                import gpuzarr_dist.cubed as gc

                cbs = [gc.progress_bar()]
            res["warmup_s"] = _warm_up(lambda: xp.mean(x, axis=0).compute())
            m = _repeat(res, "mean", lambda: xp.mean(x, axis=0).compute(callbacks=cbs), repeats)
            _repeat(res, "anomaly", lambda: cubed.to_zarr(x - xp.mean(x, axis=0), out_path, callbacks=cbs), repeats,
                    after=lambda _: _check_and_drop(path, out_path, m, res))
        else:
            raise ValueError(f"unknown row {kind!r}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return res


# -- parent -----------------------------------------------------------------------------------


def _spawn(kind: str, path: str, allowed: int, device: str, threads: int, progress: bool, repeats: int = 1) -> dict:
    # the previous row's (or the data's) dirty pages go to disk now, not while this row is timed; rows that
    # follow a large write stay noisy all the same
    os.sync()
    env = dict(os.environ)
    env.pop("CUBED_BACKEND_ARRAY_API_MODULE", None)
    row_device = "cpu" if kind == "cubed-cpu" else device
    cmd = [sys.executable, "-m", "gpuzarr_dist.bench.cubed", "--child", kind, "--path", path,
           "--allowed-mem", str(allowed), "--device", row_device, "--threads", str(threads), "--repeats", str(repeats)]
    if progress:
        cmd.append("--progress")
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None if progress else subprocess.PIPE, text=True, env=env)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        err = (p.stderr or "").strip().splitlines()[-5:]
        return {"kind": kind, "error": f"exit {p.returncode}: " + " | ".join(err)}
    res = json.loads(lines[-1])
    res["threads"] = threads
    return res


def selected_rows(rows: str | None) -> list[str]:
    """The rows ``--rows`` names (comma-separated), in ``ROWS`` order; all of them by default."""
    return selected(rows, ROWS, "bench cubed", "row")


#: time steps of the GPU default: 9.3 GiB, so allowed_mem (a tenth) is 0.93 GiB, a per-task budget a GPU
#: job would give. Smaller arrays give the variant blocks of a few tens of MB, which the read path decodes
#: at a fraction of the rate of the dask path's blocks.
GPU_STEPS = 2400


def row_threads(threads: int | None, device: str) -> tuple[int, int]:
    """``(threads of our two rows, threads of the Cubed-on-the-CPU row)``.

    ``--threads`` sets all rows. By default our rows run with the Cubed
    executor's GPU default, 8 threads (on the CPU device: the CPUs, at most
    16), and plain Cubed on the CPU with the CPUs, at most 16: the anchor gets
    every core, since it has no GPU to share.
    """
    cpus = min(16, os.cpu_count() or 1)
    if threads:
        return threads, threads
    return (min(8, cpus) if device == "gpu" else cpus), cpus


def row_repeats(kind: str, repeats: int | None, quick: bool) -> int:
    """Timed runs of the mean and of the anomaly in row ``kind``: ``--repeats``, else 3 (1 with ``--quick``);
    plain Cubed on the CPU once unless ``--repeats`` says otherwise (its anomaly alone takes minutes)."""
    if repeats:
        return repeats
    return 1 if quick or kind == "cubed-cpu" else 3


def run(args: argparse.Namespace) -> int:
    from dask.utils import format_bytes, parse_bytes

    from gpuzarr_dist.cuda.device import resolve_device

    device = resolve_device(getattr(args, "device", "auto") or "auto")
    quick = bool(getattr(args, "quick", False))
    steps = getattr(args, "time_steps", None) or (80 if quick else (GPU_STEPS if device == "gpu" else 96))
    ny, nx = (32, 40) if quick else (721, 1440)
    chunks = (4, 16, 20) if quick else (8, 181, 360)
    shape = (steps, ny, nx)
    nbytes = 4 * steps * ny * nx
    allowed = int(parse_bytes(args.allowed_mem)) if getattr(args, "allowed_mem", None) else nbytes // 10
    threads, cpu_threads = row_threads(getattr(args, "threads", None), device)
    if nbytes < 10 * allowed:
        print(f"note: the array ({format_bytes(nbytes)}) is less than 10x allowed_mem ({format_bytes(allowed)})",
              file=sys.stderr)
    progress = not quick and not getattr(args, "no_progress", False)
    with data_folder(getattr(args, "path", None), "gpuzarr-bench-cubed-") as path:
        ready = data_ready(path, shape, chunks)
        check_disk(path, nbytes, ready)
        print(f"{'using the' if ready else 'writing'} float32 {shape}, chunks {chunks}, zstd ({format_bytes(nbytes)})"
              f"{' in ' + path if ready else ' ...'}", file=sys.stderr)
        write_data(path, shape, chunks)
        rows = []
        for kind in selected_rows(getattr(args, "rows", None)):
            print(f"running {ROWS[kind]} ...", file=sys.stderr, flush=True)
            rows.append(_spawn(kind, path, allowed, device, cpu_threads if kind == "cubed-cpu" else threads, progress,
                               row_repeats(kind, getattr(args, "repeats", None), quick)))
    from gpuzarr_dist.config import gpu_decode_combine, gpu_read_slots, gpu_sync_wait, nvcomp_api

    result = {"device": device, "shape": shape, "chunks": chunks, "nbytes": nbytes, "allowed_mem": allowed,
              "threads": threads, "cpu_threads": cpu_threads, "sync_wait": gpu_sync_wait(),
              "read_slots": gpu_read_slots(), "decode_combine": gpu_decode_combine(), "nvcomp_api": nvcomp_api(),
              "rows": rows}
    print(format_result(result))
    out = getattr(args, "out", None)
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "bench-cubed.json"), "w") as f:
            json.dump(result, f, indent=1)
    bad = [r for r in rows if "error" in r or r.get("err_mean", 1) > 1e-3 or r.get("err_anomaly", 1) > 1e-3]
    peak = next((r.get("peak_task_bytes") for r in rows if r["kind"] == "ours-cubed"), None)
    over = device == "gpu" and peak is not None and peak > allowed
    return 1 if bad or over else 0


def format_result(res: dict) -> str:
    from dask.utils import format_bytes

    n = res["nbytes"]
    lines = [f"time mean and time anomaly (x - x.mean(0), written to Zarr) of float32 {tuple(res['shape'])}, "
             f"chunks {tuple(res['chunks'])}, {format_bytes(n)}; allowed_mem {format_bytes(res['allowed_mem'])} "
             f"({n / res['allowed_mem']:.0f}x smaller); device {res['device']}"
             + (f"; gpuzarr.gpu.sync-wait {res['sync_wait']}" if res.get("device") == "gpu" and "sync_wait" in res else "")
             + (f", read-slots {res['read_slots'] or 'any'}" if res.get("device") == "gpu" and "read_slots" in res else "")
             + (f", decode-combine {'on' if res['decode_combine'] else 'off'}"
                if res.get("device") == "gpu" and "decode_combine" in res else "")
             + (f", nvcomp-api {res['nvcomp_api']}" if res.get("device") == "gpu" and "nvcomp_api" in res else ""),
             f"{'row':<62} {'threads':>7} {'mean GB/s':>10} {'anomaly GB/s':>13} {'max err':>9}"]
    rate, medians = {}, {}
    for r in res["rows"]:
        label = ROWS.get(r["kind"], r["kind"])
        if "error" in r:
            lines.append(f"{label:<62} failed: {r['error']}")
            continue
        gm, ga = n / r["mean_s"] / 1e9, n / r["anomaly_s"] / 1e9
        rate[r["kind"]] = (gm, ga)
        err = max(r["err_mean"], r["err_anomaly"])
        lines.append(f"{label:<62} {r.get('threads', res.get('threads', '')):>7} {gm:>10.3f} {ga:>13.3f} {err:>9.2e}")
        if len(r.get("anomaly_times") or ()) > 1:
            medians[r["kind"]] = (n / r["mean_median_s"] / 1e9, n / r["anomaly_median_s"] / 1e9)
            lines.append(f"{'  median of ' + str(len(r['anomaly_times'])) + ' runs':<62} {'':>7} "
                         f"{medians[r['kind']][0]:>10.3f} {medians[r['kind']][1]:>13.3f}")
        if r.get("anomaly_cubed_fusion_s"):
            go = n / r["anomaly_cubed_fusion_s"] / 1e9
            rate["ours-cubed-fusion"] = (gm, go)
            lines.append(f"{'  same, with cubed.core.optimization.multiple_inputs_optimize_dag':<62} {'':>7} "
                         f"{gm:>10.3f} {go:>13.3f}")
        if r.get("anomaly_one_chunk_s"):
            g1 = n / r["anomaly_one_chunk_s"] / 1e9
            lines.append(f"{'  same, by cubed.to_zarr (one Zarr chunk per block)':<62} {'':>7} {gm:>10.3f} {g1:>13.3f}")
    busy = [f"{r['kind']} {r['mean_cores']:.1f} / {r['anomaly_cores']:.1f}" for r in res["rows"]
            if r.get("mean_cores") is not None and r.get("anomaly_cores") is not None]
    if busy:  # a thread spinning in a wait for the GPU counts as busy (see gpuzarr.gpu.sync-wait)
        lines.append("cores kept busy (process CPU seconds / wall), mean / anomaly: " + ", ".join(busy))
    joins = [f"{r['kind']} {c} calls for {q} writes ({q / c:.1f} a call)" for r in res["rows"]
             for c, q in [r.get("anomaly_encode_joins") or (0, 0)] if c]
    if joins:  # nvCOMP encodes one call at a time per GPU; writes that wait meanwhile share the next call
        lines.append("anomaly's joined nvCOMP encodes: " + ", ".join(joins))
    warm = [f"{r['kind']} {r['warmup_s']:.2f}" for r in res["rows"] if r.get("warmup_s") is not None]
    if warm:
        lines.append("first mean of each process, untimed above (CUDA context, kernels, pools), seconds: "
                     + ", ".join(warm))
    for mine, what in (("ours-cubed", "Cubed variant"), ("ours-cubed-fusion", "Cubed variant, cubed's fusion")):
        ours = rate.get(mine)
        for other, target in (("ours-dask", 0.5), ("cubed-cpu", 3.0)):
            if ours and other in rate:
                rm, ra = ours[0] / rate[other][0], ours[1] / rate[other][1]
                line = f"{what} / {ROWS[other].split(' (')[0]}: mean {rm:.2f}x, anomaly {ra:.2f}x"
                if mine in medians and other in medians:
                    line += (f" (medians: {medians[mine][0] / medians[other][0]:.2f}x, "
                             f"{medians[mine][1] / medians[other][1]:.2f}x)")
                lines.append(line + f" (target >= {target}x)")
    oc = next((r for r in res["rows"] if r["kind"] == "ours-cubed" and "error" not in r), None)
    if oc and oc.get("peak_task_bytes") is not None:
        p = oc["peak_task_bytes"]
        if res["device"] == "gpu":
            what = ("CuPy pool, nvCOMP's decode scratch in it" if res.get("nvcomp_api", "c") == "c"
                    else "CuPy pool, nvCOMP scratch outside it")
            shared = oc.get("encode_workspace_bytes")
            lines.append(f"measured peak device memory per task ({what}): "
                         f"{format_bytes(p)} of allowed_mem {format_bytes(res['allowed_mem'])} "
                         f"({'within' if p <= res['allowed_mem'] else 'OVER'}); "
                         f"reserved_mem {format_bytes(oc['reserved_mem'])}"
                         + (f"; plus the process's nvCOMP encode scratch, shared by its tasks: {format_bytes(shared)}"
                            if shared else ""))
        else:
            lines.append(f"host memory: largest growth of the process's peak RSS during one task {format_bytes(p)} "
                         f"(cubed's measure, process-wide, not per task); reserved_mem {format_bytes(oc['reserved_mem'])}")
    if oc and oc.get("intermediate_writes"):
        w = oc["intermediate_writes"]
        lines.append(f"Cubed variant's intermediate and output writes: {w['blocks_encoded']} blocks encoded by "
                     f"gpuzarr-dist ({format_bytes(w['bytes_stored'])} stored), {w['zarr_writes']} by zarr-python")
    dk = next((r for r in res["rows"] if r["kind"] == "ours-dask" and "error" not in r), None)
    if oc and oc.get("anomaly_ops"):
        from gpuzarr_dist.cubed.timing import format_rows

        for key, what in (("anomaly_ops", "gc.to_zarr, optimize_dag"), ("anomaly_cubed_fusion_ops", "cubed's fusion")):
            if oc.get(key):
                tasks = sum(r["tasks"] for r in oc[key] if r["kind"] != "create-arrays")
                lines.append(f"Cubed variant's anomaly per operation ({what}; blocks {oc.get('blocks')}, "
                             f"{tasks} tasks; output chunks {tuple(oc.get('out_chunks') or ())}; "
                             f"source {oc.get('source')}):")
                lines.append(format_rows(oc[key]))
        if dk and dk.get("anomaly_tasks"):
            lines.append(f"dask path's anomaly: {dk['anomaly_tasks']} tasks in the graph, blocks {dk.get('blocks')}")
    return "\n".join(lines)


def _main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpuzarr_dist.bench.cubed")
    p.add_argument("--child", required=True, choices=sorted(ROWS))
    p.add_argument("--path", required=True)
    p.add_argument("--allowed-mem", type=int, required=True)
    p.add_argument("--device", choices=("gpu", "cpu"), required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--progress", action="store_true")
    p.add_argument("--repeats", type=int, default=1)
    a = p.parse_args(argv)
    res = child(a.child, a.path, a.allowed_mem, a.device, a.threads, a.progress, a.repeats)
    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
