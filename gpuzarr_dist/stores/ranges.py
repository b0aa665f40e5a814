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

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

import dask.config


class ByteRange(NamedTuple):
    """``length`` bytes of object ``key`` from ``offset``; a negative ``offset`` asks for the last ``-offset`` bytes."""

    key: str
    offset: int
    length: int

    @classmethod
    def suffix(cls, key: str, n: int) -> "ByteRange":
        return cls(key, -n, n)


class Piece(NamedTuple):
    """One requested range inside a merged read: object offset, length, destination offset in the buffer."""

    offset: int
    length: int
    dest: int


@dataclass
class MergedRead:
    """Bytes ``[offset, offset + length)`` of ``key``, holding ``pieces`` (sorted by offset)."""

    key: str
    offset: int
    length: int
    pieces: list[Piece] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.offset + self.length


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


def merge_gap(default: int) -> int:
    """``gpuzarr.shards.merge-gap`` in bytes, or the store's ``default`` where the key is unset."""
    from dask.utils import parse_bytes

    value = dask.config.get("gpuzarr.shards.merge-gap", None)
    return default if value in (None, "auto") else int(parse_bytes(value))


def max_range() -> int:
    """``gpuzarr.shards.max-range`` in bytes: the largest merged read."""
    from dask.utils import parse_bytes

    return max(1, int(parse_bytes(dask.config.get("gpuzarr.shards.max-range", "16 MiB"))))
