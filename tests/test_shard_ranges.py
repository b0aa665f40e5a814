"""Byte-range reads of shards: each block reads each shard's index once (a suffix range for an
index at the end), then only the byte ranges of the inner chunks it needs, merged when close;
results compared with zarr-python's and tensorstore's reading of the same store."""

from __future__ import annotations

import dask
import numpy as np
import pytest
import zarr
import zarr.codecs as zc
from conftest import assert_same, compute_checked, dev, make_data, reference

import gpuzarr_dist as gz
from gpuzarr_dist.stores.ranges import coalesce
from tests.helpers.shard_helpers import record_ranges

pytestmark = pytest.mark.usefixtures("device")


def _write(path, data, shards, inner, location="end", compressors=(zc.ZstdCodec(),), fill=0):
    a = zarr.create_array(
        path, shape=data.shape, dtype=data.dtype, chunks=shards, fill_value=fill, compressors=None, filters=None,
        serializer=zc.ShardingCodec(chunk_shape=inner, codecs=[zc.BytesCodec(), *compressors],
                                    index_codecs=[zc.BytesCodec(), zc.Crc32cCodec()], index_location=location),
    )
    a[...] = data
    return reference(path)


def _index(path, shard_key, n_inner, location):
    """The (offset, nbytes) pairs of a shard, parsed with numpy alone (checksum left out)."""
    raw = open(f"{path}/{shard_key}", "rb").read()
    body = raw[-(16 * n_inner + 4):-4] if location == "end" else raw[: 16 * n_inner]
    return np.frombuffer(body, dtype="<u8").reshape(n_inner, 2), len(raw)


def test_coalesce_merges_close_ranges_of_one_object():
    ranges = [("a", 0, 10, 0), ("a", 15, 5, 100), ("a", 100, 10, 200), ("b", 20, 5, 300), ("a", 110, 10, 400)]
    reads = coalesce(ranges, gap=5, max_range=1000)
    assert [(r.key, r.offset, r.length) for r in reads] == [("a", 0, 20), ("a", 100, 20), ("b", 20, 5)]
    assert [p.dest for p in reads[0].pieces] == [0, 100]
    # the size limit splits a run; a single range larger than it is read alone
    reads = coalesce([("a", 0, 10, 0), ("a", 10, 10, 16), ("a", 20, 50, 32)], gap=0, max_range=20)
    assert [(r.offset, r.length) for r in reads] == [(0, 20), (20, 50)]
    # overlapping ranges never share a read (their pieces could not be scattered)
    reads = coalesce([("a", 0, 10, 0), ("a", 5, 10, 16)], gap=100, max_range=100)
    assert len(reads) == 2


@pytest.mark.parametrize("location", ["end", "start"])
def test_window_reads_only_its_inner_chunks(tmp_path, location, monkeypatch):
    shape, shards, inner = (8, 64, 96), (8, 64, 96), (2, 16, 16)
    data = make_data("float32", shape, seed=1)
    path = str(tmp_path / "w.zarr")
    expected = _write(path, data, shards, inner, location)
    log = record_ranges(monkeypatch)
    with dask.config.set({"gpuzarr.shards.merge-gap": 0}):
        x = gz.from_zarr_gpu(path, device=dev())
        sel = np.s_[2:4, 16:32, 40:70]  # inner chunks (1, 1, 2..4)
        assert_same(compute_checked(x[sel]), expected[sel])
    n_inner = 4 * 4 * 6
    index, size = _index(path, "c/0/0/0", n_inner, location)
    assert [(r.key, r.offset, r.length) for r in log["index"]] == (
        [("c/0/0/0", -(16 * n_inner + 4), 16 * n_inner + 4)] if location == "end" else [("c/0/0/0", 0, 16 * n_inner + 4)]
    )
    wanted = sorted(int(np.ravel_multi_index((1, 1, k), (4, 4, 6))) for k in (2, 3, 4))
    got = sorted((p.offset, p.length) for r in log["data"] for p in r.pieces)
    assert got == sorted((int(index[i, 0]), int(index[i, 1])) for i in wanted)
    assert sum(r.length for r in log["data"]) == sum(int(index[i, 1]) for i in wanted) < size / 10


