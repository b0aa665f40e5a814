"""Arrays written by tensorstore (zarr3 and zarr v2 drivers) read the same through ``from_zarr_gpu``."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import assert_same, compute_checked, dev, make_data

import gpuzarr_dist as gz

ts = pytest.importorskip("tensorstore")

SHAPE = (11, 9, 5)
CHUNKS = [4, 3, 2]
SELECTIONS = [np.s_[...], np.s_[3:10, ::2], np.s_[5], np.s_[:, 7, 1:4], np.s_[::-2, 1:8:3, -1], np.s_[10:, 8:, 4:]]

pytestmark = pytest.mark.usefixtures("device")


def _write(path: str, driver: str, metadata: dict, seed: int, partial: bool) -> np.ndarray:
    """Create with tensorstore, write all of the array or part of it, return tensorstore's read."""
    spec = {
        "driver": driver,
        "kvstore": {"driver": "file", "path": path},
        "create": True,
        "delete_existing": True,
        "metadata": {"shape": list(SHAPE), **metadata},
    }
    arr = ts.open(spec).result()
    data = make_data(arr.dtype.numpy_dtype, SHAPE, seed=seed)
    if partial:  # leaves chunks that are never written (so read as the fill value)
        arr[1:6, 2:, :].write(data[1:6, 2:, :]).result()
    else:
        arr.write(data).result()
    expected = ts.open({"driver": driver, "kvstore": {"driver": "file", "path": path}, "open": True}).result()
    return expected.read().result()


def _chunk_files(path: str) -> int:
    meta = {"zarr.json", ".zarray", ".zattrs", ".zgroup"}
    return sum(1 for _, _, files in os.walk(path) for f in files if f not in meta)


def _zarr3(data_type: str, codecs: list, **extra) -> dict:
    return {
        "data_type": data_type,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": CHUNKS}},
        "codecs": codecs,
        **extra,
    }


def _bytes(endian="little"):
    return {"name": "bytes", "configuration": {"endian": endian}}


ZARR3 = {
    "float32-raw": _zarr3("float32", [_bytes()]),
    "int16-zstd": _zarr3("int16", [_bytes(), {"name": "zstd", "configuration": {"level": 3}}]),
    "float64-gzip": _zarr3("float64", [_bytes(), {"name": "gzip", "configuration": {"level": 6}}]),
    "uint16-crc32c": _zarr3("uint16", [_bytes(), {"name": "crc32c"}]),
    "int32-big-zstd-crc32c": _zarr3(
        "int32", [_bytes("big"), {"name": "zstd", "configuration": {"level": 1}}, {"name": "crc32c"}]
    ),
    "float32-transpose-big-blosc": _zarr3(
        "float32",
        [
            {"name": "transpose", "configuration": {"order": [2, 0, 1]}},
            _bytes("big"),
            {"name": "blosc", "configuration": {"cname": "zstd", "clevel": 3, "shuffle": "shuffle", "typesize": 4}},
        ],
        fill_value=5.5,
    ),
    "uint8-blosc-bitshuffle-lz4": _zarr3(
        "uint8",
        [_bytes(), {"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "bitshuffle", "typesize": 1}}],
    ),
    "int64-blosc-noshuffle-blosclz": _zarr3(
        "int64",
        [_bytes(), {"name": "blosc", "configuration": {"cname": "blosclz", "clevel": 9, "shuffle": "noshuffle", "typesize": 8}}],
        fill_value=-7,
    ),
    "complex64-transpose-gzip": _zarr3(
        "complex64",
        [{"name": "transpose", "configuration": {"order": [1, 2, 0]}}, _bytes(), {"name": "gzip", "configuration": {"level": 1}}],
    ),
    "bool-zstd": _zarr3("bool", [_bytes(), {"name": "zstd", "configuration": {"level": 1}}], fill_value=True),
    "float64-nan-fill-dot-keys": _zarr3(
        "float64",
        [_bytes(), {"name": "zstd", "configuration": {"level": 1}}],
        fill_value="NaN",
        chunk_key_encoding={"name": "default", "configuration": {"separator": "."}},
    ),
    "uint32-v2-keys": _zarr3(
        "uint32",
        [_bytes("big")],
        chunk_key_encoding={"name": "v2", "configuration": {"separator": "."}},
    ),
}


@pytest.mark.parametrize("partial", [False, True], ids=["full", "partial"])
@pytest.mark.parametrize("case", list(ZARR3))
def test_tensorstore_zarr3(tmp_path, case, partial):
    path = str(tmp_path / "ts3.zarr")
    expected = _write(path, "zarr3", ZARR3[case], seed=61, partial=partial)
    assert (_chunk_files(path) < 27) == partial  # 3 x 3 x 3 chunks; a partial write leaves some out
    x = gz.from_zarr_gpu(path, device=dev())
    for sel in SELECTIONS:
        assert_same(compute_checked(x[sel]), expected[sel])


def _zarr2(dtype: str, compressor, order="C", filters=None, **extra) -> dict:
    return {"dtype": dtype, "chunks": CHUNKS, "compressor": compressor, "order": order, "filters": filters, **extra}


ZARR2 = {
    "f8-raw": _zarr2("<f8", None),
    "f8-raw-F": _zarr2("<f8", None, "F"),
    "i4-big-zstd": _zarr2(">i4", {"id": "zstd", "level": 3}),
    "i4-big-zstd-F": _zarr2(">i4", {"id": "zstd", "level": 3}, "F", fill_value=3),
    "u1-zlib": _zarr2("|u1", {"id": "zlib", "level": 5}),
    "i2-gzip-F": _zarr2("<i2", {"id": "gzip", "level": 5}, "F"),
    "f4-blosc-lz4-noshuffle": _zarr2("<f4", {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 0}),
    "f4-blosc-zstd-shuffle-F": _zarr2("<f4", {"id": "blosc", "cname": "zstd", "clevel": 5, "shuffle": 1}, "F"),
    "u8-blosc-zlib-bitshuffle": _zarr2("<u8", {"id": "blosc", "cname": "zlib", "clevel": 5, "shuffle": 2}),
    "c8-blosc-blosclz": _zarr2("<c8", {"id": "blosc", "cname": "blosclz", "clevel": 5, "shuffle": 1}),
    "f8-nan-fill-slash": _zarr2("<f8", {"id": "zstd", "level": 1}, fill_value="NaN", dimension_separator="/"),
    "b1-null-fill": _zarr2("|b1", {"id": "zlib", "level": 1}, fill_value=None),
}


@pytest.mark.parametrize("partial", [False, True], ids=["full", "partial"])
@pytest.mark.parametrize("case", list(ZARR2))
def test_tensorstore_zarr2(tmp_path, case, partial):
    path = str(tmp_path / "ts2.zarr")
    expected = _write(path, "zarr", ZARR2[case], seed=62, partial=partial)
    assert (_chunk_files(path) < 27) == partial
    x = gz.from_zarr_gpu(path, device=dev())
    for sel in SELECTIONS:
        assert_same(compute_checked(x[sel]), expected[sel])
