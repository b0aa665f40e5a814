"""How much device scratch does nvCOMP's batched encoder ask for, and what does a call cost, by chunks per call?

Prints, on one GPU, through nvCOMP's C API (:mod:`gpuzarr_dist.cuda.nvcomp`):

1. ``nvcompBatched{Zstd,Deflate}CompressGetTempSize`` for 1 to 225 chunks of
   1, 4.17 and 16 MB (the scratch of one call);
2. one thread encoding n ERA5-like float32 chunks of 4.17 MB per call (zstd):
   ms per call and GB/s of input;
3. T threads (a stream and a scratch buffer each) encoding 28 chunks per call, 3 calls each: GB/s in all.

Measured in session 15 (H200): zstd scratch 1133 MB for one 4.17 MB chunk,
1316 for 28, 2652 for 225; a call of 1 / 4 / 28 / 150 chunks 29.9 / 31.3 /
38.2 / 61.6 ms (0.14 / 0.53 / 3.06 / 10.16 GB/s); 4 / 8 / 16 threads of
28-chunk calls 7.03 / 8.18 / 7.10 GB/s in all.

    python3 tools/gpu_probe_encode_scratch.py
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

KEEP: list = []  # streams outlive the pool threads


def main() -> int:
    import cupy

    from gpuzarr_dist.cuda import nvcomp as nvcomp_c
    from gpuzarr_dist.cuda.streams import align, thread_stream

    print("1. scratch of one call, MB (chunks per call: 1 2 8 28 150 225)", flush=True)
    for alg in ("Zstd", "Deflate"):
        for nbytes in (1 << 20, 16 * 181 * 360 * 4, 16 << 20):
            sizes = [nvcomp_c.encode_scratch_size(alg, n, nbytes) / 1e6 for n in (1, 2, 8, 28, 150, 225)]
            print(f"   {alg:8s} chunks of {nbytes / 1e6:5.2f} MB: " + " ".join(f"{v:8.1f}" for v in sizes), flush=True)
    nbytes = 16 * 181 * 360 * 4
    rng = np.random.default_rng(0)
    base = (250 + 30 * np.cos(np.linspace(-1.5, 1.5, 181)))[:, None].astype(np.float32) * np.ones((181, 360), np.float32)
    chunk = (base[None] + 5 * rng.standard_normal((16, 181, 360), dtype=np.float32)).view(np.uint8).reshape(-1)
    stride, slot = align(nbytes), align(nvcomp_c.max_compressed_size("Zstd", nbytes))

    def encode(n: int, reps: int) -> float:
        stream = thread_stream()
        KEEP.append(stream)
        with stream:
            src = cupy.empty(n * stride, dtype=cupy.uint8)
            for i in range(n):
                src[i * stride : i * stride + nbytes] = cupy.asarray(chunk)
            out = cupy.empty(n * slot, dtype=cupy.uint8)
            need = nvcomp_c.encode_scratch_size("Zstd", n, nbytes)
            scratch = cupy.empty(need, dtype=cupy.uint8)
        stream.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            sizes = nvcomp_c.encode("Zstd", stream, [src.data.ptr + i * stride for i in range(n)], [nbytes] * n,
                                    [out.data.ptr + i * slot for i in range(n)], scratch.data.ptr, need, n)
        assert all(0 < s <= slot for s in sizes)
        return time.perf_counter() - t0

    print("2. one thread, zstd, 4.17 MB chunks", flush=True)
    for n in (1, 4, 28, 150):
        encode(n, 1)
        el = encode(n, 3)
        print(f"   {n:3d} chunks a call: {el / 3 * 1e3:7.1f} ms per call, {3 * n * nbytes / el / 1e9:6.2f} GB/s", flush=True)
    print("3. threads x 3 calls of 28 chunks", flush=True)
    for threads in (4, 8, 16):
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda _: encode(28, 1), range(threads)))
            t0 = time.perf_counter()
            list(pool.map(lambda _: encode(28, 3), range(threads)))
            el = time.perf_counter() - t0
        print(f"   {threads:2d} threads: {threads * 3 * 28 * nbytes / el / 1e9:6.2f} GB/s in all", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
