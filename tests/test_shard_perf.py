"""The fast sharded paths: whole-span shard reads, vectorised planning, windows that read only what they reach.

Values are compared with zarr-python; the reads a call makes are recorded at the store.
"""

from __future__ import annotations

import os

import dask
import numpy as np
import pytest
import zarr
import zarr.codecs as zc
from conftest import assert_same, compute_checked, dev, make_data, reference

import gpuzarr_dist as gz
from gpuzarr_dist.array.windows import _chunk_keys
from gpuzarr_dist.stores.source import open_source
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


@pytest.mark.parametrize("location", ["end", "start"])
def test_block_reads_each_shard_as_one_span(tmp_path, location, monkeypatch):
    """Edge shards (array smaller than the shard grid), each shard one read, values as zarr-python."""
    data = make_data("float32", (8, 45, 70), seed=11)
    path = str(tmp_path / "s.zarr")
    expected = _write(path, data, (4, 48, 72), (1, 16, 24), location)
    log = record_ranges(monkeypatch)
    assert_same(compute_checked(gz.from_zarr_gpu(path, device=dev())), expected)
    keys = sorted(r.key for r in log["data"])
    assert keys == ["c/0/0/0", "c/1/0/0"]  # one merged read per shard, not one per inner chunk
    assert all(len(r.pieces) == 4 * 3 * 3 for r in log["data"])


def test_mostly_wanted_shard_read_as_one_span_gaps_skipped(tmp_path, monkeypatch):
    """Half or more of a shard's span wanted: one read, the unwanted chunks between are read but not used."""
    data = make_data("int32", (4, 64, 64), seed=12)
    path = str(tmp_path / "g.zarr")
    expected = _write(path, data, (4, 64, 64), (1, 16, 16), compressors=())
    sel = np.s_[:, :, 0:48]  # 3 of each 4 inner chunks along x: 75% of the bytes, with gaps of one chunk
    log = record_ranges(monkeypatch)
    assert_same(compute_checked(gz.from_zarr_gpu(path, device=dev())[sel]), expected[sel])
    assert len(log["data"]) == 1 and len(log["data"][0].pieces) == 48
    log["data"].clear()
    with dask.config.set({"gpuzarr.shards.merge-gap": 0}):  # an explicit gap is obeyed: one read per run
        assert_same(compute_checked(gz.from_zarr_gpu(path, device=dev())[sel]), expected[sel])
    assert len(log["data"]) > 1 and all(r.length == sum(p.length for p in r.pieces) for r in log["data"])


def test_sparse_shard_reads_only_its_chunks(tmp_path, monkeypatch):
    data = make_data("float64", (4, 64, 64), seed=13)
    path = str(tmp_path / "p.zarr")
    expected = _write(path, data, (4, 64, 64), (1, 16, 16))
    sel = np.s_[1:3, 5:9, 40:44]  # 2 of 64 inner chunks, far apart
    log = record_ranges(monkeypatch)
    assert_same(compute_checked(gz.from_zarr_gpu(path, device=dev())[sel]), expected[sel])
    assert sum(len(r.pieces) for r in log["data"]) == 2
    assert sum(r.length for r in log["data"]) < os.path.getsize(f"{path}/c/0/0/0") / 4  # not the whole shard


def test_missing_inner_chunks_in_a_span(tmp_path):
    data = make_data("float32", (4, 32, 32), seed=14)
    path = str(tmp_path / "m.zarr")
    a = zarr.create_array(path, shape=data.shape, dtype=data.dtype, chunks=(4, 32, 32), fill_value=-3.0, compressors=None,
                          serializer=zc.ShardingCodec(chunk_shape=(1, 8, 8), codecs=[zc.BytesCodec(), zc.ZstdCodec()]))
    a[0:3, 0:24, 0:32] = data[0:3, 0:24, 0:32]
    a[3, 30, 30] = 1.5
    expected = reference(path)
    assert_same(compute_checked(gz.from_zarr_gpu(path, device=dev())), expected)
    assert_same(compute_checked(gz.from_zarr_gpu(path, device=dev())[1:4, 5:31, 3:29]), expected[1:4, 5:31, 3:29])


def test_parse_matches_chunk_key_and_rejects_bad_keys(tmp_path):
    data = make_data("uint8", (6, 20, 30), seed=15)
    path = str(tmp_path / "k.zarr")
    _write(path, data, (3, 10, 15), (1, 5, 5), compressors=())
    store, spec = open_source(path, None, None)
    coords = np.array([(t, y, x) for t in range(6) for y in range(4) for x in range(6)])
    keys = _chunk_keys(spec, coords)
    assert keys == [spec.chunk_key(tuple(c)) for c in coords.tolist()]
    shards, which, inner = store._parse(keys)
    assert [shards[j] + "[" + ",".join(map(str, np.unravel_index(i, spec.chunks_per_shard))) + "]"
            for j, i in zip(which, inner)] == keys
    with pytest.raises(ValueError, match="outside its shard"):
        store._parse(["c/0/0/0[3,0,0]"])
    with pytest.raises(ValueError, match="not an inner-chunk key"):
        store._parse(["c/0/0/0"])


def test_windows_at_edges_and_overlapping(tmp_path, monkeypatch):
    data = make_data("float32", (10, 37, 53), seed=16)
    path = str(tmp_path / "w.zarr")
    expected = _write(path, data, (4, 16, 24), (2, 8, 8))
    window = (3, 9, 10)
    starts = np.array([[0, 0, 0], [7, 28, 43], [0, 28, 0], [7, 0, 43], [3, 7, 7], [3, 7, 8], [3, 7, 7], [4, 8, 16]])
    log = record_ranges(monkeypatch)
    got = gz.WindowSampler(path, window, device=dev()).sample(starts)
    got = got.get() if hasattr(got, "get") else got
    for s, w in zip(starts, got):
        assert_same(w, expected[tuple(slice(int(a), int(a) + n) for a, n in zip(s, window))])
    # each inner chunk a window reaches is read once, and no other
    reached = {tuple(c) for s in starts for c in np.ndindex(*((s + np.array(window) - 1) // (2, 8, 8) - s // (2, 8, 8) + 1))
               for c in [tuple(np.array(c) + s // (2, 8, 8))]}
    assert sum(len(r.pieces) for r in log["data"]) == len(reached)
