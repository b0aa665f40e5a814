"""Chunks in files of a local directory, read by a shared pool of threads."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from .base import ChunkStore, staging_layout
from ..errors import ChunkReadError
from ..runtime.threads import io_pool


class LocalChunkStore(ChunkStore):
    """The chunk files of one array under ``root`` (the array's folder)."""

    def __init__(self, root: str, array: str | None = None):
        self.root = os.path.abspath(root)
        self.array = array or self.root

    def path(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/"))

    def _read(self, key: str) -> bytes | None:
        try:
            with open(self.path(key), "rb", buffering=0) as f:
                return f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise ChunkReadError(self.array, key, f"{type(e).__name__}: {e.strerror or e}") from e

    def read_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if len(keys) <= 1:
            return [self._read(k) for k in keys]
        return list(io_pool().map(self._read, keys))

    def read_into(self, keys: Sequence[str], staging: Callable[[int], Any], align: int = 256, lead: int = 0) -> tuple[Any, list[int], list[int]]:
        """Read the chunk files straight into one staging buffer (no intermediate bytes objects).

        Opens and sizes every file first, then reads them in parallel with
        ``preadv`` into their aligned slots of the buffer.
        """
        fds: list[int | None] = []
        sizes: list[int] = []
        try:
            for key in keys:
                try:
                    fd = os.open(self.path(key), os.O_RDONLY)
                except FileNotFoundError:
                    fds.append(None)
                    sizes.append(-1)
                    continue
                except OSError as e:
                    raise ChunkReadError(self.array, key, f"{type(e).__name__}: {e.strerror or e}") from e
                fds.append(fd)
                sizes.append(os.fstat(fd).st_size)
            offsets, total = staging_layout(sizes, align, lead)
            buf = staging(total)
            view = memoryview(buf).cast("B")

            def one(i: int) -> None:
                fd, n, off = fds[i], sizes[i], offsets[i]
                if fd is None or n == 0:
                    return
                try:
                    got = os.preadv(fd, [view[off : off + n]], 0)
                except OSError as e:
                    raise ChunkReadError(self.array, keys[i], f"{type(e).__name__}: {e.strerror or e}") from e
                if got != n:
                    raise ChunkReadError(self.array, keys[i], f"read {got} of {n} bytes (file changed while reading?)")

            if len(keys) > 1:
                list(io_pool().map(one, range(len(keys))))
            elif keys:
                one(0)
            return buf, offsets, sizes
        finally:
            for fd in fds:
                if fd is not None:
                    os.close(fd)

    def token(self) -> str:
        return f"file://{self.root}"

    def __repr__(self) -> str:
        return f"LocalChunkStore({self.root!r})"
