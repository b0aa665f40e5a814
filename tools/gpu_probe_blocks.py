"""Aggregate GPU read rate of one array by block size and threads: is a small block slow per byte, and where?

Reads every block of the array once (warm pass first) through ``BlockReader``
from a thread pool, each task also summing its block on its thread's stream
(as the Cubed variant's mean does), and prints GB/s of decoded data per block
size, with the cores the process kept busy meanwhile (CPU seconds / wall:
a thread spinning in a wait for the GPU counts as busy) and the share of the
time the task threads spent on a CPU (/proc: near 100% while most of their
time is waiting for the GPU means they spin). ``--stages`` repeats
each size with the read stages timed (adds synchronisations). Settings are
dask config overrides, e.g. ``gpuzarr.gpu.min-batch=0`` or ``gpuzarr.gpu.sync-wait=blocking``.

    python3 tools/gpu_probe_blocks.py --path /tmp/cb400/x.zarr --steps 8,24,72,200,400 --threads 16 \
        --set gpuzarr.gpu.sync-wait=blocking
"""
from __future__ import annotations

import argparse
import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import dask


def blocks(shape, chunks, steps, tile):
    ty, tx = tile
    for t in range(0, shape[0], steps):
        for y in range(0, shape[1], ty):
            for x in range(0, shape[2], tx):
                yield (slice(t, min(t + steps, shape[0])), slice(y, min(y + ty, shape[1])), slice(x, min(x + tx, shape[2])))


def cpu_seconds() -> float:
    """User + system CPU seconds of this process, all threads."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def threads_cpu(tids: list[int]) -> float:
    """CPU seconds of these threads of this process (Linux ``/proc``); 0 where it cannot be read."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        except (OSError, IndexError, ValueError):
            pass
    return total


def main() -> int:
    import cupy

    from gpuzarr_dist.runtime import stages
    from gpuzarr_dist.array.reader import BlockReader
    from gpuzarr_dist.cuda.streams import thread_stream
    from gpuzarr_dist.stores.source import open_source

    p = argparse.ArgumentParser()
    p.add_argument("--path", required=True)
    p.add_argument("--steps", default="8,24,72,200")
    p.add_argument("--tile", default=None, help="y,x extent of a block (default: one chunk)")
    p.add_argument("--threads", default="16")
    p.add_argument("--set", action="append", default=[], help="KEY=VALUE[,KEY=VALUE] dask config for another run (repeatable)")
    p.add_argument("--stages", action="store_true")
    p.add_argument("--switch", type=float, help="sys.setswitchinterval seconds (Python's default 0.005)")
    a = p.parse_args()
    if a.switch:
        import sys

        sys.setswitchinterval(a.switch)
    store, spec = open_source(a.path)
    shape, chunks = spec.shape, spec.chunk_shape
    tile = tuple(int(v) for v in a.tile.split(",")) if a.tile else tuple(chunks[1:])
    nbytes = spec.dtype.itemsize
    for n in shape:
        nbytes *= n
    print(f"array {shape} chunks {chunks} {nbytes / 1e9:.2f} GB; tile {tile}")
    settings = [{}] + [dict(kv.split("=", 1) for kv in group.split(",")) for group in a.set]
    for setting, threads, steps in itertools.product(settings, [int(v) for v in a.threads.split(",")],
                                                     [int(v) for v in a.steps.split(",")]):
        with dask.config.set(setting):
            r = BlockReader(store, spec, "gpu")
            sels = list(blocks(shape, chunks, steps, tile))

            def task(sel):
                b = r[sel]
                thread_stream()
                return float(b.sum(axis=0, dtype="f8")[0, 0])

            workers: list[int] = []  # native ids of the task threads: the ones that wait for the GPU
            with ThreadPoolExecutor(threads, initializer=lambda: workers.append(threading.get_native_id())) as pool:
                list(pool.map(task, sels))  # warm: streams, codecs, pools
                cpu0, w0 = cpu_seconds(), threads_cpu(workers)
                t = time.perf_counter()
                list(pool.map(task, sels))
                el = time.perf_counter() - t
                busy = (cpu_seconds() - cpu0) / el  # cores this process kept busy (a thread spinning on a GPU wait counts)
                on_cpu = (threads_cpu(workers) - w0) / (el * max(1, len(workers)))
                line = (f"{str(setting) or 'default':<36} threads {threads:>2} block {steps:>4} steps "
                        f"({len(sels):>5} blocks of {nbytes / len(sels) / 1e6:7.1f} MB): {nbytes / el / 1e9:6.2f} GB/s, "
                        f"{busy:4.1f} cores busy, task threads on a CPU {on_cpu:4.0%} of the time")
                if a.stages:
                    stages.reset()
                    stages.enable(True)
                    t = time.perf_counter()
                    list(pool.map(task, sels))
                    el2 = time.perf_counter() - t
                    stages.enable(False)
                    snap = stages.snapshot()
                    line += f"; timed stages {el2:.2f} s wall: " + ", ".join(
                        f"{k} {v[0] / len(sels) * 1e3:.1f}" for k, v in sorted(snap.items(), key=lambda kv: -kv[1][0])) + " ms/block"
                print(line, flush=True)
        cupy.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
