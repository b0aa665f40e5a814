#!/usr/bin/env python3
"""GPU check for issue 9: the zstd walk's cost per ``gpuzarr.gpu.zstd-check`` mode next to nvCOMP's decode.

On 64 ERA5-like chunks (float32 721 x 1440, zstd level 0, ~3 MiB stored):
times the device walk (``_zstd_frames``) in "headers", "sequences" and "literals" mode
(the block walk; also with other CUDA block sizes for its lanes, and the one-thread-per-frame
walk of the same modes for comparison) and one batched nvCOMP decode of the same chunks, checks the walk flags none
of them and that the batch decodes equal to numcodecs. Prints ms per batch;
exits 1 on any failure::

    python3 tools/gpu_check_zstd9.py [--chunks 64] [--steps 8]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--chunks", type=int, default=64)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    import cupy
    import dask.config
    import numcodecs
    import numpy as np

    from gpuzarr_dist.cuda.decode import _zstd_frames, decode_batch_gpu
    from gpuzarr_dist.codecs.pipeline import CodecPipeline
    from gpuzarr_dist.demo import make_era5_like
    from gpuzarr_dist.core.metadata import ArraySpec, CodecSpec
    from gpuzarr_dist.cuda.streams import ALIGN, pinned_staging, thread_stream
    from gpuzarr_dist.stores.base import staging_layout

    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        make_era5_like(os.path.join(tmp, "era5.zarr"), args.steps)
        files = sorted(os.path.join(dp, f) for dp, _, fs in os.walk(os.path.join(tmp, "era5.zarr"))
                       for f in fs if not f.endswith(".json"))
        distinct = [open(f, "rb").read() for f in files]
    chunks = [distinct[i % len(distinct)] for i in range(args.chunks)]
    shape = (721, 1440)
    spec = ArraySpec(name="era5-check", shape=(len(chunks), *shape), chunk_shape=(1, *shape), dtype=np.dtype("<f4"),
                     fill_value=0, zarr_format=3, codecs=(CodecSpec("bytes", {"endian": "little"}), CodecSpec("zstd", {})),
                     key_prefix="c", key_separator="/", metadata_key="zarr.json")
    pipe = CodecPipeline(spec)
    sizes = [len(c) for c in chunks]
    offsets, total = staging_layout(sizes, ALIGN, 0)
    host = pinned_staging(total)
    for c, o in zip(chunks, offsets):
        host[o : o + len(c)] = np.frombuffer(c, dtype=np.uint8)
    stream = thread_stream()
    keys = [f"c/{i}/0/0" for i in range(len(chunks))]
    expected = 721 * 1440 * 4
    with stream:
        dev = cupy.asarray(host[:total])
        times = {}
        for mode in ("headers", "sequences", "literals"):
            with dask.config.set({"gpuzarr.gpu.zstd-check": mode}):
                suspects = _zstd_frames("era5-check", dev, offsets, sizes, keys, expected)  # compiles, warms
                if suspects:
                    print(f"FAIL: {mode} flags {len(suspects)} valid chunks: {suspects[:3]}")
                    failures += 1
                stream.synchronize()
                t = time.perf_counter()
                for _ in range(args.reps):
                    _zstd_frames("era5-check", dev, offsets, sizes, keys, expected)
                stream.synchronize()
                times[mode] = (time.perf_counter() - t) / args.reps
        import gpuzarr_dist.cuda.kernels as kernels
        from gpuzarr_dist.cuda.decode import _kernel, walk_launch

        default = kernels.ZSTD_BLOCK_THREADS, kernels.ZSTD_LANE_SHARED, kernels.ZSTD_LIT_SLOTS
        for mode in ("sequences", "literals"):
            shapes = [(1, 0, default[2]), (2, 2, default[2]), (8, 0, default[2]), (32, 0, default[2])]
            if mode == "literals":  # the literals walk's CUDA blocks, with the default sequences lanes
                shapes = [(*default[:2], slots) for slots in (1, 4, 11)]
            for threads, shared, slots in shapes:
                kernels.ZSTD_BLOCK_THREADS, kernels.ZSTD_LANE_SHARED, kernels.ZSTD_LIT_SLOTS = threads, shared, slots
                with dask.config.set({"gpuzarr.gpu.zstd-check": mode}):
                    _zstd_frames("era5-check", dev, offsets, sizes, keys, expected)
                    stream.synchronize()
                    t = time.perf_counter()
                    for _ in range(args.reps):
                        _zstd_frames("era5-check", dev, offsets, sizes, keys, expected)
                    stream.synchronize()
                    label = f"lanes x{threads}, {shared} shared" if mode == "sequences" else f"{slots} blocks per CUDA block"
                    times[f"{mode} {label}"] = (time.perf_counter() - t) / args.reps
            kernels.ZSTD_BLOCK_THREADS, kernels.ZSTD_LANE_SHARED, kernels.ZSTD_LIT_SLOTS = default
            n = len(chunks)  # the one-thread-per-frame walk (zstd_frames) of the same mode, once
            offs = cupy.asarray(np.asarray(offsets, dtype=np.int64))
            lens = cupy.asarray(np.asarray(sizes, dtype=np.int64))
            found = cupy.empty(3 * n, dtype=cupy.int64)
            stream.synchronize()
            t = time.perf_counter()
            _kernel("zstd_frames", kernels.ZSTD_FRAMES_SRC)(*walk_launch(n), (
                dev, offs, lens, np.int32(n), found[:n], found[n : 2 * n], found[2 * n :].view(cupy.int32),
                np.int32(kernels.ZSTD_CHECK_MODES[mode])))
            stream.synchronize()
            times[f"{mode} one thread a frame"] = time.perf_counter() - t
            if found[2 * n :].view(cupy.int32)[:n].any():
                print(f"FAIL: the one-thread {mode} walk flags valid chunks")
                failures += 1
        out = decode_batch_gpu(pipe, host, offsets, sizes, keys, stream)
        stream.synchronize()
        t = time.perf_counter()
        for _ in range(args.reps):
            out = decode_batch_gpu(pipe, host, offsets, sizes, keys, stream)
        stream.synchronize()
        decode = (time.perf_counter() - t) / args.reps
    for i in sorted({0, len(chunks) - 1, len(distinct) - 1}):
        want = np.frombuffer(numcodecs.Zstd().decode(chunks[i]), dtype="<f4").reshape(shape)
        if not np.array_equal(out[i].get().reshape(shape), want):
            print(f"FAIL: chunk {i} decodes differently from numcodecs")
            failures += 1
    mib = sum(sizes) / 2**20
    print(f"{len(chunks)} chunks, {mib:.0f} MiB stored, {len(chunks) * expected / 2**20:.0f} MiB decoded")
    for mode, s in times.items():
        print(f"  walk {mode:<30} {s * 1e3:8.2f} ms per batch")
    print(f"  decode_batch_gpu (default check) {decode * 1e3:8.2f} ms per batch "
          f"({len(chunks) * expected / decode / 1e9:.1f} GB/s)")
    print(f"  sequences walk / decode: {times['sequences'] / decode:.2f}x; literals walk / decode: "
          f"{times['literals'] / decode:.2f}x")
    print("OK" if not failures else f"FAIL: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
