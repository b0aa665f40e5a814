"""How fast is the device stage of a block (copy up, frame checks, nvCOMP) with several threads at once?

``bench read``'s per-block timeline (session 16, H200, 1200 steps, blocks of
112 chunks read one at a time) had each block's files read in 13-22 ms but its
device stage (``decode_batch_gpu``: copy up, the zstd walk, nvCOMP, checks)
take 53-148 ms with three or four at once: about 20 GB/s decoded in all, the
time mean's limit. This probe times that stage alone, from one pinned copy of
a block's stored chunks read once (no file reads in the timed part), with T
threads each decoding the same block R times on its own stream, and then its
parts the same way:

- ``stage``: ``decode_batch_gpu`` as the reader calls it, per ``zstd-check``;
- ``copy``: the copy up alone;
- ``walk``: copy up + the zstd walk and its verdicts (``_zstd_frames``);
- ``nvcomp``: nvCOMP alone on frames already on the device (``_decode_frames``);
- ``walkdev``: the zstd walk alone, on frames already on the device;
- ``walknv``: the walk, then nvCOMP, on frames already on the device (no copy);
- ``copynv``: a copy up beside nvCOMP on frames already there (do they overlap?);
- ``kernels`` (one thread, ``--kernels``): each kernel of the walk and the
  nvCOMP call timed with CUDA events on the thread's stream, ms per call.

GB/s are of decoded bytes (the block's size times calls), in all threads.

    python3 tools/gpu_probe_decode_stage.py --path /tmp/b2/era5.zarr --chunks 112 --threads 1,4,8,16
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import dask
import numpy as np


def timed_kernels(gpu, once, calls: int) -> None:
    """Time each kernel ``gpu._kernel`` hands out, and ``_decode_frames``, with events on the current stream."""
    import cupy

    spans: dict[str, list] = {}
    real_kernel, real_frames = gpu._kernel, gpu._decode_frames

    def event_pair(name):
        s, e = cupy.cuda.Event(), cupy.cuda.Event()
        spans.setdefault(name, []).append((s, e))
        return s, e

    class Timed:
        def __init__(self, name, k):
            self.name, self.k = name, k

        def __call__(self, *args, **kwargs):
            s, e = event_pair(self.name)
            s.record()
            self.k(*args, **kwargs)
            e.record()

    def kernel(name, src, options=()):
        return Timed(name, real_kernel(name, src, options))

    def frames(stream, parts):
        s, e = event_pair("nvCOMP (call to sizes)")
        s.record(stream)
        out = real_frames(stream, parts)
        e.record(stream)
        return out

    gpu._kernel, gpu._decode_frames = kernel, frames
    try:
        once()
        spans.clear()
        t0 = time.perf_counter()
        for _ in range(calls):
            once()
        el = (time.perf_counter() - t0) / calls
    finally:
        gpu._kernel, gpu._decode_frames = real_kernel, real_frames
    cupy.cuda.get_current_stream().synchronize()
    print(f"  kernels, one thread: {el * 1e3:.1f} ms per stage call; " + ", ".join(
        f"{name} {np.mean([cupy.cuda.get_elapsed_time(s, e) for s, e in pairs]):.2f}" for name, pairs in spans.items())
        + " ms per call", flush=True)


def main() -> int:
    import cupy

    from gpuzarr_dist.cuda import decode as gpu

    from gpuzarr_dist.cuda import kernels
    from gpuzarr_dist.cuda.decode import NVCOMP_FRAMING, _decode_frames, _Frames, _zstd_frames, decode_batch_gpu, framing_lead
    from gpuzarr_dist.array.reader import BlockReader
    from gpuzarr_dist.cuda.streams import ALIGN, align, pinned_staging, thread_stream
    from gpuzarr_dist.stores.source import open_source

    p = argparse.ArgumentParser()
    p.add_argument("--path", required=True)
    p.add_argument("--chunks", default="112", help="chunks per block (time steps), comma-separated")
    p.add_argument("--threads", default="1,4,8,16")
    p.add_argument("--calls", type=int, default=6, help="calls per thread")
    p.add_argument("--checks", default="literals,sequences,headers")
    p.add_argument("--parts", default="stage,copy,walk,nvcomp")
    p.add_argument("--kernels", action="store_true", help="also time each walk kernel and nvCOMP (one thread)")
    p.add_argument("--kernel", action="append", default=[],
                   help="BLOCK_THREADS,LANE_SHARED,LIT_SLOTS[,FORK] of the zstd walk (kernels.ZSTD_*) for another run (repeatable)")
    p.add_argument("--switch-interval", metavar="MS", type=float, help="sys.setswitchinterval in ms (default: 5)")
    a = p.parse_args()
    if a.switch_interval:
        sys.setswitchinterval(a.switch_interval / 1e3)
    store, spec = open_source(a.path)
    pipeline = BlockReader(store, spec, "gpu").pipeline
    chunk_bytes = int(np.prod(spec.chunk_shape)) * spec.dtype.itemsize
    stride = align(chunk_bytes)
    local = threading.local()
    defaults = kernels.ZSTD_BLOCK_THREADS, kernels.ZSTD_LANE_SHARED, kernels.ZSTD_LIT_SLOTS, kernels.ZSTD_WALK_FORK

    def shape(values) -> None:
        values = list(values) + list(defaults[len(values):])
        kernels.ZSTD_BLOCK_THREADS, kernels.ZSTD_LANE_SHARED, kernels.ZSTD_LIT_SLOTS = (int(v) for v in values[:3])
        kernels.ZSTD_WALK_FORK = bool(int(values[3]))
    for n in [int(v) for v in a.chunks.split(",")]:
        keys = spec.chunk_keys(np.array([(t, 0, 0) for t in range(n)]))
        host, offsets, sizes = store.read_into(keys, pinned_staging, ALIGN, framing_lead(pipeline))
        codec = gpu._strip_outer_crc(pipeline.bytes_bytes)[0]
        algorithm, head, tail = NVCOMP_FRAMING[codec.name]
        in_offs = [o + head for o in offsets]
        in_sizes = [s - head - tail for s in sizes]
        total = int(max(o + s for o, s in zip(offsets, sizes)))
        block = n * chunk_bytes
        print(f"block of {n} chunks: {block / 1e6:.1f} MB decoded, {sum(sizes) / 1e6:.1f} MB stored", flush=True)

        def on_device():
            """This thread's copy of the block's frames on the device, and its output (made once per block size)."""
            if getattr(local, "n", None) != n:
                s = thread_stream()
                with s:
                    local.dev = cupy.empty(total, dtype=cupy.uint8)
                    local.dev.set(host[:total], stream=s)
                    local.out = cupy.empty(n * stride, dtype=cupy.uint8)
                s.synchronize()
                local.n = n
            return local.dev, local.out

        def call(part: str) -> None:
            s = thread_stream()
            with s:
                if part == "stage":
                    decode_batch_gpu(pipeline, host, offsets, sizes, keys, s)
                elif part == "copy":
                    dev = cupy.empty(total, dtype=cupy.uint8)
                    dev.set(host[:total], stream=s)
                elif part == "copynv":  # a fresh copy up, then nvCOMP on the frames already there: do the two overlap?
                    fresh = cupy.empty(total, dtype=cupy.uint8)
                    fresh.set(host[:total], stream=s)
                    dev, out = on_device()
                    got = _decode_frames(s, [_Frames(algorithm, None, dev, in_offs, in_sizes, out, stride, n)])
                    assert got == [chunk_bytes] * n, got[:3]
                elif part == "walknv":  # the walk and nvCOMP on frames already on the device (no copy)
                    dev, out = on_device()
                    _zstd_frames(spec.name, dev, in_offs, in_sizes, keys, chunk_bytes)
                    got = _decode_frames(s, [_Frames(algorithm, None, dev, in_offs, in_sizes, out, stride, n)])
                    assert got == [chunk_bytes] * n, got[:3]
                elif part == "walkdev":  # the walk alone, on frames already on the device
                    dev, out = on_device()
                    _zstd_frames(spec.name, dev, in_offs, in_sizes, keys, chunk_bytes)
                elif part == "walk":
                    dev = cupy.empty(total, dtype=cupy.uint8)
                    dev.set(host[:total], stream=s)
                    _zstd_frames(spec.name, dev, in_offs, in_sizes, keys, chunk_bytes)
                else:
                    dev, out = on_device()
                    got = _decode_frames(s, [_Frames(algorithm, None, dev, in_offs, in_sizes, out, stride, n)])
                    assert got == [chunk_bytes] * n, got[:3]
            s.synchronize()

        runs = [(part, check, None) for part in a.parts.split(",")
                for check in (a.checks.split(",") if part in ("stage", "walk", "walknv", "walkdev") else [None])]
        runs += [(part, "literals", k) for k in a.kernel for part in ("stage", "walk", "walkdev", "walknv") if part in a.parts.split(",")]
        for part, check, kernel in runs:
            if kernel:
                shape(kernel.split(","))
            else:
                shape(defaults)
            line = f"  {part:<7} {check or '':<10} {kernel or '':<8}"
            with dask.config.set({"gpuzarr.gpu.zstd-check": check or "literals"}):
                for threads in [int(v) for v in a.threads.split(",")]:
                    with ThreadPoolExecutor(threads) as pool:
                        list(pool.map(lambda _: call(part), range(threads)))  # warm: streams, kernels, pools
                        t0 = time.perf_counter()
                        list(pool.map(lambda _: [call(part) for _ in range(a.calls)], range(threads)))
                        el = time.perf_counter() - t0
                    line += f" | {threads:2d} thr {threads * a.calls * block / el / 1e9:6.2f} GB/s {el / a.calls * 1e3:6.1f} ms/call"
            print(line, flush=True)
        shape(defaults)
        if a.kernels:
            timed_kernels(gpu, lambda: call("stage"), a.calls)
        local.__dict__.clear()
        cupy.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
