"""What one nvCOMP zstd decode call costs, and what several threads' calls cost together.

Frames are ERA5-like float32 chunks of (8, 181, 360), 2.09 MB, zstd level 0
(the Cubed benchmark's chunks). Prints, on one GPU:

1. one thread, one call of 56 to 448 frames: ms per call, how long ``decode()``
   takes to return and how long the stream sync then waits;
2. whether ``decode()`` holds the GIL: a pure-Python counting thread's rate
   while the main thread is inside ``decode()`` against its rate while the
   main thread sleeps (a rate near zero: the GIL is held);
3. T threads (a stream and a codec each), 5 calls of 56 frames each: GB/s in
   all, with each thread calling nvCOMP's Python ``decode`` itself, then
   through ``gpuzarr_dist.cuda.decode._nvcomp_decode`` with each
   ``gpuzarr.gpu.nvcomp-api`` (Python, C through ctypes), alone and with
   ``gpuzarr.gpu.decode-combine`` on (the calls of the moment joined into
   one, the joined calls counted).

Parts 1 and 2 are repeated for the C API (1b, and the counting rate inside
its call). Measured in session 15 (H200, Python API): 56 frames 11.0 ms,
448 13.6 ms; the counting thread at 26% of its idle rate inside ``decode()``;
4 / 8 / 16 threads 11.6 / 12.2 / 11.7 GB/s each calling, 16.7 / 23.4 / 33.0
joined.

Measured in session 14 (H100, parts 1 and 3 without the combiner, in
``.gpuprobe``): 11.0 ms for 56 frames, 13.5 ms for 448; 8 threads x 56 frames
12.6 GB/s in all. Streams and codecs are kept for the life of the process
(a stream destroyed before its codec crashes it).

    python3 tools/gpu_probe_nvcomp_calls.py [--threads 4,8,16]
"""
from __future__ import annotations

import argparse
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

SHAPE = (8, 181, 360)
STRIDE = int(np.prod(SHAPE)) * 4
KEEP: list = []  # streams and codecs outlive the pool threads


def frames(n_distinct: int = 56) -> list[bytes]:
    import numcodecs

    rng = np.random.default_rng(0)
    base = (250 + 30 * np.cos(np.linspace(-1.5, 1.5, SHAPE[1])))[:, None].astype(np.float32) * np.ones(SHAPE[1:], np.float32)
    zs = numcodecs.Zstd(level=0)
    return [zs.encode(np.ascontiguousarray(base[None] + 5 * rng.standard_normal(SHAPE, dtype=np.float32)))
            for _ in range(n_distinct)]


