"""Shared helpers for the CPU test suite.

Every test compares what ``gpuzarr_dist.from_zarr_gpu`` reads with what an
independent implementation reads from the same store (zarr-python here,
tensorstore in ``test_tensorstore.py``), or with numpy applied to that read.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterable, Sequence
from typing import Any

import dask
import numpy as np
import pytest
import zarr

import gpuzarr_dist

# The suite's arrays are small: with the default ``gpuzarr.gpu.min-batch(-chunks)`` their GPU batches would all be
# decoded and encoded on the CPU. Every GPU batch goes to nvCOMP here, as a large one does, unless a test
# sets the key itself (tests/test_min_batch.py).
dask.config.set({"gpuzarr.gpu.min-batch": 0, "gpuzarr.gpu.min-batch-chunks": 0})

# --------------------------------------------------------------------------- hooks


def pytest_configure(config: pytest.Config) -> None:
    # zarr-python warns on every numcodecs.* codec it writes into Zarr v3 metadata;
    # the tests write such arrays on purpose.
    config.addinivalue_line(
        "filterwarnings", "ignore:Numcodecs codecs are not in the Zarr version 3 specification:UserWarning"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``gpu`` where no usable GPU stack is present, saying why."""
    if gpuzarr_dist.gpu_available():
        return
    from gpuzarr_dist.cuda.device import gpu_status

    skip = pytest.mark.skip(reason=f"needs a usable GPU: {gpu_status()[1]}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# --------------------------------------------------------------------------- data

ALL_DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]


