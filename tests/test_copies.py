"""``stores.copies.scatter``: fetched buffers land at their slots, byte for byte, on one thread or several,
through ``process_vm_readv`` tables and through the per-piece fallback, as numpy slicing says."""

from __future__ import annotations

import numpy as np
import pytest

from gpuzarr_dist.stores import copies, vectored
from gpuzarr_dist.stores.copies import Move, scatter, scatter_arrays


@pytest.fixture(params=["vm_readv", "per-piece"])
def copy_path(request, monkeypatch):
    """Each test runs through the system call and through the fallback (as where the kernel refuses the call)."""
    if request.param == "vm_readv":
        if vectored._vm_readv() is None:
            pytest.skip("process_vm_readv is missing or refused here")
    else:
        monkeypatch.setitem(vectored._fns, "process_vm_readv", None)
    return request.param


@pytest.mark.parametrize("total_mib", [1, 40], ids=["one-thread", "threads"])
def test_every_move_lands_at_its_slot_and_nothing_else_is_written(total_mib, copy_path):
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
    assert (sum(sizes) >= 2 * copies.PARALLEL_BYTES) == (total_mib == 40)
    scatter(buf, moves)
    np.testing.assert_array_equal(buf, expected)


def test_a_bytearray_target_and_no_moves(copy_path):
    buf = bytearray(b"x" * 16)
    scatter(buf, [])
    scatter(buf, [Move(4, b"abcdef", 1, 3), Move(10, b"zz", 0, 0)])
    assert bytes(buf) == b"xxxxbcdxxxxxxxxx"


def test_pieces_split_into_balanced_runs_in_order():
    lengths = np.array([10, 10, 10, 10, 40, 5, 5, 10])
    parts = copies.balanced_runs(lengths, 4)
    assert parts[0].start == 0 and parts[-1].stop == len(lengths)
    assert all(a.stop == b.start for a, b in zip(parts, parts[1:])) and all(p.stop > p.start for p in parts)
    assert len(parts) <= 4 and max(int(lengths[p].sum()) for p in parts) <= 50
    assert copies.balanced_runs(np.array([7]), 4) == [slice(0, 1)]


def test_more_pieces_than_one_system_call_takes(copy_path):
    rng = np.random.default_rng(5)
    src = rng.integers(0, 256, 3000 * 40, dtype=np.uint8).tobytes()
    n = 1300  # above vectored.GROUP twice over
    starts = rng.integers(0, len(src) - 40, n)
    lengths = rng.integers(1, 40, n)
    dests = np.arange(n) * 64
    buf = np.zeros(n * 64, dtype=np.uint8)
    scatter_arrays(buf, [src], np.zeros(n, dtype=np.int64), starts, lengths, dests)
    want = np.zeros_like(buf)
    view = np.frombuffer(src, dtype=np.uint8)
    for st, ln, d in zip(starts, lengths, dests):
        want[d : d + ln] = view[st : st + ln]
    np.testing.assert_array_equal(buf, want)


@pytest.mark.parametrize("case", ["past-source", "past-buffer", "negative-dest"])
def test_pieces_outside_their_buffers_are_refused_before_any_copy(case, copy_path):
    buf = np.zeros(64, dtype=np.uint8)
    start, length, dest = {"past-source": (10, 8, 0), "past-buffer": (0, 8, 60), "negative-dest": (0, 8, -1)}[case]
    with pytest.raises(ValueError, match="past the end of its source|outside the 64-byte"):
        scatter_arrays(buf, [b"0123456789abcdef"], np.array([0]), np.array([start]), np.array([length]), np.array([dest]))
    assert not buf.any()


def test_a_refused_system_call_falls_back_and_is_not_tried_again(monkeypatch):
    """A seccomp filter answers EPERM: the copy is done piece by piece, and later copies go straight there."""
    import ctypes
    import errno

    calls = []

    def refused(*args):
        calls.append(args)
        ctypes.set_errno(errno.EPERM)
        return -1

    monkeypatch.setitem(vectored._fns, "process_vm_readv", refused)
    buf = bytearray(8)
    scatter(buf, [Move(2, b"abcd", 0, 4)])
    assert bytes(buf) == b"\0\0abcd\0\0" and len(calls) == 1
    assert vectored._fns["process_vm_readv"] is None
    scatter(buf, [Move(0, b"zz", 0, 2)])
    assert bytes(buf) == b"zzabcd\0\0" and len(calls) == 1


def test_a_short_copy_is_an_error(monkeypatch):
    monkeypatch.setitem(vectored._fns, "process_vm_readv", lambda *a: 3)
    with pytest.raises(OSError, match="copied 3 of 4 bytes"):
        scatter(bytearray(8), [Move(0, b"abcd", 0, 4)])
