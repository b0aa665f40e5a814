"""Stores: where an array lives, and turning chunk keys into bytes."""

from gpuzarr_dist.stores.base import ChunkStore
from gpuzarr_dist.stores.local import LocalChunkStore
from gpuzarr_dist.stores.source import open_source
from gpuzarr_dist.stores.zarrstore import ZarrChunkStore

__all__ = ["ChunkStore", "LocalChunkStore", "ZarrChunkStore", "open_source"]
