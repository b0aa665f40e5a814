"""Scattered local reads (``stores/vectored.py``) and ``PieceArray``: every piece lands where it was asked,
as plain slicing of the file's bytes says, through libc's ``preadv`` and through the ``os.preadv`` fallback."""

from __future__ import annotations

import os

import numpy as np
import pytest

from gpuzarr_dist.stores import vectored
from gpuzarr_dist.stores.local import LocalChunkStore
from gpuzarr_dist.stores.ranges import MergedRead, Piece, PieceArray, piece_arrays, plan_reads


def _pieces(rng, size, count):
    """Sorted, non-overlapping (offset, length) pieces inside ``size`` bytes, with random gaps."""
    cuts = np.sort(rng.choice(np.arange(1, size), size=2 * count, replace=False))
    return cuts[0::2].astype(np.int64), (cuts[1::2] - cuts[0::2]).astype(np.int64)


def test_piece_array_reads_as_a_list_of_pieces():
    o, s, d = np.array([0, 10, 30]), np.array([5, 10, 2]), np.array([0, 256, 512])
    p = PieceArray(o, s, d)
    expected = [Piece(0, 5, 0), Piece(10, 10, 256), Piece(30, 2, 512)]
    assert len(p) == 3 and list(p) == expected and p == expected and p[1] == expected[1] and p[-1] == expected[-1]
    assert p[1:] == expected[1:] and isinstance(p[1:], PieceArray) and p != expected[:2]
    assert [x.dest for x in p] == [0, 256, 512] and "PieceArray" in repr(p)
    for arr, want in zip(piece_arrays(MergedRead("k", 0, 32, list(expected))), (o, s, d)):
        np.testing.assert_array_equal(arr, want)
    assert piece_arrays(MergedRead("k", 0, 32, p))[0] is o


