"""When does each block of a GPU read do what? A per-block timeline of reads and decodes under threads.

Reads every block of the array once (after a warm pass) through ``BlockReader``
from a thread pool and records, per block, when its file reads started and
ended and when its decode (``decode_batch_gpu`` up to its stream's sync)
started and ended, in ms from the start of the pass. ``--serial-reads on``
reads with ``gpuzarr.gpu.read-slots`` 1 (one block reads its files at a time,
the default), ``off`` with 0 (every block at once). Settings are dask
config overrides (``--set gpuzarr.gpu.zstd-check=headers``).

    python3 tools/gpu_probe_timeline.py --path /tmp/b/era5.zarr --steps 225 --threads 16 --serial-reads both
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import dask


def main() -> int:
    import cupy

    import gpuzarr_dist.cuda.blocks as rg
    from gpuzarr_dist.cuda.streams import staging_pool
    from gpuzarr_dist.array.reader import BlockReader
    from gpuzarr_dist.stores.source import open_source

    p = argparse.ArgumentParser()
    p.add_argument("--path", required=True)
    p.add_argument("--steps", default="225", help="time steps per block; comma-separated: each in turn, one process")
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--serial-reads", choices=("off", "on", "both"), default="both")
    p.add_argument("--set", action="append", default=[], help="KEY=VALUE[,KEY=VALUE] dask config (repeatable)")
    p.add_argument("--switch-interval", metavar="MS", type=float, action="append", default=[],
                   help="sys.setswitchinterval in ms for another row (repeatable; default: Python's 5 ms)")
    p.add_argument("--repeat", type=int, default=1, help="passes of every row, interleaved")
    p.add_argument("--quiet", action="store_true", help="no per-block lines")
    p.add_argument("--free-pool", action="store_true", help="free CuPy's device pool after every pass")
    p.add_argument("--walk-fork", choices=("on", "off", "both"), default="on",
                   help="the zstd literals walk beside the sequences walk (kernels.ZSTD_WALK_FORK), after it, or both")
    a = p.parse_args()
    default_interval = sys.getswitchinterval()
    store, spec = open_source(a.path)
    nbytes = spec.dtype.itemsize
    for n in spec.shape:
        nbytes *= n
    rest = tuple(slice(None) for _ in spec.shape[1:])
    events: dict[int, dict[str, float]] = {}
    t0 = [0.0]
    real_read, real_decode = type(store).read_into, rg.decode_batch_gpu

    def mark(name: str) -> None:
        events.setdefault(threading.get_ident(), {})[name] = (time.perf_counter() - t0[0]) * 1e3

    def read_into(self, *args, **kwargs):
        mark("read0")  # inside the read slot: the wait for a slot is not the read's
        out = real_read(self, *args, **kwargs)
        mark("read1")
        return out

    def decode(pipeline, host, offsets, sizes, keys, stream):
        mark("dec0")
        out = real_decode(pipeline, host, offsets, sizes, keys, stream)
        stream.synchronize()
        mark("dec1")
        return out

    slow_pins: list[tuple[float, int]] = []  # pinned allocations over 1 ms: a miss of CuPy's pinned pool
    real_pin = cupy.cuda.alloc_pinned_memory

    def alloc_pinned_memory(size):
        t = time.perf_counter()
        mem = real_pin(size)
        el = (time.perf_counter() - t) * 1e3
        if el > 1:
            slow_pins.append((el, size))
        return mem

    cupy.cuda.alloc_pinned_memory = alloc_pinned_memory
    import gpuzarr_dist.cuda.memory as rm

    releases = [0]  # the reader's retries after an out-of-memory error
    real_release = rm.release_cached_device_memory

    def release():
        releases[0] += 1
        return real_release()

    rm.release_cached_device_memory = release
    type(store).read_into = read_into
    rg.decode_batch_gpu = decode
    modes = {"off": [False], "on": [True], "both": [False, True]}[a.serial_reads]
    settings = [{}] + [dict(kv.split("=", 1) for kv in g.split(",")) for g in a.set]
    from gpuzarr_dist.cuda import kernels

    intervals = [None] + [ms / 1e3 for ms in a.switch_interval]
    forks = {"on": [True], "off": [False], "both": [True, False]}[a.walk_fork]
    pool_bytes = cupy.get_default_memory_pool().total_bytes
    for rep, steps in [(r, int(v)) for v in a.steps.split(",") for r in range(a.repeat)]:
        sels = [(slice(t, min(t + steps, spec.shape[0])), *rest) for t in range(0, spec.shape[0], steps)]
        for setting in settings:
            for interval, fork in [(i, f) for i in intervals for f in forks]:
                kernels.ZSTD_WALK_FORK = fork
                sys.setswitchinterval(default_interval if interval is None else interval)
                for mode in modes:
                    slots = {} if "gpuzarr.gpu.read-slots" in setting else {"gpuzarr.gpu.read-slots": 1 if mode else 0}
                    with dask.config.set(setting, **slots):
                        r = BlockReader(store, spec, "gpu")
                        with ThreadPoolExecutor(a.threads) as pool:
                            list(pool.map(lambda s: float(r[s].sum(axis=0, dtype="f8")[0, 0]), sels))  # warm (the same kernels: a compile holds the GIL)
                            rows = []

                            def task(i_sel):
                                i, sel = i_sel
                                events.pop(threading.get_ident(), None)
                                b = r[sel]
                                float(b.sum(axis=0, dtype="f8")[0, 0])
                                mark("end")
                                rows.append((i, dict(events[threading.get_ident()])))

                            slow_pins.clear()
                            releases[0] = 0
                            pins = staging_pool().pins
                            held = pool_bytes()
                            t0[0] = time.perf_counter()
                            list(pool.map(task, enumerate(sels)))
                            el = time.perf_counter() - t0[0]
                    print(f"pass {rep} {setting or 'default'} fork {'on' if fork else 'off'} switch {sys.getswitchinterval() * 1e3:g} ms, serial reads "
                          f"{'on' if mode else 'off'}: {len(sels)} blocks of {steps} steps, "
                          f"{a.threads} threads: {el * 1e3:.0f} ms, {nbytes / el / 1e9:.2f} GB/s; pinned allocations "
                          f"over 1 ms: {len(slow_pins)}, {sum(t for t, _ in slow_pins):.0f} ms, "
                          f"{sum(n for _, n in slow_pins) / 2**20:.0f} MiB; device pool {held / 2**30:.1f} -> "
                          f"{pool_bytes() / 2**30:.1f} GiB; out-of-memory retries {releases[0]}; staging pins {staging_pool().pins - pins}, "
                          f"{staging_pool().pinned_bytes / 2**30:.1f} GiB pinned", flush=True)
                    if not a.quiet:
                        for i, e in sorted(rows):
                            print(f"  block {i:>2}: read {e.get('read0', 0):6.1f}-{e.get('read1', 0):6.1f}  "
                                  f"decode {e.get('dec0', 0):6.1f}-{e.get('dec1', 0):6.1f}  end {e.get('end', 0):6.1f} ms")
                    if a.free_pool:
                        cupy.get_default_memory_pool().free_all_blocks()
    sys.setswitchinterval(default_interval)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
