"""Random windows: how ``WindowSampler.batches`` scales with calls in flight, warm, against tensorstore.

For batches of 64, 128 and 256 (4, 128, 128) windows of ``bench shards``'s
sharded array (256 KiB inner chunks), and 1 to 8 calls in flight, each
setting runs once to warm its threads, streams and pinned staging buffers,
then twice timed (the better rate is printed). Then the stage table of a
few settings with the stage timer on (which synchronises), and tensorstore
with 64 to 1024 reads in flight on the same files.

Measured on an H200 (session 18, 192 steps), windows/s:

| windows per call | 1 in flight | 2 | 4 | 8 |
|---|---|---|---|---|
| 64 | 1797 | 2623 | 2522 | 3033 |
| 128 | 2923 | 3583 | 3955 | |
| 256 | 5243 | 6828 | 7329 | |

Tensorstore: 4511 / 5856 / 6816 / 8402 with 64 / 256 / 512 / 1024 in flight.
At equal windows in flight: 0.43x with 64 x 4 and 0.90x with 256 x 1, against
the 2x asked. A 256-window call reads about 1560 inner chunks, 315 MB stored.
Alone its file reads took 22 ms (14 GB/s), with 4 calls in flight 59 ms each.
nvCOMP took 12-18 ms, of which 7.7 ms is the least any call costs
(``tools/gpu_probe_nvcomp_latency.py``). The frame checks took 9-14 ms.
Both tools read the same stored bytes from the page cache.

    python3 tools/gpu_probe_windows_inflight.py [--path /tmp/sh] [--steps 192] [--device gpu]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--path", default="/tmp/sh")
    ap.add_argument("--steps", type=int, default=192)
    ap.add_argument("--device", default="gpu", help="cpu: a dry run of the script's logic on a machine without a GPU")
    args = ap.parse_args()

    from gpuzarr_dist.runtime import stages
    from gpuzarr_dist.bench.shards import write_variants
    from gpuzarr_dist.array.windows import WindowSampler

    paths = write_variants(args.path, args.steps, 721, 1440, shard_t=4)
    win = (4, 128, 128)
    s = WindowSampler(paths["inner256k"], win, device=args.device)
    seed = [0]

    def starts(b: int, n: int) -> list:
        seed[0] += 1
        return [s.random_starts(b, rng=10000 * seed[0] + i) for i in range(n)]

    def run(items: list, in_flight: int) -> float:
        t0 = time.perf_counter()
        for _ in s.batches(items, in_flight=in_flight):
            pass
        return time.perf_counter() - t0

    for b, fls in ((64, (1, 2, 4, 8)), (128, (1, 2, 4)), (256, (1, 2, 4))):
        for fl in fls:
            n = max(12, 3 * fl)
            run(starts(b, n), fl)  # warm: this pool's threads, their streams and staging buffers
            best = max(b * n / run(starts(b, n), fl) for _ in range(2))
            print(f"batch {b:4d} in_flight {fl}: {best:7.0f} windows/s ({b * fl} windows in flight)", flush=True)
    for b, fl in ((256, 1), (256, 4), (64, 4)):
        run(starts(b, 8), fl)
        stages.reset()
        stages.enable()
        t = run(starts(b, 8), fl)
        stages.enable(False)
        print(f"== batch {b} in_flight {fl}, stage timer on: {8 * b / t:.0f} windows/s; {1e3 * t / 8:.1f} ms per call")
        print(stages.format_stages(stages.snapshot()))
    try:
        import tensorstore as ts
    except ImportError:
        print("tensorstore is not installed")
        return 0
    arr = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": paths["inner256k"]}}, read=True).result()
    for g in (64, 256, 512, 1024):
        best = 0.0
        for rep in range(2):
            todo = s.random_starts(2048, rng=3 + rep)
            t0 = time.perf_counter()
            for i in range(0, 2048, g):
                futs = [arr[tuple(slice(int(v), int(v) + w) for v, w in zip(x, win))].read() for x in todo[i : i + g]]
                for f in futs:
                    f.result()
            best = max(best, 2048 / (time.perf_counter() - t0))
        print(f"tensorstore {g} in flight: {best:.0f} windows/s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
