"""Where a ``to_zarr_gpu`` block's time goes: each stage of one block's write timed alone, then thread scaling.

Used by ``gpuzarr-dist bench write``. Stages,
for one block on one thread (best of 3, the stream synchronised after each):

- ``chunk grid``: the block cut into its chunks, one contiguous ``(n, *chunk)`` array (a copy kernel on the GPU);
- ``encode``: nvCOMP's batch encode with the compressed sizes read back (GPU), or numcodecs on the
  decode threads (CPU); on the GPU also ``pack`` (compressed chunks gathered on the device) and
  ``device->pinned`` (one copy of the packed buffer);
- ``shard assembly`` (sharded arrays): the shard indexes and the lists of pieces each shard is written from;
- ``object writes``: every object written to a temporary name and renamed (page cache);
- ``whole block``: :meth:`~gpuzarr_dist.array.write.BlockWriter.write`, all of the above in one call.

GB/s are of uncompressed data, so the slowest stage is the limit of one thread.
"""

from __future__ import annotations

import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from gpuzarr_dist.bench.report import best_of


def block_writer(folder: str, block_shape: tuple[int, ...], nblocks: int, dtype: Any, chunk: tuple[int, ...],
                 shard: tuple[int, ...] | None, codec: str = "zstd", device: str = "auto") -> Any:
    """A :class:`~gpuzarr_dist.array.write.BlockWriter` for an array of ``nblocks`` blocks along axis 0, under ``folder``."""
    from gpuzarr_dist.array.write import BlockWriter
    from gpuzarr_dist.core.metadata import spec_from_zarr_metadata
    from gpuzarr_dist.stores.target import codec_objects, create_metadata, open_target

    shape = (block_shape[0] * nblocks, *block_shape[1:])
    t = open_target(folder, None, None)
    arr = create_metadata(t, shape=shape, dtype=np.dtype(dtype), chunk=chunk, shard=shard,
                          compressors=codec_objects(codec, None, False), fill_value=None, attributes=None,
                          dimension_names=None, overwrite=True, resume=False)
    spec = spec_from_zarr_metadata(arr.metadata, t.name)
    chunks = tuple((b,) * (s // b) for b, s in zip(block_shape, shape))
    return BlockWriter(spec, t.writer(t.name), chunks, device)


def stage_times(block: Any, chunk: tuple[int, ...], shard: tuple[int, ...] | None, gpu: bool,
                folder: str | None = None) -> list[str]:
    """Lines giving each write stage's seconds and GB/s for ``block`` (numpy or cupy) on this thread."""
    from gpuzarr_dist.codecs.encode import chunk_grid

    nbytes = block.nbytes
    with tempfile.TemporaryDirectory(prefix="gpuzarr-stages-", dir=folder) as d:
        w = block_writer(os.path.join(d, "a.zarr"), tuple(block.shape), 1, block.dtype, chunk, shard,
                         device="gpu" if gpu else "cpu")
        spec = w.spec
        start = (0,) * block.ndim
        first, grid, coords = w.chunk_layout(tuple(block.shape), start)
        keys = [spec.chunk_key(c) for c in coords]
        times: dict[str, float] = {}
        if gpu:
            import cupy

            from gpuzarr_dist.cuda.encode import encode_batch_gpu
            from gpuzarr_dist.cuda.streams import thread_stream

            stream = thread_stream()

            def grid_copy() -> Any:
                g = chunk_grid(block, spec.chunk_shape, spec.fill_value, cupy)
                stream.synchronize()
                return g

            times["chunk grid (device copy)"] = best_of(grid_copy)
            chunks = grid_copy()
            encode_batch_gpu(w.pipeline, chunks, keys, stream)  # warm-up
            best: dict[str, float] | None = None
            for _ in range(3):
                t: dict[str, float] = {}
                encoded = encode_batch_gpu(w.pipeline, chunks, keys, stream, timings=t)
                if best is None or sum(t.values()) < sum(best.values()):
                    best = t
            for k, label in (("prepare", "rows for nvCOMP (pad/crc copy)"), ("encode", "nvCOMP encode + sizes"),
                             ("pack", "pack on device"), ("d2h", "device->pinned copy"), ("host", "host framing")):
                if best and best.get(k, 0.0) > 2e-6:
                    times[label] = best[k]
        else:
            from gpuzarr_dist.runtime.threads import decode_pool

            times["chunk grid (host copy)"] = best_of(lambda: chunk_grid(block, spec.chunk_shape, spec.fill_value, np))
            chunks = chunk_grid(block, spec.chunk_shape, spec.fill_value, np)
            times["encode (numcodecs threads)"] = best_of(lambda: w.pipeline.encode_batch(list(chunks), keys,
                                                                                        decode_pool()), 1)
            encoded = w.pipeline.encode_batch(list(chunks), keys, decode_pool())
        stored = sum(memoryview(e).nbytes for e in encoded)
        if shard is not None:
            items = _shard_items(w, encoded, first, grid)
            times["shard assembly"] = best_of(lambda: _shard_items(w, encoded, first, grid))
            n_obj = len(items)

            def put() -> None:
                w.writer.put_many(items)
        else:
            n_obj = len(encoded)
            objs = [(spec.store_key(c), e) for c, e in zip(coords, encoded)]

            def put() -> None:
                w.writer.put_many(objs)

        times[f"object writes ({n_obj} objects)"] = best_of(put)
        times["whole block (BlockWriter.write)"] = best_of(lambda: (w.write(block, start), _sync(gpu)))
    lines = [f"stages of one block {tuple(block.shape)} -> {len(keys)} chunks {tuple(chunk)}"
             f"{f' in shards {tuple(shard)}' if shard else ''}, {nbytes / 1e6:.0f} MB, ratio {nbytes / stored:.3f}, "
             "one thread, best of 3:"]
    for name, sec in times.items():
        lines.append(f"  {name:<34} {sec * 1e3:9.1f} ms {nbytes / sec / 1e9:8.2f} GB/s")
    return lines


def _shard_items(w: Any, encoded: list[Any], first: tuple[int, ...], grid: list[int]) -> list[tuple[str, Any]]:
    """What :meth:`BlockWriter._store` hands the object writer for a sharded block (without writing it)."""
    captured: list[tuple[str, Any]] = []

    class _Capture:
        def put_many(self, items: list) -> int:
            captured.extend(items)
            return 0

    real = w.writer
    w.writer = _Capture()
    try:
        w._store(encoded, first, grid)
    finally:
        w.writer = real
    return captured


def _sync(gpu: bool) -> None:
    if gpu:
        from gpuzarr_dist.cuda.streams import sync_thread_stream

        sync_thread_stream()


def thread_scaling(block: Any, chunk: tuple[int, ...], shard: tuple[int, ...] | None, gpu: bool,
                   counts: tuple[int, ...] = (1, 4, 8, 16), nblocks: int = 16, folder: str | None = None) -> list[str]:
    """GB/s of ``nblocks`` copies of ``block`` encoded (only) and written (whole) on 1..16 threads, no dask."""
    from gpuzarr_dist.codecs.encode import chunk_grid

    lines = [f"thread scaling, {nblocks} blocks of {block.nbytes / 1e6:.0f} MB, chunks {tuple(chunk)}"
             f"{f', shards {tuple(shard)}' if shard else ''}; GB/s of uncompressed data:"]
    lines.append(f"  {'stage':<22}" + "".join(f"{n:>8}" for n in counts))
    with tempfile.TemporaryDirectory(prefix="gpuzarr-scaling-", dir=folder) as d:
        w = block_writer(os.path.join(d, "a.zarr"), tuple(block.shape), nblocks, block.dtype, chunk, shard,
                         device="gpu" if gpu else "cpu")
        spec = w.spec
        starts = [(i * block.shape[0],) + (0,) * (block.ndim - 1) for i in range(nblocks)]

        def encode_only(i: int) -> None:
            first, grid, coords = w.chunk_layout(tuple(block.shape), starts[i])
            keys = [spec.chunk_key(c) for c in coords]
            if gpu:
                import cupy

                from gpuzarr_dist.cuda.encode import encode_batch_gpu
                from gpuzarr_dist.cuda.streams import thread_stream

                encode_batch_gpu(w.pipeline, chunk_grid(block, spec.chunk_shape, spec.fill_value, cupy), keys,
                                 thread_stream())
            else:
                w._encode_cpu(block, starts[i])

        def whole(i: int) -> None:
            w.write(block, starts[i])
            _sync(gpu)

        for name, fn in (("encode only", encode_only), ("whole block write", whole)):
            row = []
            for n in counts:
                with ThreadPoolExecutor(n) as pool:
                    list(pool.map(fn, range(min(n, nblocks))))  # warm-up: streams, codecs, pools
                    t0 = time.perf_counter()
                    list(pool.map(fn, range(nblocks)))
                    row.append(nblocks * block.nbytes / (time.perf_counter() - t0) / 1e9)
            lines.append(f"  {name:<22}" + "".join(f"{v:8.2f}" for v in row))
    return lines
