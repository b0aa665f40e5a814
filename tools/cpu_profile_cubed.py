"""Where the Cubed variant's time goes on the CPU: per-operation tables and a cProfile of the task threads.

    python tools/cpu_profile_cubed.py DATA_DIR [--threads 2] [--allowed-mem BYTES] [--read-block BYTES] [--profile]

``DATA_DIR`` is a ``bench cubed --path`` folder (its ``x.zarr``; e.g. made by
``gpuzarr-dist bench cubed --time-steps 96 --device cpu --path DATA_DIR``). Runs the bench's
three computations (time mean; anomaly with cubed's default fusion; anomaly with
``gc.optimize_dag``) through the Cubed variant on the CPU and prints, for each, GB/s and
:class:`gpuzarr_dist.cubed.OpTimings`' table. ``--profile`` wraps every task in a cProfile
of its worker thread (the ThreadsExecutor's threads; cProfile of the main thread sees only
waits) and prints the merged top entries. The CPU decode threads (``decode_pool``) are not
profiled: their time shows as ``acquire`` in the task threads.
Run it from the repository root (or with PYTHONPATH set to it) so that this checkout is imported.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import sys
import tempfile
import threading
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("path")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--allowed-mem", type=int, default=None, help="default: the array's size / 10, as the bench")
    p.add_argument("--read-block", type=int, default=None, help="spec(read_block=...); default: spec()'s")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--top", type=int, default=30)
    a = p.parse_args(argv)

    import zarr

    import gpuzarr_dist.cubed as gc

    src = os.path.join(a.path, "x.zarr")
    nbytes = zarr.open_array(src, mode="r").nbytes
    allowed = a.allowed_mem or nbytes // 10
    work = tempfile.mkdtemp(prefix="profile-cubed-")
    s = gc.spec(allowed, work, device="cpu", read_block=a.read_block)
    s.executor.max_workers = a.threads
    import cubed
    import cubed.array_api as xp

    profs: list[cProfile.Profile] = []
    if a.profile:
        import gpuzarr_dist.cubed.executor as ex

        local = threading.local()
        run_task = ex.run_task

        def profiled(*args, **kw):
            prof = getattr(local, "prof", None)
            if prof is None:
                prof = local.prof = cProfile.Profile()
                profs.append(prof)
            prof.enable()
            try:
                return run_task(*args, **kw)
            finally:
                prof.disable()

        ex.run_task = profiled
    x = gc.from_zarr_gpu(src, spec=s)
    print(f"{src}: {x.shape} {x.dtype}, blocks {x.chunksize}; allowed_mem {allowed}, reserved_mem {s.reserved_mem}, "
          f"{a.threads} threads")
    runs = [
        ("mean", lambda cbs: xp.mean(x, axis=0).compute(callbacks=cbs)),
        ("anomaly (default fusion)",
         lambda cbs: cubed.to_zarr(x - xp.mean(x, axis=0), os.path.join(work, "a.zarr"), callbacks=cbs)),
        ("anomaly (optimize_dag)",
         lambda cbs: cubed.to_zarr(x - xp.mean(x, axis=0), os.path.join(work, "b.zarr"), callbacks=cbs,
                                   optimize_function=gc.optimize_dag)),
    ]
    try:
        for label, fn in runs:
            ops = gc.OpTimings()
            t = time.perf_counter()
            fn([ops])
            dt = time.perf_counter() - t
            print(f"{label}: {dt:.3f} s, {nbytes / dt / 1e9:.3f} GB/s")
            print(ops.table())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if profs:
        st = pstats.Stats(profs[0])
        for prof in profs[1:]:
            st.add(prof)
        st.sort_stats("tottime").print_stats(a.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
