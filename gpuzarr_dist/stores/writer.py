"""Writing stored objects (chunks or shards) of one array, each one atomically.

A reader must never see half an object: a torn chunk would decode into garbage
or fail, where a missing one reads as the fill value. So:

- **local folders** (:class:`LocalObjectWriter`): each object is written to a
  temporary name in its own folder (``.<name>.<process tag>-<counter>.tmp``, never a
  chunk key: it starts with a dot) and renamed over
  its final name with ``os.replace``, which POSIX makes atomic within a
  filesystem; a write that fails removes its temporary file, and a killed
  one leaves at most a stray temporary file (never read: it is not a chunk
  key), which :func:`remove_stale_temporaries` (``resume=True``) removes,
  and never a partial chunk.
- **any zarr-python store** (:class:`ZarrStoreWriter`: fsspec URLs such as
  ``s3://``, object stores, memory): one ``store.set`` per object, which for
  object stores is a single PUT (an object appears whole or not at all).

An object may be given as one buffer or as a list of buffers stored end to
end (a shard: its inner chunks and index), which local folders write with
``os.writev`` without joining them first; an object larger than
:data:`SPLIT_WRITE_BYTES` that is the only one of its ``put_many`` call is
written by several I/O threads at once (``os.pwritev`` at disjoint offsets of
the same temporary file), since one thread copies into the page cache at only
a few GB/s.

Writers are picklable and hold no open handles: dask ships them to workers.
"""

from __future__ import annotations

import itertools
import os
import re
import secrets
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from typing import Any

from gpuzarr_dist.errors import ChunkReadError, ChunkWriteError
from gpuzarr_dist.runtime.aio import gather_all
from gpuzarr_dist.runtime.threads import io_pool, map_all

#: a lone object larger than this is written by several I/O threads (pieces of about WRITE_PIECE_BYTES)
SPLIT_WRITE_BYTES = 32 * 2**20
WRITE_PIECE_BYTES = 16 * 2**20
_IOV_MAX = 1024  # buffers per writev call (IOV_MAX on Linux and macOS)


def as_views(data: Any) -> list[memoryview]:
    """The object's bytes as flat memoryviews: one for a buffer, one per piece for a list or tuple of buffers."""
    if isinstance(data, (list, tuple)):
        return [v for v in (memoryview(d).cast("B") for d in data) if len(v)]
    return [memoryview(data).cast("B")]


def joined(data: Any) -> Any:
    """One buffer holding the object (a list or tuple of buffers is joined)."""
    return b"".join(data) if isinstance(data, (list, tuple)) else data


def _write_view(fd: int, view: memoryview) -> None:
    """Write one buffer at the file position with ``os.write`` (no copy), resuming short writes."""
    while len(view):
        view = view[os.write(fd, view):]


def _write_views(fd: int, views: Sequence[memoryview], offset: int | None) -> None:
    """Write ``views`` end to end at ``offset`` (or the file position when None), resuming short writes."""
    pending = list(views)
    while pending:
        batch = pending[:_IOV_MAX]
        done = os.writev(fd, batch) if offset is None else os.pwritev(fd, batch, offset)
        if offset is not None:
            offset += done
        k = 0
        while k < len(batch) and done >= len(batch[k]):
            done -= len(batch[k])
            k += 1
        rest = pending[k:]
        if done and rest:
            rest[0] = rest[0][done:]
        pending = rest


def _pieces(views: Sequence[memoryview], size: int) -> list[tuple[int, list[memoryview]]]:
    """``(offset, views)`` groups of about ``size`` bytes covering ``views`` end to end (no copies)."""
    out: list[tuple[int, list[memoryview]]] = []
    pos, start, group, filled = 0, 0, [], 0
    for v in views:
        while len(v):
            take = v[: size - filled]
            group.append(take)
            filled += len(take)
            pos += len(take)
            v = v[len(take):]
            if filled >= size:
                out.append((start, group))
                start, group, filled = pos, [], 0
    if group:
        out.append((start, group))
    return out


