"""Inner chunks of a sharded array, read through the store of its shards.

Chunk keys name a shard and a position in it (``c/0/1[1,0]``, see
:meth:`gpuzarr_dist.metadata.ArraySpec.chunk_key`). One call reads each shard
it needs once, whole, locates the inner chunks through the shard's index and
returns their bytes; the decoders then see ordinary chunks. (Byte-range reads
of parts of a shard are the next step.)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .base import ChunkStore
from ..codecs.sharding import ShardIndex
from ..metadata import ArraySpec


class ShardedChunkStore(ChunkStore):
    """Serves inner-chunk keys of ``spec`` from the shard objects of ``base``."""

    def __init__(self, base: ChunkStore, spec: ArraySpec):
        self.base = base
        self.spec = spec
        self.array = base.array
        self._index: ShardIndex | None = None
        ShardIndex(spec)  # fail early, in the client, on index codecs we cannot read

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_index": None}

    @property
    def index(self) -> ShardIndex:
        if self._index is None:
            self._index = ShardIndex(self.spec)
        return self._index

    def _split(self, key: str) -> tuple[str, int]:
        shard, inner = key[:-1].split("[")
        pos = tuple(int(i) for i in inner.split(",")) if inner else ()
        return shard, int(np.ravel_multi_index(pos, self.spec.chunks_per_shard)) if pos else 0

    def read_many(self, keys: Sequence[str]) -> list[bytes | None]:
        split = [self._split(k) for k in keys]
        shard_keys = list(dict.fromkeys(s for s, _ in split))
        shards = dict(zip(shard_keys, self.base.read_many(shard_keys)))
        located = {s: self.index.locate(b, s) for s, b in shards.items() if b is not None}
        out: list[bytes | None] = []
        for shard, i in split:
            data = shards[shard]
            if data is None or located[shard][i, 0] < 0:
                out.append(None)
            else:
                off, n = located[shard][i]
                out.append(memoryview(data)[off : off + n])
        return out

    def token(self) -> str:
        return self.base.token()

    def __repr__(self) -> str:
        return f"ShardedChunkStore({self.base!r})"