@pytest.mark.parametrize("count", [1, 7, 600, 1500])  # 600 and 1500: more entries than one preadv call takes
def test_preadv_table_scatters_pieces_and_gaps(tmp_path, count):
    if vectored._preadv() is None:
        pytest.skip("no libc preadv here")
    rng = np.random.default_rng(count)
    data = rng.integers(0, 256, size=count * 40 + 100, dtype=np.uint8)
    path = tmp_path / "f"
    path.write_bytes(data.tobytes())
    o, s = _pieces(rng, len(data), count)
    start = int(o[0]) - int(rng.integers(0, 3))  # a read may start before its first piece (a gap to scratch)
    start = max(start, 0)
    d = np.cumsum(np.concatenate(([0], (s[:-1] + 255) // 256 * 256)))  # aligned slots
    buf = np.zeros(int(d[-1] + s[-1]) + 64, dtype=np.uint8)
    scratch = bytearray(int(len(data)))
    table = vectored.iovec_table(start, o, s, d, vectored.writable_address(buf), vectored.writable_address(scratch))
    fd = os.open(path, os.O_RDONLY)
    try:
        got = vectored.preadv_table(fd, table, start)
    finally:
        os.close(fd)
    assert got == int(o[-1] + s[-1]) - start
    for off, n, dest in zip(o.tolist(), s.tolist(), d.tolist()):
        np.testing.assert_array_equal(buf[dest : dest + n], data[off : off + n])
    gaps = np.zeros(len(buf), dtype=bool)
    for n, dest in zip(s.tolist(), d.tolist()):
        gaps[dest : dest + n] = True
    assert not buf[~gaps].any()  # nothing written outside the pieces' slots


def test_short_file_reads_what_is_there(tmp_path):
    if vectored._preadv() is None:
        pytest.skip("no libc preadv here")
    (tmp_path / "f").write_bytes(bytes(range(100)))
    buf = np.zeros(512, dtype=np.uint8)
    scratch = bytearray(80)
    o, s, d = np.array([0, 90]), np.array([10, 30]), np.array([0, 256])  # the second piece runs past the end
    table = vectored.iovec_table(0, o, s, d, vectored.writable_address(buf), vectored.writable_address(scratch))
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        assert vectored.preadv_table(fd, table, 0) == 100
    finally:
        os.close(fd)
    assert bytes(buf[:10]) == bytes(range(10)) and bytes(buf[256:266]) == bytes(range(90, 100))


@pytest.mark.parametrize("libc, threads", [(True, 16), (False, 16), (True, 2), (False, 3)])  # 2, 3: several reads per job
def test_local_ranges_land_in_place_with_and_without_libc(tmp_path, monkeypatch, libc, threads):
    import dask

    monkeypatch.setitem(dask.config.config["gpuzarr"], "io-threads", threads)
    if not libc:
        monkeypatch.setitem(vectored._fns, "preadv64", None)  # as where libc's preadv is not found: os.preadv
    elif vectored._preadv() is None:
        pytest.skip("no libc preadv here")
    rng = np.random.default_rng(3)
    objects = {f"c/{j}": rng.integers(0, 256, size=5000, dtype=np.uint8) for j in range(3)}
    for key, data in objects.items():
        (tmp_path / key).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / key).write_bytes(data.tobytes())
    keys = list(objects) + ["c/missing"]
    which, offs, sizes = [], [], []
    for j in range(4):
        o, s = _pieces(rng, 5000, 20)
        which += [j] * 20
        offs += o.tolist()
        sizes += s.tolist()
    which, offs, sizes = np.array(which), np.array(offs), np.array(sizes)
    slots = (sizes + 255) // 256 * 256
    dests = np.cumsum(slots) - slots
    reads = plan_reads(keys, which, offs, sizes, dests, gap=100, limit=10**6, span_rule=False)
    store = LocalChunkStore(str(tmp_path), array="a")
    buf = np.zeros(int(slots.sum()), dtype=np.uint8)
    got = store.read_ranges_into(reads, buf)
    assert [g for g, r in zip(got, reads) if r.key == "c/missing"] and all(
        g == -1 for g, r in zip(got, reads) if r.key == "c/missing")
    for j, o, s, d in zip(which.tolist(), offs.tolist(), sizes.tolist(), dests.tolist()):
        if j < 3:
            np.testing.assert_array_equal(buf[d : d + s], objects[keys[j]][o : o + s])


def test_a_read_planned_past_the_buffer_is_refused(tmp_path):
    (tmp_path / "f").write_bytes(bytes(1000))
    store = LocalChunkStore(str(tmp_path), array="arr")
    reads = [MergedRead("f", 0, 100, [Piece(0, 100, 0)]), MergedRead("f", 200, 100, [Piece(200, 100, 950)])]
    buf = np.zeros(1000, dtype=np.uint8)
    with pytest.raises(RuntimeError, match="arr: the read of 'f' at 200: pieces planned outside the 1000-byte"):
        store.read_ranges_into(reads, buf)


def test_tables_that_would_write_past_their_buffers_are_refused():
    """The kernel writes wherever the table says: the table is checked against both buffers first."""
    buf, scratch = (1 << 20, 1000), (1 << 30, 16)
    o, s = np.array([0, 40]), np.array([10, 10])
    with pytest.raises(ValueError, match="larger than the 16-byte scratch"):
        vectored.iovec_table(0, o, s, np.array([0, 256]), buf, scratch)  # a gap of 30 bytes
    with pytest.raises(ValueError, match="outside the 1000-byte buffer"):
        vectored.iovec_table(0, o, s, np.array([0, 995]), buf, (1 << 30, 64))
    with pytest.raises(ValueError, match="overlap"):
        vectored.iovec_table(0, np.array([0, 5]), s, np.array([0, 256]), buf, (1 << 30, 64))
    t = vectored.iovec_table(0, o, s, np.array([0, 256]), buf, (1 << 30, 64))
    assert t.tolist() == [[1 << 20, 10], [1 << 30, 30], [(1 << 20) + 256, 10]]



def test_read_tables_planned_before_the_buffer_land_as_file_slicing_says(tmp_path):
    """A call's tables, planned for ``nbytes`` before the buffer exists and bound to it afterwards, scatter
    every piece of every read where plain slicing of the files says, through libc's ``preadv``."""
    if vectored._preadv() is None:
        pytest.skip("no libc preadv here")
    rng = np.random.default_rng(11)
    files, reads = {}, []
    dest = 0
    for j in range(5):
        data = rng.integers(0, 256, size=20000, dtype=np.uint8)
        (tmp_path / f"f{j}").write_bytes(data.tobytes())
        files[f"f{j}"] = data
        o, s = _pieces(rng, len(data), 30 + 200 * (j == 3))  # one read of 230 pieces
        d = dest + np.cumsum(np.concatenate(([0], (s[:-1] + 255) // 256 * 256)))
        dest = int(d[-1] + (s[-1] + 255) // 256 * 256)
        start = max(0, int(o[0]) - j)  # reads that start before their first piece (a gap to scratch) and not
        reads.append(MergedRead(f"f{j}", start, int(o[-1] + s[-1]) - start, PieceArray(o, s, d)))
    tables = vectored.ReadTables(reads, dest)
    buf = np.zeros(dest, dtype=np.uint8)
    bound = tables.bind(buf)
    for (lo, hi), r in zip(tables.bounds, reads):
        fd = os.open(tmp_path / r.key, os.O_RDONLY)
        try:
            assert vectored.preadv_table(fd, bound[lo:hi], r.offset) == r.length
        finally:
            os.close(fd)
    for r in reads:
        for off, n, d in r.pieces:
            np.testing.assert_array_equal(buf[d : d + n], files[r.key][off : off + n])
    assert len(tables.scratch) == max(int(vectored.gaps(r.offset, *piece_arrays(r)[:2]).max()) for r in reads)
    with pytest.raises(RuntimeError, match="addresses already"):
        tables.bind(buf)


def test_read_tables_refuse_a_smaller_buffer_and_name_the_read_at_fault():
    reads = [MergedRead("a", 0, 10, [Piece(0, 10, 0)]), MergedRead("b", 0, 100, [Piece(0, 40, 256), Piece(30, 70, 512)])]
    with pytest.raises(RuntimeError, match=r"arr: the read of 'b' at 0: pieces overlap"):
        vectored.ReadTables.checked(reads, 4096, "arr")
    reads[1] = MergedRead("b", 0, 100, [Piece(0, 100, 4000)])
    with pytest.raises(RuntimeError, match=r"arr: the read of 'b' at 0: pieces planned outside the 4096-byte"):
        vectored.ReadTables.checked(reads, 4096, "arr")
    tables = vectored.ReadTables([reads[0]], 4096)
    with pytest.raises(ValueError, match="outside the 1000-byte buffer"):
        tables.bind(np.zeros(1000, dtype=np.uint8))

