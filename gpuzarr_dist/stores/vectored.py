"""Scattered reads and copies with iovec tables built by numpy: ``preadv`` from a file, ``process_vm_readv`` in memory.

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

:func:`preadv_table` returns ``None`` where libc's ``preadv`` cannot be
found; the caller then uses ``os.preadv``.

Copies between buffers of this process go the same way
(:func:`copy_table`): ``process_vm_readv`` on this process's own id moves
every ``(source, length)`` pair of one table to its ``(destination, length)``
pair of another in one system call, without the GIL. A copy made of many
pieces (an object store's whole shard cut into its inner chunks' aligned
slots: 504 pieces of ~200 KB per block) by ``numpy.copyto`` per piece
re-acquired the GIL after every piece; with other threads holding it, that
took 600 ms instead of 14 ms for 91 MB on 2 cores here, and made the copies
of an S3 time mean's blocks 94 ms each on the GPU machine (session 21).
Where the call is missing or refused (not Linux, or a seccomp filter that
forbids it), :func:`copy_table` returns ``False`` and the caller copies
piece by piece.
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

_fns: dict[str, Any] = {}
_lock = threading.Lock()
#: errors that say the kernel will never do ``process_vm_readv`` for this process (not a fault of the table)
_REFUSED = (errno.ENOSYS, errno.EPERM, errno.EACCES)


def _libc(names: tuple[str, ...], argtypes: list, restype: Any) -> Any:
    """The first of libc's functions ``names`` that exists, with its argument types, or ``None`` (looked up once)."""
    key = names[0]
    if key not in _fns:
        with _lock:
            if key not in _fns:
                fn = None
                try:
                    libc = ctypes.CDLL(None, use_errno=True)
                    fn = next((getattr(libc, n) for n in names if hasattr(libc, n)), None)
                    if fn is not None:
                        fn.argtypes = argtypes
                        fn.restype = restype
                except OSError:
                    fn = None
                _fns[key] = fn
    return _fns[key]


def _preadv() -> Any:
    """libc's ``preadv`` (``preadv64`` where both exist) with its argument types, or ``None``."""
    return _libc(("preadv64", "preadv"), [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong],
                 ctypes.c_ssize_t)


def _vm_readv() -> Any:
    """libc's ``process_vm_readv`` with its argument types, or ``None`` (missing, or refused once already)."""
    return _libc(("process_vm_readv",), [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p,
                                         ctypes.c_ulong, ctypes.c_ulong], ctypes.c_ssize_t)


def available() -> bool:
    """Whether libc's ``preadv`` was found (else callers use ``os.preadv``)."""
    return _preadv() is not None


def gaps(start: int, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The bytes a read from ``start`` passes over before each piece (negative where pieces overlap)."""
    return offsets - np.concatenate(([start], offsets[:-1] + lengths[:-1]))


def writable_address(buf: Any) -> tuple[int, int] | None:
    """``(address, nbytes)`` of a writable, contiguous buffer (see :func:`address`), or ``None``."""
    try:
        return None if memoryview(buf).readonly else address(buf)
    except (TypeError, ValueError):
        return None


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


def address(buf: Any) -> tuple[int, int]:
    """``(address, nbytes)`` of a contiguous buffer, read-only or not (``TypeError``/``ValueError`` otherwise)."""
    arr = np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8)
    return arr.ctypes.data, arr.nbytes


def copy_table(dst: np.ndarray, src: np.ndarray) -> bool:
    """Copy each ``src[i]`` (address, length) to ``dst[i]`` (uint64 ``(k, 2)`` tables, equal lengths, checked
    by the caller to lie inside buffers it keeps alive), in groups of :data:`GROUP` entries, without the GIL.

    ``False`` where ``process_vm_readv`` is missing or the kernel refuses it for this process (nothing was
    copied: the caller copies otherwise); raises ``OSError`` on any other failure, a short copy included."""
    fn = _vm_readv()
    if fn is None:
        return False
    pid = os.getpid()
    for i in range(0, len(dst), GROUP):
        d = np.ascontiguousarray(dst[i : i + GROUP])
        s = np.ascontiguousarray(src[i : i + GROUP])
        want = int(d[:, 1].sum())
        got = fn(pid, d.ctypes.data, len(d), s.ctypes.data, len(s), 0)
        if got < 0:
            err = ctypes.get_errno()
            if i == 0 and err in _REFUSED:
                _fns["process_vm_readv"] = None  # refused for this process: every later call would be too
                return False
            raise OSError(err, f"process_vm_readv: {os.strerror(err)}")
        if got != want:
            raise OSError(errno.EFAULT, f"process_vm_readv copied {got} of {want} bytes")
    return True
