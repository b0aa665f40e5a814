"""Per-process thread pools shared by all tasks (one for reads, one for CPU decoding), and the read turns.

Pools are created on first use and re-created in a forked child, so worker
processes never inherit a parent's dead threads. :func:`read_slot` lets a few
blocks of the process read at a time, in the order they asked; :func:`map_all`
runs calls on a pool and leaves none running behind an error.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Executor, ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import Any, TypeVar

from gpuzarr_dist import config

T = TypeVar("T")

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


_slots: dict[tuple[int, str, int], _FifoSemaphore] = {}


@contextmanager
def read_slot(n: int, kind: str = "read") -> Iterator[None]:
    """Hold one of ``n`` process-wide slots of ``kind`` for a block (``n`` 0: no limit), first come first served:
    ``"read"`` for its reads, ``"plan"`` for preparing them (see :func:`gpuzarr_dist.cuda.blocks.read_plan_gpu`).

    Waiting threads are let in in the order they asked, so blocks land one
    after another in task order instead of all together.
    """
    if n <= 0:
        yield
        return
    key = (os.getpid(), kind, n)  # a forked child makes its own
    sem = _slots.get(key)
    if sem is None:
        with _lock:
            sem = _slots.setdefault(key, _FifoSemaphore(n))
    sem.acquire()
    try:
        yield
    finally:
        sem.release()


class _FifoSemaphore:
    """A counting semaphore that wakes its waiters in arrival order (``threading.Semaphore`` promises no order)."""

    def __init__(self, n: int):
        self._free = n
        self._lock = threading.Lock()
        self._waiters: deque[threading.Lock] = deque()

    def acquire(self) -> None:
        with self._lock:
            if self._free > 0 and not self._waiters:
                self._free -= 1
                return
            gate = threading.Lock()
            gate.acquire()
            self._waiters.append(gate)
        try:
            gate.acquire()  # released by the release() that hands this waiter its slot
        except BaseException:  # interrupted while waiting: give up the place, or the slot it was just handed
            with self._lock:
                if gate in self._waiters:
                    self._waiters.remove(gate)
                    raise
            self.release()
            raise

    def release(self) -> None:
        with self._lock:
            if self._waiters:
                self._waiters.popleft().release()  # the slot passes straight to the longest waiter
            else:
                self._free += 1


def map_all(pool: Executor, fn: Callable[..., T], *iterables: Iterable[Any]) -> list[T]:
    """``list(pool.map(fn, *iterables))``, except that no call is still running when an error leaves.

    ``Executor.map`` raises at the first failed result while the calls after
    it go on: reads into the caller's staging buffer (which the caller then
    hands back to a shared pool), writes through file descriptors the caller
    then closes (a reused descriptor number is another file), temporary files
    of an object write the caller reports as failed. Here, on a failure, the
    calls not started are cancelled and the running ones are waited for; then
    the first failure in argument order is raised.
    """
    futures = [pool.submit(fn, *args) for args in zip(*iterables)]
    try:
        _, pending = wait(futures, return_when=FIRST_EXCEPTION)
    except BaseException:  # interrupted while waiting: the calls stop with this thread's error
        pending = set(futures)
        raise
    finally:
        if pending:  # a call failed (or the wait was interrupted): start nothing more, let the running ones end
            for f in pending:
                f.cancel()
            wait(pending)
    return [f.result() for f in futures]  # the first failure in argument order (the cancelled ones come after it)
