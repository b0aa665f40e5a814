"""GPU probe: where does a sharded time mean lose against the same data unsharded? (local files, page cache)

Writes ``bench shards``' arrays (float32 (STEPS, 721, 1440), zstd level 0; unsharded, 256 KiB and 1 MiB inner
chunks) under ROOT once, then, per variant:

1. one block (BLOCK steps) read on one thread with stage timing on, under ``zstd-check`` literals and headers
   (``ONE=0`` skips this);
2. the dask time mean (16 threads, auto blocks), RUNS runs twice over, with generation-2 collections counted;
3. the stage sums of one time mean under 16 threads.

    STEPS=960 RUNS=4 python tools/gpu_probe_shard_means.py

Environment: STEPS (960), BLOCK (auto: the unsharded array's auto block), RUNS (4), ROOT (/tmp/gap),
VARIANTS (unsharded,inner256k,inner1m), ONE (1). Session 22's README section quotes its MEAN lines.
"""
import sys
import gc
import os
import time

import dask

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
steps = int(os.environ.get("STEPS", 960))
runs = int(os.environ.get("RUNS", 4))
root = os.environ.get("ROOT", "/tmp/gap")
from gpuzarr_dist.runtime import stages
from gpuzarr_dist.bench.shards import write_variants
from gpuzarr_dist.array.read import from_zarr_gpu
from gpuzarr_dist.array.reader import BlockReader
from gpuzarr_dist.stores.source import open_source

t0 = time.perf_counter()
paths = write_variants(root, steps, 721, 1440, shard_t=4)
print(f"data {time.perf_counter() - t0:.1f} s", flush=True)
nbytes = steps * 721 * 1440 * 4
names = [v for v in os.environ.get("VARIANTS", "unsharded,inner256k,inner1m").split(",")]
block = int(os.environ.get("BLOCK", 0)) or from_zarr_gpu(paths["unsharded"], device="gpu").chunks[0][0]
print(f"block {block} steps; auto blocks: " + ", ".join(f"{n} {from_zarr_gpu(paths[n], device='gpu').chunks[0]}" for n in names), flush=True)


def fmt(st):
    return "  ".join(f"{k} {1e3 * s / max(c, 1):.1f}x{c}" for k, (s, c) in st.items())


# 1. one block, one thread
for name in (names if os.environ.get('ONE', '1') == '1' else []):
    store, spec = open_source(paths[name])
    r = BlockReader(store, spec, "gpu")
    sel = (slice(0, block), slice(None), slice(None))
    for check in ("literals", "headers"):
        with dask.config.set({"gpuzarr.gpu.zstd-check": check}):
            r[sel]
            ts = []
            for _ in range(4):
                t = time.perf_counter()
                r[sel]
                ts.append(time.perf_counter() - t)
            stages.enable(); stages.reset()
            for _ in range(3):
                r[sel]
            st = stages.snapshot(); stages.enable(False)
        print(f"ONE {name:<10} {check:<8} best {1e3 * min(ts):7.1f} ms  stages/call: {fmt(st)}", flush=True)

# 2. the time mean
def mean(path, threads=16):
    x = from_zarr_gpu(path, device="gpu")
    with dask.config.set(scheduler="threads", num_workers=threads):
        float(x.mean(axis=0).compute()[0, 0])


gcs = [0, 0.0]
def cb(phase, info):
    if phase == "start":
        cb.t = time.perf_counter()
    elif info["generation"] == 2:
        gcs[0] += 1; gcs[1] += time.perf_counter() - cb.t
gc.callbacks.append(cb)
for rep in range(2):
    for name in names:
        mean(paths[name])
        ts = []
        gcs[:] = [0, 0.0]
        for _ in range(runs):
            t = time.perf_counter()
            mean(paths[name])
            ts.append(time.perf_counter() - t)
        print(f"MEAN {name:<10} rep {rep}: " + " ".join(f"{1e3 * t:.0f}" for t in ts) +
              f" ms; best {nbytes / min(ts) / 1e9:.2f} GB/s; gen2 {gcs[0]} ({1e3 * gcs[1]:.0f} ms)", flush=True)
for name in names:
    stages.enable(); stages.reset()
    t = time.perf_counter()
    mean(paths[name])
    el = time.perf_counter() - t
    st = stages.snapshot(); stages.enable(False)
    print(f"STAGES16 {name:<10} {1e3 * el:.0f} ms: {fmt(st)}", flush=True)
