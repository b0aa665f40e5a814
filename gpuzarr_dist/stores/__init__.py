"""Stores: where an array lives, and turning chunk keys into bytes."""

from .base import ChunkStore
from .local import LocalChunkStore
from .source import open_source
from .zarrstore import ZarrChunkStore

__all__ = ["ChunkStore", "LocalChunkStore", "ZarrChunkStore", "open_source"]
