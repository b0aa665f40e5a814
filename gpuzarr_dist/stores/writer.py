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

Writers are picklable and hold no open handles: dask ships them to workers.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from ..errors import ChunkReadError, ChunkWriteError
from ..runtime.threads import io_pool


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

    def path(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/"))

    def put(self, key: str, data: Any) -> int:
        path = self.path(key)
        folder, name = os.path.split(path)
        tmp = os.path.join(folder, f".{name}.{secrets.token_hex(6)}.tmp")
        view = memoryview(data).cast("B")
        try:
            os.makedirs(folder, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            try:
                done = 0
                while done < len(view):
                    done += os.write(fd, view[done:])
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
        return len(view)

    def put_many(self, items: Sequence[tuple[str, Any]]) -> int:
        if len(items) <= 1:
            return sum(self.put(k, d) for k, d in items)
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
            view = memoryview(data).cast("B")
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
