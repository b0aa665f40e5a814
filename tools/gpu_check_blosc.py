"""GPU smoke test and throughput of the Blosc decoder: a large batch per inner codec, several threads.

Run on a GPU machine from the repository root::

    python tools/gpu_check_blosc.py [--chunks 500] [--threads 4]

For each inner codec (lz4, lz4hc, zstd, zlib; byte shuffle, clevel 5) it
encodes ``--chunks`` float32 chunks of 4 MB (ERA5-like values) with
numcodecs, checks that one GPU batch decodes them bit for bit, then has
``--threads`` threads decode their own copies of the batch repeatedly on
their own streams and prints GB/s of decoded data (host frames already in
pinned memory: upload + plan + nVCOMP + unshuffle). Also prints the rate of
numcodecs on the same frames with the same threads. Exits 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numcodecs
import numpy as np


class _Pipeline:
    array = "gpu_check"

    def decode_chunk(self, data, key):
        return numcodecs.Blosc().decode(data)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=500)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--shuffle", type=int, default=1)
    args = ap.parse_args()

    import cupy

    from gpuzarr_dist.cuda.blosc import decode_blosc_batch
    from gpuzarr_dist.cuda.streams import align, pinned_staging, thread_stream

    rng = np.random.default_rng(0)
    shape = (721, 1440)
    base = (280 + 15 * np.sin(np.arange(shape[0] * shape[1]) / 2000.0)).astype("f4")
    nbytes = base.nbytes
    n = args.chunks
    # a few distinct chunks, repeated (encoding 500 distinct 4 MB chunks takes longer than the test)
    distinct = [base + rng.normal(0, 0.3, base.size).astype("f4") for _ in range(8)]
    failed = False
    print(f"{n} chunks of {nbytes / 1e6:.1f} MB float32, shuffle={args.shuffle}, {args.threads} threads")
    for cname in ("lz4", "lz4hc", "zstd", "zlib"):
        codec = numcodecs.Blosc(cname=cname, clevel=5, shuffle=args.shuffle)
        frames = [np.frombuffer(codec.encode(d), np.uint8) for d in distinct]
        offsets, at = [], 0
        for i in range(n):
            offsets.append(at)
            at = align(at + frames[i % len(frames)].size)
        sizes = [frames[i % len(frames)].size for i in range(n)]
        stored = sum(sizes)
        host = pinned_staging(at)
        for i, o in enumerate(offsets):
            host[o : o + sizes[i]] = frames[i % len(frames)]
        keys = [str(i) for i in range(n)]
        stride = align(nbytes)

        stream = thread_stream()
        out = decode_blosc_batch(_Pipeline(), host, offsets, sizes, sizes, keys, nbytes, stride, stream)
        if out is None:
            print(f"{cname}: FELL BACK TO THE CPU")
            failed = True
            continue
        got = out.get()
        bad = [i for i in range(n) if not np.array_equal(got[i * stride : i * stride + nbytes],
                                                         distinct[i % len(distinct)].view(np.uint8))]
        if bad:
            print(f"{cname}: MISMATCH in {len(bad)} of {n} chunks (first {bad[0]})")
            failed = True
            continue
        del out, got

        lock = threading.Lock()
        errors = []

        def work(_: int) -> None:
            s = thread_stream()
            try:
                for _ in range(args.repeat):
                    decode_blosc_batch(_Pipeline(), host, offsets, sizes, sizes, keys, nbytes, stride, s)
            except Exception as e:  # reported below
                with lock:
                    errors.append(e)

        with ThreadPoolExecutor(args.threads) as pool:
            list(pool.map(lambda _: thread_stream(), range(args.threads)))
            t0 = time.perf_counter()
            list(pool.map(work, range(args.threads)))
            cupy.cuda.runtime.deviceSynchronize()
            dt = time.perf_counter() - t0
        if errors:
            print(f"{cname}: ERROR under {args.threads} threads: {errors[0]!r}")
            failed = True
            continue
        total = nbytes * n * args.repeat * args.threads
        t1 = time.perf_counter()
        m = min(n, 64)
        with ThreadPoolExecutor(args.threads) as pool:
            list(pool.map(lambda i: numcodecs.Blosc().decode(host[offsets[i] : offsets[i] + sizes[i]]), range(m)))
        dt_cpu = time.perf_counter() - t1
        print(f"{cname:6s}: ratio {nbytes * n / stored:5.2f}  GPU {total / dt / 1e9:7.1f} GB/s decoded "
              f"({stored * args.repeat * args.threads / dt / 1e9:6.1f} GB/s stored)   "
              f"numcodecs {nbytes * m / dt_cpu / 1e9:5.1f} GB/s ({args.threads} threads)")
    print("FAILED" if failed else "OK")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
