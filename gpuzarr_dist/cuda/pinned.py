"""Reusable pinned host buffers for staging reads, served across sizes.

CuPy's pinned pool hands a freed buffer only to a later request of exactly
its size. A GPU block's staging buffer is rounded up to a power of two, so
blocks of another size (a different ``chunks=``, the last block of an array,
another array) would find no free buffer and pin new memory, 100-230 ms
for each new 512 MiB or 1 GiB buffer inside a block's read turn. Here a
request takes the smallest free buffer that holds it and is at most
:data:`REUSE_FACTOR` times its own size class, and pins a new one only when
none does.

A buffer goes back to the pool when the last array that views it is
garbage collected (the callers synchronise the streams that copy from it
before they drop it). Free buffers are kept for the life of the process, as
CuPy's pool keeps them; :meth:`PinnedPool.release` drops them.

Importable without cupy: the allocator is passed in (``cupy.cuda.alloc_pinned_memory``
on the GPU path), so the tests run the pool on the CPU with plain memory.
"""

from __future__ import annotations

import bisect
import ctypes
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

#: a free buffer serves requests whose size class (the next power of two) is at least 1 / this of its size
REUSE_FACTOR = 8
#: the smallest buffer the pool pins (smaller requests share this size class)
MIN_BYTES = 1 << 20


def size_class(nbytes: int) -> int:
    """The bytes the pool pins for a request of ``nbytes``: the next power of two, at least :data:`MIN_BYTES`."""
    return 1 << max(MIN_BYTES.bit_length() - 1, (max(int(nbytes), 1) - 1).bit_length())


class PinnedPool:
    """Pinned host buffers of power-of-two sizes, each reused by any later request it holds (see the module).

    ``alloc(nbytes)`` returns an object with a ``ptr`` attribute (the host
    address of at least ``nbytes`` bytes) that owns the memory while it lives.
    """

    def __init__(self, alloc: Callable[[int], Any]) -> None:
        self._alloc = alloc
        self._lock = threading.Lock()
        self._free: list[tuple[int, Any]] = []  # (size, owner), sorted by size
        self._returned: deque[tuple[int, Any]] = deque()  # appended by finalizers, from any thread
        self.pinned_bytes = 0  # all buffers this pool pinned, in use or free
        self.pins = 0  # how many times it had to pin a new buffer

    def take(self, nbytes: int) -> np.ndarray:
        """A pinned uint8 array of ``nbytes`` bytes (uninitialised), from a free buffer where one holds it."""
        nbytes = int(nbytes)
        want = size_class(nbytes)
        with self._lock:
            self._collect()
            at = bisect.bisect_left(self._free, nbytes, key=lambda e: e[0])  # the smallest that holds it
            if at < len(self._free) and self._free[at][0] <= want * REUSE_FACTOR:
                size, owner = self._free.pop(at)
            else:
                size, owner = want, None
        if owner is None:  # pinning takes long: outside the lock, so other threads' hits need not wait
            owner = self._alloc(size)
            with self._lock:
                self.pinned_bytes += size
                self.pins += 1
        view = (ctypes.c_uint8 * size).from_address(int(owner.ptr))
        # every array made from ``view`` keeps it alive (it is their base): when the last goes, so does ``view``
        weakref.finalize(view, self._returned.append, (size, owner)).atexit = False
        return np.frombuffer(view, dtype=np.uint8, count=nbytes)

    def _collect(self) -> None:
        """Move the buffers given back since the last call into the sorted free list (under the lock)."""
        while self._returned:
            bisect.insort_right(self._free, self._returned.popleft(), key=lambda e: e[0])

    def free_bytes(self) -> int:
        """Bytes of the buffers that are free now."""
        with self._lock:
            self._collect()
            return sum(size for size, _ in self._free)

    def reserve(self, count: int, nbytes: int) -> int:
        """Pin buffers until ``count`` free ones hold ``nbytes`` each (pinning is slow: do it ahead of the reads);
        the bytes newly pinned."""
        want = size_class(nbytes)
        with self._lock:
            self._collect()
            have = sum(1 for size, _ in self._free if nbytes <= size <= want * REUSE_FACTOR)
        added = []
        for _ in range(max(0, int(count) - have)):
            added.append((want, self._alloc(want)))
        with self._lock:
            for entry in added:
                bisect.insort_right(self._free, entry, key=lambda e: e[0])
            self.pinned_bytes += want * len(added)
            self.pins += len(added)
        return want * len(added)

    def release(self) -> int:
        """Drop every free buffer (their memory goes back to the allocator's owner objects); the bytes dropped."""
        with self._lock:
            self._collect()
            dropped = sum(size for size, _ in self._free)
            self._free.clear()
            self.pinned_bytes -= dropped
        return dropped
