"""Sharding beyond the plain layout: a transpose before ``sharding_indexed``, sharding nested inside a shard,
shard index entries checked against the object before any allocation, and deeply nested metadata JSON.

Values are compared with zarr-python reading the same store.
"""

from __future__ import annotations

import json
import os
import struct

import google_crc32c
import numpy as np
import pytest
import zarr
from zarr.codecs import BytesCodec, ShardingCodec, ZstdCodec

import gpuzarr_dist as gz
from gpuzarr_dist.core.metadata import MAX_JSON_DEPTH, load_document

DATA = np.arange(24 * 36 * 12, dtype="i4").reshape(24, 36, 12)


def _edit(path: str, change) -> None:
    p = os.path.join(path, "zarr.json")
    doc = json.load(open(p))
    change(doc)
    json.dump(doc, open(p, "w"))


def _compare(path: str, **kw) -> None:
    ref = zarr.open_array(path, mode="r")
    np.testing.assert_array_equal(gz.from_zarr_gpu(path, device="cpu", **kw).compute(), ref[...])
    sel = (slice(3, 20), slice(7, 35, 3), 2)
    np.testing.assert_array_equal(gz.from_zarr_gpu(path, device="cpu", **kw)[sel].compute(), ref[sel])


def _transposed_sharded(path: str, location: str, order=(2, 0, 1)) -> None:
    """Shards of 12**3 transposed by ``order`` before sharding_indexed, inner chunks (3, 4, 6) in the transposed
    shard's axes (zarr-python checks them against the untransposed shard too, so the shard is a cube)."""
    zarr.create_array(path, shape=DATA.shape, chunks=(12, 12, 12), dtype="i4", zarr_format=3, fill_value=-1,
                      serializer=BytesCodec(), compressors=None)

    def change(doc):
        doc["codecs"] = [
            {"name": "transpose", "configuration": {"order": list(order)}},
            {"name": "sharding_indexed", "configuration": {
                "chunk_shape": [3, 4, 6],
                "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                           {"name": "zstd", "configuration": {"level": 1, "checksum": False}}],
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                "index_location": location}},
        ]

    _edit(path, change)
    z = zarr.open_array(path, mode="r+")
    z[:20, :30] = DATA[:20, :30]  # some inner chunks and one shard absent


@pytest.mark.parametrize("location", ["end", "start"])
@pytest.mark.parametrize("order", [(2, 0, 1), (1, 2, 0)])
def test_transpose_before_sharding_reads_as_zarr_python(tmp_path, location, order):
    path = str(tmp_path / "t.zarr")
    _transposed_sharded(path, location, order)
    _compare(path)
    _compare(path, chunks=(24, 12, 12))


def test_what_is_not_supported_around_sharding_says_so(tmp_path):
    from gpuzarr_dist.core.metadata import CodecSpec, _sharding

    shard = CodecSpec("sharding_indexed", {"chunk_shape": [2, 2], "codecs": [{"name": "bytes"}]})
    with pytest.raises(gz.MetadataError, match="not supported by gpuzarr-dist"):
        _sharding((CodecSpec("numcodecs.delta", {"dtype": "<i4"}), shard), (4, 4), "arr")
    with pytest.raises(gz.MetadataError, match="not supported by gpuzarr-dist"):
        _sharding((shard, CodecSpec("crc32c")), (4, 4), "arr")


def test_nested_sharding_reads_as_zarr_python(tmp_path):
    path = str(tmp_path / "n.zarr")
    zarr.create_array(path, shape=DATA.shape, chunks=(6, 6, 12), shards=(12, 12, 12), dtype="i4", zarr_format=3,
                      fill_value=-7)
    inner = ShardingCodec(chunk_shape=(3, 3, 4), codecs=[BytesCodec(), ZstdCodec()], index_location="start")
    _edit(path, lambda doc: doc["codecs"][0]["configuration"].__setitem__("codecs", [inner.to_dict()]))
    z = zarr.open_array(path, mode="r+")
    assert isinstance(z.metadata.codecs[0].codecs[0], ShardingCodec)
    z[:20, :25] = DATA[:20, :25]  # absent inner-inner chunks, inner chunks and shards
    _compare(path)
    _compare(path, chunks=(12, 12, 12))


# --------------------------------------------------------------------------- index entries against the object


