"""GPU probe of the sharded read paths: store-level block reads (old per-chunk kvikio vs one preadv per shard),
whole-block GPU reads, the time mean sharded vs unsharded, per-stage ms per block of 64 steps (host reads:
parse keys / index reads / staging alloc / range planning / range reads; GPU: H2D / frame checks / nvCOMP /
checksums; place) for unsharded vs 256 KiB / 1 MiB inner chunks with 1 and 16 threads, and WindowSampler
calls of 64 and 256 windows (shard-index cache on and off; tensorstore on the same windows when installed),
each with its stage times; SUMMARY lines give the sharded/unsharded ratio and windows/s against tensorstore. A plain script: prints a compact table; exits nonzero if a value is wrong.

    python tools/gpu_probe_shards.py [--path DIR] [--steps 192]

The data (float32 (steps, 721, 1440), zstd level 0; unsharded, 256 KiB and 1 MiB inner chunks) is written
once under --path (default /tmp/gpuzarr-probe-shards) and reused.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def best(fn, repeat=5):
    fn()
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return min(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--path", default="/tmp/gpuzarr-probe-shards")
    ap.add_argument("--steps", type=int, default=192)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--device", default="gpu", help="cpu: a dry run of the script's logic on a machine without a GPU")
    args = ap.parse_args()
    device = args.device

    import dask
    import zarr

    from gpuzarr_dist.runtime import stages
    from gpuzarr_dist.core.selection import plan_selection
    from gpuzarr_dist.bench.shards import write_variants
    from gpuzarr_dist.array.reader import BlockReader
    if device == "gpu":
        from gpuzarr_dist.cuda.streams import ALIGN, pinned_staging
    else:
        ALIGN = 256

        def pinned_staging(n):
            return np.empty(n, dtype=np.uint8)

    def host(a):
        return a.get() if hasattr(a, "get") else a
    from gpuzarr_dist.stores.source import open_source
    from gpuzarr_dist.array.windows import WindowSampler
    from gpuzarr_dist.array.read import from_zarr_gpu

    t0 = time.perf_counter()
    paths = write_variants(args.path, args.steps, 721, 1440, shard_t=4)
    print(f"data ready in {time.perf_counter() - t0:.1f} s: {args.path}")
    failures = 0
    print(f"{'what':<58} {'ms':>9} {'GB/s':>7}")

    def row(what, sec, nbytes=None):
        rate = f"{nbytes / sec / 1e9:7.2f}" if nbytes else ""
        print(f"{what:<58} {1e3 * sec:9.3f} {rate:>7}", flush=True)

    # 1. store level: one block (4 steps) of the 256 KiB array
    for name in ("inner256k", "inner1m", "unsharded"):
        store, spec = open_source(paths[name], None, None)
        sel = (slice(4, 8), slice(None), slice(None))
        keys = [spec.chunk_key(p.coords) for p in plan_selection(spec, sel).parts]
        variants = [("new (preadv per shard span)", {})]
        if name != "unsharded":
            variants.append(("old (kvikio read per inner chunk)", {"gpuzarr.shards.local-reads": "kvikio",
                                                                   "gpuzarr.shards.merge-gap": "64 KiB"}))
        for label, cfg in variants:
            with dask.config.set(cfg):
                buf = store.read_into(keys, pinned_staging, ALIGN)[0]
                row(f"read_into {name}, {len(keys)} keys, {label}", best(lambda: store.read_into(keys, pinned_staging, ALIGN)),
                    len(keys) and int(np.prod(buf.shape)))
        reader = BlockReader(store, spec, device)
        ref = zarr.open_array(paths[name], mode="r")[sel]
        got = host(reader[sel])
        if not np.array_equal(got, ref):
            print(f"FAIL: {name} block differs from zarr-python")
            failures += 1
        stages.enable()
        stages.reset()
        row(f"BlockReader[4:8] {name} on the GPU", best(lambda: reader[sel]), ref.nbytes)
        print(stages.format_stages(stages.snapshot()))
        stages.enable(False)

    # 2. the time mean through dask, as the bench runs it
    nbytes = args.steps * 721 * 1440 * 4
    rates = {}
    for name in ("unsharded", "inner256k", "inner1m"):
        x = from_zarr_gpu(paths[name], device=device)

        def mean():
            with dask.config.set(scheduler="threads", num_workers=args.threads):
                float(x.mean(axis=0).compute()[0, 0])

        sec = best(mean, 3)
        rates[name] = nbytes / sec / 1e9
        row(f"time mean {name}, {args.threads} threads", sec, nbytes)
    print(f"SUMMARY time mean, {args.threads} threads: unsharded {rates['unsharded']:.2f} GB/s; sharded 256 KiB "
          f"{rates['inner256k']:.2f} ({rates['inner256k'] / rates['unsharded']:.2f}x), 1 MiB {rates['inner1m']:.2f} "
          f"({rates['inner1m'] / rates['unsharded']:.2f}x); target >= 1x", flush=True)

    # 2b. per-stage ms per block (64 steps) through dask, 1 and 16 threads: which stage of the sharded read is slow
    block = 64
    for threads in (1, args.threads):
        for name in ("unsharded", "inner256k", "inner1m"):
            x = from_zarr_gpu(paths[name], device=device, chunks=(block, 721, 1440))

            def mean():
                with dask.config.set(scheduler="threads", num_workers=threads):
                    float(x.mean(axis=0).compute()[0, 0])

            mean()  # warm: pinned pool, codecs, kernels
            stages.enable()
            stages.reset()
            t0 = time.perf_counter()
            mean()
            sec = time.perf_counter() - t0
            st = stages.snapshot()
            stages.enable(False)
            row(f"time mean {name}, blocks of {block} steps, {threads} threads (stages below)", sec, nbytes)
            print(stages.format_stages(st))

    # 3. window calls: ours with the shard-index cache (default) and without, tensorstore on the same windows
    ref = zarr.open_array(paths["inner256k"], mode="r")
    try:
        import tensorstore as ts

        ts_arr = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": paths["inner256k"]}}, read=True).result()
    except ImportError:
        ts_arr = None
    win = (4, 128, 128)
    for batch in (64, 256):
        for label, cache in (("index cache on", "64 MiB"), ("index cache off", 0)):
            sampler = WindowSampler(paths["inner256k"], win, device=device, index_cache=cache)
            starts = [sampler.random_starts(batch, rng=100 + i) for i in range(21)]  # the timed calls use fresh windows
            check = host(sampler.sample(starts[0]))
            for s, w in zip(starts[0][:16], check[:16]):
                if not np.array_equal(w, ref[tuple(slice(int(a), int(a) + n) for a, n in zip(s, win))]):
                    print(f"FAIL: window at {s} differs from zarr-python")
                    failures += 1
                    break
            stages.enable()
            stages.reset()
            it = iter(range(1, 10**9))
            sec = best(lambda: sampler.sample(starts[next(it) % 21]), 10)
            row(f"WindowSampler.sample, {batch} windows/call, {label} ({batch / sec:.0f} windows/s)", sec)
            print(stages.format_stages(stages.snapshot()))
            stages.enable(False)
            if cache:
                ours = batch / sec
        if ts_arr is not None:
            it = iter(range(1, 10**9))

            def ts_batch():
                futs = [ts_arr[tuple(slice(int(a), int(a) + n) for a, n in zip(s, win))].read() for s in starts[next(it) % 21]]
                for f in futs:
                    f.result()

            sec = best(ts_batch, 10)
            row(f"tensorstore, {batch} reads in flight ({batch / sec:.0f} windows/s)", sec)
            print(f"SUMMARY windows {batch}/call: ours {ours:.0f}/s, tensorstore {batch / sec:.0f}/s, "
                  f"ratio {ours * sec / batch:.2f}x (target 2x)", flush=True)
    print("FAILED" if failures else "ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
