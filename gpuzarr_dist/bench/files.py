"""File-level helpers for benchmarks: the folder a benchmark writes its data in, the chunk files of a store,
dropping them from the page cache, and the raw read rate of the same files (the ceiling row)."""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor


@contextlib.contextmanager
def data_folder(path: str | None, prefix: str) -> Iterator[str]:
    """The folder a benchmark writes its data in, for the ``with`` block.

    ``path`` when given: created if missing and kept afterwards, so data written
    there is reused by the next run. Without it, a new folder under the system's
    temporary directory whose name starts with ``prefix``, removed with all it
    holds when the block ends, also when the block raises (the exception goes
    on).
    """
    if path is not None:
        os.makedirs(path, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield tmp


def chunk_files(root: str) -> list[str]:
    """Every chunk file under ``root`` (metadata documents excluded), sorted."""
    out = []
    for d, _, names in os.walk(root):
        out.extend(os.path.join(d, n) for n in names if n not in ("zarr.json", ".zarray", ".zattrs", ".zgroup"))
    return sorted(out)


def drop_page_cache(files: list[str]) -> None:
    """Evict ``files`` from the page cache (``posix_fadvise(DONTNEED)`` after a sync), for cold reads."""
    os.sync()
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_ceiling(files: list[str], threads: int, device: str) -> tuple[float, int]:
    """Read every file with ``threads`` threads into reusable buffers, no decode; return (seconds, bytes).

    Each thread owns one buffer as large as the largest file (pinned host memory
    on the GPU device, plus a device buffer it copies into on its own stream),
    so no allocation happens per file: the fastest way we know to move these
    bytes, and the rate our read path is measured against.
    """
    size = max(os.path.getsize(p) for p in files)
    local = threading.local()
    if device == "gpu":
        import cupy
        import numpy as np

    def buffers():
        if not hasattr(local, "host"):
            if device == "gpu":
                mem = cupy.cuda.alloc_pinned_memory(size)
                local.host = np.frombuffer(mem, dtype=np.uint8, count=size)
                local.pinned = mem
                local.dev = cupy.empty(size, dtype=cupy.uint8)
                local.stream = cupy.cuda.Stream(non_blocking=True)
            else:
                local.host = bytearray(size)
        return local

    def one(path: str) -> int:
        b = buffers()
        with open(path, "rb", buffering=0) as f:
            n = f.readinto(memoryview(b.host)[:size])
        if device == "gpu":
            b.dev[:n].set(b.host[:n], stream=b.stream)
            b.stream.synchronize()
        return n

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda _: buffers(), range(threads)))  # warm the per-thread buffers
        t0 = time.perf_counter()
        total = sum(pool.map(one, files))
        dt = time.perf_counter() - t0
    return dt, total
