"""Chunks in files of a local directory, read by a shared pool of threads."""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from gpuzarr_dist.config import io_threads, local_reads
from gpuzarr_dist.cuda import files as cufiles  # loads no CUDA library at import
from gpuzarr_dist.errors import ChunkReadError
from gpuzarr_dist.runtime.stages import stage_timer
from gpuzarr_dist.runtime.threads import io_pool, map_all
from gpuzarr_dist.stores.base import ChunkStore, check_key, staging_layout, stored_refusal
from gpuzarr_dist.stores.ranges import ByteRange, MergedRead
from gpuzarr_dist.stores.retry import with_retries
from gpuzarr_dist.stores.vectored import ReadTables, available, preadv_table

#: per thread: the (store, files) that ``LocalChunkStore.held`` keeps open
_HELD = threading.local()
#: ranges of at most this many bytes (shard indexes) are read on the calling thread (see ``read_ranges``)
SMALL_RANGE = 64 * 1024
#: how chunk files are opened: a pipe opens at once (and is then refused) instead of waiting for a writer
OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)


class Refused(OSError):
    """A chunk file that must not be read (see :func:`.base.stored_refusal`); reported as it is, never retried."""


class LocalChunkStore(ChunkStore):
    """The chunk files of one array under ``root`` (the array's folder)."""

    read_turns = True  # the reads of all blocks share the host's read bandwidth (see ChunkStore.read_turns)

    def __init__(self, root: str, array: str | None = None):
        self.root = os.path.abspath(root)
        self.array = array or self.root

    def path(self, key: str) -> str:
        return os.path.join(self.root, *check_key(self.array, key).split("/"))

    def _read_file(self, path: str) -> bytes:
        """The bytes of one chunk file (the one place the CPU path touches a file; tests inject faults here).

        The open file is checked first (:func:`.base.stored_refusal`): a file that is not a regular file or is
        larger than :attr:`object_limit` raises :class:`Refused` before anything is read.
        """
        fd = os.open(path, OPEN_FLAGS)
        with open(fd, "rb", buffering=0) as f:
            st = os.fstat(fd)
            why = stored_refusal(st.st_mode, st.st_size, self.object_limit)
            if why:
                raise Refused(why)
            return f.read()

    def _pread(self, fd: int, view: memoryview, n: int) -> int:
        """Read the first ``n`` bytes of the open file ``fd`` into ``view``; the byte count read."""
        return os.preadv(fd, [view[:n]], 0)

    def _read(self, key: str) -> bytes | None:
        def once() -> bytes | None:
            try:
                return self._read_file(self.path(key))
            except FileNotFoundError:
                return None
            except Refused as e:
                raise ChunkReadError(self.array, key, str(e)) from None

        return with_retries(once, self.array, key)

    def read_slot(self, key: str, view: memoryview, n: int) -> None:
        """Read chunk ``key`` (``n`` bytes) into ``view`` with its own file handle, retrying transient errors."""

        def once() -> None:
            fd = os.open(self.path(key), OPEN_FLAGS)
            try:
                got = self._pread(fd, view, n)
            finally:
                os.close(fd)
            if got != n:
                raise ChunkReadError(self.array, key, f"read {got} of {n} bytes (file changed while reading?)")

        with_retries(once, self.array, key)

    def read_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if len(keys) <= 1:
            return [self._read(k) for k in keys]
        return map_all(io_pool(), self._read, keys)

    def read_into(self, keys: Sequence[str], staging: Callable[[int], Any], align: int = 256, lead: int = 0) -> tuple[Any, list[int], list[int]]:
        """Read the chunk files straight into one staging buffer (no intermediate bytes objects).

        Sizes every file first, then reads them all at once into their aligned
        slots: through cuFile (:func:`gpuzarr_dist.cuda.files.read_files_into`) where
        ``gpuzarr.local-reads`` asks for it and it is installed, otherwise with
        ``preadv`` on the shared I/O threads.
        """
        mode = local_reads()
        reader = cufiles.cufile() if cufiles.for_files(mode) else None
        if reader is not None:
            return cufiles.read_files_into(reader, self, keys, staging, align, lead)
        timed = stage_timer()
        fds: list[int | None] = []
        sizes: list[int] = []
        try:
            for key in keys:
                fd = with_retries(lambda: self._open_or_none(key), self.array, key)
                fds.append(fd)
                if fd is None:
                    sizes.append(-1)
                    continue
                st = os.fstat(fd)
                why = stored_refusal(st.st_mode, st.st_size, self.object_limit)
                if why:  # before the staging buffer is sized from it
                    raise ChunkReadError(self.array, key, why)
                sizes.append(st.st_size)
            offsets, total = staging_layout(sizes, align, lead)
            timed("files: open + sizes")
            buf = staging(total)
            timed("staging alloc")
            view = memoryview(buf).cast("B")

            def one(i: int) -> None:
                fd, n, off = fds[i], sizes[i], offsets[i]
                if fd is None or n == 0:
                    return
                try:
                    got = self._pread(fd, view[off : off + n], n)
                except OSError as e:
                    if isinstance(e, ChunkReadError):
                        raise
                    got = -1
                if got != n:  # failed or short: again, with a fresh handle and the retry policy
                    self.read_slot(keys[i], view[off : off + n], n)

            if len(keys) > 1 and mode != "inline":
                map_all(io_pool(), one, range(len(keys)))  # none still reading into buf when an error leaves
            else:
                for i in range(len(keys)):
                    one(i)
            timed("files: reads", sum(n for n in sizes if n > 0))
            return buf, offsets, sizes
        finally:
            for fd in fds:
                if fd is not None:
                    os.close(fd)

    def _open_or_none(self, key: str) -> int | None:
        try:
            return os.open(self.path(key), OPEN_FLAGS)
        except FileNotFoundError:
            return None

    # -- byte ranges (shards) ----------------------------------------------------------

    def _open(self, key: str) -> int | None:
        try:
            return os.open(self.path(key), OPEN_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise ChunkReadError(self.array, key, f"{type(e).__name__}: {e.strerror or e}") from e

    @contextmanager
    def held(self, keys: Sequence[str]) -> Iterator[None]:
        """Open ``keys`` once for this thread's range reads inside the ``with`` block (see :meth:`ChunkStore.held`).

        Each open and close is a system call that gives the GIL up and takes it
        back: beside other blocks' work, a block of 56 shards opened twice waited
        for it 224 times, part of that inside its read turn."""
        fds = self._open_all(keys)
        stack = _HELD.__dict__.setdefault("stack", [])
        stack.append((self, fds))
        try:
            yield
        finally:
            stack.pop()
            _close(fds)

    def _held(self) -> dict[str, int | None]:
        """The files :meth:`held` keeps open for this store in this thread (none outside its ``with`` block)."""
        stack = _HELD.__dict__.get("stack")
        return stack[-1][1] if stack and stack[-1][0] is self else {}

    def _open_all(self, keys: Sequence[str]) -> dict[str, int | None]:
        held = self._held()
        fds: dict[str, int | None] = {}
        try:
            for key in keys:
                if key not in fds:
                    fds[key] = held[key] if key in held else self._open(key)
        except BaseException:
            self._close_own(fds)
            raise
        return fds

    def _close_own(self, fds: dict[str, int | None]) -> None:
        """Close what :meth:`_open_all` opened for one call (not what :meth:`held` keeps open)."""
        held = self._held()
        _close({k: fd for k, fd in fds.items() if k not in held})

    def read_ranges(self, requests: Sequence[ByteRange]) -> list[Any]:
        """``pread`` each range (files opened once per call): on the shared I/O threads, or on this thread where
        every range is at most :data:`SMALL_RANGE` bytes (shard indexes)."""
        fds = self._open_all([r.key for r in requests])
        try:
            def one(r: ByteRange) -> bytes | None:
                fd = fds[r.key]
                if fd is None:
                    return None
                if r.offset < 0:  # the index at a shard's end: a shard that is no regular file is refused here
                    st = os.fstat(fd)
                    why = stored_refusal(st.st_mode, 0, None, "shard")  # its size: checked against its index
                    if why:
                        raise ChunkReadError(self.array, r.key, why)
                try:
                    if r.offset < 0:
                        return os.pread(fd, min(-r.offset, st.st_size), max(0, st.st_size + r.offset))
                    return os.pread(fd, r.length, r.offset)
                except OSError as e:
                    raise ChunkReadError(self.array, r.key, f"{type(e).__name__}: {e.strerror or e}") from e

            if len(requests) > 1 and any(abs(r.offset) > SMALL_RANGE if r.offset < 0 else r.length > SMALL_RANGE
                                         for r in requests):
                return map_all(io_pool(), one, requests)  # none still reading when the files close
            # small ranges (shard indexes) on this thread: queued on the I/O threads they would wait behind
            # other blocks' merged reads, and each hand-off takes the GIL twice (several times slower in all)
            return [one(r) for r in requests]
        finally:
            self._close_own(fds)

    def prepare_ranges(self, reads: Sequence[MergedRead], nbytes: int) -> ReadTables | None:
        """The iovec tables of ``reads`` into a buffer of ``nbytes`` (see :class:`.vectored.ReadTables`), for
        :meth:`read_ranges_into`; ``None`` where cuFile reads the ranges (:func:`gpuzarr_dist.cuda.files.for_ranges`).

        Raises ``RuntimeError`` naming the array and the read where a piece would land outside the buffer."""
        return None if cufiles.for_ranges() else ReadTables.checked(reads, nbytes, self.array)

    def read_ranges_into(self, reads: Sequence[MergedRead], buf: Any, prepared: ReadTables | None = None) -> list[int]:
        """Scatter each merged range straight into ``buf`` with one ``preadv`` (gap bytes go to a scratch buffer).

        One system call per merged read whether or not cuFile is installed: a
        sharded block is then one ``preadv`` per shard instead of one cuFile
        future (and its Python bookkeeping) per inner chunk, and the chunks still
        land at aligned slots. ``gpuzarr.shards.local-reads`` restores one cuFile
        read per piece (:func:`gpuzarr_dist.cuda.files.read_ranges_into`; to
        compare on a GPU machine). ``prepared``:
        :meth:`prepare_ranges`' tables for ``reads``, built before ``buf`` was.
        """
        reader = cufiles.cufile() if cufiles.for_ranges() else None
        if reader is not None:
            return cufiles.read_ranges_into(reader, self, reads, buf)
        tables = prepared if prepared is not None else ReadTables.checked(reads, memoryview(buf).nbytes, self.array)
        try:
            bound = tables.bind(buf) if available() else None  # numpy tables for libc's preadv, no object per piece
        except ValueError as e:
            raise RuntimeError(f"{self.array}: the reads of {len(reads)} ranges: {e}") from None
        fds = self._open_all([r.key for r in reads])
        view = memoryview(buf).cast("B")
        scratch = memoryview(tables.scratch)

        def fallback(i: int) -> int:  # os.preadv: one buffer object per piece (no libc preadv, or no address)
            r = reads[i]
            fd = fds[r.key]
            if fd is None:
                return -1
            iov, pos = [], r.offset
            for off, n, dest in r.pieces:  # pieces of one read never overlap (see coalesce)
                if off > pos:
                    iov.append(scratch[: off - pos])
                iov.append(view[dest : dest + n])
                pos = off + n
            try:
                return _preadv_all(fd, iov, r.offset)
            except OSError as e:
                raise ChunkReadError(self.array, r.key, f"{type(e).__name__}: {e.strerror or e}") from e

        def direct(i: int) -> int:  # libc's preadv on the read's rows of the bound tables
            r = reads[i]
            fd = fds[r.key]
            if fd is None:
                return -1
            lo, hi = tables.bounds[i]
            try:
                return preadv_table(fd, bound[lo:hi], r.offset)
            except OSError as e:
                raise ChunkReadError(self.array, r.key, f"{type(e).__name__}: {e.strerror or e}") from e

        run = fallback if bound is None else direct
        got = [0] * len(reads)
        following = itertools.count()

        def job() -> None:  # takes the next read until none is left: a slow read holds up only its own thread
            while (i := next(following)) < len(reads):
                got[i] = run(i)

        # at most one job per I/O thread, each taking reads as it comes free: each job is a Python call that takes
        # the GIL to start and to return, beside other blocks' work (a block of 31 shards on 16 I/O threads)
        try:
            k = min(io_threads(), len(reads))
            if k > 1:  # none still reading into buf when the files close
                map_all(io_pool(), lambda _: job(), range(k))
            else:
                job()
        finally:
            self._close_own(fds)
        return got

    def size_or_missing(self, key: str) -> int:
        """The size of chunk ``key``'s file, -1 where there is none; :class:`ChunkReadError` for a file that must
        not be read (:func:`.base.stored_refusal`)."""
        try:
            st = os.stat(self.path(key))
        except FileNotFoundError:
            return -1
        why = stored_refusal(st.st_mode, st.st_size, self.object_limit)
        if why:
            raise ChunkReadError(self.array, key, why)
        return st.st_size

    def token(self) -> str:
        return f"file://{self.root}"

    def __repr__(self) -> str:
        return f"LocalChunkStore({self.root!r})"


def _close(fds: dict[str, int | None]) -> None:
    for fd in fds.values():
        if fd is not None:
            os.close(fd)


def _preadv_all(fd: int, iov: list[memoryview], offset: int) -> int:
    """``preadv`` in groups below the system's iovec limit; the bytes read (fewer only at the end of the file)."""
    total = 0
    for i in range(0, len(iov), 512):
        group = iov[i : i + 512]
        want = sum(len(v) for v in group)
        got = os.preadv(fd, group, offset + total)
        total += got
        if got < want:
            break
    return total
