"""CPU profile of ``LocalObjectWriter.put_many`` against the write ceiling's plain threads (no GPU needed).

    python tools/cpu_profile_writer.py [--dir DIR] [--threads 1,2,4] [--repeat 5] [--profile]

Writes the same objects (``200 x 3 MiB`` and ``600 x 64 KiB`` of random bytes) into fresh folders under
``--dir`` (default: a temporary folder, i.e. the page cache), under two chunk key layouts: ``c/i/0/0``
(Zarr v3's default, one folder per time step) and ``i.0.0`` (one flat folder), with

- ``ceiling temp+replace``: the bench's ``_replace`` (temporary name, ``os.replace``) on a pool of threads,
  folders made *before* the clock starts (as the bench's ceiling rows do);
- ``ceiling + makedirs``: the same, with each distinct folder made inside the timed region (once);
- ``put_many``: ``LocalObjectWriter.put_many`` with ``gpuzarr.io-threads`` set to the same thread count,
  a new writer per run, once into folders made before the clock starts (like for like with the first)
  and once making its own folders (like for like with the second).

Prints GB/s (best of ``--repeat``, the variants interleaved) and put_many's share of the matching ceiling row. ``--profile`` adds cProfile's
top entries for one put_many call per case (the main thread only: the writes run on I/O threads, so
look at the wall-clock split instead of per-thread internals).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def objects(n: int, size: int, layout: str) -> list[tuple[str, bytes]]:
    blob = os.urandom(size + n)  # distinct slices of one random buffer: cheap, incompressible
    keys = [f"c/{i}/0/0" if layout == "c/0/0/0" else f"{i}.0.0" for i in range(n)]
    return [(k, blob[i : i + size]) for i, k in enumerate(keys)]


def timed(variants: dict, repeat: int) -> dict[str, float]:
    """Best time of each ``name: (run, prepare)``, the variants interleaved run by run so that load from
    other processes falls on all of them alike (best, not median: this machine is shared)."""
    best = {name: float("inf") for name in variants}
    for i in range(repeat + 1):  # the first round is a warm-up
        for name, (fn, prepare) in variants.items():
            prepare()
            t0 = time.perf_counter()
            fn()
            if i:
                best[name] = min(best[name], time.perf_counter() - t0)
    return best


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=None)
    ap.add_argument("--threads", default="1,2,4")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--cases", default="all", help="all, big or small (200 x 3 MiB / 600 x 64 KiB)")
    args = ap.parse_args()

    import dask

    from gpuzarr_dist.bench.write_ceiling import _replace
    from gpuzarr_dist.stores.writer import LocalObjectWriter

    base = tempfile.mkdtemp(prefix="gpuzarr-profile-writer-", dir=args.dir)
    root = os.path.join(base, "w")
    try:
        cases = {"big": [(200, 3 * 2**20)], "small": [(600, 64 * 2**10)]}.get(
            args.cases, [(200, 3 * 2**20), (600, 64 * 2**10)])
        for n, size in cases:
            for layout in ("c/0/0/0", "0.0.0"):
                objs = objects(n, size, layout)
                stored = n * size
                folders = sorted({os.path.dirname(k) for k, _ in objs})
                print(f"{n} x {size / 2**20:.3g} MiB, keys {layout!r} ({len(folders)} folders):")

                def fresh(make: bool) -> None:
                    shutil.rmtree(root, ignore_errors=True)
                    os.makedirs(root)
                    if make:
                        for d in folders:
                            os.makedirs(os.path.join(root, d), exist_ok=True)

                for t in (int(x) for x in args.threads.split(",")):
                    with ThreadPoolExecutor(t) as pool, dask.config.set({"gpuzarr.io-threads": t}):
                        def ceiling() -> None:
                            list(pool.map(lambda kd: _replace(root, *kd), objs))

                        def ceiling_mk() -> None:
                            for d in folders:
                                os.makedirs(os.path.join(root, d), exist_ok=True)
                            ceiling()

                        def ours() -> None:
                            LocalObjectWriter(root, "profile").put_many(objs)

                        made, bare = (lambda: fresh(True)), (lambda: fresh(False))
                        b = timed({"ceil": (ceiling, made), "ours_mk": (ours, made), "mk": (ceiling_mk, bare),
                                   "ours": (ours, bare)}, args.repeat)
                        s_ceil, s_ours_mk, s_mk, s_ours = b["ceil"], b["ours_mk"], b["mk"], b["ours"]
                        print(f"  {t} threads, GB/s: ceiling temp+replace {stored / s_ceil / 1e9:5.2f}, "
                              f"put_many into made folders {stored / s_ours_mk / 1e9:5.2f} "
                              f"({s_ceil / s_ours_mk:.0%});  ceiling + makedirs {stored / s_mk / 1e9:5.2f}, "
                              f"put_many making its folders {stored / s_ours / 1e9:5.2f} ({s_mk / s_ours:.0%})")
                        if args.profile and t == max(int(x) for x in args.threads.split(",")):
                            fresh(False)
                            prof = cProfile.Profile()
                            prof.enable()
                            ours()
                            prof.disable()
                            pstats.Stats(prof).sort_stats("cumulative").print_stats(12)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