def make_data(dtype: Any, shape: Sequence[int], seed: int = 0, specials: bool = True) -> np.ndarray:
    """Random data of ``dtype`` covering the whole value range (and NaN/inf for floats)."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    n = math.prod(shape)
    if dt.kind == "b":
        flat = rng.random(n) > 0.5
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        flat = rng.integers(info.min, info.max, size=n, endpoint=True, dtype=dt.newbyteorder("="))
    elif dt.kind == "f":
        flat = (rng.standard_normal(n) * 1000).astype(dt.newbyteorder("="))
        if specials and n >= 4:
            flat[rng.choice(n, 3, replace=False)] = [np.nan, np.inf, -np.inf]
    elif dt.kind == "c":
        real = np.dtype(f"f{dt.itemsize // 2}")
        flat = (rng.standard_normal(n) * 1000).astype(real) + 1j * (rng.standard_normal(n) * 1000).astype(real)
        flat = flat.astype(dt.newbyteorder("="))
        if specials and n >= 2:
            flat[rng.integers(n)] = complex(np.nan, 1.0)
    else:  # pragma: no cover - the tests only use the kinds above
        raise ValueError(dt)
    return flat.reshape(shape).astype(dt)


def chunk_regions(shape: Sequence[int], chunks: Sequence[int]) -> list[tuple[tuple[int, ...], tuple[slice, ...]]]:
    """``(grid coords, region)`` of every chunk of an array, edge chunks trimmed."""
    grid = [range(math.ceil(s / c)) for s, c in zip(shape, chunks)]
    out = []
    for coords in itertools.product(*grid):
        region = tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(coords, chunks, shape))
        out.append((coords, region))
    return out


def write_array(
    store: Any,
    data: np.ndarray,
    chunks: Sequence[int],
    *,
    name: str | None = None,
    zarr_format: int = 3,
    which: str | Iterable[tuple[int, ...]] = "all",
    fill_value: Any = "default",
    **create_kwargs: Any,
) -> zarr.Array:
    """Write ``data`` with zarr-python and return the (zarr-python) array.

    ``which``: "all" writes every chunk, "some" every other chunk (a
    checkerboard, so the first chunk is written and its neighbour is not),
    "none" no chunk at all, or an explicit iterable of chunk grid coordinates.
    ``fill_value="default"`` leaves zarr-python's default.
    """
    kwargs = dict(create_kwargs)
    if fill_value != "default":
        kwargs["fill_value"] = fill_value
    arr = zarr.create_array(
        store,
        name=name,
        shape=data.shape,
        chunks=tuple(chunks),
        dtype=data.dtype,
        zarr_format=zarr_format,
        overwrite=True,
        **kwargs,
    )
    if which == "all":
        if data.size:
            arr[...] = data
        return arr
    if which == "none":
        return arr
    if which == "some":
        chosen = {c for c, _ in chunk_regions(data.shape, chunks) if sum(c) % 2 == 0}
    else:
        chosen = {tuple(c) for c in which}
    for coords, region in chunk_regions(data.shape, chunks):
        if coords in chosen:
            arr[region] = data[region]
    return arr


def reference(store: Any, path: str | None = None) -> np.ndarray:
    """The whole array as zarr-python reads it, from a freshly opened handle."""
    kw = {"path": path} if path else {}
    return zarr.open_array(store, mode="r", **kw)[...]


def assert_same(actual: Any, expected: np.ndarray) -> None:
    """Same shape, same numeric dtype (byte order aside) and the same elements (NaN == NaN)."""
    assert isinstance(actual, np.ndarray), type(actual)
    assert actual.shape == expected.shape
    assert actual.dtype.newbyteorder("=") == expected.dtype.newbyteorder("="), (actual.dtype, expected.dtype)
    np.testing.assert_array_equal(actual, expected, strict=False)


def record_chunk_reads(mp: pytest.MonkeyPatch) -> list[str]:
    """Patch ``LocalChunkStore`` so every chunk key read (CPU ``read_many``, GPU ``read_into``) is recorded."""
    import threading

    from gpuzarr_dist.stores.local import LocalChunkStore

    keys: list[str] = []
    lock = threading.Lock()
    original, original_into = LocalChunkStore.read_many, LocalChunkStore.read_into

    def read_many(self, ks):
        with lock:
            keys.extend(ks)
        return original(self, ks)

    def read_into(self, ks, *args, **kwargs):
        with lock:
            keys.extend(ks)
        return original_into(self, ks, *args, **kwargs)

    mp.setattr(LocalChunkStore, "read_many", read_many)
    mp.setattr(LocalChunkStore, "read_into", read_into)
    return keys


# --------------------------------------------------------------------------- devices

_device = ["cpu"]


def dev() -> str:
    """The device the current test reads on (set by the ``device`` fixture)."""
    return _device[0]


@pytest.fixture(params=["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def device(request: pytest.FixtureRequest):
    """Run a test once per device; modules opt in with ``pytestmark = pytest.mark.usefixtures("device")``.

    The GPU case is marked ``gpu`` (skipped without one) and checks that blocks are cupy arrays.
    """
    _device[0] = request.param
    yield request.param
    _device[0] = "cpu"


def compute_checked(x: Any) -> np.ndarray:
    """Compute a dask array and check the result agrees with its declared shape and dtype.

    On the GPU device the result must be a cupy array; it is copied to the host for comparison.
    """
    out = x.compute()
    if dev() == "gpu":
        import cupy

        assert isinstance(out, cupy.ndarray), type(out)
        assert isinstance(x._meta, cupy.ndarray), type(x._meta)
        out = out.get()
    assert isinstance(out, np.ndarray), type(out)
    assert out.shape == x.shape
    assert out.dtype == x.dtype
    return out


def chunk_key(coords: Sequence[int], zarr_format: int, separator: str | None = None) -> str:
    """The store key of a chunk under the default key encoding of each format."""
    if zarr_format == 3:
        sep = separator or "/"
        return sep.join(["c", *map(str, coords)])
    sep = separator or "."
    return sep.join(map(str, coords)) if coords else "0"


def touched_chunk_keys(
    shape: Sequence[int], chunks: Sequence[int], selection: Any, zarr_format: int
) -> list[str]:
    """Keys of the chunks holding the elements ``selection`` picks, found by numpy on an index grid."""
    # select on an array of flat positions, then map the picked positions back to coordinates
    positions = np.arange(math.prod(shape)).reshape(shape)[selection]
    coords = np.unravel_index(np.asarray(positions).ravel(), shape)
    chunk_coords = set(zip(*(co // c for co, c in zip(coords, chunks))))
    return sorted(chunk_key(tuple(int(v) for v in cc), zarr_format) for cc in chunk_coords)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def store_path(tmp_path: Any) -> str:
    """A fresh path for one Zarr store."""
    return os.path.join(str(tmp_path), "data.zarr")


@pytest.fixture
def zarr_writer(tmp_path: Any):
    """``zarr_writer(data, chunks, **kw) -> (path, expected)``: write with zarr-python, read back with it."""
    counter = itertools.count()

    def write(data: np.ndarray, chunks: Sequence[int], **kwargs: Any) -> tuple[str, np.ndarray]:
        path = os.path.join(str(tmp_path), f"a{next(counter)}.zarr")
        write_array(path, data, chunks, **kwargs)
        return path, reference(path)

    return write


def slow_calls(mp: pytest.MonkeyPatch, module: Any, name: str, seconds: float = 0.02) -> None:
    """``module.name`` sleeps before each call: other threads queue behind one call and join the next
    (the tests of :mod:`gpuzarr_dist.cuda.combine`'s joined calls)."""
    import time

    real = getattr(module, name)

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(seconds)
        return real(*args, **kwargs)

    mp.setattr(module, name, slow)
