"""Every codec numcodecs decodes is read: Zarr v2 ids and Zarr v3 ``numcodecs.*`` names, compared with zarr-python.

Arrays are written by zarr-python with numcodecs' codecs; what
``from_zarr_gpu(..., device="cpu")`` reads must equal what zarr-python reads.
Decoders bound their output: a chunk that decompresses to more than its
chunk's size fails with :class:`ChunkDecodeError` naming the array, the chunk
and the codec, without allocating what it claims.
"""

from __future__ import annotations

import bz2
import json
import lzma
import os
import tracemalloc
import warnings

import numcodecs
import numpy as np
import pytest
import zarr

import gpuzarr_dist as gz
from gpuzarr_dist.codecs import get_codec, known_codecs
from gpuzarr_dist.core.metadata import CodecSpec

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import zarr.codecs.numcodecs as zn

SHAPE, CHUNKS = (37, 26), (10, 8)  # edge chunks on both axes


def _data(dtype: str = "f4") -> np.ndarray:
    rng = np.random.default_rng(7)
    return (rng.standard_normal(SHAPE) * 100).astype(dtype)


def _same_as_zarr(path: str, **kw) -> np.ndarray:
    ref = zarr.open_array(path, mode="r")[...]
    got = gz.from_zarr_gpu(path, device="cpu", **kw).compute()
    assert got.shape == ref.shape
    np.testing.assert_array_equal(got, ref)
    return got


def _write(path: str, data: np.ndarray, fmt: int, **codecs) -> zarr.Array:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr-python warns on numcodecs.* codecs in v3 metadata
        z = zarr.create_array(path, shape=data.shape, chunks=CHUNKS, dtype=data.dtype, zarr_format=fmt,
                              fill_value=0, **codecs)
        z[:30] = data[:30]  # the last row of chunks is partly absent: fill values too
    return z


V2_CASES = {
    "bz2": dict(compressors=numcodecs.BZ2(level=5)),
    "lzma": dict(compressors=numcodecs.LZMA(preset=1)),
    "lzma-raw": dict(compressors=numcodecs.LZMA(format=lzma.FORMAT_RAW, filters=[{"id": lzma.FILTER_LZMA2, "preset": 1}])),
    "shuffle-filter": dict(filters=[numcodecs.Shuffle(elementsize=4)], compressors=numcodecs.Zlib(level=1)),
    "shuffle-compressor": dict(compressors=numcodecs.Shuffle(elementsize=4)),
    "bitround": dict(filters=[numcodecs.BitRound(keepbits=6)], compressors=numcodecs.Zstd(level=1)),
    "fixedscaleoffset": dict(filters=[numcodecs.FixedScaleOffset(offset=5, scale=10, dtype="f4", astype="i2")],
                             compressors=numcodecs.BZ2()),
    "quantize": dict(filters=[numcodecs.Quantize(digits=2, dtype="f4")], compressors=None),
    "astype": dict(filters=[numcodecs.AsType(encode_dtype="f8", decode_dtype="f4")], compressors=numcodecs.LZMA()),
    "fletcher32": dict(compressors=numcodecs.Fletcher32()),
    "crc32": dict(compressors=numcodecs.CRC32()),
    "adler32": dict(compressors=numcodecs.Adler32()),
    "jenkins_lookup3": dict(compressors=numcodecs.JenkinsLookup3()),
    "zlib-filter": dict(filters=[numcodecs.Zlib(level=1)], compressors=None),
    "two-filters": dict(filters=[numcodecs.Shuffle(elementsize=4), numcodecs.BZ2(level=1)], compressors=numcodecs.Zstd()),
}


@pytest.mark.parametrize("case", sorted(V2_CASES))
def test_v2_numcodecs_codecs_read_as_zarr_reads_them(tmp_path, case):
    path = str(tmp_path / "a.zarr")
    _write(path, _data(), 2, **V2_CASES[case])
    _same_as_zarr(path)
    _same_as_zarr(path, chunks=(20, 16))  # several chunks per block


@pytest.mark.parametrize("case", ["shuffle-filter", "fixedscaleoffset", "quantize", "astype", "two-filters"])
def test_v2_numcodecs_filters_on_big_endian_arrays(tmp_path, case):
    path = str(tmp_path / "be.zarr")
    kw = dict(V2_CASES[case])
    if case == "fixedscaleoffset":
        kw["filters"] = [numcodecs.FixedScaleOffset(offset=5, scale=10, dtype=">f4", astype="<i2")]
    elif case == "quantize":
        kw["filters"] = [numcodecs.Quantize(digits=2, dtype=">f4")]
    elif case == "astype":
        kw["filters"] = [numcodecs.AsType(encode_dtype=">f8", decode_dtype=">f4")]
    _write(path, _data(">f4"), 2, **kw)
    _same_as_zarr(path)


