"""Arrays written by zarr-python read element for element the same through ``from_zarr_gpu``.

A matrix over data types, byte orders, shapes (1-d to 5-d, edge chunks), both
Zarr formats, every codec the registry claims, fill values and missing chunks.
"""

from __future__ import annotations

import numcodecs
import numpy as np
import pytest
import zarr.codecs as zc
from conftest import ALL_DTYPES, assert_same, compute_checked, dev, make_data

import gpuzarr_dist as gz

zn = pytest.importorskip("zarr.codecs.numcodecs")

pytestmark = pytest.mark.usefixtures("device")


def read(path: str, **kw) -> np.ndarray:
    return compute_checked(gz.from_zarr_gpu(path, device=dev(), **kw))


# --------------------------------------------------------------------------- data types


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("zarr_format", [2, 3])
def test_dtypes(zarr_writer, zarr_format, dtype):
    data = make_data(dtype, (11, 7), seed=1)
    path, expected = zarr_writer(data, (4, 3), zarr_format=zarr_format)
    assert_same(read(path), expected)
    assert_same(expected, data)  # the reference itself round-tripped (guards the fixture)


@pytest.mark.parametrize("endian", ["little", "big"])
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_v3_bytes_codec_endian(zarr_writer, dtype, endian):
    data = make_data(dtype, (9, 5), seed=2)
    path, expected = zarr_writer(data, (4, 2), serializer=zc.BytesCodec(endian=endian), compressors=None)
    assert_same(read(path), expected)


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", [">i2", ">i4", ">i8", ">u4", ">u8", ">f2", ">f4", ">f8", ">c8", ">c16"])
def test_v2_big_endian(zarr_writer, dtype, order):
    data = make_data(dtype, (10, 6), seed=3)
    assert data.dtype.byteorder == ">"
    path, expected = zarr_writer(data, (3, 4), zarr_format=2, order=order)
    assert_same(read(path), expected)


# --------------------------------------------------------------------------- shapes and layouts

SHAPES = [
    ((10,), (3,)),
    ((5,), (8,)),  # one chunk larger than the array
    ((1,), (1,)),
    ((7, 5), (3, 2)),
    ((6, 4), (6, 4)),  # exactly one chunk
    ((5, 4, 3), (2, 3, 2)),
    ((4, 3, 5, 2), (3, 2, 2, 1)),
    ((3, 4, 2, 3, 2), (2, 3, 1, 2, 2)),
    ((2, 3, 4, 5, 3), (2, 2, 3, 2, 3)),
]


@pytest.mark.parametrize("shape,chunks", SHAPES, ids=[f"{s}-{c}" for s, c in SHAPES])
@pytest.mark.parametrize("layout", ["v3", "v2-C", "v2-F"])
def test_shapes_and_edge_chunks(zarr_writer, shape, chunks, layout):
    fmt = 3 if layout == "v3" else 2
    kw = {"order": layout[-1]} if fmt == 2 else {}
    data = make_data("int32", shape, seed=len(shape))
    path, expected = zarr_writer(data, chunks, zarr_format=fmt, **kw)
    assert_same(read(path), expected)


KEY_ENCODINGS = [
    (3, {"name": "default", "separator": "/"}),
    (3, {"name": "default", "separator": "."}),
    (3, {"name": "v2", "separator": "."}),
    (3, {"name": "v2", "separator": "/"}),
    (2, {"name": "v2", "separator": "."}),
    (2, {"name": "v2", "separator": "/"}),
]


@pytest.mark.parametrize("zarr_format,encoding", KEY_ENCODINGS, ids=lambda v: str(v))
def test_chunk_key_encodings(zarr_writer, zarr_format, encoding):
    data = make_data("float32", (7, 6, 5), seed=4)
    path, expected = zarr_writer(data, (3, 4, 2), zarr_format=zarr_format, chunk_key_encoding=encoding, which="some")
    assert_same(read(path), expected)


# --------------------------------------------------------------------------- codecs, Zarr v3


def _blosc_v3():
    out = {}
    for cname in ["lz4", "zstd", "zlib", "blosclz"]:
        for shuffle in ["noshuffle", "shuffle", "bitshuffle"]:
            out[f"blosc-{cname}-{shuffle}"] = {"compressors": [zc.BloscCodec(cname=cname, clevel=5, shuffle=shuffle)]}
    return out


