"""CPU profile of the sharded block read and of a window call (no GPU needed): host-side planning and reads.

    python tools/cpu_profile_shards.py [--path DIR] [--steps 64] [--profile]

Times ``store.read_into`` of one block of ``--steps`` time steps for the unsharded array and the sharded
arrays (256 KiB and 1 MiB inner chunks), with the stage split (index reads, range planning, range reads),
and ``WindowSampler.sample`` calls of 64 and 256 windows on the CPU device, with and without the CPU
decode (the host-side planning per call is printed on its own). ``--steps 192`` is the H200 bench's shape. ``--profile`` adds cProfile's top
entries for the 256 KiB block read.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def best(fn, repeat=7):
    fn()
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return min(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--path", default="/tmp/gpuzarr-profile-shards")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()

    from gpuzarr_dist.runtime import stages
    from gpuzarr_dist.core.selection import plan_selection
    from gpuzarr_dist.bench.shards import write_variants
    from gpuzarr_dist.stores.source import open_source
    from gpuzarr_dist.array.windows import WindowSampler

    paths = write_variants(args.path, args.steps, 721, 1440, shard_t=4)
    sel = (slice(0, args.steps), slice(None), slice(None))

    def staging(n):
        return np.empty(n, dtype=np.uint8)

    for name in ("unsharded", "inner256k", "inner1m"):
        store, spec = open_source(paths[name], None, None)
        t0 = time.perf_counter()
        parts = plan_selection(spec, sel).parts
        keys = [spec.chunk_key(p.coords) for p in parts]
        t_keys = time.perf_counter() - t0
        buf, offs, sizes = store.read_into(keys, staging, 256)
        stored = sum(s for s in sizes if s > 0)
        sec = best(lambda: store.read_into(keys, staging, 256))
        print(f"{name:<10} {len(keys):5d} keys  plan+keys {1e3 * t_keys:7.2f} ms  read_into {1e3 * sec:8.2f} ms "
              f"({stored / sec / 1e9:5.2f} GB/s of {stored / 1e6:.0f} MB stored)")
        if hasattr(store, "base"):  # host-side work alone: the same call with the byte-range reads left out
            real = store.base.read_ranges_into
            store.base.read_ranges_into = lambda reads, buf, *prepared: [r.length for r in reads]
            plan_sec = best(lambda: store.read_into(keys, staging, 256), 15)
            store.base.read_ranges_into = real
            print(f"{'':<10} host-side planning (keys parsed, indexes read and decoded, ranges planned): {1e3 * plan_sec:.2f} ms")
        stages.enable()
        stages.reset()
        for _ in range(5):
            store.read_into(keys, staging, 256)
        st = stages.snapshot()
        stages.enable(False)
        if st:
            print(stages.format_stages(st))
        if args.profile and name == "inner256k":
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(5):
                store.read_into(keys, staging, 256)
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(14)

    sampler = WindowSampler(paths["inner256k"], (4, 128, 128), device="cpu")
    dec = sampler._decode
    got = {}

    def cached(keys):  # read + decode once per batch: what is left is the per-window work (plan, keys, cut)
        k = tuple(keys)
        if k not in got:
            got[k] = dec(keys)
        return got[k]

    sampler._decode = cached
    starts = [sampler.random_starts(64, rng=i) for i in range(8)]
    for s in starts:
        sampler.sample(s)
    it = iter(range(10**9))
    sec = best(lambda: sampler.sample(starts[next(it) % 8]), 15)
    print(f"WindowSampler.sample, 64 windows (cpu), read + decode cached: {1e3 * sec:.2f} ms of per-window work")
    sampler._decode = dec
    for batch in (64, 256):
        starts = [sampler.random_starts(batch, rng=100 + i) for i in range(8)]
        it = iter(range(10**9))
        stages.enable()
        stages.reset()
        sec = best(lambda: sampler.sample(starts[next(it) % 8]), 7)
        print(f"WindowSampler.sample, {batch} windows (cpu): {1e3 * sec:.2f} ms ({batch / sec:.0f} windows/s)")
        print(stages.format_stages(stages.snapshot()))
        stages.enable(False)

    def no_decode(keys):  # the read happens (indexes, ranges); the CPU decode, which the GPU replaces, is left out
        raw = sampler.reader.store.read_many(keys) if keys else []
        present = [i for i, b in enumerate(raw) if b is not None]
        return np.zeros((len(present), *sampler.spec.chunk_shape), sampler.spec.dtype), present

    sampler._decode = no_decode
    for batch in (64, 256):
        starts = [sampler.random_starts(batch, rng=200 + i) for i in range(8)]
        it = iter(range(10**9))
        stages.enable()
        stages.reset()
        sec = best(lambda: sampler.sample(starts[next(it) % 8]), 7)
        st = stages.snapshot()
        stages.enable(False)
        host_ms = sum(1e3 * st[k][0] / st["windows: plan"][1] for k in ("windows: plan", "shards: parse keys", "index reads",
                                                                       "range planning", "range checks") if k in st)
        print(f"WindowSampler.sample, {batch} windows, decode left out: {1e3 * sec:.2f} ms per call; host-side "
              f"planning (plan, keys, indexes, ranges, checks) {host_ms:.2f} ms per call")
    sampler._decode = dec
    starts = [sampler.random_starts(64, rng=i) for i in range(8)]
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for i in range(5):
            sampler.sample(starts[i])
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(14)
    return 0


if __name__ == "__main__":
    sys.exit(main())
