"""Sharded arrays (``sharding_indexed``) written by zarr-python and tensorstore read the same
through ``from_zarr_gpu``: index at the start or the end, inner codecs, missing inner
chunks and missing shards, edge shards, slices; damaged shards name the shard."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest
import zarr
import zarr.codecs as zc
from conftest import assert_same, compute_checked, dev, make_data, reference

import gpuzarr_dist as gz

pytestmark = pytest.mark.usefixtures("device")

SHAPE, SHARDS, INNER = (13, 22), (4, 10), (2, 5)


def _write(path: str, data: np.ndarray, *, location: str = "end", compressors=None, index_crc: bool = True,
           partial: bool = False, fill=0) -> np.ndarray:
    codecs = [zc.BytesCodec(), *(compressors or [])]
    index_codecs = [zc.BytesCodec()] + ([zc.Crc32cCodec()] if index_crc else [])
    a = zarr.create_array(
        path, shape=data.shape, dtype=data.dtype, chunks=SHARDS, fill_value=fill, compressors=None, filters=None,
        serializer=zc.ShardingCodec(chunk_shape=INNER, codecs=codecs, index_codecs=index_codecs, index_location=location),
    )
    if partial:  # some inner chunks of some shards, one shard not at all
        a[0:3, 0:7] = data[0:3, 0:7]
        a[9:, 12:] = data[9:, 12:]
    else:
        a[...] = data
    return reference(path)


@pytest.mark.parametrize("location", ["end", "start"])
@pytest.mark.parametrize("compressors", [None, [zc.ZstdCodec()], [zc.GzipCodec()], [zc.ZstdCodec(), zc.Crc32cCodec()]],
                         ids=["raw", "zstd", "gzip", "zstd+crc32c"])
@pytest.mark.parametrize("partial", [False, True], ids=["full", "partial"])
def test_sharded_arrays_read_like_zarr_python(tmp_path, location, compressors, partial):
    data = make_data("float32", SHAPE, seed=7)
    path = str(tmp_path / "s.zarr")
    expected = _write(path, data, location=location, compressors=compressors, partial=partial, fill=np.nan)
    x = gz.from_zarr_gpu(path, device=dev())
    assert_same(compute_checked(x), expected)
    for sel in (np.s_[3:11, 4:19:3], np.s_[5, ::-1], np.s_[-1:, 20:]):
        assert_same(compute_checked(x[sel]), expected[sel])


@pytest.mark.parametrize("dtype", ["int16", "uint64", "complex64", "bool"])
def test_sharded_dtypes_and_explicit_blocks(tmp_path, dtype):
    data = make_data(dtype, SHAPE, seed=8)
    path = str(tmp_path / "s.zarr")
    expected = _write(path, data, compressors=[zc.ZstdCodec()], index_crc=False)
    with pytest.warns(UserWarning, match="not multiples of the Zarr shard size 4"):
        x = gz.from_zarr_gpu(path, device=dev(), chunks=(6, 10))
    assert_same(compute_checked(x), expected)


def test_auto_blocks_are_whole_shards(tmp_path):
    data = make_data("int32", SHAPE, seed=9)
    path = str(tmp_path / "s.zarr")
    _write(path, data)
    import dask

    with dask.config.set({"gpuzarr.block-size.cpu": "200 B", "gpuzarr.block-size.gpu": "200 B"}):
        x = gz.from_zarr_gpu(path, device=dev())
    assert all(b % s == 0 for bs, s in zip(x.chunks, SHARDS) for b in bs[:-1])


def test_auto_blocks_count_only_the_shards_part_inside_the_array(tmp_path):
    """Shards padded past the array's edge (4 x 32 x 48 over 21 x 40): an ``auto`` block holds as many shards as
    their part inside the array fits the block size, not their padded extent (which gave blocks half as big)."""
    import dask
    import zarr.codecs as zc

    data = make_data("int32", (64, 21, 40), seed=11)
    path = str(tmp_path / "padded.zarr")
    a = zarr.create_array(path, shape=data.shape, dtype=data.dtype, chunks=(4, 32, 48), compressors=None,
                          serializer=zc.ShardingCodec(chunk_shape=(1, 16, 16), codecs=[zc.BytesCodec(), zc.ZstdCodec()]))
    a[...] = data
    step_bytes = 21 * 40 * 4  # one time step inside the array
    target = 54_000
    with dask.config.set({"gpuzarr.block-size.cpu": f"{target} B", "gpuzarr.block-size.gpu": f"{target} B"}):
        x = gz.from_zarr_gpu(path, device=dev())
    steps = target // (4 * step_bytes) * 4  # whole shards of 4 steps: 16 (the padded count, 4 x 32 x 48, gave 8)
    assert x.chunks[0][0] == steps == 16
    assert max(x.chunks[0]) * step_bytes <= target
    assert_same(compute_checked(x), reference(path))


def test_each_shard_index_is_read_once_per_block(tmp_path, monkeypatch):
    data = make_data("int32", SHAPE, seed=10)
    path = str(tmp_path / "s.zarr")
    expected = _write(path, data, compressors=[zc.ZstdCodec()])
    from tests.helpers.shard_helpers import record_ranges

    log = record_ranges(monkeypatch)
    x = gz.from_zarr_gpu(path, device=dev(), chunks=SHARDS)
    assert_same(compute_checked(x), expected)
    shards = sorted(f"c/{i}/{j}" for i in range(4) for j in range(3))
    assert sorted(r.key for r in log["index"]) == shards  # one index read per shard, each block one shard
    assert sorted({r.key for r in log["data"]}) == shards


def test_a_block_plans_its_read_tables_before_its_staging_buffer(tmp_path, monkeypatch):
    """The iovec tables of a block's range reads are built before it asks for its staging buffer (on the GPU
    path that call takes the read turn), and the block's values are zarr-python's."""
    from numcodecs import Zstd

    from gpuzarr_dist.stores import vectored
    from gpuzarr_dist.stores.source import open_source

    data = make_data("int32", SHAPE, seed=13)
    path = str(tmp_path / "s.zarr")
    expected = _write(path, data, compressors=[zc.ZstdCodec()])
    events: list[str] = []
    real_init = vectored.ReadTables.__init__
    monkeypatch.setattr(vectored.ReadTables, "__init__", lambda self, *a: (events.append("tables"), real_init(self, *a))[1])
    store, spec = open_source(path)
    coords = [(i, j) for i in range(SHAPE[0] // INNER[0] + 1) for j in range(SHAPE[1] // INNER[1] + 1)]
    keys = spec.chunk_keys(coords)

    def staging(n):
        events.append("staging")
        return np.empty(n, dtype=np.uint8)

    buf, offsets, sizes = store.read_into(keys, staging, 1, 0)
    assert events == ["tables", "staging"] and min(sizes) > 0
    got = np.asarray(expected)
    for (ci, cj), o, n in zip(coords, offsets, sizes):  # each inner chunk, uncompressed, against zarr-python's
        raw = np.frombuffer(Zstd().decode(bytes(buf[o : o + n])), dtype="int32").reshape(INNER)
        want = got[ci * INNER[0] : (ci + 1) * INNER[0], cj * INNER[1] : (cj + 1) * INNER[1]]
        np.testing.assert_array_equal(raw[: want.shape[0], : want.shape[1]], want)  # edge chunks: padded


def test_a_block_opens_each_shard_file_once(tmp_path, monkeypatch):
    """A block's index reads and range reads share one opening of each shard file (local files), and every
    file it opened is closed again when it returns."""
    import collections

    from gpuzarr_dist.stores import local
    from gpuzarr_dist.stores.source import open_source

    data = make_data("int32", SHAPE, seed=12)
    path = str(tmp_path / "s.zarr")
    expected = _write(path, data, compressors=[zc.ZstdCodec()])
    opened, closed = collections.Counter(), []
    real_open, real_close = local.LocalChunkStore._open, local.os.close

    def counted(self, key):
        fd = real_open(self, key)
        opened[key] += fd is not None
        return fd

    monkeypatch.setattr(local.LocalChunkStore, "_open", counted)
    store, spec = open_source(path)
    x = gz.from_zarr_gpu(path, device=dev(), chunks=(8, 20))  # blocks of 2 x 2 shards
    assert_same(compute_checked(x), expected)
    shards = sorted(f"c/{i}/{j}" for i in range(4) for j in range(3))
    assert sorted(opened) == shards and set(opened.values()) == {1}
    monkeypatch.setattr(local.os, "close", lambda fd: (closed.append(fd), real_close(fd)))
    with store.base.held(["c/0/0", "c/0/1"]):
        store.base.read_ranges([local.ByteRange("c/0/0", -16, 16), local.ByteRange("c/0/1", -16, 16)])
        assert not closed  # held: the block closes them, not each read
    assert len(closed) == 2


def test_tensorstore_sharded_array(tmp_path):
    ts = pytest.importorskip("tensorstore")
    data = make_data("uint16", SHAPE, seed=11)
    path = str(tmp_path / "ts.zarr")
    spec = {
        "driver": "zarr3",
        "kvstore": {"driver": "file", "path": path},
        "metadata": {
            "shape": list(SHAPE),
            "data_type": "uint16",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(SHARDS)}},
            "codecs": [{"name": "sharding_indexed", "configuration": {
                "chunk_shape": list(INNER),
                "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd", "configuration": {"level": 3}}],
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
            }}],
        },
        "create": True,
    }
    t = ts.open(spec).result()
    t[2:11, 3:17].write(data[2:11, 3:17]).result()
    expected = reference(path)
    assert_same(compute_checked(gz.from_zarr_gpu(path, device=dev())), expected)
    assert_same(expected[2:11, 3:17], data[2:11, 3:17])


@pytest.mark.parametrize("damage", ["index-crc", "truncated", "index-past-end"])
def test_damaged_shard_names_the_shard(tmp_path, damage):
    data = make_data("int32", SHAPE, seed=12)
    path = str(tmp_path / "s.zarr")
    _write(path, data, compressors=[zc.ZstdCodec()])
    shard = pathlib.Path(path, "c", "1", "1")
    raw = bytearray(shard.read_bytes())
    if damage == "index-crc":
        raw[-6] ^= 0xFF
    elif damage == "truncated":
        raw = raw[:10]
    else:  # a valid checksum over an index that points outside the shard
        import google_crc32c

        index = np.frombuffer(bytes(raw[-(16 * 4 + 4):-4]), dtype="<u8").copy()
        index[0] = len(raw) * 10
        body = index.tobytes()
        raw = raw[: -(16 * 4 + 4)] + body + google_crc32c.value(body).to_bytes(4, "little")
    shard.write_bytes(bytes(raw))
    with pytest.raises(gz.ChunkDecodeError) as info:
        gz.from_zarr_gpu(path, device=dev()).compute()
    assert "c/1/1" in str(info.value) and os.path.abspath(path) in str(info.value)


@pytest.mark.parametrize("index_codecs", [
    [zc.BytesCodec()], [zc.BytesCodec(), zc.Crc32cCodec()], [zc.BytesCodec(endian="big"), zc.Crc32cCodec()],
    [zc.BytesCodec(), zc.Crc32cCodec(), zc.Crc32cCodec()],
], ids=["bytes", "crc32c", "big-endian", "two-crc32c"])
def test_shard_indexes_decoded_together_match_the_stored_bytes(tmp_path, index_codecs):
    """``ShardIndex.decode_many`` (all of a block's indexes as one array) gives, shard by shard, what the index
    bytes zarr-python wrote say (read here with numpy) and what ``decode`` gives; a damaged one raises as ``decode``."""
    from gpuzarr_dist.codecs.sharding import ShardIndex
    from gpuzarr_dist.errors import ChunkDecodeError
    from gpuzarr_dist.stores.source import open_source

    data = make_data("int32", SHAPE, seed=13)
    path = str(tmp_path / "s.zarr")
    a = zarr.create_array(path, shape=SHAPE, dtype="int32", chunks=SHARDS, compressors=None,
                          serializer=zc.ShardingCodec(chunk_shape=INNER, codecs=[zc.BytesCodec(), zc.ZstdCodec()],
                                                      index_codecs=index_codecs))
    a[0:3, 0:7] = data[0:3, 0:7]  # some inner chunks missing
    a[5:, :] = data[5:, :]
    _, spec = open_source(path)
    ix = ShardIndex(spec)
    keys = sorted(str(p.relative_to(path)) for p in pathlib.Path(path).glob("c/*/*"))
    raws = [pathlib.Path(path, k).read_bytes()[-ix.nbytes :] for k in keys] + [None]
    got = ix.decode_many(raws, keys + ["c/9/9"])
    assert got[-1] is None
    big = "big" in str(index_codecs[0].endian)  # zarr-python's Endian enum
    for k, raw, g in zip(keys, raws, got):
        stored = np.frombuffer(raw[: ix.count * 16], dtype=">u8" if big else "<u8").reshape(-1, 2)
        want = np.where(stored == np.uint64(2**64 - 1), -1, stored.astype(np.int64))
        np.testing.assert_array_equal(g, want)
        np.testing.assert_array_equal(g, ix.decode(raw, k))
    if len(index_codecs) > 1:  # a flipped byte: the same error as decode's, naming the shard
        bad = bytearray(raws[1])
        bad[3] ^= 0xFF
        with pytest.raises(ChunkDecodeError) as one:
            ix.decode(bytes(bad), keys[1])
        with pytest.raises(ChunkDecodeError) as many:
            ix.decode_many([raws[0], bytes(bad), raws[2]], keys[:3])
        assert str(many.value) == str(one.value) and keys[1] in str(many.value)
    with pytest.raises(ChunkDecodeError, match="truncated"):
        ix.decode_many([raws[0], raws[1][:-1]], keys[:2])