class ObjectWriter(ABC):
    """Puts whole objects under an array's keys; each put is atomic."""

    array: str

    @abstractmethod
    def put_many(self, items: Sequence[tuple[str, Any]]) -> int:
        """Write every ``(key, buffer)``; returns the bytes written."""

    @abstractmethod
    def existing(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key holds an object already."""

    def prepare(self, keys: Sequence[str]) -> list[Future]:
        """A hint that ``keys`` will be written soon (e.g. make their folders ahead); returns at once, with the
        futures of any work it started, for :func:`settle` to end before the caller returns. Optional."""
        return []


def settle(futures: Sequence[Future]) -> None:
    """Cancel those of ``futures`` that have not started and wait for the others (whose errors are left to the
    writes that need their work): nothing :meth:`ObjectWriter.prepare` started runs on after its caller returns."""
    for f in futures:
        f.cancel()
    wait(futures)


class LocalObjectWriter(ObjectWriter):
    """Objects as files under ``root`` (the array's folder): temporary name, then ``os.replace``.

    The cost of a write here is the copy into the page cache; everything
    around it is kept to a few system calls per object: the temporary file is
    opened straight away (no ``stat``, no ``makedirs``) and its folder is made
    only when that open says it is missing, so objects going into folders that
    exist cost one ``open``, one ``write`` (or ``writev``), one ``close`` and
    one ``rename``. Folders are what a fresh Zarr v3 array (keys ``c/i/j/...``)
    pays for most: a ``mkdir`` costs as much as writing megabytes, and those
    in one parent folder run one at a time in the kernel. So :meth:`prepare`
    starts making a block's folders on a few background threads while the
    block is still being encoded.
    """

    def __init__(self, root: str, array: str | None = None, fsync: bool = False):
        self.root = os.path.abspath(root)
        self.array = array or self.root
        #: also fsync each file before the rename (survives power loss; slower, off by default like zarr-python)
        self.fsync = fsync
        self._folders: set[str] = set()  # folders made, or handed to prepare's threads (per process: not pickled)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_folders": set()}

    def path(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/"))

    def _check_key(self, key: str) -> None:
        """A key names a file under ``root``: no empty, ``.`` or ``..`` part (which would leave the array's folder)."""
        if not key or any(p in ("", ".", "..") for p in key.split("/")):
            raise ChunkWriteError(self.array, key, "not a valid object key (empty, '.' or '..' part)")

    def prepare(self, keys: Sequence[str]) -> list[Future]:
        """Start making the folders that ``keys`` go into, on :func:`folder_pool`'s threads, and return their
        futures (for :func:`settle`: the caller ends them before it returns).

        Called before a block is encoded so that its folders are made while it
        is. Best effort: a folder not made (yet, or at all) is made by the
        write that needs it, which also reports any error naming its key.
        """
        folders = self.__dict__.setdefault("_folders", set())
        todo = []
        for key in keys:
            folder = os.path.dirname(self.path(key))
            if folder not in folders and folder != self.root:
                folders.add(folder)
                todo.append(folder)
        if not todo:
            return []
        from gpuzarr_dist.runtime.threads import folder_pool

        pool = folder_pool()
        # in the order asked (the blocks' order); makedirs makes the parents; a cancelled one is made by its write
        return [pool.submit(_make_folder_quietly, folder, folders) for folder in todo]

    def _create(self, folder: str, tmp: str) -> int:
        """Open ``tmp`` (new) for writing, making its folder only when the open finds it missing.

        A folder removed since it was made (by hand, or by another process) is
        made again the same way; many threads finding one new folder missing at
        once all make it, which ``exist_ok`` makes safe.
        """
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        try:
            return os.open(tmp, flags, 0o666)
        except FileNotFoundError:
            os.makedirs(folder, exist_ok=True)
            self.__dict__.setdefault("_folders", set()).add(folder)
            return os.open(tmp, flags, 0o666)

    def put(self, key: str, data: Any, split: bool = False) -> int:
        """Write one object (a buffer, or a list of buffers end to end) atomically; ``split``: with several
        I/O threads when it is large (only from a thread that is not itself an I/O thread)."""
        self._check_key(key)
        path = self.path(key)
        folder, name = os.path.split(path)
        tmp = os.path.join(folder, f".{name}.{_temp_tag()}.tmp")
        views = as_views(data)
        total = sum(len(v) for v in views)
        try:
            fd = self._create(folder, tmp)
            try:
                if split and total > SPLIT_WRITE_BYTES and hasattr(os, "pwritev"):
                    futures = [io_pool().submit(_write_views, fd, g, off) for off, g in _pieces(views, WRITE_PIECE_BYTES)]
                    wait(futures)  # all of them before the descriptor closes, failed or not
                    for f in futures:
                        f.result()
                elif len(views) == 1:
                    _write_view(fd, views[0])
                else:
                    _write_views(fd, views, None)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException as e:  # no temporary file outlives a failed write, whatever stopped it
            try:
                os.unlink(tmp)
            except OSError:
                pass
            if not isinstance(e, OSError):
                raise
            reason = f"{type(e).__name__}: {e.strerror or e}"
            if isinstance(e, (NotADirectoryError, FileExistsError)) and not os.path.isdir(folder):
                reason += f" (a file stands in the way of its folder {os.path.relpath(folder, self.root)!r})"
            raise ChunkWriteError(self.array, key, reason) from e
        return total

    def put_many(self, items: Sequence[tuple[str, Any]]) -> int:
        if len(items) <= 1:  # e.g. one shard per block: its pieces go out on several I/O threads
            return sum(self.put(k, d, split=True) for k, d in items)
        return sum(map_all(io_pool(), self._put_item, items))  # none still writing when an error leaves

    def _put_item(self, item: tuple[str, Any]) -> int:
        return self.put(item[0], item[1])

    def existing(self, keys: Sequence[str]) -> list[bool]:
        return [os.path.isfile(self.path(k)) for k in keys]

    def __repr__(self) -> str:
        return f"LocalObjectWriter({self.root!r})"


def _make_folder_quietly(folder: str, made: set[str]) -> None:
    """``os.makedirs`` for :meth:`LocalObjectWriter.prepare`: errors are left to the write that needs the folder."""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:
        made.discard(folder)


#: a temporary file of :meth:`LocalObjectWriter.put`: ``.<object name>.<process tag>-<counter>.tmp``
TEMPORARY_NAME = re.compile(r"^\..+\.[0-9a-f]{9,}-[0-9a-f]+\.tmp$")


def remove_stale_temporaries(root: str) -> int:
    """Remove every temporary file :class:`LocalObjectWriter` leaves when killed mid-write, under the array's
    folder ``root``; the number removed. Only names of that pattern (:data:`TEMPORARY_NAME`) are touched.

    For ``resume=True``: it assumes that no other process is writing the array
    (a temporary file of a live write removed here fails that write, naming its key).
    """
    removed = 0
    for folder, _, files in os.walk(root):
        for name in files:
            if TEMPORARY_NAME.match(name):
                try:
                    os.unlink(os.path.join(folder, name))
                    removed += 1
                except FileNotFoundError:  # its write finished or failed meanwhile
                    pass
    return removed


_temp_state: tuple[int, str, Any] | None = None


def _temp_tag() -> str:
    """A temporary-name tag unique to this object write: a per-process random prefix and a counter.

    Cheaper than a random token per object, and still unique across
    processes and hosts sharing a filesystem (two hosts may run the same pid);
    re-drawn in a forked child.
    """
    global _temp_state
    state = _temp_state
    pid = os.getpid()
    if state is None or state[0] != pid:
        state = _temp_state = (pid, f"{pid:x}{secrets.token_hex(4)}", itertools.count())
    return f"{state[1]}-{next(state[2]):x}"


class ZarrStoreWriter(ObjectWriter):
    """Objects through a zarr-python ``Store`` (one ``set``, i.e. one PUT, per object), all in flight at once."""

    def __init__(self, store: Any, path: str, array: str, scrub: Callable[[str], str] | None = None):
        self.store = store
        self.prefix = f"{path.strip('/')}/" if path.strip("/") else ""
        self.array = array
        self.scrub = scrub  # takes credentials out of the store's error texts (object stores)

    def _reason(self, e: Exception) -> str:
        if self.scrub is None:
            return f"{type(e).__name__}: {e}"
        from gpuzarr_dist.stores.remote import store_error_text

        return store_error_text(e, self.scrub)  # one line: obstore's messages run to 40 lines of debug output

    def _error(self, kind: type, key: str, e: Exception) -> Exception:
        """``kind(array, key, reason)`` chained to ``e`` unless the store's own text may show credentials
        (object stores): then not chained at all, to be raised outside the ``except`` (no ``__context__``)."""
        error = kind(self.array, key, self._reason(e))
        if self.scrub is None:
            error.__cause__ = e
        else:
            from gpuzarr_dist.core.redact import shows_secret

            error.__cause__ = None if shows_secret(e, clean=self.scrub) else e
        error.__suppress_context__ = True
        return error

    def put_many(self, items: Sequence[tuple[str, Any]]) -> int:
        from zarr.core.buffer import default_buffer_prototype
        from zarr.core.sync import sync

        proto = default_buffer_prototype()

        async def put(key: str, data: Any) -> int:
            view = memoryview(joined(data)).cast("B")
            error = None
            try:
                await self.store.set(self.prefix + key, proto.buffer.from_bytes(view))
            except Exception as e:
                error = self._error(ChunkWriteError, key, e)
            if error is not None:
                raise error
            return len(view)

        async def put_all() -> int:
            return sum(await gather_all(put(k, d) for k, d in items))  # none still writing after a failure

        return sync(put_all())

    def existing(self, keys: Sequence[str]) -> list[bool]:
        from zarr.core.sync import sync

        async def one(key: str) -> bool:
            error = None
            try:
                return bool(await self.store.exists(self.prefix + key))
            except Exception as e:
                error = self._error(ChunkReadError, key, e)
            raise error

        async def all_() -> list[bool]:
            return await gather_all(one(k) for k in keys)

        return sync(all_())

    def __repr__(self) -> str:
        return f"ZarrStoreWriter({self.array!r})"
