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
def test_random_missing_inner_chunks_read_as_zarr_python_reads(tmp_path, location, device):
    """Arrays with inner chunks left unwritten at random, read whole and in windows (host planning end to end;
    on the GPU the window gather fills the missing chunks' elements)."""
    from conftest import make_data

    from gpuzarr_dist.array.windows import WindowSampler
    from gpuzarr_dist.stores.source import open_source

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
    from gpuzarr_dist.array.reader import BlockReader

    def host(a):
        return a.get() if hasattr(a, "get") else a

    reader = BlockReader(store, spec, device)
    np.testing.assert_array_equal(host(reader[1:5, 3:37, :]), ref[1:5, 3:37, :])
    sampler = WindowSampler(path, (2, 7, 9), device=device)
    for seed in range(3):
        starts = sampler.random_starts(20, rng=seed)
        got = host(sampler.sample(starts))
        for s, w in zip(starts, got):
            np.testing.assert_array_equal(w, ref[tuple(slice(int(x), int(x) + n) for x, n in zip(s, (2, 7, 9)))])


def _sharded(path, data, shards=(4, 32, 32), inner=(1, 8, 8), location="end"):
    a = zarr.create_array(path, shape=data.shape, dtype=data.dtype, chunks=shards, compressors=None,
                          serializer=zc.ShardingCodec(chunk_shape=inner, codecs=[zc.BytesCodec(), zc.ZstdCodec()],
                                                      index_location=location))
    a[...] = data
    return a


def _check_windows(sampler, ref, starts):
    got = sampler.sample(starts)
    for s, w in zip(starts, got):
        np.testing.assert_array_equal(w, ref[tuple(slice(int(x), int(x) + n) for x, n in zip(s, sampler.window))])


@pytest.mark.parametrize("location", ["end", "start"])
def test_window_sampler_reads_each_shard_index_once_across_calls(tmp_path, monkeypatch, location):
    from conftest import make_data

    from gpuzarr_dist.array.windows import WindowSampler
    from tests.helpers.shard_helpers import record_ranges

    data = make_data("float32", (16, 64, 96), seed=4)
    path = str(tmp_path / "c.zarr")
    _sharded(path, data, location=location)
    ref = zarr.open_array(path, mode="r")
    log = record_ranges(monkeypatch)
    sampler = WindowSampler(path, (3, 10, 12), device="cpu")
    seen = set()
    for seed in range(6):
        before = len(log["index"])
        starts = sampler.random_starts(16, rng=seed)
        _check_windows(sampler, ref, starts)
        asked = [r.key for r in log["index"][before:]]
        assert len(asked) == len(set(asked)) and not seen & set(asked)  # never an index read twice
        seen |= set(asked)
    cache = sampler.reader.store.index_cache
    assert cache.hits > 0 and len(cache) == len(seen)
    # off: every call reads the indexes of the shards it touches again
    plain = WindowSampler(path, (3, 10, 12), device="cpu", index_cache=0)
    starts = sampler.random_starts(16, rng=0)
    before = len(log["index"])
    _check_windows(plain, ref, starts)
    first = len(log["index"]) - before
    _check_windows(plain, ref, starts)
    assert len(log["index"]) - before == 2 * first > 0


def test_index_cache_is_bounded_and_cleared(tmp_path):
    from conftest import make_data

    from gpuzarr_dist.array.windows import WindowSampler
    from gpuzarr_dist.stores.sharded import IndexCache

    data = make_data("float32", (16, 64, 96), seed=5)
    path = str(tmp_path / "b.zarr")
    a = _sharded(path, data)
    one = (4 * 4 * 4) * 16  # bytes of one decoded index: 64 inner chunks x (offset, size) int64
    sampler = WindowSampler(path, (2, 9, 9), device="cpu", index_cache=3 * one)
    ref = zarr.open_array(path, mode="r")
    for seed in range(5):
        _check_windows(sampler, ref, sampler.random_starts(12, rng=seed))
        cache = sampler.reader.store.index_cache
        assert len(cache) <= 3 and cache.nbytes <= 3 * one
    # a rewritten array is read through fresh indexes once the cache is cleared
    a[...] = data[::-1]
    sampler.clear_cache()
    ref = zarr.open_array(path, mode="r")
    _check_windows(sampler, ref, sampler.random_starts(12, rng=9))
    # least recently used goes first; an absent shard is remembered as absent
    c = IndexCache(2 * one)
    x, y, z = (np.zeros((64, 2), dtype=np.int64) for _ in range(3))
    c.put_many({"a": x, "b": y})
    assert c.get_many(["a"]) == {"a": x}
    c.put_many({"c": z})
    assert set(c.get_many(["a", "b", "c"])) == {"a", "c"}
    c.put_many({"gone": None})
    assert "gone" in c.get_many(["gone"]) and not x.flags.writeable


def test_sampler_store_pickles_without_its_cache(tmp_path):
    import pickle

    from conftest import make_data

    from gpuzarr_dist.array.windows import WindowSampler

    path = str(tmp_path / "p.zarr")
    _sharded(path, make_data("float32", (8, 32, 32), seed=6))
    sampler = WindowSampler(path, (2, 5, 5), device="cpu")
    sampler.sample(sampler.random_starts(4, rng=0))
    assert len(sampler.reader.store.index_cache)
    assert pickle.loads(pickle.dumps(sampler.reader.store)).index_cache is None


@pytest.mark.parametrize("case", ["none missing", "some missing", "all missing"])
def test_window_gather_without_a_fill_chunk(case):
    """The host cut with no, some and only missing chunks, against a numpy cut (the device's kernel: test_windows)."""
    from gpuzarr_dist.array.windows import _cut_windows

    rng = np.random.default_rng(11)
    chunk, window = (3, 4, 5), (2, 6, 7)
    grid = tuple((w + c - 2) // c + 1 for w, c in zip(window, chunk))
    n, m = 9, (0 if case == "all missing" else 15)
    chunks = rng.standard_normal((m, *chunk)).astype("float32")
    idx = rng.integers(0, m + (case != "none missing"), size=(n, *grid))
    offsets = np.stack([rng.integers(0, c, size=n) for c in chunk], axis=1)
    got = _cut_windows(chunks, idx, offsets, window, 7.5)
    pool = np.concatenate([chunks, np.full((1, *chunk), 7.5, dtype="float32")])
    for w in range(n):
        mosaic = pool[idx[w]].transpose(0, 3, 1, 4, 2, 5).reshape([g * c for g, c in zip(grid, chunk)])
        o = offsets[w]
        np.testing.assert_array_equal(got[w], mosaic[o[0]:o[0] + window[0], o[1]:o[1] + window[1], o[2]:o[2] + window[2]])
