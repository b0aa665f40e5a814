#!/usr/bin/env python3
"""GPU check for issue 9 (deflate): the deflate walk's cost per launch geometry next to nvCOMP's decode.

On ERA5-like chunks (float32 721 x 1440, 4.15 MB; ``--chunks`` of them, made
from ``--steps`` distinct time steps) compressed with zlib level 1 and with
gzip level 1: times the device walk (:func:`gpu_deflate.deflate_walk`) for
each threads-per-block option, the segmented adler32 / CRC-32 checks, one
batched nvCOMP decode alone and ``decode_batch_gpu`` (walk + nvCOMP +
checksums); checks that the walk flags no valid chunk (no false positives),
that the batch decodes equal to numcodecs, that damaged chunks (truncated,
overwritten runs, a flipped adler32) are named and never handed to nvCOMP,
and that the device walk agrees with the host build of the same source on
small damaged streams. Prints ms per batch; exits 1 on any failure::

    python3 tools/gpu_check_deflate9.py [--chunks 64] [--steps 8] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))

GEOMETRIES = (1, 4, 8, 32, 64, None)  # threads per block; None: "auto"


def _spec(codec: str, n: int):
    import numpy as np

    from gpuzarr_dist.core.metadata import ArraySpec, CodecSpec

    shape = (721, 1440)
    return ArraySpec(name=f"era5-{codec}", shape=(n, *shape), chunk_shape=(1, *shape), dtype=np.dtype("<f4"),
                     fill_value=0, zarr_format=2, codecs=(CodecSpec("bytes", {"endian": "little"}),
                                                          CodecSpec(codec, {"level": 1})),
                     key_prefix="", key_separator=".", metadata_key=".zarray")


def _staged(chunks: list[bytes], lead: int):
    import numpy as np

    from gpuzarr_dist.cuda.streams import ALIGN, pinned_staging
    from gpuzarr_dist.stores.base import staging_layout

    sizes = [len(c) for c in chunks]
    offsets, total = staging_layout(sizes, ALIGN, lead)
    host = pinned_staging(total)
    for c, o in zip(chunks, offsets):
        host[o : o + len(c)] = np.frombuffer(c, dtype=np.uint8)
    return host, offsets, sizes, total


def _timed(fn, reps: int, stream) -> float:
    fn()  # compiles, warms
    stream.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    stream.synchronize()
    return (time.perf_counter() - t) / reps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--chunks", type=int, default=64)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    import cupy
    import numcodecs
    import numpy as np
    import zarr
    from nvidia import nvcomp

    from gpuzarr_dist.cuda import decode as gpu
    from gpuzarr_dist.cuda.deflate_walk import DEFLATE_GZIP, DEFLATE_WALK_REASONS, DEFLATE_ZLIB
    from gpuzarr_dist.cuda.decode import decode_batch_gpu, framing_lead
    from gpuzarr_dist.cuda.deflate import adler32_streams, deflate_walk, walk_threads
    from gpuzarr_dist.codecs.pipeline import CodecPipeline
    from gpuzarr_dist.demo import make_era5_like
    from gpuzarr_dist.errors import ChunkDecodeError
    from gpuzarr_dist.cuda.streams import thread_stream

    failures = 0

    def fail(msg: str) -> None:
        nonlocal failures
        failures += 1
        print("FAIL:", msg)

    with tempfile.TemporaryDirectory() as tmp:
        make_era5_like(os.path.join(tmp, "era5.zarr"), args.steps)
        steps = np.asarray(zarr.open_array(os.path.join(tmp, "era5.zarr"), mode="r")[: args.steps])
    t0 = time.perf_counter()
    distinct = {"zlib": [bytes(numcodecs.Zlib(level=1).encode(s.tobytes())) for s in steps],
                "gzip": [bytes(numcodecs.GZip(level=1).encode(s.tobytes())) for s in steps]}
    print(f"compressed {args.steps} steps with zlib and gzip level 1 in {time.perf_counter() - t0:.1f} s")
    expected = 721 * 1440 * 4
    stream = thread_stream()
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    print(f"{args.chunks} chunks of {expected / 1e6:.2f} MB, {sms} SMs; auto threads per block: "
          f"{walk_threads(args.chunks, 0)}")
    for codec, wrap in (("zlib", DEFLATE_ZLIB), ("gzip", DEFLATE_GZIP)):
        chunks = [distinct[codec][i % args.steps] for i in range(args.chunks)]
        pipe = CodecPipeline(_spec(codec, args.chunks))
        host, offsets, sizes, total = _staged(chunks, framing_lead(pipe))
        keys = [f"{i}.0.0" for i in range(args.chunks)]
        dev = cupy.asarray(host[:total])
        stored = sum(sizes)
        print(f"{codec}: {stored / 2**20:.0f} MiB stored, ratio {args.chunks * expected / stored:.2f}")
        for threads in GEOMETRIES:
            lengths, ends = deflate_walk(dev, offsets, sizes, expected, wrap, stream, threads)
            bad = np.flatnonzero(lengths != expected)
            if bad.size:
                fail(f"{codec} walk (threads {threads}) flags {bad.size} valid chunks, e.g. {keys[bad[0]]}: "
                     f"{DEFLATE_WALK_REASONS.get(int(lengths[bad[0]]), int(lengths[bad[0]]))}")
            s = _timed(lambda: deflate_walk(dev, offsets, sizes, expected, wrap, stream, threads), args.reps, stream)
            label = "auto" if threads is None else str(threads)
            print(f"  walk, {label:>4} threads/block {s * 1e3:9.2f} ms per batch ({args.chunks * expected / s / 1e9:6.1f} GB/s decoded-equivalent)")
        head, tail = gpu.NVCOMP_FRAMING[codec][1:]
        in_offs = [o + head for o in offsets]
        in_sizes = [n - head - tail for n in sizes]
        stride = (expected + 255) // 256 * 256
        out = cupy.empty(args.chunks * stride, dtype=cupy.uint8)
        algorithm = gpu.NVCOMP_FRAMING[codec][0]

        def nv():
            res = gpu._nvcomp_codec(algorithm, stream).decode(
                nvcomp.as_arrays(dev, in_offs, in_sizes),
                out=nvcomp.as_arrays(out, [i * stride for i in range(args.chunks)], [stride] * args.chunks))
            stream.synchronize()
            return list(res.buffer_sizes)

        s_nv = _timed(nv, args.reps, stream)
        print(f"  nvCOMP {algorithm} decode alone     {s_nv * 1e3:9.2f} ms per batch ({args.chunks * expected / s_nv / 1e9:6.1f} GB/s)")
        if codec == "zlib":
            s_ad = _timed(lambda: adler32_streams(out, [i * stride for i in range(args.chunks)], [expected] * args.chunks,
                                                  stream), args.reps, stream)
            got = adler32_streams(out, [i * stride for i in range(args.chunks)], [expected] * args.chunks, stream)
            want = [int.from_bytes(c[-4:], "big") for c in chunks]
            if got.tolist() != want:
                fail("device adler32 differs from the stored adler32 of valid chunks")
            print(f"  adler32 (segmented)           {s_ad * 1e3:9.2f} ms per batch")
        s_all = _timed(lambda: decode_batch_gpu(pipe, host, offsets, sizes, keys, stream), args.reps, stream)
        print(f"  decode_batch_gpu (walk + nvCOMP + checks) {s_all * 1e3:9.2f} ms per batch "
              f"({args.chunks * expected / s_all / 1e9:.1f} GB/s)")
        dec = decode_batch_gpu(pipe, host, offsets, sizes, keys, stream)
        stream.synchronize()
        for i in sorted({0, args.steps - 1, args.chunks - 1}):
            if not np.array_equal(dec[i].get().reshape(721, 1440).view("u4"), steps[i % args.steps].view("u4")):
                fail(f"{codec} chunk {i} decodes differently from the data")
        # damaged chunks: named, and never handed to nvCOMP
        rng = np.random.default_rng(9)
        good = chunks[0]
        cut = good[: len(good) // 3]
        run = bytearray(good)
        at = len(good) // 2
        run[at : at + 200] = rng.bytes(200)
        damaged = {5 % args.chunks: cut, 17 % args.chunks: bytes(run)}
        adler_only = 30 % args.chunks
        if codec == "zlib":
            damaged[adler_only] = good[:-1] + bytes([good[-1] ^ 1])  # the adler32 alone: nvCOMP decodes, the check names it
        for j, b in damaged.items():
            bad_chunks = list(chunks)
            bad_chunks[j] = b
            h2, o2, s2, _ = _staged(bad_chunks, framing_lead(pipe))
            calls = []
            real = gpu._decode_ptrs  # every nvCOMP decode call, through either interface
            gpu._decode_ptrs = lambda *a: calls.append(a) or real(*a)
            try:
                decode_batch_gpu(pipe, h2, o2, s2, keys, stream)
                stream.synchronize()
                fail(f"{codec}: damaged chunk {j} decoded without an error")
            except ChunkDecodeError as e:
                if e.key != keys[j]:
                    fail(f"{codec}: damaged chunk {j}: error names {e.key}")
                else:
                    print(f"  damaged chunk {j}: named ({e.reason[:100]}); nvCOMP called {len(calls)} time(s)")
                if not (codec == "zlib" and j == adler_only) and calls:
                    fail(f"{codec}: damaged chunk {j} reached nvCOMP")
            finally:
                gpu._decode_ptrs = real
    # the device build agrees with the host build on small damaged streams (the fuzz's hang class)
    from deflate_walk_host import HostKernels

    with tempfile.TemporaryDirectory() as tmp:
        hk = HostKernels.build(tmp, sanitize=False)
        if hk is None:
            print("  (no C++ compiler here: device/host agreement not checked)")
        else:
            rng = np.random.default_rng(10)
            base = [zlib.compress(rng.integers(0, 8, n).astype("u1").tobytes(), lv) for n in (30, 200, 700, 3000)
                    for lv in (1, 6, 9)]
            streams, limits = [], []
            for k in range(3000):
                s = bytearray(base[k % len(base)])
                kind = k % 3
                if kind == 0:
                    s = s[: rng.integers(1, len(s))]
                elif kind == 1:
                    i = int(rng.integers(len(s)))
                    s[i : i + 8] = rng.bytes(8)
                else:
                    s[int(rng.integers(len(s)))] ^= 1 << int(rng.integers(8))
                streams.append(bytes(s))
                limits.append(3000)
            buf = np.zeros(sum(len(s) for s in streams) + 1, np.uint8)
            offs, at = [], 0
            for s in streams:
                buf[at : at + len(s)] = np.frombuffer(s, np.uint8)
                offs.append(at)
                at += len(s)
            for threads in GEOMETRIES:
                lengths, ends = deflate_walk(cupy.asarray(buf), offs, [len(s) for s in streams], limits, DEFLATE_ZLIB,
                                             stream, threads)
                dev_res = list(zip(lengths.tolist(), ends.tolist()))
                if dev_res != hk.walk(streams, DEFLATE_ZLIB, limits):
                    fail(f"device walk (threads {threads}) differs from the host build on small damaged streams")
            print(f"  device and host walks agree on {len(streams)} small damaged zlib streams "
                  f"({sum(r < 0 for r, _ in dev_res)} rejected)")
            hk.close()
    cupy.cuda.runtime.deviceSynchronize()
    print("OK" if not failures else f"FAIL: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