def test_merge_gap_and_max_range_settings(tmp_path):
    shape, shards, inner = (4, 64, 64), (4, 64, 64), (1, 16, 16)
    data = make_data("int32", shape, seed=2)
    path = str(tmp_path / "m.zarr")
    expected = _write(path, data, shards, inner, compressors=())
    sel = np.s_[:, :, 0:16]  # 16 of the 64 inner chunks, 1 KiB each
    index, _ = _index(path, "c/0/0/0", 64, "end")
    wanted = sorted(tuple(int(v) for v in index[int(np.ravel_multi_index((t, y, 0), (4, 4, 4)))]) for t in range(4) for y in range(4))
    runs = 1 + sum(b[0] != a[0] + a[1] for a, b in zip(wanted, wanted[1:]))  # contiguous runs of wanted bytes
    for gap, max_range, check in (
        ("0 B", "16 MiB", lambda reads: len(reads) == runs),
        ("1 MiB", "16 MiB", lambda reads: len(reads) == 1),
        ("1 MiB", "2 KiB", lambda reads: len(reads) >= 8 and max(r.length for r in reads) <= 2048),
    ):
        mp = pytest.MonkeyPatch()
        log = record_ranges(mp)
        try:
            with dask.config.set({"gpuzarr.shards.merge-gap": gap, "gpuzarr.shards.max-range": max_range}):
                assert_same(compute_checked(gz.from_zarr_gpu(path, device=dev())[sel]), expected[sel])
        finally:
            mp.undo()
        assert check(log["data"]), (gap, max_range, log["data"])
        assert sorted((p.offset, p.length) for r in log["data"] for p in r.pieces) == wanted


def test_many_tiny_inner_chunks_in_one_merged_read(tmp_path):
    """More pieces in one read than one preadv call takes (the iovec limit)."""
    data = make_data("uint16", (50, 60), seed=3)
    path = str(tmp_path / "t.zarr")
    expected = _write(path, data, (50, 60), (1, 2), compressors=())
    x = gz.from_zarr_gpu(path, device=dev())
    assert_same(compute_checked(x), expected)
    assert_same(compute_checked(x[3:47:2, 5:55]), expected[3:47:2, 5:55])


def test_missing_inner_chunks_and_shards_give_the_fill_value(tmp_path):
    data = make_data("float64", (12, 40), seed=4)
    path = str(tmp_path / "p.zarr")
    a = zarr.create_array(path, shape=data.shape, dtype=data.dtype, chunks=(6, 20), fill_value=-7.5, compressors=None,
                          serializer=zc.ShardingCodec(chunk_shape=(3, 5), codecs=[zc.BytesCodec(), zc.GzipCodec()]))
    a[0:3, 0:5] = data[0:3, 0:5]
    a[7:12, 22:31] = data[7:12, 22:31]
    expected = reference(path)
    x = gz.from_zarr_gpu(path, device=dev())
    assert_same(compute_checked(x), expected)
    assert_same(compute_checked(x[1:11, 3:33]), expected[1:11, 3:33])


@pytest.mark.parametrize("location", ["end", "start"])
def test_tensorstore_shards_by_ranges(tmp_path, location):
    ts = pytest.importorskip("tensorstore")
    shape, shards, inner = (6, 40, 50), (3, 40, 50), (1, 10, 10)
    data = make_data("int16", shape, seed=5)
    path = str(tmp_path / "ts.zarr")
    t = ts.open({
        "driver": "zarr3", "kvstore": {"driver": "file", "path": path}, "create": True,
        "metadata": {
            "shape": list(shape), "data_type": "int16", "fill_value": 3,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(shards)}},
            "codecs": [{"name": "sharding_indexed", "configuration": {
                "chunk_shape": list(inner), "index_location": location,
                "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd", "configuration": {"level": 1}}],
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
            }}],
        },
    }).result()
    t[1:5, 5:33, 12:50].write(data[1:5, 5:33, 12:50]).result()
    expected = reference(path)
    x = gz.from_zarr_gpu(path, device=dev())
    assert_same(compute_checked(x), expected)
    assert_same(compute_checked(x[2:4, 10:20, 20:41]), expected[2:4, 10:20, 20:41])
    assert_same(np.asarray(t[2:4, 10:20, 20:41].read().result()), expected[2:4, 10:20, 20:41])
