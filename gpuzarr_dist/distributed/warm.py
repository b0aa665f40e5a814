"""Warming a GPU worker before its first task: what a fresh process otherwise pays inside its first blocks.

A new worker process's first read on each thread creates the thread's CUDA
stream, nvCOMP's handles and scratch, loads our kernels and CuPy's reduction
kernels, starts kvikio's and our I/O thread pools and pins staging buffers
(100-250 ms per 512 MiB). :func:`warm_worker` does all of it at start-up: it
writes a small zstd array into the worker's local directory and, on every one
of the worker's threads at once, grows the device pool for the thread's stream
by :data:`DEVICE_BLOCKS_PER_THREAD` GPU blocks (at most half the free memory
in all, :func:`device_share`), reads the array with
:func:`gpuzarr_dist.from_zarr_gpu` and reduces it, after pinning one staging
buffer of the GPU block size per thread. Any error is raised: a worker that cannot read on its GPU should not
start as if it could.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
import time
from typing import Any

import numpy as np

#: the warm-up array: 64 chunks of 64 KiB (one nvCOMP batch of many chunks), float32
_SHAPE, _CHUNKS = (64, 64, 256), (1, 64, 256)
#: device memory each thread's stream gets in the pool ahead of its first block, in GPU blocks: a task
#: holds about this many blocks' worth while it reads and decodes zstd (see ``gpuzarr.block-size.gpu``)
DEVICE_BLOCKS_PER_THREAD = 6
#: the most of the device's free memory the warm-up takes into the pool, all threads together
DEVICE_SHARE_OF_FREE = 0.5


def _probe_data() -> np.ndarray:
    return (np.arange(np.prod(_SHAPE), dtype=np.float32) % 977).reshape(_SHAPE)


def _write_probe(root: str) -> str:
    import zarr
    from zarr.codecs import ZstdCodec

    path = os.path.join(root, "gpuzarr-warm.zarr")
    data = _probe_data()
    arr = zarr.create_array(store=path, shape=_SHAPE, chunks=_CHUNKS, dtype="float32",
                            compressors=ZstdCodec(level=0), overwrite=True)
    arr[...] = data
    return path


def _block_bytes() -> int:
    from gpuzarr_dist import config
    from gpuzarr_dist.cuda.device import gpu_memory_bytes

    return config.block_size_bytes("gpu", gpu_memory_bytes)


def device_share(nthreads: int) -> int:
    """The device memory each of ``nthreads`` threads' streams gets in the pool ahead of its first block:
    :data:`DEVICE_BLOCKS_PER_THREAD` GPU blocks, but all threads together at most :data:`DEVICE_SHARE_OF_FREE`
    of the memory free now (a GPU shared with other work is not filled by a warm-up)."""
    from gpuzarr_dist.cuda.device import device_memory_info

    free, _ = device_memory_info()
    return int(min(DEVICE_BLOCKS_PER_THREAD * _block_bytes(), DEVICE_SHARE_OF_FREE * free / max(1, nthreads)))


def _read_probe(path: str, barrier: threading.Barrier, share: int) -> str:
    """On this thread: the stream and its share of the device pool, one batched read + decode and the usual
    reductions."""
    from gpuzarr_dist.array.read import from_zarr_gpu
    from gpuzarr_dist.cuda.streams import reserve_device_memory, sync_thread_stream, thread_stream

    thread_stream()
    barrier.wait()  # every thread of the pool at once: each warms its own stream
    reserve_device_memory(share)
    x = from_zarr_gpu(path, device="gpu", chunks=_SHAPE)
    m = x.mean(axis=0).compute(scheduler="sync")
    s = x.sum(axis=(1, 2), dtype="float64").compute(scheduler="sync")
    sync_thread_stream()
    data = _probe_data()
    got_m, got_s = (a.get() if hasattr(a, "get") else np.asarray(a) for a in (m, s))
    if not (np.allclose(got_m, data.mean(axis=0), rtol=1e-6) and np.allclose(got_s, data.sum(axis=(1, 2), dtype=np.float64))):
        raise RuntimeError("gpuzarr-dist's warm-up read of a small zstd array on this worker's GPU gave wrong values")
    return threading.current_thread().name


def warm_worker(nthreads: int, local_dir: str | None = None) -> dict[str, Any]:
    """Pin staging for ``nthreads`` blocks, then read the warm-up array on ``nthreads`` threads at once.

    Runs the reads on a pool of its own; :func:`warm_dask_worker` runs them on
    the worker's executor instead. Returns what it did (seconds, bytes pinned).
    """
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.perf_counter()
    pinned = _reserve(nthreads)
    with tempfile.TemporaryDirectory(dir=local_dir, prefix="gpuzarr-warm-") as root:
        path = _write_probe(root)
        barrier = threading.Barrier(nthreads, timeout=120)
        share = device_share(nthreads)
        with ThreadPoolExecutor(nthreads) as pool:
            list(pool.map(lambda _: _read_probe(path, barrier, share), range(nthreads)))
    return {"seconds": time.perf_counter() - t0, "pinned_bytes": pinned, "threads": nthreads}


def _reserve(nthreads: int) -> int:
    from gpuzarr_dist.cuda.streams import reserve_staging

    return reserve_staging(nthreads, _block_bytes())


async def warm_dask_worker(worker: Any) -> dict[str, Any]:
    """:func:`warm_worker` for a dask worker, with the reads on the worker's own executor threads."""
    t0 = time.perf_counter()
    loop = asyncio.get_running_loop()
    executor = worker.executors["default"]
    n = max(1, int(worker.state.nthreads))
    pinned = await loop.run_in_executor(executor, _reserve, n)
    root = tempfile.mkdtemp(dir=worker.local_directory, prefix="gpuzarr-warm-")
    try:
        path = await loop.run_in_executor(executor, _write_probe, root)
        barrier = threading.Barrier(n, timeout=120)
        share = await loop.run_in_executor(executor, device_share, n)
        await asyncio.gather(*(loop.run_in_executor(executor, _read_probe, path, barrier, share) for _ in range(n)))
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return {"seconds": time.perf_counter() - t0, "pinned_bytes": pinned, "threads": n}


def _device_probe(n: int = 1 << 18) -> Any:
    """A small device array made on this worker (1 MiB of float32 ones)."""
    from gpuzarr_dist.cuda.device import device_empty

    a = device_empty((n,), np.float32)
    a.fill(1)
    return a


def _device_total(a: Any) -> float:
    return float(a.sum())


def warm_comms(client: Any) -> None:
    """Move a small device array from every GPU worker to every other one, and one to the client.

    A fresh cluster's first computation otherwise opens each connection
    between workers, and between a worker and the client, and loads the
    serializers of device arrays, while it waits for its first partial
    results to travel.
    """
    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    made = {w: client.submit(_device_probe, workers=[w], pure=False) for w in workers}
    used = [client.submit(_device_total, made[v], workers=[w], pure=False)
            for w in workers for v in workers if v != w]
    totals = client.gather(used)
    if any(t != float(1 << 18) for t in totals):
        raise RuntimeError(f"gpuzarr-dist's warm-up moved a device array between workers and got {totals}")
    if workers:
        client.gather(made[workers[0]])  # and one to the client
