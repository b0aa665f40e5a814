"""Copying fetched bytes into a block's staging buffer, on several threads and without the GIL.

Object stores hand back each object or range as its own buffer, which then
goes to its slot of the block's (pinned) staging buffer; a shard read whole
is cut into its inner chunks' aligned slots. The copies are planned as
numpy arrays (source, start, length, destination) and done by
:func:`.vectored.copy_table`: one system call per 512 pieces, with the GIL
released. ``numpy.copyto`` per piece releases the GIL for each copy and
takes it back after, behind other threads' Python (several times slower for
a block's hundreds of pieces), and a ``memoryview`` slice assignment
holds the GIL for the whole copy, keeping the event loop that handles the
other requests' responses waiting. ``numpy.copyto`` per piece remains
where ``process_vm_readv`` is refused. Large copies are spread over the
shared I/O threads, at most :data:`MAX_PARTS` of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from gpuzarr_dist.stores import vectored

#: bytes per thread of a copy spread over the I/O threads (below twice this, the calling thread copies alone)
PARALLEL_BYTES = 16 << 20
#: the most threads one copy takes: each system call copies several GB/s without the GIL, and each thread
#: handed a part takes the GIL to start and to finish it, behind the other threads' Python
MAX_PARTS = 4


class Move(NamedTuple):
    """``n`` bytes of ``src`` from ``start`` on, to ``dest`` in the staging buffer."""

    dest: int
    src: Any
    start: int
    n: int


def scatter(buf: Any, moves: Sequence[Move]) -> None:
    """Do every move into ``buf`` (a writable buffer)."""
    sources = list({id(m.src): m.src for m in moves}.values())
    number = {id(s): i for i, s in enumerate(sources)}
    which = np.fromiter((number[id(m.src)] for m in moves), dtype=np.int64, count=len(moves))
    starts, lengths, dests = (np.fromiter((m[k] for m in moves), dtype=np.int64, count=len(moves)) for k in (2, 3, 0))
    scatter_arrays(buf, sources, which, starts, lengths, dests)


def scatter_arrays(buf: Any, sources: Sequence[Any], which: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                   dests: np.ndarray) -> None:
    """Copy ``lengths[i]`` bytes of ``sources[which[i]]`` from ``starts[i]`` on to ``dests[i]`` of ``buf``.

    Every piece is checked to lie inside its source and inside ``buf`` first
    (``ValueError`` otherwise: the system call would copy whatever memory the
    addresses name). Pieces of no bytes are skipped; ``sources`` not named by
    ``which`` may be ``None``.
    """
    from gpuzarr_dist.config import io_threads
    from gpuzarr_dist.runtime.threads import io_pool, map_all

    keep = lengths > 0
    if not keep.all():
        which, starts, lengths, dests = which[keep], starts[keep], lengths[keep], dests[keep]
    if not len(lengths):
        return
    dst = np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8)
    if not dst.flags.writeable:
        raise ValueError("the staging buffer is read-only")
    used = np.unique(which)
    addr = np.zeros(len(sources), dtype=np.uint64)
    size = np.zeros(len(sources), dtype=np.int64)
    for j in used.tolist():
        addr[j], size[j] = vectored.address(sources[j])
    if int(starts.min()) < 0 or bool((starts + lengths > size[which]).any()):
        raise ValueError("a copy would read past the end of its source buffer")
    if int(dests.min()) < 0 or int((dests + lengths).max()) > dst.nbytes:
        raise ValueError(f"a copy would write outside the {dst.nbytes}-byte staging buffer")
    d_table = np.empty((len(lengths), 2), dtype=np.uint64)
    s_table = np.empty((len(lengths), 2), dtype=np.uint64)
    d_table[:, 0] = dst.ctypes.data + dests.astype(np.uint64)
    s_table[:, 0] = addr[which] + starts.astype(np.uint64)
    d_table[:, 1] = s_table[:, 1] = lengths

    def run(part: slice) -> None:
        if not vectored.copy_table(d_table[part], s_table[part]):
            for i in range(part.start, part.stop):
                src = np.frombuffer(memoryview(sources[which[i]]).cast("B"), dtype=np.uint8)
                np.copyto(dst[dests[i] : dests[i] + lengths[i]], src[starts[i] : starts[i] + lengths[i]])

    k = min(MAX_PARTS, io_threads(), len(lengths), int(lengths.sum()) // PARALLEL_BYTES)
    parts = balanced_runs(lengths, k) if k > 1 else [slice(0, len(lengths))]
    if len(parts) == 1:
        run(parts[0])
        return
    map_all(io_pool(), run, parts)  # none still copying into ``buf`` when an error leaves


def balanced_runs(lengths: np.ndarray, k: int) -> list[slice]:
    """``[0, len(lengths))`` cut into at most ``k`` runs of consecutive pieces with about the same bytes each."""
    ends = np.cumsum(lengths)
    cuts = np.searchsorted(ends, ends[-1] * np.arange(1, k) / k, side="left") + 1
    bounds = [0, *sorted(set(int(c) for c in cuts if 0 < c < len(lengths))), len(lengths)]
    return [slice(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
