"""``gpuzarr-dist bench write``: writing an ERA5-like array through ``to_zarr_gpu`` and, in the same run
on the same data, through zarr-python (numcodecs zstd) and ``dask.array.to_zarr``.

The data is made once and held in memory (on the GPU as cupy blocks when the
device is the GPU, in host memory otherwise), so each row times the write
alone: chunking, compression and files written into the page cache of the
output folder (a fresh one each run: the last run's output is removed before
the clock starts). Every row writes zstd at its default level, chunks of one time
step (1, 721, 1440); the table gives GB/s of uncompressed data and the
compression ratio each tool achieved.
"""

from __future__ import annotations

import math
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np

from gpuzarr_dist.bench.files import chunk_files
from gpuzarr_dist.bench.report import Row, format_table, save

OURS = "gpuzarr-dist to_zarr_gpu"
CHUNK = (1, 721, 1440)


def _stored(path: str) -> int:
    return sum(os.path.getsize(p) for p in chunk_files(path))


def _data(steps: int) -> np.ndarray:
    from gpuzarr_dist.synthetic import Field, slabs

    return np.concatenate(list(slabs(Field(seed=0), steps)))


def _sync(device: str) -> None:
    if device == "gpu":
        import cupy

        cupy.cuda.runtime.deviceSynchronize()


def run(args) -> int:
    """Entry point of ``gpuzarr-dist bench write``; returns the exit status."""
    import dask
    import dask.array as da
    import zarr
    import zarr.codecs as zc

    from gpuzarr_dist.api import to_zarr_gpu
    from gpuzarr_dist.cuda.device import gpu_status, resolve_device

    device = resolve_device(getattr(args, "device", "auto") or "auto")
    quick = bool(getattr(args, "quick", False))
    threads = int(getattr(args, "threads", None) or min(16, os.cpu_count() or 1))
    steps = getattr(args, "time_steps", None) or (8 if quick else (600 if device == "gpu" else 48))
    block_steps = int(getattr(args, "block_steps", None) or (4 if quick else 64))
    repeat = 1 if quick else 3
    out_dir = getattr(args, "out", None) or "bench-results"
    where = getattr(args, "path", None)
    if where:  # a folder that does not exist yet is made (as bench read does with its --path)
        os.makedirs(where, exist_ok=True)
    tmp = tempfile.TemporaryDirectory(prefix="gpuzarr-bench-write-", dir=where)
    data = _data(steps)
    nbytes = data.nbytes
    print(f"array: float32 {data.shape}, chunks {CHUNK}, dask blocks of {block_steps} steps; "
          f"{nbytes / 1e9:.2f} GB uncompressed, in {'GPU' if device == 'gpu' else 'host'} memory")
    print(f"device: {device} ({gpu_status()[1]}); {threads} threads; output under {tmp.name}; {platform.node()}")

    x = da.from_array(data, chunks=(block_steps, *CHUNK[1:]))
    if device == "gpu":
        import cupy

        x = x.map_blocks(cupy.asarray)
    with dask.config.set(scheduler="threads", num_workers=threads):
        x = x.persist()
    _sync(device)

    def ours(shards: bool) -> Callable[[str], None]:
        def go(path: str) -> None:
            with dask.config.set(scheduler="threads", num_workers=threads):
                to_zarr_gpu(x, path, chunks=None if shards else CHUNK, shards=True if shards else None)

        return go

    def zarr_python(path: str) -> None:
        a = zarr.create_array(path, shape=data.shape, chunks=CHUNK, dtype=data.dtype,
                              compressors=[zc.ZstdCodec(level=0)])
        a[...] = data

    def dask_to_zarr(path: str) -> None:
        a = zarr.create_array(path, shape=data.shape, chunks=CHUNK, dtype=data.dtype,
                              compressors=[zc.ZstdCodec(level=0)])
        with dask.config.set(scheduler="threads", num_workers=threads):
            da.to_zarr(da.from_array(data, chunks=(block_steps, *CHUNK[1:])), a)

    small = [] if quick else [_small_chunk(block_steps, m) for m in (getattr(args, "chunk_mib", None) or (1.0, 0.25))]

    def ours_small(chunk: tuple[int, ...]) -> Callable[[str], None]:
        def go(path: str) -> None:
            with dask.config.set(scheduler="threads", num_workers=threads):
                to_zarr_gpu(x, path, chunks=chunk)

        return go

    candidates: list[tuple[str, str, Callable[[str], None]]] = [
        (OURS, "ours.zarr", ours(False)),
        ("gpuzarr-dist, shards=True", "ours-sharded.zarr", ours(True)),
        *((f"gpuzarr-dist, chunks {c} ({math.prod(c) * 4 / 2**20:.2f} MiB)", "ours-small.zarr", ours_small(c))
          for c in small),
        ("zarr-python a[:] = data (numcodecs zstd)", "zarr-python.zarr", zarr_python),
        (f"dask.array.to_zarr, {threads} threads", "dask.zarr", dask_to_zarr),
    ]
    rows: list[Row] = []
    ratios: dict[str, float] = {}
    for name, folder, fn in candidates:
        path = os.path.join(tmp.name, folder)
        times = []
        for k in range(repeat + 1):  # run 0 warms up: imports, CUDA context, nvCOMP handles, thread pools
            # the last run's output goes before the clock starts: removing its files can take a third of a
            # whole write's time, and no user's write pays it
            shutil.rmtree(path, ignore_errors=True)
            t0 = time.perf_counter()
            fn(path)
            if k:
                times.append(time.perf_counter() - t0)
        ratio = nbytes / _stored(path)
        ratios[name] = ratio
        rows.append(Row(name, "warm", statistics.median(times), nbytes, note=f"compression ratio {ratio:.3f}",
                        extra={"ratio": ratio}))
        if name != OURS:
            shutil.rmtree(path, ignore_errors=True)
    ceiling_lines: list[str] = []
    if not getattr(args, "no_ceiling", False):  # what the machine's page cache takes: the bound on every row
        from gpuzarr_dist.bench.write_ceiling import ceiling_rows, load_objects

        crows, ceiling_lines = ceiling_rows(load_objects(os.path.join(tmp.name, "ours.zarr")), nbytes, threads,
                                            tmp.name, repeat)
        rows.extend(crows)
    print(format_table(rows, OURS))
    print("\n".join(ceiling_lines))
    ours_row = rows[0]
    zp = next(r for r in rows if r.name.startswith("zarr-python"))
    cpu_ratio = ratios[zp.name]
    print(f"targets: {ours_row.gbps:.2f} GB/s (target 5); {ours_row.gbps / zp.gbps:.1f}x zarr-python (target 4x); "
          f"compression ratio {ratios[OURS]:.3f} vs CPU zstd {cpu_ratio:.3f} "
          f"({(ratios[OURS] / cpu_ratio - 1) * 100:+.1f}%, target within 5%)")
    if not getattr(args, "no_stages", False):
        _stages(x, device, block_steps, small, tmp.name, quick)
    check = _read_back(os.path.join(tmp.name, "ours.zarr"), data)
    print(f"read back by zarr-python: {'identical' if check else 'DIFFERENT'}")
    meta = {"device": device, "threads": threads, "time_steps": steps, "block_steps": block_steps,
            "nbytes": nbytes, "host": platform.node(), "quick": quick, "read_back_identical": check}
    written = save(rows, out_dir, "bench-write", f"write float32 {data.shape}, zstd, {device}", meta)
    print("saved:", ", ".join(written))
    tmp.cleanup()
    return 0 if check else 1


