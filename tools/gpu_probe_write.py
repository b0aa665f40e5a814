"""GPU probe of the write path: where a to_zarr_gpu block's time goes, and the device's nvCOMP encode ceiling.

Run on the GPU machine from the repository root (after the wheel recipe of shared/gpu/README.md):

    python3 tools/gpu_probe_write.py [--steps 64] [--threads 1,4,8,16]

Prints (and exits 0 unless a round trip is wrong):
A. raw nvCOMP zstd encode, one thread, one call: 1024 x 256 KiB / 256 x 1 MiB / 64 x 4 MiB, with nvCOMP's
   own output buffers and with ``encode(out=)`` into one preallocated buffer (what codecs/gpu_encode.py uses);
   then the same 1024 x 256 KiB call on 4/8/16 threads at once, one codec per thread on its own stream;
B. for chunks of ~256 KiB, ~1 MiB and 4 MiB (one time step) of one ERA5-like block: each stage of
   BlockWriter.write on one thread (chunk grid copy, nvCOMP encode incl. sizes, pack, device->pinned,
   shard assembly for the sharded layout, object writes with temp + rename), then thread scaling;
C. a round trip: every chunk our encoder wrote decodes with numcodecs to the input.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FAILED: list[str] = []


def era5(steps: int) -> np.ndarray:
    from gpuzarr_dist.demo import _Field, _slabs

    return np.concatenate(list(_slabs(_Field(seed=1), steps)))


def raw_nvcomp(data: np.ndarray, counts: tuple[int, ...]) -> None:
    import cupy
    from nvidia import nvcomp

    from gpuzarr_dist.cuda.streams import align, thread_stream

    print("A. raw nvCOMP zstd encode (GB/s of uncompressed data; best of 3; sizes read back)")
    flat = cupy.asarray(data.reshape(-1).view(np.uint8))

    def one_call(size: int, n: int, use_out: bool, state: dict) -> float:
        stream = thread_stream()
        if "codec" not in state:  # created in the using thread, on its stream, kept (as the library does)
            state["codec"] = nvcomp.Codec(algorithm="Zstd", bitstream_kind=nvcomp.BitstreamKind.RAW,
                                          device_id=cupy.cuda.Device().id, cuda_stream=stream.ptr)
        codec = state["codec"]
        src = nvcomp.as_arrays(flat, [i * size for i in range(n)], [size] * n)
        if use_out:
            cap = state.setdefault(("cap", size), int(codec.get_max_comp_buffer_size(nvcomp.as_array(flat[:size]))))
            slot = align(cap)
            out = state.get(("out", size, n))
            if out is None:
                out = state[("out", size, n)] = cupy.empty(n * slot, dtype=cupy.uint8)
            t0 = time.perf_counter()
            res = codec.encode(src, out=nvcomp.as_arrays(out, [i * slot for i in range(n)], [cap] * n))
        else:
            t0 = time.perf_counter()
            res = codec.encode(src)
        stream.synchronize()
        sizes = list(res.buffer_sizes)
        dt = time.perf_counter() - t0
        state["ratio"] = size * n / sum(sizes)
        return dt

    cases = [(256 << 10, 1024), (1 << 20, 256), (4 << 20, 64)]
    state: dict = {}
    for size, n in cases:
        n = min(n, flat.size // size)
        row = []
        for use_out in (False, True):
            try:
                one_call(size, n, use_out, state)
                dt = min(one_call(size, n, use_out, state) for _ in range(3))
                row.append(f"{size * n / dt / 1e9:6.2f}")
            except Exception as e:
                row.append(f"{type(e).__name__}: {e}"[:60])
        print(f"  {size >> 10:5d} KiB x {n:4d}, one call: nvCOMP buffers {row[0]} | encode(out=) {row[1]} GB/s"
              f"  (ratio {state.get('ratio', 0):.3f})")
    size, n = 256 << 10, min(1024, flat.size // (256 << 10))
    for threads in counts:
        if threads == 1:
            continue
        states = [dict() for _ in range(threads)]
        try:
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(lambda st: one_call(size, n, True, st), states))  # warm-up: streams, codecs
                t0 = time.perf_counter()
                list(pool.map(lambda st: one_call(size, n, True, st), states))
                dt = time.perf_counter() - t0
            print(f"  {threads:2d} threads x (1024 x 256 KiB, encode(out=)), a codec per thread: "
                  f"{threads * size * n / dt / 1e9:6.2f} GB/s together")
        except Exception as e:
            print(f"  {threads} threads: {type(e).__name__}: {e}")


def stages(data: np.ndarray, counts: tuple[int, ...], folder: str | None) -> None:
    import cupy

    from gpuzarr_dist.bench.write_stages import stage_times, thread_scaling
    from gpuzarr_dist.array.write import split_shape

    print("B. stages of BlockWriter.write, one block on the device")
    block = cupy.asarray(data)
    step = data.shape[1:]
    layouts = [
        ((1, *step), None, "one chunk per time step (the issue's layout)"),
        ((1, *split_shape(step, 4, 1 << 20)), None, "~1 MiB chunks"),
        ((1, *split_shape(step, 4, 256 << 10)), None, "~256 KiB chunks"),
        ((1, *split_shape(step, 4, 1 << 20)), tuple(data.shape), "shards=True: one shard per block, ~1 MiB inner"),
    ]
    for chunk, shard, what in layouts:
        print(f"\n  -- {what}")
        try:
            print("\n".join("  " + line for line in stage_times(block, chunk, shard, True, folder)))
            print("\n".join("  " + line for line in thread_scaling(block, chunk, shard, True, counts,
                                                                    nblocks=max(counts), folder=folder)))
        except Exception:
            traceback.print_exc()
            FAILED.append(f"stages {what}")


def round_trip(data: np.ndarray) -> None:
    import cupy
    import numcodecs

    from gpuzarr_dist.cuda.encode import encode_batch_gpu
    from gpuzarr_dist.codecs.pipeline import CodecPipeline
    from gpuzarr_dist.core.metadata import ArraySpec, CodecSpec
    from gpuzarr_dist.cuda.streams import thread_stream

    print("C. round trip of our encoder (numcodecs decodes every chunk to the input)")
    chunks = data[:4].reshape(4 * 7, 103, 1440)
    for crc in (False, True):
        codecs = [CodecSpec("bytes", {"endian": "little"}), CodecSpec("zstd", {"level": 0})]
        if crc:
            codecs.append(CodecSpec("crc32c"))
        spec = ArraySpec("probe", chunks.shape[1:], chunks.shape[1:], np.dtype("float32"), np.float32(0), 3,
                         tuple(codecs), "c", "/", "zarr.json")
        out = encode_batch_gpu(CodecPipeline(spec), cupy.asarray(chunks), [str(i) for i in range(len(chunks))],
                               thread_stream())
        z = numcodecs.Zstd()
        ok = all(np.array_equal(np.frombuffer(z.decode(bytes(o)[: len(bytes(o)) - (4 if crc else 0)]), "<f4"),
                                c.reshape(-1)) for o, c in zip(out, chunks))
        print(f"  [{'ok' if ok else 'FAIL'}] zstd{' + crc32c' if crc else ''}: {len(out)} chunks")
        if not ok:
            FAILED.append(f"round trip crc={crc}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=64, help="time steps of the block (64: 265 MB, as bench write)")
    ap.add_argument("--threads", default="1,4,8,16")
    ap.add_argument("--path", default=None, help="folder for written objects (default: the temporary folder)")
    args = ap.parse_args()
    counts = tuple(int(v) for v in args.threads.split(","))
    data = era5(args.steps)
    print(f"data: float32 {data.shape}, {data.nbytes / 1e9:.2f} GB; threads {counts}")
    for step in (lambda: round_trip(data), lambda: raw_nvcomp(data, counts), lambda: stages(data, counts, args.path)):
        try:
            step()
        except Exception:
            traceback.print_exc()
            FAILED.append("a step raised")
        print()
    print("FAILED: " + ", ".join(FAILED) if FAILED else "probe done, round trips ok")
    return 1 if any(f.startswith("round trip") for f in FAILED) else 0


if __name__ == "__main__":
    raise SystemExit(main())