V3_CODECS = {
    "none": {"compressors": None},
    "zstd": {"compressors": [zc.ZstdCodec(level=1)]},
    "zstd-level9-checksum": {"compressors": [zc.ZstdCodec(level=9, checksum=True)]},
    "gzip": {"compressors": [zc.GzipCodec(level=5)]},
    "crc32c": {"compressors": [zc.Crc32cCodec()]},
    "zstd+crc32c": {"compressors": [zc.ZstdCodec(level=3), zc.Crc32cCodec()]},
    "transpose": {"filters": [zc.TransposeCodec(order=(1, 2, 0))], "compressors": [zc.ZstdCodec()]},
    "transpose-reverse-big": {
        "filters": [zc.TransposeCodec(order=(2, 1, 0))],
        "serializer": zc.BytesCodec(endian="big"),
        "compressors": None,
    },
    "transpose-big-gzip-crc32c": {
        "filters": [zc.TransposeCodec(order=(0, 2, 1))],
        "serializer": zc.BytesCodec(endian="big"),
        "compressors": [zc.GzipCodec(), zc.Crc32cCodec()],
    },
    "numcodecs.zlib": {"compressors": [zn.Zlib(level=3)]},
    "numcodecs.lz4": {"compressors": [zn.LZ4()]},
    "numcodecs.zstd": {"compressors": [zn.Zstd(level=2)]},
    "numcodecs.gzip": {"compressors": [zn.GZip(level=4)]},
    "numcodecs.blosc": {"compressors": [zn.Blosc(cname="zstd", clevel=3, shuffle=numcodecs.Blosc.BITSHUFFLE)]},
    "numcodecs.crc32c": {"compressors": [zn.CRC32C()]},
    "numcodecs.delta": {"delta": True, "compressors": [zc.ZstdCodec()]},
    **_blosc_v3(),
}


@pytest.mark.parametrize("dtype", ["uint8", "int16", "float32", "float64"])
@pytest.mark.parametrize("codec", list(V3_CODECS))
def test_v3_codecs(zarr_writer, codec, dtype):
    kw = dict(V3_CODECS[codec])
    delta = kw.pop("delta", False)
    if delta:
        kw["filters"] = [zn.Delta(dtype=dtype)]
    data = make_data(dtype, (9, 8, 5), seed=5, specials=not delta)
    path, expected = zarr_writer(data, (4, 3, 2), zarr_format=3, **kw)
    assert_same(read(path), expected)


# --------------------------------------------------------------------------- codecs, Zarr v2


def _v2_codecs():
    out = {
        "none": {"compressor": None},
        "zstd": {"compressor": numcodecs.Zstd(level=1)},
        "gzip": {"compressor": numcodecs.GZip(level=5)},
        "zlib": {"compressor": numcodecs.Zlib(level=3)},
        "lz4": {"compressor": numcodecs.LZ4()},
        "delta": {"delta": True, "compressor": None},
        "delta+zlib": {"delta": True, "compressor": numcodecs.Zlib()},
    }
    for cname in ["lz4", "zstd", "zlib", "blosclz"]:
        for sname, shuffle in [("noshuffle", 0), ("shuffle", 1), ("bitshuffle", 2)]:
            out[f"blosc-{cname}-{sname}"] = {"compressor": numcodecs.Blosc(cname=cname, clevel=5, shuffle=shuffle)}
    return out


V2_CODECS = _v2_codecs()


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", ["uint8", "<i4", ">f8"])
@pytest.mark.parametrize("codec", list(V2_CODECS))
def test_v2_codecs(zarr_writer, codec, dtype, order):
    kw = dict(V2_CODECS[codec])
    delta = kw.pop("delta", False)
    if delta:
        kw["filters"] = [numcodecs.Delta(dtype=dtype)]
    comp = kw.pop("compressor")
    data = make_data(dtype, (9, 8, 5), seed=6, specials=not delta)
    path, expected = zarr_writer(data, (4, 3, 2), zarr_format=2, order=order, compressors=comp, **kw)
    assert_same(read(path), expected)


