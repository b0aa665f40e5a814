"""GPU probe of to_zarr_gpu's pipelined sub-batches: whole-block writes with and without pipelining.

Run on the GPU machine from the repository root (page cache of /tmp, or --path):

    python3 tools/gpu_probe_write2.py [--steps 64] [--blocks 16] [--threads 1,4,16]

Prints, then exits 1 if a check failed:
1. checks: a block written with sub-batches (and without) reads back through zarr-python equal to the
   input, for zstd, zstd + crc32c, gzip and none; no temporary files left;
2. asynchrony: how long ``launch_encode_gpu`` holds the host thread against the whole encode
   (launch << finish means the encode runs while the host writes);
3. a table: GB/s (uncompressed) of ``BlockWriter.write`` of ``--blocks`` blocks of ``--steps`` ERA5-like
   steps (4.15 MB chunks, zstd) on 1/4/16 threads, for batch-size off (one batch per block: no overlap)
   and 32/64/128 MiB sub-batches; and the encode-only and write-only rates for the same blocks.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FAILED: list[str] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"  [{'ok' if ok else 'FAIL'}] {name} {detail}")
    if not ok:
        FAILED.append(name)


def era5(steps: int) -> np.ndarray:
    from gpuzarr_dist.demo import _Field, _slabs

    return np.concatenate(list(_slabs(_Field(seed=2), steps)))


def writer_for(folder: str, block_shape, nblocks: int, codec: str = "zstd", crc: bool = False):
    from gpuzarr_dist.core.metadata import spec_from_zarr_metadata
    from gpuzarr_dist.array.write import BlockWriter, _codec_objects, _open_target, create_metadata

    shape = (block_shape[0] * nblocks, *block_shape[1:])
    t = _open_target(folder, None, None)
    arr = create_metadata(t, shape=shape, dtype=np.dtype("float32"), chunk=(1, *block_shape[1:]), shard=None,
                          compressors=_codec_objects(codec, None, crc), fill_value=None, attributes=None,
                          dimension_names=None, overwrite=True, resume=False)
    spec = spec_from_zarr_metadata(arr.metadata, t.name)
    return BlockWriter(spec, t.writer(t.name), tuple((b,) * (s // b) for b, s in zip(block_shape, shape)), "gpu")


def checks(block_host: np.ndarray, base: str) -> None:
    import cupy
    import dask
    import zarr

    from gpuzarr_dist.cuda.streams import sync_thread_stream

    print("1. sub-batched block writes read back by zarr-python")
    block = cupy.asarray(block_host)
    for codec, crc in (("zstd", False), ("zstd", True), ("gzip", False), ("none", False)):
        for size in (None, "16 MiB"):
            path = os.path.join(base, f"check-{codec}-{crc}-{size}.zarr".replace(" ", ""))
            try:
                w = writer_for(path, block.shape, 2, codec, crc)
                with dask.config.set({"gpuzarr.write.batch-size": size}):
                    w.write(block, (0, 0, 0))
                    w.write(block[::-1].copy(), (block.shape[0], 0, 0))
                sync_thread_stream()
                got = zarr.open_array(path, mode="r")[...]
                ok = np.array_equal(got, np.concatenate([block_host, block_host[::-1]]))
                tmp = [n for _, _, ns in os.walk(path) for n in ns if n.endswith(".tmp")]
                check(f"{codec}{' + crc32c' if crc else ''}, batch-size {size}", ok and not tmp,
                      "" if ok else "DIFFERENT" if not tmp else f"temporary files left: {tmp[:3]}")
            except Exception:
                traceback.print_exc()
                check(f"{codec}{' + crc32c' if crc else ''}, batch-size {size}", False, "raised")
            shutil.rmtree(path, ignore_errors=True)


def asynchrony(block_host: np.ndarray) -> None:
    import cupy

    from gpuzarr_dist.cuda.encode import finish_encode_gpu, launch_encode_gpu
    from gpuzarr_dist.cuda.streams import thread_stream
    from gpuzarr_dist.array.write import chunk_grid

    print("2. does launch_encode_gpu return before the GPU is done? (host ms in launch / in finish)")
    with tempfile.TemporaryDirectory() as d:
        w = writer_for(os.path.join(d, "a.zarr"), block_host.shape, 1)
        stream = thread_stream()
        chunks = chunk_grid(cupy.asarray(block_host), w.spec.chunk_shape, w.spec.fill_value, cupy)
        for n in sorted({min(16, chunks.shape[0]), chunks.shape[0]}):
            keys = [str(i) for i in range(n)]
            finish_encode_gpu(launch_encode_gpu(w.pipeline, chunks[:n], keys, stream))  # warm-up
            stream.synchronize()
            t0 = time.perf_counter()
            p = launch_encode_gpu(w.pipeline, chunks[:n], keys, stream)
            t1 = time.perf_counter()
            finish_encode_gpu(p)
            t2 = time.perf_counter()
            print(f"  {n:4d} chunks ({n * chunks[0].nbytes / 2**20:.0f} MiB): launch {1e3 * (t1 - t0):7.2f} ms, "
                  f"finish {1e3 * (t2 - t1):7.2f} ms -> {'async' if t1 - t0 < 0.3 * (t2 - t0) else 'MOSTLY SYNC'}")


def table(block_host: np.ndarray, nblocks: int, counts: list[int], base: str) -> None:
    import cupy
    import dask

    from gpuzarr_dist.cuda.streams import sync_thread_stream
    from gpuzarr_dist.cuda.write import encode_block_gpu

    print(f"3. BlockWriter.write GB/s (uncompressed), {nblocks} blocks of {block_host.nbytes / 1e6:.0f} MB, "
          f"chunks (1, 721, 1440), zstd, files under {base}")
    block = cupy.asarray(block_host)
    nb = block.nbytes
    print(f"  {'variant':<28}" + "".join(f"{n:>9}" for n in counts))
    variants = [("batch-size off (no overlap)", None), ("sub-batches 32 MiB", "32 MiB"),
                ("sub-batches 64 MiB", "64 MiB"), ("sub-batches 128 MiB", "128 MiB")]
    path = os.path.join(base, "table.zarr")
    w = writer_for(path, block.shape, nblocks)
    starts = [(i * block.shape[0], 0, 0) for i in range(nblocks)]
    sync_thread_stream()

    def rate(fn, n: int) -> float:
        with ThreadPoolExecutor(n) as pool:
            list(pool.map(fn, range(min(n, nblocks))))  # warm-up: streams, codecs, pools
            t0 = time.perf_counter()
            list(pool.map(fn, range(nblocks)))
            return nblocks * nb / (time.perf_counter() - t0) / 1e9

    def whole(i: int) -> None:
        w.write(block, starts[i])
        sync_thread_stream()

    for name, size in variants:
        with dask.config.set({"gpuzarr.write.batch-size": size}):  # global: set here, not in the threads
            print(f"  {name:<28}" + "".join(f"{rate(whole, n):9.2f}" for n in counts), flush=True)
    encoded = {}

    def encode_only(i: int) -> None:
        encoded[i] = encode_block_gpu(w, block, starts[i])

    print(f"  {'encode only (one batch)':<28}" + "".join(f"{rate(encode_only, n):9.2f}" for n in counts), flush=True)
    objs = {i: [(w.spec.store_key(c), e) for c, e in zip(w._chunk_layout(tuple(block.shape), starts[i])[2],
                                                          encoded[i][0])] for i in encoded}

    def write_only(i: int) -> None:
        w.writer.put_many(objs[i % len(objs)])

    print(f"  {'object writes only':<28}" + "".join(f"{rate(write_only, n):9.2f}" for n in counts), flush=True)
    shutil.rmtree(path, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=64, help="time steps (4.15 MB chunks) per block")
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--threads", default="1,4,16")
    ap.add_argument("--path", default=None, help="folder for the output (default: the temporary folder)")
    args = ap.parse_args()
    counts = [int(v) for v in args.threads.split(",")]
    data = era5(args.steps)
    base = tempfile.mkdtemp(prefix="gpuzarr-probe-write2-", dir=args.path)
    try:
        for step in (checks, asynchrony):
            try:
                step(data[: min(8, args.steps)], base) if step is checks else step(data)
            except Exception:
                traceback.print_exc()
                check(step.__name__, False, "raised")
        try:
            table(data, args.blocks, counts, base)
        except Exception:
            traceback.print_exc()
            check("table", False, "raised")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print("FAILED: " + ", ".join(FAILED) if FAILED else "all checks passed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
