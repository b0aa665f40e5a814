"""Scattered reads and copies with iovec tables built by numpy: ``preadv`` from a file, ``process_vm_readv`` in memory.

A merged read of a shard (:class:`.ranges.MergedRead`) lands each inner chunk
in its own aligned slot of the staging buffer, and the bytes between wanted
chunks in a scratch buffer. ``os.preadv`` takes one Python buffer object per
destination: for a block of 3528 inner chunks, two objects per chunk (a
memoryview and its managed buffer) alive while the reads run, with several
blocks reading at once. Python's collector counts such objects, and its full
collections (about 100 ms, the GIL held) stall every reading thread. Here
the table of ``(address, length)`` pairs is one
numpy array and libc's ``preadv`` is called through ctypes (which releases the
GIL for the call), so a read makes no object per piece.

:func:`preadv_table` returns ``None`` where libc's ``preadv`` cannot be
found; the caller then uses ``os.preadv``.

Copies between buffers of this process go the same way
(:func:`copy_table`): ``process_vm_readv`` on this process's own id moves
every ``(source, length)`` pair of one table to its ``(destination, length)``
pair of another in one system call, without the GIL. A copy made of many
pieces (an object store's whole shard cut into its inner chunks' aligned
slots: hundreds of pieces per block) by ``numpy.copyto`` per piece
re-acquires the GIL after every piece, and with other threads holding it
takes many times longer.
Where the call is missing or refused (not Linux, or a seccomp filter that
forbids it), :func:`copy_table` returns ``False`` and the caller copies
piece by piece.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from collections.abc import Sequence
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
    return _gap_sizes(np.array([start], dtype=np.int64), np.array([len(offsets)]), offsets, lengths)


def writable_address(buf: Any) -> tuple[int, int] | None:
    """``(address, nbytes)`` of a writable, contiguous buffer (see :func:`address`), or ``None``."""
    try:
        return None if memoryview(buf).readonly else address(buf)
    except (TypeError, ValueError):
        return None


class PlanError(ValueError):
    """A table that would make the kernel write outside its buffers; ``read`` is the index of the read at fault."""

    def __init__(self, message: str, read: int):
        super().__init__(message)
        self.read = read


def _table_rows(starts: np.ndarray, counts: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, dests: np.ndarray,
                nbytes: int, scratch_bytes: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The iovec rows of reads ``i`` from ``starts[i]`` of their ``counts[i]`` pieces (``offsets``, ``lengths``,
    ``dests``, read after read): ``(table, gap, rows, scratch_bytes)``, where ``table`` (uint64 ``(k, 2)``)
    holds each piece's destination *offset* in the buffer and 0 for each gap's address, ``gap`` marks the gap
    rows and ``rows[i]`` is how many rows read ``i`` has. ``scratch_bytes`` ``None``: a scratch buffer as large
    as the largest gap (at least 1 byte). Raises :class:`PlanError` (see :func:`iovec_table`)."""
    m = len(offsets)
    read_of = np.repeat(np.arange(len(counts)), counts)
    gap = _gap_sizes(starts, counts, offsets, lengths)
    if scratch_bytes is None:
        scratch_bytes = max(1, int(np.max(gap, initial=0)))
    outside = np.flatnonzero((dests < 0) | (dests + lengths > nbytes) | (lengths < 0))
    if len(outside):
        raise PlanError(f"pieces planned outside the {nbytes}-byte buffer", int(read_of[outside[0]]))
    wrong = np.flatnonzero((gap < 0) | (gap > scratch_bytes))
    if len(wrong):
        raise PlanError(f"pieces overlap or leave a gap larger than the {scratch_bytes}-byte scratch buffer",
                        int(read_of[wrong[0]]))
    has_gap = gap > 0
    slot = np.arange(m) + np.cumsum(has_gap)
    table = np.zeros((m + int(has_gap.sum()), 2), dtype=np.uint64)
    table[slot, 0] = dests
    table[slot, 1] = lengths
    table[slot[has_gap] - 1, 1] = gap[has_gap]
    is_gap = np.zeros(len(table), dtype=bool)
    is_gap[slot[has_gap] - 1] = True
    rows = counts + np.bincount(read_of[has_gap], minlength=len(counts))
    return table, is_gap, rows, scratch_bytes