@pytest.mark.parametrize("dtype", ["int16", "int64", "float32"])
def test_v3_delta_big_endian(zarr_writer, dtype):
    # zarr-python 3.1.6 itself misreads numcodecs.delta followed by bytes(endian=big), so the
    # stored bytes are checked against numpy's deltas, and numpy's cumulative sum is the reference.
    data = make_data(dtype, (4, 6), seed=10, specials=False)
    path, _ = zarr_writer(
        data, (4, 6), filters=[zn.Delta(dtype=dtype)], serializer=zc.BytesCodec(endian="big"), compressors=None
    )
    flat = data.ravel()
    deltas = np.concatenate([flat[:1], np.diff(flat)]).astype(np.dtype(dtype).newbyteorder(">"))
    with open(f"{path}/c/0/0", "rb") as f:
        assert f.read() == deltas.tobytes()
    expected = np.cumsum(deltas.astype(dtype), dtype=dtype).reshape(data.shape)
    assert_same(read(path), expected)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_delta_with_astype(zarr_writer, zarr_format):
    rng = np.random.default_rng(7)
    data = np.cumsum(rng.integers(-50, 50, size=(12, 10)), axis=1).astype("int32")
    if zarr_format == 2:
        kw = {"filters": [numcodecs.Delta(dtype="<i4", astype="<i2")], "compressors": numcodecs.Zstd()}
    else:
        kw = {"filters": [zn.Delta(dtype="int32", astype="int16")]}
    path, expected = zarr_writer(data, (5, 4), zarr_format=zarr_format, **kw)
    assert_same(read(path), expected)


# --------------------------------------------------------------------------- fill values, missing chunks

FILLS = [
    (3, "int32", 42),
    (3, "uint8", 42),
    (3, "int64", np.iinfo("int64").min),
    (3, "uint64", np.iinfo("uint64").max),
    (3, "float16", np.nan),
    (3, "float32", np.nan),
    (3, "float64", np.nan),
    (3, "float64", -np.inf),
    (3, "float32", 42.5),
    (3, "bool", True),
    (3, "complex64", 1 + 2j),
    (3, "complex128", complex(np.nan, 0)),
    (2, "int32", None),
    (2, "float64", None),
    (2, "bool", None),
    (2, "complex64", None),
    (2, "int16", 42),
    (2, "uint32", 42),
    (2, "float32", np.nan),
    (2, "float64", 42.25),
    (2, "bool", True),
    (2, "complex128", 3 - 4j),
    (2, ">i4", 42),
    (2, ">f8", np.nan),
]


@pytest.mark.parametrize("which", ["some", "none"])
@pytest.mark.parametrize("zarr_format,dtype,fill", FILLS, ids=[f"v{f}-{d}-{v}" for f, d, v in FILLS])
def test_fill_value_for_missing_chunks(zarr_writer, zarr_format, dtype, fill, which):
    data = make_data(dtype, (10, 7), seed=8, specials=False)
    path, expected = zarr_writer(data, (3, 3), zarr_format=zarr_format, fill_value=fill, which=which)
    if which == "some":  # the store really lacks some chunks, and holds others
        assert not np.array_equal(expected, data, equal_nan=data.dtype.kind in "fc")
    assert_same(read(path), expected)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_fill_value_with_sliced_read(zarr_writer, zarr_format):
    data = make_data("float64", (12, 9), seed=9, specials=False)
    path, expected = zarr_writer(data, (5, 4), zarr_format=zarr_format, fill_value=np.nan, which=[(0, 0), (2, 1)])
    x = gz.from_zarr_gpu(path, device=dev())
    for sel in [np.s_[3:11, 2:7], np.s_[10:, :], np.s_[:, 8], np.s_[4:6, ::3]]:
        assert_same(compute_checked(x[sel]), expected[sel])


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("shape,chunks", [((0,), (4,)), ((0, 3), (2, 2)), ((4, 0, 2), (2, 1, 2))])
def test_zero_size_arrays(zarr_writer, zarr_format, shape, chunks):
    data = np.zeros(shape, dtype="int16")
    path, expected = zarr_writer(data, chunks, zarr_format=zarr_format)
    x = gz.from_zarr_gpu(path, device=dev())
    assert x.shape == expected.shape
    assert_same(compute_checked(x), expected)