def _one_shard_with_entry(path: str, size: int) -> str:
    """A one-shard array whose index claims ``size`` bytes for inner chunk 0; the shard's file path."""
    z = zarr.create_array(path, shape=(8, 8), chunks=(4, 4), shards=(8, 8), dtype="f8", zarr_format=3)
    z[:] = np.arange(64.0).reshape(8, 8)
    shard = os.path.join(path, "c", "0", "0")
    raw = bytearray(open(shard, "rb").read())
    index = raw[-(4 * 16 + 4):-4]
    off = struct.unpack_from("<Q", index, 0)[0]
    struct.pack_into("<QQ", index, 0, off, size)
    raw[-(4 * 16 + 4):] = bytes(index) + google_crc32c.value(bytes(index)).to_bytes(4, "little")
    open(shard, "wb").write(bytes(raw))
    return shard


def _read_block(source, huge: int) -> None:
    """Read every inner chunk of the one shard through the store, with a staging buffer that refuses to be sized
    from the bad entry (the pinned staging buffer on the GPU device is sized the same way)."""
    from gpuzarr_dist.stores.source import open_source

    store, spec = open_source(source)
    asked = []

    def staging(n: int):
        asked.append(n)
        assert n < huge, f"staging buffer of {n} bytes asked for"
        return np.empty(n, dtype=np.uint8)

    keys = spec.chunk_keys(np.array([[0, 0], [0, 1], [1, 0], [1, 1]]))
    try:
        store.read_into(keys, staging, 256, 0)
    finally:
        assert all(n < huge for n in asked)


def test_huge_index_entry_fails_before_allocating_local(tmp_path):
    path = str(tmp_path / "big.zarr")
    _one_shard_with_entry(path, 2**40)
    with pytest.raises(gz.ChunkDecodeError) as info:
        _read_block(path, 2**40)
    e = info.value
    assert path in str(e) and e.key.startswith("c/0/0[") and "c/0/0" in e.reason and "past the end" in e.reason
    with pytest.raises(gz.ChunkDecodeError):
        gz.from_zarr_gpu(path, device="cpu").compute()


def test_huge_index_entry_fails_before_allocating_any_store(tmp_path):
    import asyncio

    from zarr.core.buffer import default_buffer_prototype

    path = str(tmp_path / "big.zarr")
    _one_shard_with_entry(path, 2**40)
    store = zarr.storage.MemoryStore()
    src = zarr.storage.LocalStore(path)

    async def copy():
        async for key in src.list():
            await store.set(key, await src.get(key, prototype=default_buffer_prototype()))

    asyncio.run(copy())
    arr = zarr.open_array(store, mode="r")
    with pytest.raises(gz.ChunkDecodeError) as info:  # no object size up front here: the per-chunk bound
        _read_block(arr, 2**40)
    assert "c/0/0" in info.value.reason and str(2**40) in info.value.reason


# --------------------------------------------------------------------------- metadata documents


def test_deeply_nested_json_is_a_metadata_error_naming_the_document():
    deep = "[" * 200_000 + "]" * 200_000
    with pytest.raises(gz.MetadataError) as info:
        load_document('{"attributes": ' + deep + "}", "a.zarr/zarr.json")
    assert "a.zarr/zarr.json" in str(info.value) and "deeper" in str(info.value)
    with pytest.raises(gz.MetadataError, match="not valid JSON"):
        load_document("{", "a.zarr/.zattrs")
    assert load_document(b'{"a": ' + b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1) + b"}", "x") is not None


# --------------------------------------------------------------------------- the GPU device


@pytest.mark.gpu
@pytest.mark.parametrize("location", ["end", "start"])
def test_transpose_before_sharding_on_gpu(tmp_path, location):
    path = str(tmp_path / "t.zarr")
    _transposed_sharded(path, location)
    ref = zarr.open_array(path, mode="r")[...]
    got = gz.from_zarr_gpu(path, device="gpu", chunks=(24, 12, 12)).compute()
    np.testing.assert_array_equal(got.get(), ref)


@pytest.mark.gpu
def test_nested_sharding_on_gpu_decodes_on_host(tmp_path):
    import warnings

    path = str(tmp_path / "n.zarr")
    zarr.create_array(path, shape=DATA.shape, chunks=(6, 6, 12), shards=(12, 12, 12), dtype="i4", zarr_format=3,
                      fill_value=-7)
    inner = ShardingCodec(chunk_shape=(3, 3, 4), codecs=[BytesCodec(), ZstdCodec()])
    _edit(path, lambda doc: doc["codecs"][0]["configuration"].__setitem__("codecs", [inner.to_dict()]))
    zarr.open_array(path, mode="r+")[:20, :25] = DATA[:20, :25]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the one "no GPU decoder" warning
        got = gz.from_zarr_gpu(path, device="gpu").compute()
    np.testing.assert_array_equal(got.get(), zarr.open_array(path, mode="r")[...])