def iovec_table(start: int, offsets: np.ndarray, lengths: np.ndarray, dests: np.ndarray, buf: tuple[int, int],
                scratch: tuple[int, int]) -> np.ndarray:
    """The ``(address, length)`` table (uint64, ``(k, 2)``) that reads the file from ``start`` on: each piece
    ``offsets[i], lengths[i]`` (sorted, not overlapping, none before ``start``) to ``dests[i]`` of the buffer
    ``buf`` (``(address, nbytes)``, see :func:`writable_address`), and each gap before a piece to the
    ``scratch`` buffer.

    Raises ``ValueError`` where a piece would land outside ``buf``, or a gap does not fit in ``scratch``
    (the kernel would write past them: nothing here checks addresses after this)."""
    offsets, lengths, dests = (np.asarray(a, dtype=np.int64) for a in (offsets, lengths, dests))
    table, is_gap, _, _ = _table_rows(np.array([start], dtype=np.int64), np.array([len(offsets)]), offsets, lengths,
                                   dests, buf[1], scratch[1])
    table[:, 0] += np.where(is_gap, np.uint64(scratch[0]), np.uint64(buf[0]))
    return table


class ReadTables:
    """The iovec tables of a call's merged reads (:func:`iovec_table`'s, one array for all), planned for a
    buffer of ``nbytes`` before that buffer exists; :meth:`bind` gives them its address.

    A GPU block plans its reads before its read turn (see
    :func:`gpuzarr_dist.cuda.blocks.read_plan_gpu`): building 31 tables of
    a 124-step block one by one inside the turn was numpy and Python under
    the GIL, beside the other blocks' work, while every other block waited
    for the turn. Inside the turn only :meth:`bind` is left: one addition.
    """

    def __init__(self, reads: Sequence[Any], nbytes: int):
        from gpuzarr_dist.stores.ranges import piece_arrays

        arrays = [piece_arrays(r) for r in reads]
        counts = np.array([len(a[0]) for a in arrays], dtype=np.int64)
        cat = [np.concatenate([a[k] for a in arrays]).astype(np.int64, copy=False) if arrays else np.empty(0, np.int64)
               for k in range(3)]
        starts = np.array([r.offset for r in reads], dtype=np.int64)
        self.nbytes = nbytes
        self._table, self._gap, rows, gap = _table_rows(starts, counts, *cat, nbytes, None)
        self.scratch = bytearray(gap)  # gap bytes land here; nobody reads them
        ends = np.cumsum(rows)
        self.bounds = list(zip((ends - rows).tolist(), ends.tolist()))
        self._bound = False

    @classmethod
    def checked(cls, reads: Sequence[Any], nbytes: int, array: str) -> ReadTables:
        """The tables, or ``RuntimeError`` naming ``array`` and the read whose pieces would land outside the
        buffer or overlap (a planning error: the kernel must never write past the buffers)."""
        try:
            return cls(reads, nbytes)
        except PlanError as e:
            r = reads[e.read]
            raise RuntimeError(f"{array}: the read of {r.key!r} at {r.offset}: {e}") from None

    def bind(self, buf: Any) -> np.ndarray | None:
        """The tables with ``buf``'s address (``None`` where ``buf`` has no writable address); once per plan.

        Raises ``ValueError`` where ``buf`` is smaller than the ``nbytes`` planned for."""
        where, scratch_at = writable_address(buf), writable_address(self.scratch)
        if where is None or scratch_at is None:
            return None
        if where[1] < self.nbytes:
            raise ValueError(f"pieces planned outside the {where[1]}-byte buffer (planned for {self.nbytes} bytes)")
        if self._bound:
            raise RuntimeError("ReadTables.bind: these tables hold addresses already")
        self._bound = True
        self._table[:, 0] += np.where(self._gap, np.uint64(scratch_at[0]), np.uint64(where[0]))
        return self._table


def _gap_sizes(starts: np.ndarray, counts: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The bytes each piece's read passes over before it (negative where pieces overlap), for reads from
    ``starts`` of ``counts`` pieces each, the pieces read after read."""
    prev_end = np.empty(len(offsets), dtype=np.int64)
    if len(offsets):
        prev_end[1:] = offsets[:-1] + lengths[:-1]
        has = counts > 0
        prev_end[(np.cumsum(counts) - counts)[has]] = starts[has]
    return offsets - prev_end


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
