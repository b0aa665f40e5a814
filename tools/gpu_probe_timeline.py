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

    import gpuzarr_dist.reader_gpu as rg
    from gpuzarr_dist.reader import BlockReader
    from gpuzarr_dist.stores.source import open_source

    p = argparse.ArgumentParser()
    p.add_argument("--path", required=True)
    p.add_argument("--steps", type=int, default=225)
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--serial-reads", choices=("off", "on", "both"), default="both")
    p.add_argument("--set", action="append", default=[], help="KEY=VALUE[,KEY=VALUE] dask config (repeatable)")
    p.add_argument("--switch-interval", metavar="MS", type=float, action="append", default=[],
                   help="sys.setswitchinterval in ms for another row (repeatable; default: Python's 5 ms)")
    p.add_argument("--repeat", type=int, default=1, help="passes of every row, interleaved")
    p.add_argument("--quiet", action="store_true", help="no per-block lines")
    p.add_argument("--walk-fork", choices=("on", "off", "both"), default="on",
                   help="the zstd literals walk beside the sequences walk (kernels.ZSTD_WALK_FORK), after it, or both")
    a = p.parse_args()
    default_interval = sys.getswitchinterval()
    store, spec = open_source(a.path)
    nbytes = spec.dtype.itemsize
    for n in spec.shape:
        nbytes *= n
    rest = tuple(slice(None) for _ in spec.shape[1:])
    sels = [(slice(t, min(t + a.steps, spec.shape[0])), *rest) for t in range(0, spec.shape[0], a.steps)]
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

    type(store).read_into = read_into
    rg.decode_batch_gpu = decode
    modes = {"off": [False], "on": [True], "both": [False, True]}[a.serial_reads]
    settings = [{}] + [dict(kv.split("=", 1) for kv in g.split(",")) for g in a.set]
    from gpuzarr_dist.codecs import kernels

    intervals = [None] + [ms / 1e3 for ms in a.switch_interval]
    forks = {"on": [True], "off": [False], "both": [True, False]}[a.walk_fork]
    for rep in range(a.repeat):
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

                            t0[0] = time.perf_counter()
                            list(pool.map(task, enumerate(sels)))
                            el = time.perf_counter() - t0[0]
                    print(f"pass {rep} {setting or 'default'} fork {'on' if fork else 'off'} switch {sys.getswitchinterval() * 1e3:g} ms, serial reads "
                          f"{'on' if mode else 'off'}: {len(sels)} blocks of {a.steps} steps, "
                          f"{a.threads} threads: {el * 1e3:.0f} ms, {nbytes / el / 1e9:.2f} GB/s", flush=True)
                    if not a.quiet:
                        for i, e in sorted(rows):
                            print(f"  block {i:>2}: read {e.get('read0', 0):6.1f}-{e.get('read1', 0):6.1f}  "
                                  f"decode {e.get('dec0', 0):6.1f}-{e.get('dec1', 0):6.1f}  end {e.get('end', 0):6.1f} ms")
                    cupy.get_default_memory_pool().free_all_blocks()
    sys.setswitchinterval(default_interval)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
