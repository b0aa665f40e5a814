"""Inner chunks of a sharded array, read as byte ranges of the shard objects of its store.

Chunk keys name a shard and a position in it (``c/0/1[1,0]``, see
:meth:`gpuzarr_dist.metadata.ArraySpec.chunk_key`). One call (one block):

1. reads the index of each shard it needs once, as one byte range (a suffix
   range ``bytes=-N`` for an index at the end, the first ``N`` bytes for one at
   the start), all shards' indexes in one batch;
2. looks up the inner chunks it needs; those the index marks absent are
   missing (the reader fills them with the fill value), and so are all chunks
   of a shard object that does not exist;
3. merges the byte ranges of one shard that are at most
   ``gpuzarr.shards.merge-gap`` apart into reads of at most
   ``gpuzarr.shards.max-range`` bytes (:func:`.ranges.coalesce`), and reads
   them all at once through the base store's :meth:`read_ranges_into`, which
   puts every inner chunk straight at its aligned slot of the staging buffer
   (pinned memory on the GPU path; gap bytes go to a scratch buffer on local
   files, or are skipped in the copy out of an object store's response).

The decoders then see ordinary chunks at aligned offsets, so all inner
chunks of the block decode in one batch on either device. Indexes are cached
for the duration of one call only: a later task reads them again (an index
is one small request), so a rewritten shard is never read through a stale one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .base import ChunkStore, staging_layout
from .ranges import ByteRange, coalesce, max_range, merge_gap
from ..codecs.sharding import ShardIndex
from ..errors import ChunkDecodeError, ChunkReadError
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

    @property
    def merge_gap_default(self) -> int:  # type: ignore[override]
        return self.base.merge_gap_default

    def _split(self, key: str) -> tuple[str, int]:
        shard, inner = key[:-1].split("[")
        pos = tuple(int(i) for i in inner.split(",")) if inner else ()
        return shard, int(np.ravel_multi_index(pos, self.spec.chunks_per_shard)) if pos else 0

    def read_indexes(self, shards: Sequence[str]) -> dict[str, np.ndarray | None]:
        """The decoded index of each shard (``None`` for a shard object that does not exist), one range each."""
        shards = list(dict.fromkeys(shards))
        off, n = self.index.raw_range()
        raw = self.base.read_ranges([ByteRange(s, off, n) for s in shards])
        return {s: None if r is None else self.index.decode(r, s) for s, r in zip(shards, raw)}

    def _name_chunk(self, e: ChunkReadError, keys: Sequence[str], what: str) -> ChunkReadError:
        """``e`` (about a shard object) re-raised against the first inner chunk of ``keys`` in that shard."""
        inner = [k for k in keys if k.split("[", 1)[0] == e.key]
        if not inner or e.key in inner:
            return e
        more = f" and {len(inner) - 1} more inner chunks" if len(inner) > 1 else ""
        return ChunkReadError(self.array, inner[0], f"{what} of shard {e.key!r}{more}: {e.reason}")

    def locate(self, keys: Sequence[str]) -> list[tuple[str, int, int] | None]:
        """``(shard, offset, nbytes)`` of each inner-chunk key, ``None`` where the chunk is absent."""
        split = [self._split(k) for k in keys]
        try:
            indexes = self.read_indexes([s for s, _ in split])
        except ChunkReadError as e:
            raise self._name_chunk(e, keys, "reading the index") from None
        out: list[tuple[str, int, int] | None] = []
        for shard, i in split:
            ix = indexes[shard]
            if ix is None or ix[i, 0] < 0:
                out.append(None)
            else:
                out.append((shard, int(ix[i, 0]), int(ix[i, 1])))
        return out

    def read_into(self, keys: Sequence[str], staging: Callable[[int], Any], align: int = 256, lead: int = 0) -> tuple[Any, list[int], list[int]]:
        where = self.locate(keys)
        sizes = [-1 if w is None else w[2] for w in where]
        offsets, total = staging_layout(sizes, align, lead)
        buf = staging(total)
        slot = {}
        ranges = []
        for i, w in enumerate(where):
            if w is not None and w[2] > 0:
                ranges.append((w[0], w[1], w[2], offsets[i]))
                slot[offsets[i]] = i
        reads = coalesce(ranges, merge_gap(self.merge_gap_default), max_range())
        try:
            got = self.base.read_ranges_into(reads, buf)
        except ChunkReadError as e:
            raise self._name_chunk(e, keys, "reading byte ranges") from None
        for r, n in zip(reads, got):
            for off, length, dest in r.pieces:
                key = keys[slot[dest]]
                if n < 0:
                    raise ChunkReadError(self.array, key, f"shard {r.key!r} disappeared while it was being read")
                if off + length > r.offset + n:
                    raise ChunkDecodeError(
                        self.array, key,
                        f"shard index of {r.key!r} points past the end of the shard object "
                        f"(bytes {off}-{off + length - 1} asked for, the object ends before byte {r.offset + n})",
                    )
        return buf, offsets, sizes

    def read_many(self, keys: Sequence[str]) -> list[Any]:
        """The inner chunks' bytes as views into one buffer (``None`` where absent)."""
        buf, offsets, sizes = self.read_into(keys, lambda n: np.empty(n, dtype=np.uint8), 1, 0)
        view = memoryview(buf)
        return [None if n < 0 else view[o : o + n] for o, n in zip(offsets, sizes)]

    def token(self) -> str:
        return self.base.token()

    def __repr__(self) -> str:
        return f"ShardedChunkStore({self.base!r})"
