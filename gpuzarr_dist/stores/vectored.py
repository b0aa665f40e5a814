"""Scattered reads of one file range into many places of a buffer: ``preadv`` with an iovec table built by numpy.

A merged read of a shard (:class:`.ranges.MergedRead`) lands each inner chunk
in its own aligned slot of the staging buffer, and the bytes between wanted
chunks in a scratch buffer. ``os.preadv`` takes one Python buffer object per
destination: for a block of 3528 inner chunks, two objects per chunk (a
memoryview and its managed buffer) alive while the reads ran, with several
blocks reading at once. Python's collector counts such objects, and its full
collections (100 ms, the GIL held, on the GPU machine) stalled every reading
thread (session 20). Here the table of ``(address, length)`` pairs is one
numpy array and libc's ``preadv`` is called through ctypes (which releases the
GIL for the call), so a read makes no object per piece.

:func:`preadv_pieces` returns ``None`` where libc's ``preadv`` cannot be
found or the buffer gives no writable address; the caller then uses
``os.preadv``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from typing import Any

import numpy as np

#: iovec entries per call, below every system's IOV_MAX (1024 on Linux)
GROUP = 512

_state: list = []
_lock = threading.Lock()


def _preadv() -> Any:
    """libc's ``preadv`` (``preadv64`` where both exist) with its argument types, or ``None``."""
    if not _state:
        with _lock:
            if not _state:
                fn = None
                try:
                    libc = ctypes.CDLL(None, use_errno=True)
                    fn = getattr(libc, "preadv64", None) or libc.preadv
                    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong]
                    fn.restype = ctypes.c_ssize_t
                except (OSError, AttributeError):
                    fn = None
                _state.append(fn)
    return _state[0]


def available() -> bool:
    """Whether libc's ``preadv`` was found (else callers use ``os.preadv``)."""
    return _preadv() is not None


def gaps(start: int, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The bytes a read from ``start`` passes over before each piece (negative where pieces overlap)."""
    return offsets - np.concatenate(([start], offsets[:-1] + lengths[:-1]))


def writable_address(buf: Any) -> tuple[int, int] | None:
    """``(address, nbytes)`` of a writable, contiguous buffer, or ``None``."""
    try:
        arr = np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8)
    except (TypeError, ValueError):
        return None
    if not arr.flags.writeable:
        return None
    return arr.ctypes.data, arr.nbytes


def iovec_table(start: int, offsets: np.ndarray, lengths: np.ndarray, dests: np.ndarray, buf: tuple[int, int],
                scratch: tuple[int, int]) -> np.ndarray:
    """The ``(address, length)`` table (uint64, ``(k, 2)``) that reads the file from ``start`` on: each piece
    ``offsets[i], lengths[i]`` (sorted, not overlapping, none before ``start``) to ``dests[i]`` of the buffer
    ``buf`` (``(address, nbytes)``, see :func:`writable_address`), and each gap before a piece to the
    ``scratch`` buffer.

    Raises ``ValueError`` where a piece would land outside ``buf``, or a gap does not fit in ``scratch``
    (the kernel would write past them: nothing here checks addresses after this)."""
    gap = gaps(start, offsets, lengths)
    if len(dests) and (int(dests.min()) < 0 or int((dests + lengths).max()) > buf[1] or int(lengths.min()) < 0):
        raise ValueError(f"pieces planned outside the {buf[1]}-byte buffer")
    if len(gap) and (int(gap.min()) < 0 or int(gap.max()) > scratch[1]):
        raise ValueError(f"pieces overlap or leave a gap larger than the {scratch[1]}-byte scratch buffer")
    has_gap = gap > 0
    slot = np.arange(len(offsets)) + np.cumsum(has_gap)
    table = np.empty((len(offsets) + int(has_gap.sum()), 2), dtype=np.uint64)
    table[slot, 0] = buf[0] + dests
    table[slot, 1] = lengths
    table[slot[has_gap] - 1, 0] = scratch[0]
    table[slot[has_gap] - 1, 1] = gap[has_gap]
    return table


def preadv_table(fd: int, table: np.ndarray, offset: int) -> int | None:
    """Read the file from ``offset`` into the places of ``table`` (see :func:`iovec_table`), in groups of
    :data:`GROUP` entries; the bytes read (fewer only at the end of the file), or ``None`` without libc's
    ``preadv``. Raises ``OSError`` with the call's errno."""
    fn = _preadv()
    if fn is None:
        return None
    total = 0
    for i in range(0, len(table), GROUP):
        group = np.ascontiguousarray(table[i : i + GROUP])
        want = int(group[:, 1].sum())
        while True:
            got = fn(fd, group.ctypes.data, len(group), offset + total)
            if got >= 0:
                break
            err = ctypes.get_errno()
            if err != errno.EINTR:
                raise OSError(err, os.strerror(err))
        total += got
        if got < want:
            break
    return total
