"""GPU probe: the block placement kernel (``reader_gpu.place_tiles``: one CUDA block per row, the last axis in
32-bit) against session 23's (one thread per element, every axis with 64-bit divisions), alone and in bench
shards' time means.

    python tools/gpu_probe_place.py                  # the kernels alone, (96, 721, 1440) float32 blocks
    MEANS=1 STEPS=960 ROUNDS=3 python tools/gpu_probe_place.py   # and time means, rounds interleaved

Alone: each kernel on a block of 256 KiB and of 1 MiB inner chunks, best and median of 20 runs (CUDA events),
checked equal to each other. Means: the best of RUNS (3) bench shards time means per round, variant and kernel.
Environment: MEANS (0), STEPS (960), ROUNDS (3), RUNS (3), ROOT (/tmp/gap), VARIANTS (unsharded,inner256k,inner1m).
"""
import os
import statistics
import sys

import cupy
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import gpuzarr_dist.cuda.blocks as rg  # noqa: E402
from gpuzarr_dist.cuda.decode import _kernel  # noqa: E402
from gpuzarr_dist.cuda.streams import upload  # noqa: E402

OLD_SRC = r"""
extern "C" __global__ void place_tiles(const T* chunks, T* out, long long total, int nd, const long long* dims,
                                       long long tile_stride) {
    // dims: the block's shape, the chunk shape, the grid (chunks per axis), the block's start in its first chunk
    const long long *shape = dims, *chunk = dims + nd, *grid = dims + 2 * nd, *start = dims + 3 * nd;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long rem = i, tile = 0, within = 0, tmul = 1, wmul = 1;
        for (int d = nd - 1; d >= 0; d--) {
            long long o = rem % shape[d], g;
            rem /= shape[d];
            g = o + start[d];
            long long q = g / chunk[d];
            tile += q * tmul; tmul *= grid[d];
            within += (g - q * chunk[d]) * wmul; wmul *= chunk[d];
        }
        out[i] = chunks[tile * tile_stride + within];
    }
}
"""
new_place = rg.place_tiles


def old_place(out, chunks, chunk_shape, grid, start):
    item = out.dtype.itemsize
    kernel = _kernel("place_tiles", f"typedef {rg._PLACE_TYPES[item]} T;\n" + OLD_SRC, (f"-DGZ_PLACE_ITEM={item}",))
    dims = upload(np.asarray([*out.shape, *chunk_shape, *grid, *start], dtype=np.int64))
    total = out.size
    blocks = max(1, min((total + 255) // 256, 1 << 16))
    kernel((blocks,), (256,), (chunks, out, np.int64(total), np.int32(out.ndim), dims, np.int64(chunks.strides[0] // item)))


def alone() -> None:
    shape = (96, 721, 1440)
    for side in (256, 512):
        chunk = (1, side, side)
        grid = tuple(-(-n // c) for n, c in zip(shape, chunk))
        tiles = cupy.random.random((int(np.prod(grid)), *chunk), dtype=cupy.float32)
        outs = {}
        for name, fn in (("one thread per element (old)", old_place), ("a CUDA block per row (new)", new_place)):
            out = cupy.empty(shape, dtype=cupy.float32)
            fn(out, tiles, chunk, grid, (0, 0, 0))
            times = []
            for _ in range(20):
                a, b = cupy.cuda.Event(), cupy.cuda.Event()
                a.record()
                fn(out, tiles, chunk, grid, (0, 0, 0))
                b.record()
                b.synchronize()
                times.append(cupy.cuda.get_elapsed_time(a, b))
            outs[name] = out
            gbps = 2 * out.nbytes / (min(times) * 1e6)
            print(f"{side}x{side} inner chunks, {name}: best {min(times):.2f} ms, median {statistics.median(times):.2f} ms "
                  f"({gbps:.0f} GB/s read + written)", flush=True)
        a, b = outs.values()
        print(f"  equal: {bool((a == b).all())}")


def means() -> None:
    from gpuzarr_dist.bench.shards import _best, _mean, write_variants

    steps = int(os.environ.get("STEPS", 960))
    rounds, runs = int(os.environ.get("ROUNDS", 3)), int(os.environ.get("RUNS", 3))
    names = os.environ.get("VARIANTS", "unsharded,inner256k,inner1m").split(",")
    paths = write_variants(os.environ.get("ROOT", "/tmp/gap"), steps, 721, 1440, shard_t=4)
    best: dict = {}
    for r in range(rounds):
        for name in names:
            for kind in (("new", "old") if r % 2 == 0 else ("old", "new")):
                rg.place_tiles = new_place if kind == "new" else old_place
                t = _best(_mean(paths[name], "gpu", 16), runs)
                best.setdefault((name, kind), []).append(t)
                print(f"round {r} {name:10s} {kind} kernel {t * 1e3:7.1f} ms", flush=True)
    rg.place_tiles = new_place
    for kind in ("new", "old"):
        base = statistics.median(best[("unsharded", kind)]) if "unsharded" in names else None
        for name in names:
            m = statistics.median(best[(name, kind)])
            print(f"median {name:10s} {kind} kernel {m * 1e3:7.1f} ms" + (f"  {base / m:.2f}x the unsharded rate" if base else ""))


alone()
if os.environ.get("MEANS", "0") == "1":
    means()