def main() -> int:
    import cupy
    import dask
    from nvidia import nvcomp

    p = argparse.ArgumentParser()
    p.add_argument("--threads", default="4,8,16")
    a = p.parse_args()
    fr = frames()
    print(f"frame {STRIDE / 1e6:.2f} MB decoded, {np.mean([len(f) for f in fr]) / 1e6:.2f} MB stored", flush=True)
    local = threading.local()

    def batch(n: int):
        """This thread's stream, codec and device buffers for calls of ``n`` frames (made once)."""
        if not hasattr(local, "stream"):
            from gpuzarr_dist.cuda.streams import thread_stream

            local.stream = thread_stream()  # the library's per-thread stream (kept for the process's life)
            local.codec = nvcomp.Codec(algorithm="Zstd", bitstream_kind=nvcomp.BitstreamKind.RAW, device_id=0,
                                       cuda_stream=local.stream.ptr)
            local.bufs = {}
            KEEP.append((local.stream, local.codec))
        if n not in local.bufs:
            chosen = [fr[i % len(fr)] for i in range(n)]
            sizes = [len(f) for f in chosen]
            offs = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int).tolist()
            with local.stream:
                dev = cupy.asarray(np.frombuffer(b"".join(chosen), dtype=np.uint8))
                out = cupy.empty(n * STRIDE, dtype=cupy.uint8)
            local.stream.synchronize()
            local.bufs[n] = (dev, offs, sizes, out)
        return local.stream, local.codec, local.bufs[n]

    def direct(n: int, reps: int = 1) -> tuple[float, float]:
        stream, codec, (dev, offs, sizes, out) = batch(n)
        launch = wait = 0.0
        with stream:
            for _ in range(reps):
                t0 = time.perf_counter()
                res = codec.decode(nvcomp.as_arrays(dev, offs, sizes),
                                   out=nvcomp.as_arrays(out, [i * STRIDE for i in range(n)], [STRIDE] * n))
                t1 = time.perf_counter()
                stream.synchronize()
                got = list(res.buffer_sizes)
                launch, wait = launch + t1 - t0, wait + time.perf_counter() - t1
        assert got == [STRIDE] * n, got[:4]
        return launch, wait

    def library(n: int, reps: int = 1) -> None:
        """The library's decode call (``_nvcomp_decode``) under the settings in force."""
        from gpuzarr_dist.cuda.decode import _nvcomp_decode

        stream, _, (dev, offs, sizes, out) = batch(n)
        with stream:
            for _ in range(reps):
                got = _nvcomp_decode("Zstd", stream, dev, offs, sizes, out, STRIDE, n)
                assert got == [STRIDE] * n, got[:4]

    print("1. one thread, one call", flush=True)
    for n in (56, 112, 224, 448):
        direct(n)
        launch, wait = direct(n, 5)
        print(f"   {n:3d} frames: {(launch + wait) / 5 * 1e3:6.1f} ms per call (decode() returns after "
              f"{launch / 5 * 1e3:5.1f} ms, then the sync waits {wait / 5 * 1e3:5.1f}); "
              f"{n * STRIDE * 5 / (launch + wait) / 1e9:5.1f} GB/s", flush=True)

    print("1b. the same through nvCOMP's C API (gpuzarr.gpu.nvcomp-api c, the thread waits on the stream)", flush=True)
    with dask.config.set({"gpuzarr.gpu.nvcomp-api": "c"}):
        for n in (56, 112, 224, 448):
            library(n)
            t0 = time.perf_counter()
            library(n, 5)
            el = time.perf_counter() - t0
            print(f"   {n:3d} frames: {el / 5 * 1e3:6.1f} ms per call; {n * STRIDE * 5 / el / 1e9:5.1f} GB/s", flush=True)

    print("2. does decode() hold the GIL? a Python thread counts while the main thread is in decode()", flush=True)
    count, stop = [0], [False]

    def spin() -> None:
        while not stop[0]:
            count[0] += 1

    th = threading.Thread(target=spin)
    th.start()
    time.sleep(0.05)
    c0, t0 = count[0], time.perf_counter()
    time.sleep(0.1)
    idle = (count[0] - c0) / (time.perf_counter() - t0)
    stream, codec, (dev, offs, sizes, out) = batch(448)
    in_decode = []
    for _ in range(5):
        c0, t0 = count[0], time.perf_counter()
        with stream:
            codec.decode(nvcomp.as_arrays(dev, offs, sizes),
                         out=nvcomp.as_arrays(out, [i * STRIDE for i in range(448)], [STRIDE] * 448))
        in_decode.append((count[0] - c0) / (time.perf_counter() - t0))
        stream.synchronize()
    stop[0] = True
    th.join()
    print(f"   counting rate while the main thread sleeps {idle:,.0f}/s, while it is inside decode() "
          f"{np.median(in_decode):,.0f}/s ({np.median(in_decode) / idle:.0%})", flush=True)
    stop[0] = False
    th = threading.Thread(target=spin)
    th.start()
    in_c = []
    with dask.config.set({"gpuzarr.gpu.nvcomp-api": "c"}):
        for _ in range(5):
            c0, t0 = count[0], time.perf_counter()
            library(448)
            in_c.append((count[0] - c0) / (time.perf_counter() - t0))
    stop[0] = True
    th.join()
    print(f"   ... while it is inside the C API's decode and its stream wait {np.median(in_c):,.0f}/s "
          f"({np.median(in_c) / idle:.0%})", flush=True)

    print("3. threads x 5 calls of 56 frames each", flush=True)
    from gpuzarr_dist.cuda import combine

    for threads in [int(v) for v in a.threads.split(",")]:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda _: direct(56), range(threads)))  # streams, codecs, buffers
            t0 = time.perf_counter()
            list(pool.map(lambda _: direct(56, 5), range(threads)))
            el = time.perf_counter() - t0
            line = f"   {threads:2d} threads: Python API each its own calls {threads * 5 * 56 * STRIDE / el / 1e9:5.1f} GB/s"
            for api in ("python", "c"):
                with dask.config.set({"gpuzarr.gpu.nvcomp-api": api}):
                    list(pool.map(lambda _: library(56), range(threads)))
                    t0 = time.perf_counter()
                    list(pool.map(lambda _: library(56, 5), range(threads)))
                    el = time.perf_counter() - t0
                    line += f"; {api} API, library call {threads * 5 * 56 * STRIDE / el / 1e9:5.1f}"
                    with dask.config.set({"gpuzarr.gpu.decode-combine": True}):
                        list(pool.map(lambda _: library(56), range(threads)))
                        combine._combiners.clear()
                        t0 = time.perf_counter()
                        list(pool.map(lambda _: library(56, 5), range(threads)))
                        el = time.perf_counter() - t0
                    (c,) = combine._combiners.values()
                    line += f", joined {threads * 5 * 56 * STRIDE / el / 1e9:5.1f} ({c.requests} requests in {c.calls} calls)"
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
