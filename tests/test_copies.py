"""``stores.copies.scatter``: fetched buffers land at their slots, byte for byte, on one thread or several."""

from __future__ import annotations

import numpy as np
import pytest

from gpuzarr_dist.stores import copies
from gpuzarr_dist.stores.copies import Move, scatter


@pytest.mark.parametrize("total_mib", [1, 40], ids=["one-thread", "threads"])
def test_every_move_lands_at_its_slot_and_nothing_else_is_written(total_mib):
    rng = np.random.default_rng(total_mib)
    n = 64
    sizes = rng.integers(0, total_mib * 2 * (1 << 20) // n, size=n)
    sources = [bytes(rng.integers(0, 256, int(s) + 100, dtype=np.uint8)) for s in sizes]  # 100 spare bytes each
    starts = rng.integers(0, 100, size=n)
    dests = np.concatenate([[0], np.cumsum(sizes + 512)])[:-1]
    buf = np.full(int(dests[-1] + sizes[-1] + 512), 0xAB, dtype=np.uint8)
    expected = buf.copy()
    moves = []
    for src, st, d, s in zip(sources, starts.tolist(), dests.tolist(), sizes.tolist()):
        moves.append(Move(d, memoryview(src) if s % 2 else src, st, s))  # bytes and memoryviews alike
        expected[d : d + s] = np.frombuffer(src, dtype=np.uint8)[st : st + s]
    assert (sum(sizes) >= copies.PARALLEL_BYTES) == (total_mib == 40)
    scatter(buf, moves)
    np.testing.assert_array_equal(buf, expected)


def test_a_bytearray_target_and_no_moves():
    buf = bytearray(b"x" * 16)
    scatter(buf, [])
    scatter(buf, [Move(4, b"abcdef", 1, 3), Move(10, b"zz", 0, 0)])
    assert bytes(buf) == b"xxxxbcdxxxxxxxxx"


def test_moves_split_into_balanced_runs_in_order():
    moves = [Move(i, b"", 0, n) for i, n in enumerate([10, 10, 10, 10, 40, 5, 5, 10])]
    groups = copies._balanced(moves, 4)
    assert [m for g in groups for m in g] == moves
    assert len(groups) <= 4 and all(g for g in groups)
    assert max(sum(m.n for m in g) for g in groups) <= 50
