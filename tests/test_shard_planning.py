"""The vectorised byte-range planning of sharded reads (``ranges.plan_reads``) against the scalar
planning it replaced (kept here as the reference), on random shard indexes with missing chunks,
overlapping (damaged) entries and both index locations; and whole reads of arrays with random
missing inner chunks against zarr-python, with the shard-index cache of a WindowSampler."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
import zarr.codecs as zc

from gpuzarr_dist.stores.ranges import MergedRead, Piece, coalesce, plan_reads


def _scalar_plan(shards, which, offs, sizes, dests, gap, limit, span_rule):
    """The planning as ShardedChunkStore._plan_reads did it before: a loop per shard, coalesce per piece."""
    keep = sizes > 0
    order = np.lexsort((offs, which))
    order = order[keep[order]]
    bounds = np.flatnonzero(np.diff(which[order])) + 1
    reads: list[MergedRead] = []
    for grp in np.split(order, bounds) if len(order) else []:
        key = shards[int(which[grp[0]])]
        o, s, d = offs[grp], sizes[grp], dests[grp]
        lo, hi = int(o[0]), int((o + s).max())
        dense = span_rule and hi - lo <= limit and 2 * int(s.sum()) >= hi - lo and bool((o[1:] >= (o + s)[:-1]).all())
        if dense:
            reads.append(MergedRead(key, lo, hi - lo, list(map(Piece, o.tolist(), s.tolist(), d.tolist()))))
        else:
            reads.extend(coalesce(zip([key] * len(grp), o.tolist(), s.tolist(), d.tolist()), gap, limit))
    return reads


def _random_shards(rng, n_shards, per_shard, location, p_missing, damaged):
    """Random (offset, nbytes) indexes as a writer lays them out (chunks end to end in a random order,
    the index at the start shifting every offset), with missing chunks and, if ``damaged``, entries that
    overlap or repeat."""
    index_bytes = per_shard * 16 + 4
    tables = []
    for _ in range(n_shards):
        sizes = rng.integers(1, 5000, per_shard)
        missing = rng.random(per_shard) < p_missing
        layout = rng.permutation(per_shard) if rng.random() < 0.5 else np.arange(per_shard)  # C order, or any order
        offs = np.zeros(per_shard, dtype=np.int64)
        pos = index_bytes if location == "start" else 0
        for i in layout:
            if not missing[i]:
                offs[i] = pos
                pos += sizes[i] + (rng.integers(0, 3000) if rng.random() < 0.2 else 0)  # unreferenced bytes between
        table = np.stack([np.where(missing, -1, offs), np.where(missing, -1, sizes)], axis=1)
        if damaged and per_shard > 2:
            j, k = rng.choice(per_shard, 2, replace=False)
            table[j] = table[k]  # two chunks pointing at the same bytes
            i = rng.integers(per_shard)
            if table[i, 0] >= 0:
                table[i, 0] = max(0, table[i, 0] - rng.integers(1, 100))  # reaching into the chunk before it
        tables.append(table)
    return np.stack(tables)


@pytest.mark.parametrize("location", ["end", "start"])
@pytest.mark.parametrize("damaged", [False, True])
def test_vectorised_planning_equals_scalar_planning(location, damaged):
    rng = np.random.default_rng(7 if location == "end" else 8)
    for trial in range(150):
        n_shards, per_shard = int(rng.integers(1, 6)), int(rng.integers(1, 40))
        table = _random_shards(rng, n_shards, per_shard, location, rng.choice([0.0, 0.1, 0.5, 0.9]), damaged)
        n = int(rng.integers(0, 3 * n_shards * per_shard))
        which = rng.integers(0, n_shards, n)
        inner = rng.integers(0, per_shard, n)  # keys asked for twice are allowed too
        rows = table[which, inner] if n else np.empty((0, 2), dtype=np.int64)
        offs, sizes = rows[:, 0], np.where(rows[:, 0] < 0, -1, rows[:, 1])
        slots = np.where(sizes < 0, 0, (sizes + 255) // 256 * 256)
        dests = np.cumsum(slots) - slots
        shards = [f"c/{j}/0" for j in range(n_shards)]
        gap = int(rng.choice([0, 100, 2000, 10**6]))
        limit = int(rng.choice([1, 3000, 20000, 10**9]))
        for span_rule in (False, True):
            want = _scalar_plan(shards, which, offs, sizes, dests, gap, limit, span_rule)
            got = plan_reads(shards, which, offs, sizes, dests, gap, limit, span_rule)
            assert got == want, (trial, gap, limit, span_rule)
            # every present chunk lands once, where the caller put it, inside its read
            pieces = sorted((p.dest, p.offset, p.length) for r in got for p in r.pieces)
            assert pieces == sorted(zip(dests[sizes > 0].tolist(), offs[sizes > 0].tolist(), sizes[sizes > 0].tolist()))
            for r in got:
                assert all(r.offset <= p.offset and p.offset + p.length <= r.end for p in r.pieces)
                assert all(a.offset + a.length <= b.offset for a, b in zip(r.pieces, r.pieces[1:]))
                assert r.length <= limit or len(r.pieces) == 1


def test_planning_edge_cases():
    assert plan_reads(["a"], np.zeros(0, int), np.zeros(0, int), np.zeros(0, int), np.zeros(0, int), 0, 10, True) == []
    # all absent
    assert plan_reads(["a"], np.zeros(3, int), -np.ones(3, int), -np.ones(3, int), np.arange(3), 0, 10, True) == []
    # one piece larger than the limit is read alone, and the one after it starts a read of its own
    got = plan_reads(["a"], np.zeros(3, int), np.array([0, 10, 100]), np.array([10, 90, 5]), np.array([0, 16, 112]), 10, 50, False)
    assert [(r.offset, r.length) for r in got] == [(0, 10), (10, 90), (100, 5)]
    # the limit and the gap are inclusive, as coalesce has them
    two = (np.zeros(2, int), np.array([0, 15]), np.array([10, 10]), np.array([0, 16]))
    for gap, limit, want in ((5, 25, [(0, 25)]), (5, 24, [(0, 10), (15, 10)]), (4, 25, [(0, 10), (15, 10)])):
        got = plan_reads(["a"], *two, gap, limit, False)
        assert [(r.offset, r.length) for r in got] == want
        assert got == coalesce(zip(["a"] * 2, [0, 15], [10, 10], [0, 16]), gap, limit)


@pytest.mark.parametrize("location", ["end", "start"])
def test_random_missing_inner_chunks_read_as_zarr_python_reads(tmp_path, location):
    """Arrays with inner chunks left unwritten at random, read whole and in windows (host planning end to end)."""
    from gpuzarr_dist.stores.source import open_source
    from gpuzarr_dist.windows import WindowSampler

    from conftest import make_data

    rng = np.random.default_rng(3)
    shape, shards, inner = (6, 40, 50), (3, 20, 25), (1, 5, 5)
    path = str(tmp_path / f"m_{location}.zarr")
    a = zarr.create_array(path, shape=shape, dtype="float32", chunks=shards, fill_value=-3.0, compressors=None,
                          serializer=zc.ShardingCodec(chunk_shape=inner, codecs=[zc.BytesCodec(), zc.ZstdCodec()],
                                                      index_location=location))
    data = make_data("float32", shape, seed=2)
    for t in range(shape[0]):
        for i in range(0, shape[1], inner[1]):
            for j in range(0, shape[2], inner[2]):
                if rng.random() < 0.6:
                    a[t, i : i + inner[1], j : j + inner[2]] = data[t, i : i + inner[1], j : j + inner[2]]
    ref = zarr.open_array(path, mode="r")
    store, spec = open_source(path, None, None)
    from gpuzarr_dist.reader import BlockReader

    reader = BlockReader(store, spec, "cpu")
    np.testing.assert_array_equal(reader[1:5, 3:37, :], ref[1:5, 3:37, :])
    sampler = WindowSampler(path, (2, 7, 9), device="cpu")
    for seed in range(3):
        starts = sampler.random_starts(20, rng=seed)
        got = sampler.sample(starts)
        for s, w in zip(starts, got):
            np.testing.assert_array_equal(w, ref[tuple(slice(int(x), int(x) + n) for x, n in zip(s, (2, 7, 9)))])
