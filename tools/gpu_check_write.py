"""GPU smoke test and micro-benchmark of the write path (to_zarr_gpu, nvCOMP batch encode).

Run on the GPU machine from the repository root:

    python3 tools/gpu_check_write.py [--steps 120]

Prints what it checks and measures; exits 1 when a check fails. It checks:
1. our batch encoder (codecs/gpu_encode.py) for zstd, gzip (nvCOMP Deflate in a gzip member), none,
   with and without crc32c: every chunk decodes with numcodecs to the input;
2. whether nvCOMP's Codec accepts a zstd ``level`` and whether it changes the output size (informational);
3. nvCOMP zstd encode GB/s and compression ratio for 256 KiB / 1 MiB / 4 MiB chunks in batches of
   about 256 MB, against numcodecs zstd (default level) on the same ERA5-like data;
4. to_zarr_gpu of cupy blocks (plain and sharded), read back by zarr-python, with its GB/s.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FAILED: list[str] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"  [{'ok' if ok else 'FAIL'}] {name} {detail}")
    if not ok:
        FAILED.append(name)


def era5(steps: int) -> np.ndarray:
    from gpuzarr_dist.demo import _Field, _slabs

    return np.concatenate(list(_slabs(_Field(seed=1), steps)))


def pipeline_for(codec: str, crc: bool, chunk: tuple[int, ...]):
    from gpuzarr_dist.codecs.pipeline import CodecPipeline
    from gpuzarr_dist.core.metadata import ArraySpec, CodecSpec

    codecs = [CodecSpec("bytes", {"endian": "little"})]
    if codec != "none":
        codecs.append(CodecSpec(codec, {"level": 0 if codec == "zstd" else 5}))
    if crc:
        codecs.append(CodecSpec("crc32c"))
    spec = ArraySpec("check", chunk, chunk, np.dtype("float32"), np.float32(0), 3, tuple(codecs), "c", "/", "zarr.json")
    return CodecPipeline(spec)


def encoder_checks(data: np.ndarray) -> None:
    import cupy

    from gpuzarr_dist.cuda.encode import encode_batch_gpu
    from gpuzarr_dist.cuda.streams import thread_stream

    print("1. batch encoder round trips (decoded by numcodecs / our CPU pipeline)")
    stream = thread_stream()
    chunks = cupy.asarray(data[:16].reshape(16 * 7, 103, 1440))  # 593 KB chunks
    host = chunks.get()
    for codec in ("zstd", "gzip", "none"):
        for crc in (False, True):
            name = f"{codec}{' + crc32c' if crc else ''}"
            try:
                p = pipeline_for(codec, crc, chunks.shape[1:])
                t0 = time.perf_counter()
                out = encode_batch_gpu(p, chunks, [f"k{i}" for i in range(len(host))], stream)
                dt = time.perf_counter() - t0
                same = all(np.array_equal(p.decode_chunk(bytes(o), "k"), h) for o, h in zip(out, host))
                stored = sum(memoryview(o).nbytes for o in out)
                check(name, same, f"ratio {host.nbytes / stored:.3f}, {host.nbytes / dt / 1e9:.2f} GB/s (first call)")
            except Exception:
                traceback.print_exc()
                check(name, False, "raised")


def level_probe(data: np.ndarray) -> None:
    import cupy
    from nvidia import nvcomp

    print("2. does nvCOMP zstd take a level? (informational)")
    buf = cupy.asarray(data[:4].reshape(-1).view(np.uint8))
    for kw in ({}, {"level": 1}, {"level": 9}, {"level": 19}):
        try:
            codec = nvcomp.Codec(algorithm="Zstd", bitstream_kind=nvcomp.BitstreamKind.RAW, **kw)
            res = codec.encode(nvcomp.as_array(buf))
            cupy.cuda.runtime.deviceSynchronize()
            print(f"  Codec({kw}) -> {int(res.buffer_size)} bytes of {buf.nbytes}")
        except Exception as e:
            print(f"  Codec({kw}) -> {type(e).__name__}: {e}")


def encode_rates(data: np.ndarray) -> None:
    import cupy
    import numcodecs

    from gpuzarr_dist.cuda.encode import encode_batch_gpu
    from gpuzarr_dist.cuda.streams import thread_stream

    print("3. nvCOMP zstd batch encode vs numcodecs zstd (one thread), same data")
    stream = thread_stream()
    flat = data.reshape(-1)
    for size in (256 * 1024, 1 << 20, 4 << 20):
        per = size // 4
        n = min(len(flat) // per, (256 << 20) // size)
        host = flat[: n * per].reshape(n, per)
        dev = cupy.asarray(host)
        p = pipeline_for("zstd", False, (per,))
        keys = [str(i) for i in range(n)]
        encode_batch_gpu(p, dev, keys, stream)
        t0 = time.perf_counter()
        out = encode_batch_gpu(p, dev, keys, stream)
        dt = time.perf_counter() - t0
        gpu_ratio = host.nbytes / sum(memoryview(o).nbytes for o in out)
        z = numcodecs.Zstd(level=0)
        t1 = time.perf_counter()
        cpu = [z.encode(h) for h in host[: max(1, n // 8)]]
        dt_cpu = (time.perf_counter() - t1) * n / max(1, n // 8)
        cpu_ratio = host[: len(cpu)].nbytes / sum(len(c) for c in cpu)
        print(f"  {size >> 10:5d} KiB x {n:4d}: GPU {host.nbytes / dt / 1e9:6.2f} GB/s ratio {gpu_ratio:.3f} | "
              f"numcodecs 1 thread {host.nbytes / dt_cpu / 1e9:5.2f} GB/s ratio {cpu_ratio:.3f} "
              f"({(gpu_ratio / cpu_ratio - 1) * 100:+.1f}%)")


def to_zarr_checks(data: np.ndarray) -> None:
    import cupy
    import dask
    import dask.array as da
    import zarr

    import gpuzarr_dist as gz

    print("4. to_zarr_gpu with cupy blocks, read back by zarr-python")
    x = da.from_array(data, chunks=(32, 721, 1440)).map_blocks(cupy.asarray)
    with dask.config.set(scheduler="threads", num_workers=16):
        x = x.persist()
    cupy.cuda.runtime.deviceSynchronize()
    with tempfile.TemporaryDirectory() as d:
        for name, kw in (("chunks (1, 721, 1440)", {"chunks": (1, 721, 1440)}), ("shards=True", {"shards": True}),
                         ("gzip + crc32c", {"codec": "gzip", "crc32c": True, "chunks": (1, 721, 1440)})):
            path = os.path.join(d, "out.zarr")
            try:
                with dask.config.set(scheduler="threads", num_workers=16):
                    gz.to_zarr_gpu(x, path, overwrite=True, **kw)
                    t0 = time.perf_counter()
                    gz.to_zarr_gpu(x, path, overwrite=True, **kw)
                    dt = time.perf_counter() - t0
                stored = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)
                same = np.array_equal(zarr.open_array(path, mode="r")[...], data)
                check(name, same, f"{data.nbytes / dt / 1e9:.2f} GB/s, ratio {data.nbytes / stored:.3f}")
            except Exception:
                traceback.print_exc()
                check(name, False, "raised")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=120)
    args = ap.parse_args()
    data = era5(args.steps)
    print(f"data: float32 {data.shape}, {data.nbytes / 1e9:.2f} GB")
    for step in (encoder_checks, level_probe, encode_rates, to_zarr_checks):
        try:
            step(data)
        except Exception:
            traceback.print_exc()
            FAILED.append(step.__name__)
    print("FAILED: " + ", ".join(FAILED) if FAILED else "all checks passed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    raise SystemExit(main())
