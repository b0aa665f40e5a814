"""Inner chunks of a sharded array, read as byte ranges of the shard objects of its store.

Chunk keys name a shard and a position in it (``c/0/1[1,0]``, see
:meth:`gpuzarr_dist.core.metadata.ArraySpec.chunk_key`). One call (one block):

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
A :class:`~gpuzarr_dist.WindowSampler` opts in to keeping them across its calls
(:class:`IndexCache`, bounded, least recently used dropped first): it samples
the same shards over and over, and treats the array as immutable while it lives.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gpuzarr_dist import config
from gpuzarr_dist.codecs.sharding import ShardIndex
from gpuzarr_dist.core.metadata import ArraySpec, ChunkKeys
from gpuzarr_dist.errors import ChunkDecodeError, ChunkReadError
from gpuzarr_dist.runtime.stages import stage_timer as _stage_timer
from gpuzarr_dist.stores.base import ChunkStore
from gpuzarr_dist.stores.ranges import ByteRange, MergedRead, max_range, merge_gap, plan_reads


class IndexCache:
    """Decoded shard indexes by shard key, kept across calls up to ``max_bytes`` (least recently used dropped first).

    Nothing invalidates an entry: it is for arrays that are not rewritten while
    the cache lives (a training set sampled many times). A shard object that
    did not exist is remembered as absent too. Thread-safe; ``hits`` and
    ``misses`` count shards looked up.
    """

    _ABSENT_BYTES = 64  # what an "absent" entry is charged, so a cache of absent shards stays bounded

    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        self.nbytes = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[str, np.ndarray | None] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get_many(self, shards: Sequence[str]) -> dict[str, np.ndarray | None]:
        """The cached entries among ``shards`` (marked as recently used)."""
        out: dict[str, np.ndarray | None] = {}
        with self._lock:
            for s in shards:
                if s in self._entries:
                    self._entries.move_to_end(s)
                    out[s] = self._entries[s]
            self.hits += len(out)
            self.misses += len(shards) - len(out)
        return out

    def put_many(self, entries: dict[str, np.ndarray | None]) -> None:
        with self._lock:
            for s, ix in entries.items():
                if s in self._entries:
                    continue
                if ix is not None:
                    ix.flags.writeable = False  # shared by later calls: nobody may change it
                self._entries[s] = ix
                self.nbytes += self._size(ix)
            while self.nbytes > self.max_bytes and self._entries:
                _, old = self._entries.popitem(last=False)
                self.nbytes -= self._size(old)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.nbytes = 0

    def _size(self, ix: np.ndarray | None) -> int:
        return self._ABSENT_BYTES if ix is None else ix.nbytes


class ShardedChunkStore(ChunkStore):
    """Serves inner-chunk keys of ``spec`` from the shard objects of ``base``."""

    def __init__(self, base: ChunkStore, spec: ArraySpec):
        self.base = base
        self.spec = spec
        self.array = base.array
        self._index: ShardIndex | None = None
        self.index_cache: IndexCache | None = None  # off: see the module docstring
        ShardIndex(spec)  # fail early, in the client, on index codecs we cannot read

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_index": None, "index_cache": None, "_inner_no": {}, "_inner_count": {}}  # a copy elsewhere reads its own indexes

    @property
    def index(self) -> ShardIndex:
        if self._index is None:
            self._index = ShardIndex(self.spec)
        return self._index

    @property
    def merge_gap_default(self) -> int:  # type: ignore[override]
        return self.base.merge_gap_default

    @property
    def read_turns(self) -> bool:  # type: ignore[override]
        return self.base.read_turns

    @property
    def object_store(self) -> bool:  # type: ignore[override]
        return self.base.object_store

    def _split(self, key: str) -> tuple[str, int]:
        shard, inner = key[:-1].split("[")
        pos = tuple(int(i) for i in inner.split(",")) if inner else ()
        return shard, int(np.ravel_multi_index(pos, self.spec.chunks_per_shard)) if pos else 0

    def read_indexes(self, shards: Sequence[str]) -> dict[str, np.ndarray | None]:
        """The decoded index of each shard (``None`` for a shard object that does not exist), one range each."""
        shards = list(dict.fromkeys(shards))
        cache = self.index_cache
        known = cache.get_many(shards) if cache is not None else {}
        todo = [s for s in shards if s not in known] if known else shards
        if todo:
            off, n = self.index.raw_range()
            raw = self.base.read_ranges([ByteRange(s, off, n) for s in todo])
            got = dict(zip(todo, self.index.decode_many(raw, todo)))
            if cache is not None:
                cache.put_many(got)
            if not known:
                return got
            known.update(got)
        return known

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

    _INNER_MEMO = 1 << 16  # in-shard positions remembered per store (text -> number); more are parsed each call

    def _parse(self, keys: Sequence[str]) -> tuple[list[str], np.ndarray, np.ndarray]:
        """Shard keys (first-seen order), each key's shard number, and its inner chunk's C-order position: vectorised.

        One string split per key (``map``, no Python per key) and a dict lookup
        of the in-shard position's text (``"1,0,2]"``), remembered per store
        once parsed and checked; texts not seen before are parsed together
        with numpy.
        """
        per = self.spec.chunks_per_shard
        n = len(keys)
        if not n:
            return [], np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        if isinstance(keys, ChunkKeys) and len(keys.which) == n and len(keys.inner) == n:  # built from coordinates
            return list(keys.shards), keys.which, keys.inner
        # strings only: a 3-tuple per key (str.rpartition) made thousands of tuples live at once per block,
        # which Python's collector counts (see assemble.Plan)
        cut = list(map(str.rfind, keys, itertools.repeat("[", n)))
        if -1 in cut or not all(map(str.endswith, keys, itertools.repeat("]", n))):
            bad = next(k for k, c in zip(keys, cut) if c < 0 or not k.endswith("]"))
            raise ValueError(f"{self.array}: {bad!r} is not an inner-chunk key (shard[i,j,...])")
        shard_of = [k[:c] for k, c in zip(keys, cut)]
        texts = [k[c + 1 :] for k, c in zip(keys, cut)]
        shard_no = {s: j for j, s in enumerate(dict.fromkeys(shard_of))}
        which = np.fromiter(map(shard_no.__getitem__, shard_of), dtype=np.int64, count=n)
        if not per:
            return list(shard_no), which, np.zeros(n, dtype=np.int64)
        memo = self.__dict__.setdefault("_inner_no", {})
        found = list(map(memo.get, texts))
        if None in found:
            new = list(dict.fromkeys(t for t, f in zip(texts, found) if f is None))
            numbers = self._parse_positions(new, keys)
            if len(memo) + len(new) <= self._INNER_MEMO:
                memo.update(zip(new, numbers))
                found = list(map(memo.get, texts))
            else:
                local = dict(zip(new, numbers))
                found = [local[t] if f is None else f for t, f in zip(texts, found)]
        return list(shard_no), which, np.fromiter(found, dtype=np.int64, count=n)

    def _parse_positions(self, texts: list[str], keys: Sequence[str]) -> list[int]:
        """C-order positions of in-shard position texts (``"i,j,k]"``), checked against the shard's grid."""
        per = self.spec.chunks_per_shard
        try:
            pos = np.array(",".join(t[:-1] for t in texts).split(","), dtype=np.int64).reshape(len(texts), len(per))
        except ValueError:
            raise ValueError(f"{self.array}: malformed inner-chunk key among {list(keys)[:3]}...") from None
        bad = ((pos < 0) | (pos >= np.array(per))).any(axis=1)
        if bad.any():
            text = texts[int(np.argmax(bad))]
            key = next(k for k in keys if k.endswith("[" + text))
            raise ValueError(f"{self.array}: inner chunk {key!r} lies outside its shard of {per} chunks")
        strides = np.cumprod((1, *per[:0:-1]))[::-1].astype(np.int64)
        return (pos @ strides).tolist()

    def read_into(self, keys: Sequence[str], staging: Callable[[int], Any], align: int = 256, lead: int = 0) -> tuple[Any, list[int], list[int]]:
        """Inner chunks into aligned slots of one staging buffer, each shard's bytes in as few reads as possible.

        Planning is vectorised over all keys of the call. Where the merge gap
        is not set and the chunks asked of a shard hold at least half of the
        bytes between the first and the last of them (a block reads most of
        its shards), that whole span is one read, scattered into the aligned
        slots (gap bytes to scratch); sparse shards (windows) merge ranges
        at most the merge gap apart.
        """
        timed = _stage_timer()
        shards, which, inner = self._parse(keys)
        timed("shards: parse keys")
        with self.base.held(shards):  # local files: each shard opened once, for its index and its ranges
            return self._read_into(keys, shards, which, inner, staging, align, lead, timed)

    def _read_into(self, keys: Sequence[str], shards: list[str], which: np.ndarray, inner: np.ndarray,
                   staging: Callable[[int], Any], align: int, lead: int, timed: Callable[[str], None]) -> tuple[Any, list[int], list[int]]:
        n = len(keys)
        whole = self._read_whole_shards(shards, which, inner, keys)
        timed("whole shard reads")
        try:
            indexes = self.read_indexes([s for s in shards if s not in whole])
        except ChunkReadError as e:
            raise self._name_chunk(e, keys, "reading the index") from None
        indexes.update((s, ix) for s, (ix, _) in whole.items())
        timed("index reads")
        count = self.index.count
        table = np.full((max(len(shards), 1), count, 2), -1, dtype=np.int64)
        for j, s in enumerate(shards):
            ix = indexes[s]
            if ix is not None:
                table[j] = ix
        rows = table[which, inner] if n else np.empty((0, 2), dtype=np.int64)
        offs, sizes = rows[:, 0], np.where(rows[:, 0] < 0, -1, rows[:, 1])
        self._check_entries(keys, shards, which, offs, sizes, whole)  # before any buffer of their size exists
        pad = (-lead) % align
        slots = np.where(sizes < 0, 0, (pad + sizes + align - 1) // align * align)
        ends = np.cumsum(slots)
        dests = ends - slots + pad
        total = int(ends[-1]) if n else 0
        rest: Any = slice(None)  # the chunks left to the range reads
        if whole:
            from_whole = np.isin(which, [j for j, s in enumerate(shards) if s in whole])
            rest = ~from_whole
        reads = self._plan_reads(shards, which[rest], offs[rest], sizes[rest], dests[rest])  # before the turn
        prepared = self.base.prepare_ranges(reads, total)  # local files: the iovec tables, before the turn too
        timed("range planning")
        buf = staging(total)
        timed("staging alloc")  # pinned memory on the GPU path: a pool hit, or a fresh pinned allocation
        if whole:
            self._copy_from_whole(buf, whole, keys, shards, which, offs, sizes, dests, from_whole)
        timed("whole shard copies")
        try:
            got = self.base.read_ranges_into(reads, buf, prepared)
        except ChunkReadError as e:
            raise self._name_chunk(e, keys, "reading byte ranges") from None
        timed("range reads")
        self._check_reads(keys, reads, got, dests, sizes)
        timed("range checks")
        return buf, dests.tolist(), sizes.tolist()

    #: where a store cannot tell an object's size up front: the most bytes an inner chunk of a numeric array
    #: may be stored in, as a multiple of its decoded bytes plus a constant (compressors add a few bytes at worst)
    STORED_FACTOR = 2
    STORED_EXTRA = 1 << 16

    def _check_entries(self, keys: Sequence[str], shards: list[str], which: np.ndarray, offs: np.ndarray,
                       sizes: np.ndarray, whole: dict) -> None:
        """Refuse index entries no shard object can hold, before a staging buffer is sized from them.

        Each entry must end inside its shard object: the object's size comes
        from the read itself for shards read whole, from the file for local
        stores (:meth:`size_or_missing`). Where the size is not known up front
        (object stores' range reads), an inner chunk of a numeric array may be
        at most :attr:`STORED_FACTOR` times its decoded bytes plus
        :attr:`STORED_EXTRA` bytes. Raises :class:`ChunkDecodeError` naming the
        array, the inner chunk and the shard.
        """
        rows = np.flatnonzero(sizes >= 0)
        if not len(rows):
            return
        sizer = getattr(self.base, "size_or_missing", None)
        limits = np.full(len(shards), -1, dtype=np.int64)  # -1: not known
        for j, s in enumerate(shards):
            if s in whole:
                view = whole[s][1]
                limits[j] = 0 if view is None else len(view)
            elif sizer is not None:
                limits[j] = sizer(s)
        lim = limits[which[rows]]
        ends = offs[rows] + sizes[rows]  # both below 2**62 (checked when the index is decoded): no overflow
        bad = np.flatnonzero((lim >= 0) & (ends > lim))
        if len(bad):
            i = int(rows[bad[0]])
            raise ChunkDecodeError(
                self.array, keys[i],
                f"shard index of {shards[which[i]]!r} points past the end of the shard object (bytes "
                f"{int(offs[i])}-{int(offs[i] + sizes[i]) - 1} asked for, the object holds {int(limits[which[i]])})",
            )
        if not self.spec.numeric:
            return
        cap = self.spec.chunk_nbytes * self.STORED_FACTOR + self.STORED_EXTRA
        big = np.flatnonzero((lim < 0) & (sizes[rows] > cap))
        if len(big):
            i = int(rows[big[0]])
            raise ChunkDecodeError(
                self.array, keys[i],
                f"shard index of {shards[which[i]]!r} gives this inner chunk {int(sizes[i])} stored bytes, more "
                f"than any codec makes of its {self.spec.chunk_nbytes} decoded bytes (at most {cap})",
            )

    def _read_whole_shards(self, shards: list[str], which: np.ndarray, inner: np.ndarray,
                           keys: Sequence[str]) -> dict[str, tuple[np.ndarray | None, Any]]:
        """``{shard: (index, object bytes)}`` for the shards this call needs every inner chunk of, read whole.

        Only where the base store asks for it (:attr:`ChunkStore.whole_shards`,
        object stores): one request per shard brings the index and the chunks,
        where the index read and then the range read cost two round trips. A
        shard object that does not exist gives ``(None, None)`` (all its chunks
        missing). Its index is checked as any index is (truncation, checksum),
        naming the shard; an entry past the object's end is named with its inner
        chunk when the chunks are copied out (:meth:`_copy_from_whole`).
        """
        if not getattr(self.base, "whole_shards", False) or not len(which):
            return {}
        count = self.index.count
        asked = np.bincount(np.unique(which * count + inner) // count, minlength=len(shards)).tolist()
        full = [s for s, a in zip(shards, asked) if a == self._inner_in_array(s)]
        if not full:
            return {}
        try:
            objects = self.base.read_many(full)
        except ChunkReadError as e:
            raise self._name_chunk(e, keys, "reading the whole shard") from None
        views = [None if data is None else memoryview(data).cast("B") for data in objects]
        indexes = self.index.decode_many([None if v is None else self.index.raw_of(v) for v in views], full)
        out: dict[str, tuple[np.ndarray | None, Any]] = {s: (ix, v) for s, ix, v in zip(full, indexes, views)}
        if self.index_cache is not None:
            self.index_cache.put_many({s: ix for s, (ix, _) in out.items()})
        return out

    def _inner_in_array(self, shard: str) -> int:
        """How many inner chunks of shard ``shard`` lie inside the array (fewer than a shard holds at the edges)."""
        memo = self.__dict__.setdefault("_inner_count", {})
        n = memo.get(shard)
        if n is None:
            spec = self.spec
            text = shard
            if spec.key_prefix:
                text = text[len(spec.key_prefix) + len(spec.key_separator):]
            coords = [int(c) for c in text.split(spec.key_separator)] if spec.ndim else []
            n = 1
            for c, size, inner, length in zip(coords, spec.shard_shape or (), spec.chunk_shape, spec.shape):
                n *= -(-max(0, min(size, length - c * size)) // inner)
            if len(memo) < self._INNER_MEMO:
                memo[shard] = n
        return n

    def _copy_from_whole(self, buf: Any, whole: dict[str, tuple[Any, Any]], keys: Sequence[str], shards: list[str],
                         which: np.ndarray, offs: np.ndarray, sizes: np.ndarray, dests: np.ndarray,
                         mask: np.ndarray) -> None:
        """Copy the inner chunks of the shards read whole (``mask``) from their objects into their slots.

        An index entry past the object's end is named as the range path names it (array, inner chunk, shard).
        """
        from gpuzarr_dist.stores.copies import scatter_arrays

        rows = np.flatnonzero(mask & (sizes >= 0))
        sources = [whole[s][1] if s in whole else None for s in shards]
        ends = np.array([0 if v is None else len(v) for v in sources], dtype=np.int64)
        w, o, n = which[rows], offs[rows], sizes[rows]
        past = np.flatnonzero(o + n > ends[w])
        if len(past):
            i = int(rows[past[0]])
            shard, o0, n0 = shards[which[i]], int(offs[i]), int(sizes[i])
            raise ChunkDecodeError(
                self.array, keys[i],
                f"shard index of {shard!r} points past the end of the shard object "
                f"(bytes {o0}-{o0 + n0 - 1} asked for, the object ends before byte {int(ends[which[i]])})",
            )
        scatter_arrays(buf, sources, w, o, n, dests[rows])

    def _plan_reads(self, shards: list[str], which: np.ndarray, offs: np.ndarray, sizes: np.ndarray,
                    dests: np.ndarray) -> list[MergedRead]:
        """The merged reads for chunks at ``offs``/``sizes`` of shard ``which`` landing at ``dests``."""
        gap_set = config.shard_merge_gap() is not None
        return plan_reads(shards, which, offs, sizes, dests, merge_gap(self.merge_gap_default), max_range(),
                          span_rule=not gap_set)

    def _check_reads(self, keys: Sequence[str], reads: list[MergedRead], got: list[int], dests: np.ndarray,
                     sizes: np.ndarray) -> None:
        """Name the first inner chunk of a shard that vanished or whose index points past the shard's end."""
        for r, n in zip(reads, got):
            if n >= 0 and r.pieces[-1].offset + r.pieces[-1].length <= r.offset + n and n >= r.length:
                continue  # the common case: the whole read arrived
            for off, length, dest in r.pieces:
                if n >= 0 and off + length <= r.offset + n:
                    continue
                key = keys[int(np.flatnonzero((dests == dest) & (sizes > 0))[0])]
                if n < 0:
                    raise ChunkReadError(self.array, key, f"shard {r.key!r} disappeared while it was being read")
                raise ChunkDecodeError(
                    self.array, key,
                    f"shard index of {r.key!r} points past the end of the shard object "
                    f"(bytes {off}-{off + length - 1} asked for, the object ends before byte {r.offset + n})",
                )

    def read_many(self, keys: Sequence[str]) -> list[Any]:
        """The inner chunks' bytes as views into one buffer (``None`` where absent)."""
        buf, offsets, sizes = self.read_into(keys, lambda n: np.empty(n, dtype=np.uint8), 1, 0)
        view = memoryview(buf)
        return [None if n < 0 else view[o : o + n] for o, n in zip(offsets, sizes)]

    def token(self) -> str:
        return self.base.token()

    def __repr__(self) -> str:
        return f"ShardedChunkStore({self.base!r})"
