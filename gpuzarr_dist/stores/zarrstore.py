"""Chunks in any zarr-python store (memory, fsspec, object stores), all requests in flight at once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuzarr_dist.core.redact import redact_text, shows_secret
from gpuzarr_dist.errors import ChunkReadError
from gpuzarr_dist.runtime.aio import gather_all
from gpuzarr_dist.stores.base import ChunkStore, check_key


class ZarrChunkStore(ChunkStore):
    """Reads chunk keys of the array at ``path`` inside a zarr-python ``Store``."""

    def __init__(self, store: Any, path: str, array: str):
        self.store = store
        self.prefix = f"{path.strip('/')}/" if path.strip("/") else ""
        self.array = array

    def read_many(self, keys: Sequence[str]) -> list[bytes | None]:
        from zarr.core.buffer import default_buffer_prototype
        from zarr.core.sync import sync

        proto = default_buffer_prototype()

        async def get(key: str) -> bytes | None:
            error = None
            try:
                buf = await self.store.get(self.prefix + check_key(self.array, key), prototype=proto)
            except ChunkReadError:
                raise
            except Exception as e:  # fsspec's messages may quote the URL it was given, password included
                error = ChunkReadError(self.array, key, redact_text(f"{type(e).__name__}: {e}"))
                error.__cause__ = None if shows_secret(e) else e
            if error is not None:
                raise error  # outside the except: no __context__ to carry what __cause__ leaves out
            return None if buf is None else buf.to_bytes()

        async def get_all() -> list[bytes | None]:
            return await gather_all(get(k) for k in keys)

        return sync(get_all())

    def token(self) -> str:
        return f"{type(self.store).__name__}:{self.array}:{id(self.store) if 'Memory' in type(self.store).__name__ else ''}"

    def __repr__(self) -> str:
        return f"ZarrChunkStore({self.array!r})"
