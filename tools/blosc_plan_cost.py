#!/usr/bin/env python3
"""Host cost of the Blosc plan (``plan_frames`` + ``place``) per batch, alone and under thread contention.

The GPU path plans every block's frames on the dask worker thread before the
decode, so under a threaded scheduler many threads plan at once and contend
for the GIL. This builds batches like the real ones: ERA5-like float32
(721, 1440) chunks (a smooth field plus noise, 4.15 MB decoded), encoded by
numcodecs' Blosc (lz4, clevel 5, byte shuffle, typesize 4), laid out in one
uint8 buffer at 256-byte aligned offsets; then times ``plan_frames`` +
``place`` on one thread and with ``--threads`` threads calling it at once
(each thread making calls back to back, as busy dask workers would): the
mean time of one call, in milliseconds, as the calling thread sees it::

    python3 tools/blosc_plan_cost.py [--chunks 64 225] [--threads 16] [--calls 64] [--impl new|old]

``--impl old`` times the reference copy of the earlier, per-frame
``plan_frames`` kept in ``tests/test_blosc_plan_vectorised.py``. Only a few
distinct chunks are encoded and repeated (the plan's cost depends on the
frames' structure, not on their bytes).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from gpuzarr_dist.codecs import blosc_frames as bf  # noqa: E402

SHAPE = (721, 1440)


def era5_like_frames(distinct: int, seed: int = 0) -> list[np.ndarray]:
    """``distinct`` Blosc frames of float32 (721, 1440) fields: smooth large-scale pattern plus noise."""
    import numcodecs

    codec = numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)
    lat = np.linspace(-90, 90, SHAPE[0], dtype=np.float32)[:, None]
    lon = np.linspace(0, 360, SHAPE[1], endpoint=False, dtype=np.float32)[None, :]
    rng = np.random.default_rng(seed)
    frames = []
    for t in range(distinct):
        field = (273.0 + 30 * np.cos(np.deg2rad(lat)) + 5 * np.sin(np.deg2rad(2 * lon + 7 * t))
                 + rng.normal(0, 0.5, SHAPE)).astype(np.float32)
        frames.append(np.frombuffer(codec.encode(field), np.uint8))
    return frames


def batch(frames: list[np.ndarray], n: int) -> tuple[np.ndarray, list[int], list[int]]:
    """``n`` frames (cycling through ``frames``) in one buffer at 256-byte aligned offsets."""
    offsets, sizes, at = [], [], 0
    for i in range(n):
        f = frames[i % len(frames)]
        offsets.append(at)
        sizes.append(f.size)
        at = int(bf._align(at + f.size))
    host = np.zeros(at, np.uint8)
    for o, s, i in zip(offsets, sizes, range(n)):
        host[o : o + s] = frames[i % len(frames)]
    return host, offsets, sizes


def load_impl(name: str):
    if name == "new":
        return bf.plan_frames
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import test_blosc_plan_vectorised as ref

    return ref.plan_frames_v1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--chunks", type=int, nargs="+", default=[64, 225])
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--calls", type=int, default=64, help="calls timed on one thread, and in all over the threads")
    p.add_argument("--distinct", type=int, default=8, help="distinct chunks encoded")
    p.add_argument("--impl", choices=["new", "old"], default="new")
    args = p.parse_args(argv)
    plan_frames = load_impl(args.impl)
    frames = era5_like_frames(args.distinct)
    expected = SHAPE[0] * SHAPE[1] * 4
    print(f"impl={args.impl} cpus={os.cpu_count()} numpy={np.__version__} "
          f"frame bytes ~{int(np.mean([f.size for f in frames]))} of {expected}")
    for n in args.chunks:
        host, offsets, sizes = batch(frames, n)
        keys = [f"{i}.0.0" for i in range(n)]
        in_total = offsets[-1] + sizes[-1]

        def one() -> float:
            t0 = time.perf_counter()
            plan = plan_frames("t2m", host, offsets, sizes, keys, expected)
            bf.place(plan, in_total)
            return time.perf_counter() - t0

        plan = plan_frames("t2m", host, offsets, sizes, keys, expected)
        for _ in range(3):
            one()
        single = [one() for _ in range(args.calls)]
        # every thread makes `reps` calls back to back, all starting together: per-call latency under contention
        reps = max(1, args.calls // args.threads)
        barrier = threading.Barrier(args.threads)

        def worker(_: int) -> list[float]:
            one()
            barrier.wait()
            return [one() for _ in range(reps)]

        with ThreadPoolExecutor(args.threads) as pool:
            t0 = time.perf_counter()
            conc = [t for ts in pool.map(worker, range(args.threads)) for t in ts]
            wall = time.perf_counter() - t0
        print(f"N={n:4d} blocks={plan.nblocks} pieces={plan.npieces}: "
              f"1 thread {1e3 * statistics.mean(single):7.2f} ms/call (median {1e3 * statistics.median(single):.2f}); "
              f"{args.threads} threads {1e3 * statistics.mean(conc):7.2f} ms/call "
              f"(median {1e3 * statistics.median(conc):.2f}, max {1e3 * max(conc):.2f}; "
              f"{1e3 * wall / (args.threads * (reps + 1)):.2f} ms wall per call)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
