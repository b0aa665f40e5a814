"""Per-process thread pools shared by all tasks: one for reads, one for CPU decoding.

Pools are created on first use and re-created in a forked child, so worker
processes never inherit a parent's dead threads.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

from .. import config

_lock = threading.Lock()
_pools: dict[str, tuple[int, int, ThreadPoolExecutor]] = {}


def _pool(kind: str, size: int) -> ThreadPoolExecutor:
    pid = os.getpid()
    entry = _pools.get(kind)
    if entry is not None and entry[0] == pid and entry[1] == size:
        return entry[2]
    with _lock:
        entry = _pools.get(kind)
        if entry is None or entry[0] != pid or entry[1] != size:
            pool = ThreadPoolExecutor(size, thread_name_prefix=f"gpuzarr-{kind}")
            _pools[kind] = (pid, size, pool)
            return pool
        return entry[2]


def io_pool() -> ThreadPoolExecutor:
    """Threads that read chunk bytes (``gpuzarr.io-threads``)."""
    return _pool("io", config.io_threads())


def decode_pool() -> ThreadPoolExecutor:
    """Threads that decode chunks on the CPU (``gpuzarr.decode-threads``)."""
    return _pool("decode", config.decode_threads())


def folder_pool() -> ThreadPoolExecutor:
    """A few threads that make a write's folders ahead of its objects (while the block is encoded).

    Apart from :func:`io_pool` so that making folders for blocks still being
    encoded never queues behind, or ahead of, another block's file writes.
    Making folders in one parent is serialised by the filesystem, so a few
    threads are enough.
    """
    return _pool("folders", min(4, config.io_threads()))
