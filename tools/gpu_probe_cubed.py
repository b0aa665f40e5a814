"""Where the Cubed variant's time goes, against our dask path, in one process on one array.

For each configuration (threads, read block, reserved_mem) it runs the time
mean once untimed, then times the mean and the anomaly (``gc.to_zarr`` with
``gc.optimize_dag``) and prints GB/s with cubed's per-operation table
(:class:`gpuzarr_dist.cubed.OpTimings`): tasks, wall and summed task seconds
(their ratio is the operation's mean concurrency), reads and writes. Then the
dask path's mean and anomaly on the same data. Results are checked against
the float64 numpy mean kept by ``bench cubed``'s data writer.

    python3 tools/gpu_probe_cubed.py --path /tmp/cb --steps 400 \\
        --config threads=16 --config threads=4 --config threads=8,read_block=40MB,reserved_mem=4MB
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import numpy as np


def parse_config(text: str) -> dict:
    out: dict = {}
    for kv in filter(None, text.split(",")):
        k, v = kv.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--path", required=True)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--allowed-mem", default=None, help="default: the array's bytes / 10 (as bench cubed)")
    p.add_argument("--config", action="append", default=[], help="threads=N,read_block=B,reserved_mem=B,measure=M")
    p.add_argument("--device", default="gpu")
    p.add_argument("--no-dask", action="store_true")
    p.add_argument("--no-cubed", action="store_true")
    p.add_argument("--mean-only", action="store_true", help="time the mean only (e.g. under a profiler)")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--json", default=None)
    a = p.parse_args()

    from dask.utils import format_bytes, parse_bytes

    from gpuzarr_dist.bench.cubed import write_data

    shape, chunks = (a.steps, 721, 1440), (8, 181, 360)
    ref = write_data(a.path, shape, chunks)
    src = os.path.join(a.path, "x.zarr")
    nbytes = 4 * int(np.prod(shape))
    allowed = int(parse_bytes(a.allowed_mem)) if a.allowed_mem else nbytes // 10
    print(f"array {shape} chunks {chunks} {nbytes / 1e9:.2f} GB; allowed_mem {format_bytes(allowed)}", flush=True)

    import gpuzarr_dist.cubed as gc

    gc.use_backend(a.device)  # before cubed's import: it reads its array backend then
    import cubed
    import cubed.array_api as xp
    from gpuzarr_dist.cubed.timing import format_rows

    def host(v):
        return v.get() if hasattr(v, "get") else np.asarray(v)

    class Tasks(cubed.Callback):
        def __init__(self):
            self.by_op: dict = {}

        def on_task_end(self, event):
            s, e = getattr(event, "function_start_tstamp", None), getattr(event, "function_end_tstamp", None)
            if s is not None and e is not None:
                self.by_op.setdefault(event.name, []).append((s, e))

        def summary(self):
            out = []
            for op, spans in self.by_op.items():
                d = sorted(e - s for s, e in spans)
                first, last = min(s for s, _ in spans), max(e for _, e in spans)
                out.append(f"    {op}: {len(d)} tasks, median {statistics.median(d) * 1e3:.1f} ms, "
                           f"p90 {d[int(0.9 * (len(d) - 1))] * 1e3:.1f} ms, max {d[-1] * 1e3:.1f} ms, "
                           f"span {1e3 * (last - first):.0f} ms")
            return "\n".join(out)

    results = []
    for text in [] if a.no_cubed else (a.config or ["threads=16"]):
        cfg = parse_config(text)
        work = tempfile.mkdtemp(prefix="probe-cubed-", dir=a.path)
        kw = {}
        if "read_block" in cfg:
            kw["read_block"] = int(parse_bytes(cfg["read_block"]))
        if "reserved_mem" in cfg:
            kw["reserved_mem"] = int(parse_bytes(cfg["reserved_mem"]))
        s = gc.spec(allowed, work, device=a.device, **kw)
        s.executor.max_workers = int(cfg.get("threads", 16))
        if "measure" in cfg:
            s.executor.measure = cfg["measure"]
        x = gc.from_zarr_gpu(src, spec=s)
        block = x.chunks[0][0], x.chunks[1][0], x.chunks[2][0]
        bb = 4 * int(np.prod(block))
        print(f"\n== {text}: blocks {block} ({format_bytes(bb)}), reserved_mem {format_bytes(s.reserved_mem)}",
              flush=True)
        t = time.perf_counter()
        m = xp.mean(x, axis=0).compute()
        print(f"  first mean {time.perf_counter() - t:.2f} s", flush=True)
        row = {"config": text, "block": block}
        for rep in range(a.repeat):
            ops, tasks = gc.OpTimings(), Tasks()
            cpu0 = cpu_seconds()
            t = time.perf_counter()
            m = xp.mean(x, axis=0).compute(callbacks=[ops, tasks])
            el = time.perf_counter() - t
            busy = (cpu_seconds() - cpu0) / el  # cores kept busy; threads spinning in GPU waits count
            err = float(np.max(np.abs(host(m).astype("f8") - ref)))
            print(f"  mean {el:.3f} s = {nbytes / el / 1e9:.2f} GB/s, {busy:.1f} cores busy (max err {err:.1e})",
                  flush=True)
            print(format_rows(ops.rows()))
            print(tasks.summary())
            row.setdefault("mean_gbs", []).append(nbytes / el / 1e9)
            if a.mean_only:
                continue
            ops, tasks = gc.OpTimings(), Tasks()
            out = os.path.join(work, f"anom{rep}.zarr")
            t = time.perf_counter()
            gc.to_zarr(x - xp.mean(x, axis=0), out, callbacks=[ops, tasks], optimize_function=gc.optimize_dag)
            el = time.perf_counter() - t
            import zarr

            z = zarr.open_array(out, mode="r")
            err = float(np.max(np.abs(host(z[a.steps // 2]).astype("f8") - (host(cubed_src_row(src, a.steps // 2)).astype("f8") - ref))))
            print(f"  anomaly (optimize_dag) {el:.3f} s = {nbytes / el / 1e9:.2f} GB/s (max err {err:.1e})", flush=True)
            print(format_rows(ops.rows()))
            print(tasks.summary())
            row.setdefault("anomaly_gbs", []).append(nbytes / el / 1e9)
        results.append(row)
        shutil.rmtree(work, ignore_errors=True)

    if not a.no_dask and a.device == "gpu":
        import dask

        import gpuzarr_dist as gz

        xd = gz.from_zarr_gpu(src, device=a.device)
        print(f"\n== dask path: blocks {[c[0] for c in xd.chunks]}", flush=True)
        with dask.config.set(scheduler="threads", num_workers=16):
            xd.mean(axis=0).compute()
            for rep in range(a.repeat):
                t = time.perf_counter()
                md = xd.mean(axis=0).compute()
                el = time.perf_counter() - t
                err = float(np.max(np.abs(host(md).astype("f8") - ref)))
                print(f"  mean {el:.3f} s = {nbytes / el / 1e9:.2f} GB/s (max err {err:.1e})", flush=True)
                if a.mean_only:
                    continue
                t = time.perf_counter()
                gz.to_zarr_gpu(xd - xd.mean(axis=0), os.path.join(a.path, f"dask-anom{rep}.zarr"), overwrite=True)
                el2 = time.perf_counter() - t
                print(f"  anomaly {el2:.3f} s = {nbytes / el2 / 1e9:.2f} GB/s", flush=True)
                shutil.rmtree(os.path.join(a.path, f"dask-anom{rep}.zarr"), ignore_errors=True)
                results.append({"config": "dask", "mean_gbs": [nbytes / el / 1e9], "anomaly_gbs": [nbytes / el2 / 1e9]})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def cpu_seconds() -> float:
    """User + system CPU seconds of this process, all threads."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def cubed_src_row(src: str, t: int):
    import zarr

    return zarr.open_array(src, mode="r")[t]


if __name__ == "__main__":
    raise SystemExit(main())
