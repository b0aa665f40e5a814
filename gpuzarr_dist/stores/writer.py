"""Writing stored objects (chunks or shards) of one array, each one atomically.

A reader must never see half an object: a torn chunk would decode into garbage
or fail, where a missing one reads as the fill value. So:

- **local folders** (:class:`LocalObjectWriter`): each object is written to a
  temporary name in its own folder (``.<name>.<random>.tmp``) and renamed over
  its final name with ``os.replace``, which POSIX makes atomic within a
  filesystem; an interrupted write leaves at most a stray temporary file
  (never read: it is not a chunk key) and never a partial chunk.
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

import asyncio
import os
import secrets
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import wait
from typing import Any

from ..errors import ChunkReadError, ChunkWriteError
from ..runtime.threads import io_pool

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


class LocalObjectWriter(ObjectWriter):
    """Objects as files under ``root`` (the array's folder): temporary name, then ``os.replace``."""

    def __init__(self, root: str, array: str | None = None, fsync: bool = False):
        self.root = os.path.abspath(root)
        self.array = array or self.root
        #: also fsync each file before the rename (survives power loss; slower, off by default like zarr-python)
        self.fsync = fsync
        self._folders: set[str] = set()  # folders made already (per process: not pickled)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_folders": set()}

    def path(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/"))

    def _create(self, folder: str, tmp: str) -> int:
        """Open ``tmp`` (new) for writing; its folder is made once per writer, not once per object."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        folders = self.__dict__.setdefault("_folders", set())
        if folder not in folders:
            os.makedirs(folder, exist_ok=True)
            folders.add(folder)
        try:
            return os.open(tmp, flags, 0o666)
        except FileNotFoundError:  # the folder went away since (e.g. removed by hand): make it again
            os.makedirs(folder, exist_ok=True)
            return os.open(tmp, flags, 0o666)

    def put(self, key: str, data: Any, split: bool = False) -> int:
        """Write one object (a buffer, or a list of buffers end to end) atomically; ``split``: with several
        I/O threads when it is large (only from a thread that is not itself an I/O thread)."""
        path = self.path(key)
        folder, name = os.path.split(path)
        tmp = os.path.join(folder, f".{name}.{secrets.token_hex(6)}.tmp")
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
                else:
                    _write_views(fd, views, None)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise ChunkWriteError(self.array, key, f"{type(e).__name__}: {e.strerror or e}") from e
        return total

    def put_many(self, items: Sequence[tuple[str, Any]]) -> int:
        if len(items) <= 1:  # e.g. one shard per block: its pieces go out on several I/O threads
            return sum(self.put(k, d, split=True) for k, d in items)
        return sum(io_pool().map(lambda kd: self.put(*kd), items))

    def existing(self, keys: Sequence[str]) -> list[bool]:
        return [os.path.isfile(self.path(k)) for k in keys]

    def __repr__(self) -> str:
        return f"LocalObjectWriter({self.root!r})"


class ZarrStoreWriter(ObjectWriter):
    """Objects through a zarr-python ``Store`` (one ``set``, i.e. one PUT, per object), all in flight at once."""

    def __init__(self, store: Any, path: str, array: str):
        self.store = store
        self.prefix = f"{path.strip('/')}/" if path.strip("/") else ""
        self.array = array

    def put_many(self, items: Sequence[tuple[str, Any]]) -> int:
        from zarr.core.buffer import default_buffer_prototype
        from zarr.core.sync import sync

        proto = default_buffer_prototype()

        async def put(key: str, data: Any) -> int:
            view = memoryview(joined(data)).cast("B")
            try:
                await self.store.set(self.prefix + key, proto.buffer.from_bytes(view))
            except Exception as e:
                raise ChunkWriteError(self.array, key, f"{type(e).__name__}: {e}") from e
            return len(view)

        async def put_all() -> int:
            return sum(await asyncio.gather(*(put(k, d) for k, d in items)))

        return sync(put_all())

    def existing(self, keys: Sequence[str]) -> list[bool]:
        from zarr.core.sync import sync

        async def one(key: str) -> bool:
            try:
                return bool(await self.store.exists(self.prefix + key))
            except Exception as e:
                raise ChunkReadError(self.array, key, f"{type(e).__name__}: {e}") from e

        async def all_() -> list[bool]:
            return list(await asyncio.gather(*(one(k) for k in keys)))

        return sync(all_())

    def __repr__(self) -> str:
        return f"ZarrStoreWriter({self.array!r})"
