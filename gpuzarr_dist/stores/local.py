"""Chunks in files of a local directory, read by a shared pool of threads."""

from __future__ import annotations

import os
from collections.abc import Sequence

from .base import ChunkStore
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

    def token(self) -> str:
        return f"file://{self.root}"

    def __repr__(self) -> str:
        return f"LocalChunkStore({self.root!r})"
