"""GPU probe: a per-block timeline of the dask time mean (local files), read turns included.

For each block of each variant (``bench shards``' arrays, written under ROOT once): when its task started, its
shard-index reads began and ended, it waited for and took its read turn, gave the turn back (its reads done),
its decode began and ended (the stream waited for), and its task ended, in ms from the run's start.

    STEPS=960 RUNS=2 python tools/gpu_probe_shard_turns.py
    SPY=1 RUNS=5 VARIANTS=inner256k py-spy record --gil --threads --nonblocking -r 500 -f raw -o gil.txt \
        -- python tools/gpu_probe_shard_turns.py

Environment: STEPS (960), ROOT (/tmp/gap), VARIANTS (unsharded,inner256k), RUNS (3), SPY (1: the run times
only, for py-spy), SET (``key=value,...`` dask settings for every run).
"""
import os
import sys
import threading
import time

import dask

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
steps = int(os.environ.get("STEPS", 960))
runs = int(os.environ.get("RUNS", 3))
root = os.environ.get("ROOT", "/tmp/gap")
names = os.environ.get("VARIANTS", "unsharded,inner256k").split(",")
setting = dict(kv.split("=", 1) for kv in os.environ.get("SET", "").split(",") if kv)
import gpuzarr_dist.cuda.blocks as rg
import gpuzarr_dist.stores.sharded as sh
from gpuzarr_dist.bench.shards import write_variants
from gpuzarr_dist.array.read import from_zarr_gpu

paths = write_variants(root, steps, 721, 1440, shard_t=4)
nbytes = steps * 721 * 1440 * 4
ev: dict[int, dict[str, float]] = {}
t0 = [0.0]


def mark(name):
    ev.setdefault(threading.get_ident(), {})[name] = (time.perf_counter() - t0[0]) * 1e3


real_plan, real_slot, real_dec = rg.read_plan_gpu, rg.read_slot, rg.decode_batch_gpu
real_ix = sh.ShardedChunkStore.read_indexes


def plan(reader, p):
    ev.pop(threading.get_ident(), None)
    mark("start")
    out = real_plan(reader, p)
    mark("end")
    rows.append(dict(ev[threading.get_ident()]))
    return out


class slot:
    def __init__(self, n):
        self.cm = real_slot(n)

    def __enter__(self):
        mark("wait")
        self.cm.__enter__()
        mark("in")

    def __exit__(self, *a):
        mark("out")
        return self.cm.__exit__(*a)


def dec(*a, **k):
    mark("d0")
    r = real_dec(*a, **k)
    mark("d1")
    return r


def ix(self, shards):
    mark("i0")
    r = real_ix(self, shards)
    mark("i1")
    return r


rg.read_plan_gpu, rg.read_slot, rg.decode_batch_gpu = plan, slot, dec
sh.ShardedChunkStore.read_indexes = ix
rows: list = []


def mean(path):
    x = from_zarr_gpu(path, device="gpu")
    with dask.config.set(scheduler="threads", num_workers=16):
        float(x.mean(axis=0).compute()[0, 0])


with dask.config.set(setting):
    for name in names:
        mean(paths[name])
        for r in range(runs):
            rows.clear()
            t0[0] = time.perf_counter()
            mean(paths[name])
            el = (time.perf_counter() - t0[0]) * 1e3
            print(f"{name} {setting or ''} run {r}: {el:.0f} ms {nbytes / el / 1e6:.2f} GB/s", flush=True)
            if os.environ.get("SPY") != "1":
                for e in sorted(rows, key=lambda e: e.get("in", 0)):
                    print("   " + "  ".join(f"{k} {e[k]:6.1f}" for k in ("start", "i0", "i1", "wait", "in", "out", "d0", "d1", "end") if k in e))