def test_v2_packbits_and_categorize(tmp_path):
    path = str(tmp_path / "bits.zarr")
    z = zarr.create_array(path, shape=(53,), chunks=(10,), dtype=bool, zarr_format=2, filters=[numcodecs.PackBits()],
                          compressors=numcodecs.BZ2())
    z[:] = np.arange(53) % 3 == 0
    got = _same_as_zarr(path)
    assert got.dtype == bool
    path = str(tmp_path / "delta.zarr")
    z = zarr.create_array(path, shape=(53,), chunks=(10,), dtype=">i4", zarr_format=2,
                          filters=[numcodecs.Delta(dtype=">i4")], compressors=numcodecs.LZMA())
    z[:] = np.arange(53) ** 2
    _same_as_zarr(path)


V3_CASES = {
    "bz2": dict(compressors=[zn.BZ2(level=3)]),
    "lzma": dict(compressors=[zn.LZMA()]),
    "shuffle": dict(compressors=[zn.Shuffle(elementsize=4), zn.Zlib(level=1)]),
    "bitround": dict(filters=[zn.BitRound(keepbits=8)], compressors=[zn.BZ2()]),
    "fixedscaleoffset": dict(filters=[zn.FixedScaleOffset(offset=0, scale=10, dtype="f4", astype="i4")], compressors=None),
    "quantize": dict(filters=[zn.Quantize(digits=3, dtype="f4")], compressors=[zn.LZMA()]),
    "astype": dict(filters=[zn.AsType(encode_dtype="f8", decode_dtype="f4")], compressors=None),
    "fletcher32": dict(compressors=[zn.Fletcher32()]),
    "crc32-after-lzma": dict(compressors=[zn.LZMA(), zn.CRC32()]),
    "adler32": dict(compressors=[zn.Adler32()]),
    "jenkins_lookup3": dict(compressors=[zn.JenkinsLookup3()]),
}