def _small_chunk(block_steps: int, mib: float) -> tuple[int, ...]:
    """A chunk shape of about ``mib`` MiB dividing one time step (so it divides the blocks too)."""
    from gpuzarr_dist.core.layout import split_shape

    return (1, *split_shape(CHUNK[1:], 4, max(1, int(mib * 2**20))))


def _stages(x, device: str, block_steps: int, small: list[tuple[int, ...]], folder: str, quick: bool) -> None:
    """Per-stage timings of one block on one thread, then thread scaling, for each layout of the table."""
    from gpuzarr_dist.bench.write_stages import stage_times, thread_scaling
    from gpuzarr_dist.core.layout import plan_layout

    gpu = device == "gpu"
    block = x.blocks[0].compute(scheduler="sync")
    _, shard_layout = plan_layout(x, None, True)
    inner, _ = plan_layout(x, None, True)
    layouts = [(CHUNK, None), (inner, shard_layout), *((c, None) for c in small)]
    counts = (1, 2) if quick else (1, 4, 8, 16)
    for chunk, shard in layouts:
        print()
        print("\n".join(stage_times(block, chunk, shard, gpu, folder)))
        print("\n".join(thread_scaling(block, chunk, shard, gpu, counts, nblocks=max(counts), folder=folder)))
    _sync(device)


def _read_back(path: str, data: np.ndarray) -> bool:
    import zarr

    return bool(np.array_equal(zarr.open_array(path, mode="r")[...], data))
