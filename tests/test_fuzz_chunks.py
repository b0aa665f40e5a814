"""Fuzzing of chunk decoding on the CPU: random and mutated stored chunks for every CPU codec chain.

Each example damages one stored chunk (bit flips, truncation, extension,
overwritten bytes, random bytes, an empty chunk, a valid chunk of another
size) and decodes it with our pipeline and with zarr-python from the same
store. Ours must either raise :class:`~gpuzarr_dist.ChunkDecodeError` naming
the array and the chunk key, or return an array of the chunk's shape and dtype
equal to what zarr-python decodes from the same bytes. Decoding something that
zarr-python rejects counts as a silent wrong value and fails the test.

Deterministic in CI (``derandomize=True``, no example database).
"""

from __future__ import annotations

import warnings
import zlib

import numcodecs
import numpy as np
import pytest
import zarr
import zarr.codecs as zc
from conftest import assert_same, make_data
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import gpuzarr_dist as gz
from gpuzarr_dist.codecs.pipeline import CodecPipeline
from gpuzarr_dist.stores.source import open_source

FUZZ = dict(deadline=None, derandomize=True, database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
EXAMPLES_PER_CHAIN = 110

CHAINS = {
    "v3-raw-le": (3, "int32", {"compressors": None}),
    "v3-raw-be": (3, "float64", {"compressors": None, "serializer": zc.BytesCodec(endian="big")}),
    "v3-zstd": (3, "int32", {"compressors": [zc.ZstdCodec(level=1)]}),
    "v3-zstd-checksum": (3, "uint16", {"compressors": [zc.ZstdCodec(level=1, checksum=True)]}),
    "v3-gzip": (3, "float32", {"compressors": [zc.GzipCodec(level=1)]}),
    "v3-crc32c": (3, "int16", {"compressors": [zc.Crc32cCodec()]}),
    "v3-zstd-crc32c": (3, "int64", {"compressors": [zc.ZstdCodec(level=1), zc.Crc32cCodec()]}),
    "v3-blosc-lz4": (3, "float32", {"compressors": [zc.BloscCodec(cname="lz4", shuffle="shuffle")]}),
    "v3-blosc-zstd-bit": (3, "uint8", {"compressors": [zc.BloscCodec(cname="zstd", shuffle="bitshuffle")]}),
    "v3-transpose-zstd": (3, "complex64", {"compressors": [zc.ZstdCodec(level=1)], "filters": [zc.TransposeCodec(order=(1, 0))]}),
    "v2-zlib": (2, "<i4", {"compressors": numcodecs.Zlib(level=1)}),
    "v2-lz4": (2, ">f8", {"compressors": numcodecs.LZ4()}),
    "v2-zstd": (2, "<u4", {"compressors": numcodecs.Zstd(level=1)}),
    "v2-gzip": (2, "<i2", {"compressors": numcodecs.GZip(level=1)}),
    "v2-blosc": (2, "<f4", {"compressors": numcodecs.Blosc(cname="lz4", shuffle=numcodecs.Blosc.SHUFFLE)}),
    "v2-delta-zstd-F": (2, "<i4", {"compressors": numcodecs.Zstd(level=1), "filters": [numcodecs.Delta(dtype="<i4")], "order": "F"}),
    "v2-raw": (2, "<i8", {"compressors": None}),
}
SHAPE, CHUNKS = (6, 5), (3, 5)


class Chain:
    """One array written by zarr-python with one codec chain, in a memory store we damage."""

    def __init__(self, name: str):
        fmt, dtype, kw = CHAINS[name]
        self.store = zarr.storage.MemoryStore()
        self.data = make_data(dtype, SHAPE, seed=zlib.crc32(name.encode()) % 1000)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.arr = zarr.create_array(self.store, name="a", shape=SHAPE, chunks=CHUNKS, dtype=self.data.dtype,
                                         zarr_format=fmt, **kw)
            self.arr[...] = self.data
            # a chunk of another shape, encoded the same way: valid bytes of the wrong decoded size
            other = zarr.create_array(self.store, name="other", shape=(7, 5), chunks=(7, 5), dtype=self.data.dtype,
                                      zarr_format=fmt, **kw)
            other[...] = make_data(self.data.dtype, (7, 5), seed=3)
        cstore, self.spec = open_source(self.store, "a")
        self.pipeline = CodecPipeline(self.spec)
        self.key = self.spec.chunk_key((1, 0))
        self.good = self._get("a/" + self.key)
        self.wrong_size = self._get("other/" + self.spec.chunk_key((0, 0)))

    def _get(self, key: str) -> bytes:
        from zarr.core.buffer import default_buffer_prototype
        from zarr.core.sync import sync

        return sync(self.store.get(key, prototype=default_buffer_prototype())).to_bytes()

    def put(self, raw: bytes) -> None:
        from zarr.core.buffer import default_buffer_prototype
        from zarr.core.sync import sync

        sync(self.store.set("a/" + self.key, default_buffer_prototype().buffer.from_bytes(raw)))

    def zarr_decodes(self) -> np.ndarray | None:
        """What zarr-python reads for the damaged chunk, or ``None`` where it raises."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return np.asarray(zarr.open_array(self.store, path="a", mode="r")[3:6, :])
        except Exception:
            return None


_chains: dict[str, Chain] = {}


def _chain(name: str) -> Chain:
    if name not in _chains:
        _chains[name] = Chain(name)
    return _chains[name]


@st.composite
def damaged(draw, good: bytes, wrong_size: bytes):
    """Damaged versions of one stored chunk."""
    kind = draw(st.sampled_from(["flip", "flip", "truncate", "extend", "overwrite", "random", "empty",
                                 "wrong-size", "splice", "good"]))
    raw = bytearray(good)
    if kind == "flip":
        for _ in range(draw(st.integers(1, 8))):
            i = draw(st.integers(0, len(raw) - 1))
            raw[i] ^= 1 << draw(st.integers(0, 7))
    elif kind == "truncate":
        raw = raw[: draw(st.integers(0, len(raw) - 1))]
    elif kind == "extend":
        raw += draw(st.binary(min_size=1, max_size=64))
    elif kind == "overwrite":
        i = draw(st.integers(0, len(raw) - 1))
        patch = draw(st.binary(min_size=1, max_size=8))
        raw[i : i + len(patch)] = patch
    elif kind == "random":
        raw = bytearray(draw(st.binary(max_size=256)))
    elif kind == "empty":
        raw = bytearray()
    elif kind == "wrong-size":
        raw = bytearray(wrong_size)
    elif kind == "splice":
        i = draw(st.integers(0, len(raw)))
        raw = raw[:i] + bytearray(good)
    event(kind)
    return bytes(raw)


@pytest.mark.parametrize("chain", list(CHAINS))
@settings(max_examples=EXAMPLES_PER_CHAIN, **FUZZ)
@given(data=st.data())
def test_damaged_chunk_decodes_like_zarr_or_raises_chunk_decode_error(chain, data):
    c = _chain(chain)
    raw = data.draw(damaged(c.good, c.wrong_size), label="chunk")
    c.put(raw)
    expected = c.zarr_decodes()
    try:
        ours = c.pipeline.decode_chunk(raw, c.key)
    except gz.ChunkDecodeError as e:
        assert e.key == c.key and e.array == c.spec.name
        assert c.key in str(e) and c.spec.name in str(e)
        event("ChunkDecodeError" + (" (zarr-python decodes it)" if expected is not None else ""))
        return
    # decoded: the right shape and dtype, and what zarr-python reads from the same bytes
    assert isinstance(ours, np.ndarray)
    assert ours.shape == CHUNKS and ours.dtype == c.spec.dtype
    assert expected is not None, f"{chain}: decoded {len(raw)} bytes that zarr-python rejects: {raw[:40]!r}..."
    assert_same(np.asarray(ours), expected)
    event("decoded, equal to zarr-python")


GPU_CHAINS = [c for c in CHAINS if "blosc" not in c]  # blosc has no GPU decoder (it falls back to the CPU)


@pytest.mark.gpu
@pytest.mark.parametrize("chain", GPU_CHAINS)
@settings(max_examples=60, **FUZZ)
@given(data=st.data())
def test_gpu_damaged_chunk_decodes_like_zarr_or_raises_chunk_decode_error(chain, data):
    """The same cases through ``from_zarr_gpu(device="gpu")``: a batch of the damaged chunk and a good one."""
    c = _chain(chain)
    raw = data.draw(damaged(c.good, c.wrong_size), label="chunk")
    c.put(raw)
    expected = c.zarr_decodes()
    x = gz.from_zarr_gpu(c.store, "a", device="gpu", chunks=SHAPE)  # one block: the good chunk and the damaged one
    try:
        ours = x.compute().get()
    except gz.ChunkDecodeError as e:
        assert e.key == c.key, (e.key, str(e))
        event("ChunkDecodeError")
        return
    assert_same(ours[:3], c.data[:3])
    if expected is None and chain.endswith(("gzip", "zlib")):
        # bytes between the deflate stream and the checksum at the chunk's end (e.g. a second member or stream):
        # nvCOMP inflates the first deflate stream and the GPU checks it against the checksum and size at the
        # end of the chunk; zlib reads the trailer right after the stream and refuses. What the GPU returned
        # must then be exactly that deflate stream's content, inflated by zlib itself:
        inflate = zlib.decompressobj(-15)
        content = inflate.decompress(raw[10 if chain.endswith("gzip") else 2 :])
        assert inflate.eof, f"{chain}: the GPU decoded {len(raw)} bytes whose deflate stream zlib rejects: {raw[:40]!r}"
        assert_same(ours[3:6], np.frombuffer(content, dtype=c.spec.dtype).reshape(ours[3:6].shape))
        event("decoded the deflate stream; its trailer is not where zlib looks for it")
        return
    assert expected is not None, f"{chain}: the GPU decoded {len(raw)} bytes that zarr-python rejects: {raw[:40]!r}..."
    assert_same(ours[3:6], expected)
    event("decoded, equal to zarr-python")


@pytest.fixture(scope="module")
def sharded():
    """A sharded v3 array (2 shards of 2x2 inner zstd chunks, index with crc32c) in a memory store."""
    store = zarr.storage.MemoryStore()
    data = make_data("int16", (8, 4), seed=9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        arr = zarr.create_array(store, name="s", shape=(8, 4), chunks=(2, 2), shards=(4, 4), dtype="int16",
                                compressors=[zc.ZstdCodec(level=1)], zarr_format=3)
        arr[...] = data
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    good = sync(store.get("s/c/1/0", prototype=default_buffer_prototype())).to_bytes()
    return store, data, good


@settings(max_examples=150, **FUZZ)
@given(data=st.data())
def test_damaged_shard_reads_like_zarr_or_raises_chunk_decode_error(sharded, data):
    """Damage anywhere in a shard (its inner chunks or its index): our read equals zarr-python's, or names the shard."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    store, original, good = sharded
    raw = data.draw(damaged(good, good[: len(good) // 2]), label="shard")
    sync(store.set("s/c/1/0", default_buffer_prototype().buffer.from_bytes(raw)))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = np.asarray(zarr.open_array(store, path="s", mode="r")[4:8])
    except Exception:
        expected = None
    try:
        ours = gz.from_zarr_gpu(store, "s", device="cpu")[4:8].compute()
    except gz.ChunkDecodeError as e:
        assert e.key.startswith("c/1/0"), e.key
        event("ChunkDecodeError" + (" (zarr-python reads it)" if expected is not None else ""))
        return
    assert expected is not None, f"read a shard zarr-python rejects: {raw[-40:]!r}"
    assert_same(ours, expected)
    event("read, equal to zarr-python")
