"""Property-based tests: random arrays, partly written by zarr-python, read and sliced like zarr-python."""

from __future__ import annotations

import math
import os
import tempfile
import warnings

import dask.array as da
import numcodecs
import numpy as np
import pytest
import zarr
import zarr.codecs as zc
from conftest import assert_same, compute_checked, make_data, record_chunk_reads, touched_chunk_keys
from dask.array.core import normalize_chunks
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpuzarr_dist as gz

DTYPES_V3 = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "complex64", "complex128"]
DTYPES_V2 = DTYPES_V3 + [">i2", ">u4", ">i8", ">f4", ">f8", ">c16"]
# most chunks along each axis, so that no example writes hundreds of files
MAX_CHUNKS_PER_AXIS = {1: 8, 2: 5, 3: 3, 4: 2}

COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _scalar(draw, dtype: np.dtype):
    if dtype.kind == "b":
        return draw(st.booleans())
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return draw(st.integers(int(info.min), int(info.max)))
    if dtype.kind == "c":
        width = dtype.itemsize * 4  # bits of each of the two parts
        real = draw(st.floats(width=width, allow_nan=True, allow_infinity=True))
        imag = draw(st.floats(width=width, allow_nan=False, allow_infinity=False))
        return complex(real, imag)
    return draw(st.floats(width=dtype.itemsize * 8, allow_nan=True, allow_infinity=True))


def _data(draw, dtype: np.dtype, shape) -> np.ndarray:
    return make_data(dtype, shape, seed=draw(st.integers(0, 2**32 - 1)), specials=False)


@st.composite
def zarr_cases(draw):
    """A random array description: shape, chunks, dtype, format, codec, fill value and partial writes."""
    ndim = draw(st.integers(1, 4))
    shape = tuple(draw(st.integers(1, 12 if ndim <= 2 else 6)) for _ in range(ndim))
    most = MAX_CHUNKS_PER_AXIS[ndim]
    chunks = tuple(draw(st.integers(max(1, math.ceil(n / most)), n + 2)) for n in shape)
    fmt = draw(st.sampled_from([2, 3]))
    dtype = np.dtype(draw(st.sampled_from(DTYPES_V2 if fmt == 2 else DTYPES_V3)))
    fill = None if (fmt == 2 and draw(st.booleans())) else _scalar(draw, dtype)
    kwargs: dict = {}
    if fmt == 2:
        kwargs["order"] = draw(st.sampled_from("CF"))
        kwargs["compressors"] = draw(
            st.sampled_from([None, numcodecs.Zstd(level=1), numcodecs.Blosc(shuffle=numcodecs.Blosc.BITSHUFFLE), numcodecs.Zlib()])
        )
    else:
        kwargs["compressors"] = draw(st.sampled_from([None, [zc.ZstdCodec(level=1)], [zc.BloscCodec(cname="lz4", shuffle="shuffle")], [zc.GzipCodec(level=1)]]))
        if draw(st.booleans()):
            kwargs["serializer"] = zc.BytesCodec(endian="big")
        if ndim > 1 and draw(st.booleans()):
            kwargs["filters"] = [zc.TransposeCodec(order=tuple(draw(st.permutations(range(ndim)))))]
    # regions written: none, the whole array, or a few random boxes (partial chunks included)
    n_boxes = draw(st.integers(0, 3))
    boxes = []
    for _ in range(n_boxes):
        box = []
        for n in shape:
            a = draw(st.integers(0, n - 1))
            b = draw(st.integers(a + 1, n))
            box.append(slice(a, b))
        boxes.append(tuple(box))
    if draw(st.booleans()) and not boxes:
        boxes = [tuple(slice(None) for _ in shape)]
    data = _data(draw, dtype, shape)
    return {"shape": shape, "chunks": chunks, "fmt": fmt, "dtype": dtype, "fill": fill, "kwargs": kwargs, "boxes": boxes, "data": data}


def _write(store, case) -> zarr.Array:
    arr = zarr.create_array(
        store,
        shape=case["shape"],
        chunks=case["chunks"],
        dtype=case["dtype"],
        zarr_format=case["fmt"],
        fill_value=case["fill"],
        overwrite=True,
        **case["kwargs"],
    )
    for box in case["boxes"]:
        arr[box] = case["data"][box]
    return arr


