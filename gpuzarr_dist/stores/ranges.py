"""Byte ranges of stored objects: what to read, and merging ranges that are close.

A sharded array's block needs a few inner chunks of each shard, each a byte
range of the shard object. Reading each range alone costs one request (a
round trip to an object store, a system call on a local file); reading the
bytes between two close ranges costs little. :func:`coalesce` merges ranges of
one object whose gap is at most ``gap`` bytes into one read of at most
``max_range`` bytes (``gpuzarr.shards.merge-gap`` / ``gpuzarr.shards.max-range``).
Each merged read keeps its pieces: where each requested range lies inside the
read, and where in the caller's buffer it must land, so a store can scatter the
bytes straight to their (aligned) destinations.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from gpuzarr_dist import config


class ByteRange(NamedTuple):
    """``length`` bytes of object ``key`` from ``offset``; a negative ``offset`` asks for the last ``-offset`` bytes."""

    key: str
    offset: int
    length: int

    @classmethod
    def suffix(cls, key: str, n: int) -> ByteRange:
        return cls(key, -n, n)


class Piece(NamedTuple):
    """One requested range inside a merged read: object offset, length, destination offset in the buffer."""

    offset: int
    length: int
    dest: int


class PieceArray(Sequence):
    """A merged read's pieces as three int64 arrays (offsets, lengths, destinations), read as a sequence of
    :class:`Piece`: each piece is made when it is looked at, not kept.

    :func:`plan_reads` gives a block's reads their pieces this way. As a list,
    a block of thousands of inner chunks would keep as many named tuples
    alive while it reads, and with several blocks at once Python's collector
    runs full collections of about 100 ms with the GIL held. Compares equal to a list of the
    same pieces.
    """

    __slots__ = ("offsets", "lengths", "dests")

    def __init__(self, offsets: np.ndarray, lengths: np.ndarray, dests: np.ndarray):
        self.offsets, self.lengths, self.dests = offsets, lengths, dests

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return PieceArray(self.offsets[i], self.lengths[i], self.dests[i])
        return Piece(int(self.offsets[i]), int(self.lengths[i]), int(self.dests[i]))

    def __iter__(self):
        return map(Piece, self.offsets.tolist(), self.lengths.tolist(), self.dests.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (PieceArray, list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"PieceArray({list(self)!r})"


@dataclass
class MergedRead:
    """Bytes ``[offset, offset + length)`` of ``key``, holding ``pieces`` (sorted by offset)."""

    key: str
    offset: int
    length: int
    pieces: list[Piece] | PieceArray = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.offset + self.length


def piece_arrays(read: MergedRead) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A read's pieces as int64 arrays ``(offsets, lengths, dests)`` (no copy for a :class:`PieceArray`)."""
    p = read.pieces
    if isinstance(p, PieceArray):
        return p.offsets, p.lengths, p.dests
    a = np.array([tuple(x) for x in p], dtype=np.int64).reshape(-1, 3)
    return a[:, 0], a[:, 1], a[:, 2]


def coalesce(ranges: Iterable[tuple[str, int, int, int]], gap: int, max_range: int) -> list[MergedRead]:
    """Merge ``(key, offset, length, dest)`` ranges of the same object whose gap is at most ``gap``.

    A merged read never exceeds ``max_range`` bytes unless a single range does
    (then it is read alone). Ranges that overlap the read before them (a
    damaged index, or one range asked for twice) start a read of their own, so
    the pieces of one read never overlap. Returns the reads grouped by key, in offset order.
    """
    by_key: dict[str, list[tuple[int, int, int]]] = {}
    for key, off, n, dest in ranges:
        by_key.setdefault(key, []).append((off, n, dest))
    out: list[MergedRead] = []
    for key, items in by_key.items():
        items.sort()
        cur: MergedRead | None = None
        for off, n, dest in items:
            if cur is not None and cur.end <= off <= cur.end + gap and max(cur.end, off + n) - cur.offset <= max_range:
                cur.length = max(cur.end, off + n) - cur.offset
            else:
                cur = MergedRead(key, off, n)
                out.append(cur)
            cur.pieces.append(Piece(off, n, dest))
    return out


def plan_reads(keys: Sequence[str], which: np.ndarray, offs: np.ndarray, sizes: np.ndarray, dests: np.ndarray,
               gap: int, limit: int, span_rule: bool) -> list[MergedRead]:
    """The merged reads for pieces ``offs``/``sizes`` of objects ``keys[which]`` landing at ``dests``: numpy, no per-piece loop.

    Pieces of size 0 or less (absent chunks) are left out. With ``span_rule``,
    an object whose pieces do not overlap, span at most ``limit`` bytes and hold
    at least half of that span is one read (a block reading most of a shard).
    Every other object is merged as :func:`coalesce` merges it (the same reads,
    pieces and order; ``tests/test_shard_ranges.py`` checks this on random shard
    indexes): a piece joins the read before it when it does not overlap the
    previous piece, the gap is at most ``gap`` and the read stays within
    ``limit`` bytes (the size limit is applied greedily, a pass per split).
    Reads come grouped by object number, in offset order.
    """
    idx = np.flatnonzero(np.asarray(sizes) > 0)
    if not len(idx):
        return []
    which, offs, sizes, dests = (np.asarray(a, dtype=np.int64)[idx] for a in (which, offs, sizes, dests))
    order = np.lexsort((dests, sizes, offs, which))  # coalesce sorts (offset, length, dest) tuples per object
    w, o, s, d = which[order], offs[order], sizes[order], dests[order]
    e = o + s
    m = len(o)
    new_obj = np.ones(m, dtype=bool)
    new_obj[1:] = w[1:] != w[:-1]
    overlap = np.zeros(m, dtype=bool)
    overlap[1:] = (o[1:] < e[:-1]) & ~new_obj[1:]
    brk = new_obj | overlap
    brk[1:] |= o[1:] - e[:-1] > gap
    if span_rule:
        first = np.flatnonzero(new_obj)
        lo, hi = o[first], np.maximum.reduceat(e, first)
        dense = (hi - lo <= limit) & (2 * np.add.reduceat(s, first) >= hi - lo) & ~np.logical_or.reduceat(overlap, first)
        brk = np.where(np.repeat(dense, np.diff(np.append(first, m))), new_obj, brk)
    # inside a read the pieces do not overlap and are sorted, so a read's end is its last piece's end:
    # split a read where it would pass ``limit`` (greedily: the first piece past it starts the next read)
    while True:
        seg = np.cumsum(brk) - 1
        over = (e - o[np.flatnonzero(brk)][seg] > limit) & ~brk
        if not over.any():
            break
        at = np.flatnonzero(over)
        brk[at[np.unique(seg[at], return_index=True)[1]]] = True
    starts = np.flatnonzero(brk)
    stops = np.append(starts[1:], m)
    r_off = o[starts]
    r_len = np.maximum.reduceat(e, starts) - r_off
    return [MergedRead(keys[k], off, n, PieceArray(o[a:b], s[a:b], d[a:b]))
            for k, off, n, a, b in zip(w[starts].tolist(), r_off.tolist(), r_len.tolist(), starts.tolist(), stops.tolist())]


def merge_gap(default: int) -> int:
    """``gpuzarr.shards.merge-gap`` in bytes, or the store's ``default`` where the key is unset."""
    gap = config.shard_merge_gap()
    return default if gap is None else gap


def max_range() -> int:
    """``gpuzarr.shards.max-range`` in bytes: the largest merged read."""
    return config.shard_max_range()
