"""Copying fetched bytes into a block's staging buffer, on several threads and without the GIL.

Object stores hand back each object or range as its own buffer, which then
goes to its slot of the block's (pinned) staging buffer. A ``memoryview``
slice assignment holds the GIL for the whole copy: a block's ~100 MB copied
that way kept the event loop that handles the other requests' responses,
and every other thread, waiting. ``numpy.copyto`` releases the GIL for large
copies, and the moves are spread over the shared I/O threads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

#: below this many bytes in all, one thread copies (handing work to threads costs more than it saves)
PARALLEL_BYTES = 8 << 20


class Move(NamedTuple):
    """``n`` bytes of ``src`` from ``start`` on, to ``dest`` in the staging buffer."""

    dest: int
    src: Any
    start: int
    n: int


def scatter(buf: Any, moves: Sequence[Move]) -> None:
    """Do every move into ``buf`` (a writable buffer), on the shared I/O threads when there is enough to copy."""
    from ..config import io_threads
    from ..runtime.threads import io_pool, map_all

    dst = np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8)
    total = sum(m.n for m in moves)

    def run(group: Sequence[Move]) -> None:
        for m in group:
            if m.n > 0:
                src = np.frombuffer(memoryview(m.src).cast("B"), dtype=np.uint8, count=m.n, offset=m.start)
                np.copyto(dst[m.dest : m.dest + m.n], src)

    if total < PARALLEL_BYTES or len(moves) < 2:
        run(moves)
        return
    groups = _balanced(moves, min(len(moves), max(1, io_threads())))
    map_all(io_pool(), run, groups)  # none still copying into ``buf`` when an error leaves


def _balanced(moves: Sequence[Move], k: int) -> list[list[Move]]:
    """``moves`` cut into ``k`` runs of consecutive moves with about the same bytes each."""
    total = sum(m.n for m in moves) or 1
    groups: list[list[Move]] = [[] for _ in range(k)]
    done = 0
    for m in moves:
        groups[min(k - 1, done * k // total)].append(m)
        done += m.n
    return [g for g in groups if g]