def _axis_index(draw, n: int, allow_negative_step: bool = True, allow_int: bool = True):
    kinds = ["slice"] + (["int"] if allow_int else [])
    if draw(st.sampled_from(kinds)) == "int":
        return draw(st.integers(-n, n - 1))
    start = draw(st.one_of(st.none(), st.integers(-n - 2, n + 2)))
    stop = draw(st.one_of(st.none(), st.integers(-n - 2, n + 2)))
    steps = st.integers(1, 4) if not allow_negative_step else st.integers(-4, 4).filter(bool)
    step = draw(st.one_of(st.none(), steps))
    return slice(start, stop, step)


@st.composite
def selections(draw, shape, allow_negative_step=True, allow_int=True):
    sel = tuple(_axis_index(draw, n, allow_negative_step, allow_int) for n in shape)
    k = draw(st.integers(0, len(sel)))
    sel = sel[:k]  # trailing axes left out
    if draw(st.integers(0, 4)) == 0 and k < len(shape):
        sel = sel + (Ellipsis,)
    return sel


def _dask_slices_like_numpy(shape, sel) -> bool:
    """Whether dask itself gets the shape of ``sel`` right.

    dask 2026.8 mis-normalises some negative-step slices whose start lies
    before the array (``da.from_array(np.arange(5))[-7::-1]`` has 5 elements,
    numpy's has none); such selections say nothing about this library.
    """
    probe = da.from_array(np.empty(shape, dtype="u1"), chunks=-1)
    return probe[sel].shape == np.empty(shape, dtype="u1")[sel].shape


@settings(max_examples=160, **COMMON)
@given(case=zarr_cases(), data=st.data())
def test_random_arrays_read_and_slice_like_zarr(case, data):
    use_memory = data.draw(st.booleans(), label="memory store")
    with tempfile.TemporaryDirectory() as tmp:
        store = zarr.storage.MemoryStore() if use_memory else os.path.join(tmp, "a.zarr")
        arr = _write(store, case)
        expected = zarr.open_array(store, mode="r")[...]
        source = arr if use_memory else store
        x = gz.from_zarr_gpu(source, device="cpu")
        assert_same(compute_checked(x), expected)
        for _ in range(3):
            sel = data.draw(selections(case["shape"]), label="selection")
            if not _dask_slices_like_numpy(case["shape"], sel):
                continue
            assert_same(compute_checked(x[sel]), expected[sel])


@settings(max_examples=100, **COMMON)
@given(case=zarr_cases(), data=st.data())
def test_random_block_shapes(case, data):
    shape = case["shape"]
    blocks = tuple(data.draw(st.integers(1, n), label="block") for n in shape)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "a.zarr")
        _write(path, case)
        expected = zarr.open_array(path, mode="r")[...]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # blocks off the Zarr grid may warn
            x = gz.from_zarr_gpu(path, chunks=blocks, device="cpu")
        assert x.chunks == normalize_chunks(blocks, shape)
        assert_same(compute_checked(x), expected)
        sel = data.draw(selections(shape), label="selection")
        if _dask_slices_like_numpy(shape, sel):
            assert_same(compute_checked(x[sel]), expected[sel])


@settings(max_examples=100, **COMMON)
@given(case=zarr_cases(), data=st.data())
def test_random_slices_read_only_touched_chunks(case, data, monkeypatch_module):
    shape, chunks = case["shape"], case["chunks"]
    # blocks that are whole multiples of the Zarr chunks, so no chunk is shared by two blocks
    blocks = tuple(c * data.draw(st.integers(1, 3), label="chunks per block") for c in chunks)
    sel = data.draw(selections(shape, allow_negative_step=False), label="selection")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "a.zarr")
        _write(path, case)
        expected = zarr.open_array(path, mode="r")[...]
        x = gz.from_zarr_gpu(path, chunks=tuple(min(b, n) for b, n in zip(blocks, shape)), device="cpu")
        keys = monkeypatch_module
        keys.clear()
        assert_same(compute_checked(x[sel]), expected[sel])
        assert sorted(keys) == touched_chunk_keys(shape, chunks, sel, case["fmt"])


@pytest.fixture(scope="module")
def monkeypatch_module():
    """Record the chunk keys read (module-wide, reset per example)."""
    mp = pytest.MonkeyPatch()
    yield record_chunk_reads(mp)
    mp.undo()