@pytest.mark.parametrize("case", sorted(V3_CASES))
def test_v3_numcodecs_names_read_as_zarr_reads_them(tmp_path, case):
    path = str(tmp_path / "a.zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _write(path, _data(), 3, **V3_CASES[case])
    names = [c["name"] for c in json.load(open(os.path.join(path, "zarr.json")))["codecs"]]
    assert any(n.startswith("numcodecs.") for n in names), names
    _same_as_zarr(path)


def test_v3_packbits(tmp_path):
    path = str(tmp_path / "bits.zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        z = zarr.create_array(path, shape=(53,), chunks=(10,), dtype=bool, zarr_format=3, filters=[zn.PackBits()],
                              compressors=[zn.BZ2()])
        z[:] = np.arange(53) % 4 == 1
    assert _same_as_zarr(path).dtype == bool


def test_native_decoders_stay_first_choice():
    from gpuzarr_dist.codecs.compressors import Zstd
    from gpuzarr_dist.codecs.numcodecs_codecs import NumcodecsBytesBytes

    assert type(get_codec(CodecSpec("zstd", {"level": 1}), "a")) is Zstd
    assert type(get_codec(CodecSpec("numcodecs.zstd", {"level": 1}), "a")) is Zstd
    assert type(get_codec(CodecSpec("bz2", {"level": 1}), "a")) is NumcodecsBytesBytes
    assert type(get_codec(CodecSpec("numcodecs.bz2", {"level": 1}), "a")) is NumcodecsBytesBytes


def test_unknown_codec_still_unsupported_and_lists_known(tmp_path):
    path = str(tmp_path / "u.zarr")
    _write(path, _data(), 2, compressors=numcodecs.BZ2())
    doc = json.load(open(os.path.join(path, ".zarray")))
    doc["compressor"] = {"id": "no_such_codec"}
    json.dump(doc, open(os.path.join(path, ".zarray"), "w"))
    spec = CodecSpec("no_such_codec", {}, "compressor")
    with pytest.raises(gz.UnsupportedCodecError) as info:
        get_codec(spec, "arr")
    assert "no_such_codec" in str(info.value) and "numcodecs.bz2" in str(info.value) and "lzma" in str(info.value)
    assert "numcodecs.bz2" in known_codecs() and "bz2" in known_codecs()


def test_invalid_numcodecs_configuration_is_metadata_error():
    with pytest.raises(gz.MetadataError, match="shuffle"):
        get_codec(CodecSpec("numcodecs.shuffle", {"no_such_option": 4}), "arr")


# --------------------------------------------------------------------------- bounded output


def _replace_chunk(path: str, key: str, raw: bytes) -> None:
    with open(os.path.join(path, key), "wb") as f:
        f.write(raw)


@pytest.mark.parametrize("codec", ["bz2", "lzma"])
def test_bomb_chunk_fails_without_allocating_its_claim(tmp_path, codec):
    path = str(tmp_path / "bomb.zarr")
    comp = numcodecs.BZ2() if codec == "bz2" else numcodecs.LZMA(preset=0)
    _write(path, _data(), 2, compressors=comp)
    claim = 256 << 20  # 256 MiB of zeros for a chunk of 320 bytes
    bomb = bz2.compress(bytes(claim), 9) if codec == "bz2" else lzma.compress(bytes(claim), preset=0)
    assert len(bomb) < 64 << 10
    _replace_chunk(path, "1.1", bomb)
    x = gz.from_zarr_gpu(path, device="cpu", chunks=CHUNKS)
    tracemalloc.start()
    try:
        with pytest.raises(gz.ChunkDecodeError) as info:
            x.compute(scheduler="sync")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    e = info.value
    assert e.key == "1.1" and e.codec == codec and path in str(e), str(e)
    assert "more than" in e.reason
    assert peak < 32 << 20, f"peak {peak} bytes"  # numcodecs' own decoder would hold 256 MiB here


def test_bomb_in_a_filter_fails_within_the_chunk_size(tmp_path):
    path = str(tmp_path / "bombf.zarr")
    _write(path, _data(), 2, filters=[numcodecs.BZ2()], compressors=None)
    _replace_chunk(path, "0.0", bz2.compress(bytes(64 << 20), 9))
    tracemalloc.start()
    try:
        with pytest.raises(gz.ChunkDecodeError) as info:
            gz.from_zarr_gpu(path, device="cpu").compute(scheduler="sync")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.key == "0.0" and info.value.codec == "bz2" and "more than" in info.value.reason
    assert peak < 16 << 20, f"peak {peak} bytes"


@pytest.mark.parametrize("codec", ["bz2", "lzma", "fletcher32"])
def test_short_or_corrupt_chunk_names_array_chunk_and_codec(tmp_path, codec):
    path = str(tmp_path / "short.zarr")
    comp = {"bz2": numcodecs.BZ2(), "lzma": numcodecs.LZMA(), "fletcher32": numcodecs.Fletcher32()}[codec]
    _write(path, _data(), 2, compressors=comp)
    _replace_chunk(path, "0.2", comp.encode(b"\x01" * 12))  # a valid stream of the wrong size
    with pytest.raises(gz.ChunkDecodeError) as info:
        gz.from_zarr_gpu(path, device="cpu").compute()
    assert info.value.key == "0.2" and info.value.codec == codec
    raw = open(os.path.join(path, "1.0"), "rb").read()
    _replace_chunk(path, "0.2", raw[: len(raw) // 2] + b"\xff" * 7)  # truncated and damaged
    with pytest.raises(gz.ChunkDecodeError) as info:
        gz.from_zarr_gpu(path, device="cpu").compute()
    assert info.value.key == "0.2" and info.value.codec == codec


def test_concatenated_bz2_streams_decode_as_numcodecs_does(tmp_path):
    path = str(tmp_path / "multi.zarr")
    _write(path, _data(), 2, compressors=numcodecs.BZ2())
    chunk = _data()[:10, :8].tobytes()
    _replace_chunk(path, "0.0", bz2.compress(chunk[:100]) + bz2.compress(chunk[100:]))
    got = gz.from_zarr_gpu(path, device="cpu").compute()
    np.testing.assert_array_equal(got, zarr.open_array(path, mode="r")[...])
    np.testing.assert_array_equal(got[:10, :8], _data()[:10, :8])


# --------------------------------------------------------------------------- the GPU device


@pytest.mark.gpu
def test_numcodecs_only_codec_on_gpu_decodes_on_host_with_one_warning(tmp_path):
    from gpuzarr_dist.cuda import blocks as reader_gpu

    path = str(tmp_path / "bz2.zarr")
    _write(path, _data(), 2, compressors=numcodecs.BZ2())
    reader_gpu._warned.discard("bz2")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = gz.from_zarr_gpu(path, device="gpu", chunks=(20, 16)).compute()
    msgs = [str(w.message) for w in caught if "no GPU decoder" in str(w.message)]
    assert len(msgs) == 1 and "'bz2'" in msgs[0], msgs
    np.testing.assert_array_equal(got.get(), zarr.open_array(path, mode="r")[...])
