"""The public surface: sources, ``device=``, ``chunks=``, the dask registration, import hygiene."""

from __future__ import annotations

import itertools
import math
import os
import pathlib
import subprocess
import sys

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from conftest import assert_same, compute_checked, make_data, reference, write_array
from dask.array.core import normalize_chunks

import gpuzarr_dist as gz

REPO = pathlib.Path(__file__).resolve().parent.parent


def blocks_are_numpy(x: da.Array) -> bool:
    blocks = dask.compute(*x.to_delayed().ravel())
    return all(type(b) is np.ndarray for b in blocks)


# --------------------------------------------------------------------------- registration, import


def test_registered_on_dask_array():
    assert da.from_zarr_gpu is gz.from_zarr_gpu


def test_dask_array_from_zarr_gpu_reads(zarr_writer):
    data = make_data("float32", (9, 4), seed=1)
    path, expected = zarr_writer(data, (4, 4))
    x = da.from_zarr_gpu(path, device="cpu")
    assert isinstance(x, da.Array)
    assert_same(compute_checked(x), expected)


def test_import_does_not_import_cupy():
    code = "import gpuzarr_dist, sys; assert 'cupy' not in sys.modules, 'cupy was imported'"
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


def test_building_and_reading_on_cpu_does_not_import_cupy(tmp_path):
    code = (
        "import sys, numpy as np, zarr, gpuzarr_dist as gz\n"
        f"p = {str(tmp_path / 'a.zarr')!r}\n"
        "a = zarr.create_array(p, shape=(6,), chunks=(4,), dtype='i4'); a[:] = np.arange(6)\n"
        "x = gz.from_zarr_gpu(p, device='auto')\n"
        "assert (x.compute() == np.arange(6)).all()\n"
        "assert 'cupy' not in sys.modules, 'cupy was imported'\n"
    )
    if gz.gpu_available():
        pytest.skip("device='auto' picks the GPU here")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


# --------------------------------------------------------------------------- device


def test_device_cpu_gives_numpy_blocks(zarr_writer):
    data = make_data("int16", (10, 6), seed=2)
    path, expected = zarr_writer(data, (3, 4))
    x = gz.from_zarr_gpu(path, device="cpu", chunks=(3, 4))
    assert type(x._meta) is np.ndarray
    assert blocks_are_numpy(x)
    assert_same(compute_checked(x), expected)


def test_device_auto_without_gpu_gives_numpy_blocks(zarr_writer):
    if gz.gpu_available():
        pytest.skip("a GPU is usable here: device='auto' picks it")
    data = make_data("float64", (10, 6), seed=3)
    path, expected = zarr_writer(data, (3, 4))
    x = gz.from_zarr_gpu(path, chunks=(6, 4))  # device="auto" is the default
    assert blocks_are_numpy(x)
    assert_same(compute_checked(x), expected)
    assert_same(compute_checked(gz.from_zarr_gpu(path, device="auto")), expected)


def test_device_gpu_without_gpu_raises(zarr_writer):
    if gz.gpu_available():
        pytest.skip("a GPU is usable here")
    path, _ = zarr_writer(make_data("int8", (4,)), (2,))
    with pytest.raises(gz.DeviceUnavailableError):
        gz.from_zarr_gpu(path, device="gpu")


@pytest.mark.gpu
def test_device_gpu_reads_like_zarr(zarr_writer):
    cupy = pytest.importorskip("cupy")
    data = make_data("float32", (10, 6), seed=17)
    path, expected = zarr_writer(data, (3, 4), which="some", fill_value=np.nan)
    x = gz.from_zarr_gpu(path, device="gpu", chunks=(6, 4))
    blocks = dask.compute(*x.to_delayed().ravel())
    assert all(isinstance(b, cupy.ndarray) for b in blocks)
    assert_same(cupy.asnumpy(x.compute()), expected)
    assert_same(cupy.asnumpy(x[3:9, ::2].compute()), expected[3:9, ::2])


def test_unknown_device_is_rejected(zarr_writer):
    path, _ = zarr_writer(make_data("int8", (4,)), (2,))
    with pytest.raises(ValueError, match="tpu"):
        gz.from_zarr_gpu(path, device="tpu")


# --------------------------------------------------------------------------- sources


@pytest.fixture(params=[2, 3], ids=["v2", "v3"])
def fmt(request):
    return request.param


@pytest.fixture
def local_array(tmp_path, fmt):
    data = make_data("float32", (9, 7), seed=4)
    path = str(tmp_path / "arr.zarr")
    write_array(path, data, (4, 3), zarr_format=fmt, which="some", fill_value=-1.5)
    return path, reference(path)


def test_source_str_path(local_array):
    path, expected = local_array
    assert_same(compute_checked(gz.from_zarr_gpu(path, device="cpu")), expected)


def test_source_relative_path(local_array, monkeypatch):
    path, expected = local_array
    monkeypatch.chdir(os.path.dirname(path))
    assert_same(compute_checked(gz.from_zarr_gpu("arr.zarr", device="cpu")), expected)


def test_source_file_url(local_array):
    path, expected = local_array
    url = pathlib.Path(path).as_uri()
    assert url.startswith("file://")
    assert_same(compute_checked(gz.from_zarr_gpu(url, device="cpu")), expected)


def test_source_pathlib(local_array):
    path, expected = local_array
    assert_same(compute_checked(gz.from_zarr_gpu(pathlib.Path(path), device="cpu")), expected)


def test_source_zarr_array_local(local_array):
    path, expected = local_array
    arr = zarr.open_array(path, mode="r")
    assert_same(compute_checked(gz.from_zarr_gpu(arr, device="cpu")), expected)


def test_source_zarr_array_in_memory_store(fmt):
    store = zarr.storage.MemoryStore()
    data = make_data("int32", (10, 5), seed=5)
    arr = write_array(store, data, (3, 2), zarr_format=fmt, which="some", fill_value=7)
    expected = reference(store)
    assert_same(compute_checked(gz.from_zarr_gpu(arr, device="cpu")), expected)


@pytest.mark.parametrize("component", ["a", "grp/a", "g1/g2/a"])
def test_source_memory_store_with_component(fmt, component):
    store = zarr.storage.MemoryStore()
    root = zarr.open_group(store, mode="w", zarr_format=fmt)
    for part in component.split("/")[:-1]:
        root = root.require_group(part)
    data = make_data("float64", (8, 6), seed=6)
    write_array(store, data, (3, 4), name=component, zarr_format=fmt, which="some", fill_value=np.nan)
    expected = reference(store, component)
    assert_same(compute_checked(gz.from_zarr_gpu(store, component, device="cpu")), expected)
    # a zarr.Array handle opened through the group reads the same
    arr = zarr.open_group(store, mode="r")[component]
    assert_same(compute_checked(gz.from_zarr_gpu(arr, device="cpu")), expected)


@pytest.mark.parametrize("component", ["a", "grp/a", "g1/g2/a"])
def test_source_local_store_path_and_group_with_component(tmp_path, fmt, component):
    path = str(tmp_path / "root.zarr")
    root = zarr.open_group(path, mode="w", zarr_format=fmt)
    for part in component.split("/")[:-1]:
        root = root.require_group(part)
    data = make_data("uint16", (7, 9), seed=7)
    write_array(path, data, (2, 4), name=component, zarr_format=fmt, which="some", fill_value=3)
    expected = reference(path, component)
    # a path and a component
    assert_same(compute_checked(gz.from_zarr_gpu(path, component, device="cpu")), expected)
    # a zarr LocalStore and a component
    store = zarr.storage.LocalStore(path, read_only=True)
    assert_same(compute_checked(gz.from_zarr_gpu(store, component, device="cpu")), expected)
    # a zarr.Group and a component naming the array (nested below it)
    group = zarr.open_group(path, mode="r")
    assert_same(compute_checked(gz.from_zarr_gpu(group, component=component, device="cpu")), expected)
    # a zarr.Group of an inner level and the rest of the path
    if "/" in component:
        head, tail = component.split("/", 1)
        assert_same(compute_checked(gz.from_zarr_gpu(group[head], tail, device="cpu")), expected)
    # the array's own folder as a path
    assert_same(compute_checked(gz.from_zarr_gpu(os.path.join(path, component), device="cpu")), expected)


def test_two_arrays_in_one_graph(tmp_path, fmt):
    """Two arrays of the same shape and metadata in one group are told apart in a graph."""
    path = str(tmp_path / "two.zarr")
    zarr.open_group(path, mode="w", zarr_format=fmt)
    a = make_data("int32", (6, 4), seed=8)
    b = make_data("int32", (6, 4), seed=9)
    write_array(path, a, (3, 2), name="a", zarr_format=fmt)
    write_array(path, b, (3, 2), name="b", zarr_format=fmt)
    x = gz.from_zarr_gpu(path, "a", device="cpu")
    y = gz.from_zarr_gpu(path, "b", device="cpu")
    assert_same(compute_checked(x - y), reference(path, "a") - reference(path, "b"))


def test_two_memory_stores_in_one_graph(fmt):
    """Identical metadata in two different in-memory stores must not share dask keys."""
    arrays, refs = [], []
    for seed in (10, 11):
        store = zarr.storage.MemoryStore()
        write_array(store, make_data("float64", (5, 5), seed=seed), (5, 5), zarr_format=fmt)
        arrays.append(gz.from_zarr_gpu(store, device="cpu"))
        refs.append(reference(store))
    assert_same(compute_checked(arrays[0] + 2 * arrays[1]), refs[0] + 2 * refs[1])


# --------------------------------------------------------------------------- chunks=


@pytest.mark.parametrize(
    "chunks",
    [(4, 3), (8, 6), 4, (5, 7), ((4, 4, 4, 1), (3, 3, 3, 2)), ((13,), (11,)), (-1, 3), ((2, 5, 6), (11,))],
    ids=str,
)
@pytest.mark.filterwarnings("ignore:.*not multiples of the Zarr chunk size:UserWarning")
def test_explicit_chunks_are_honoured(zarr_writer, chunks, fmt):
    data = make_data("int16", (13, 11), seed=12)
    path, expected = zarr_writer(data, (4, 3), zarr_format=fmt, which="some", fill_value=-3)
    x = gz.from_zarr_gpu(path, chunks=chunks, device="cpu")
    assert x.chunks == normalize_chunks(chunks, expected.shape, dtype=expected.dtype)
    assert_same(compute_checked(x), expected)
    assert blocks_are_numpy(x)


def _check_aligned(x: da.Array, shape, chunk_shape) -> None:
    for ax, (blocks, c, n) in enumerate(zip(x.chunks, chunk_shape, shape)):
        assert sum(blocks) == n, (ax, blocks)
        for b in blocks[:-1]:
            assert b % c == 0, f"axis {ax}: block {b} is not a multiple of the Zarr chunk {c}: {blocks}"
        # only the last block of an axis may be ragged, and then only because the array ends
        assert blocks[-1] % c == 0 or sum(blocks) == n


@pytest.mark.parametrize("target", ["1 KiB", "2 KiB", "5 KiB", "16 KiB"])
@pytest.mark.parametrize(
    "shape,chunks,dtype",
    [
        ((40, 30), (4, 3), "int32"),
        ((100,), (7,), "float64"),
        ((9, 20, 11), (2, 3, 4), "int16"),
        ((13, 17), (13, 17), "float64"),  # one chunk bigger than small targets
        ((64, 8), (5, 8), "uint8"),
    ],
)
def test_auto_chunks_are_chunk_multiples_within_block_size(zarr_writer, shape, chunks, dtype, target):
    data = make_data(dtype, shape, seed=13)
    path, expected = zarr_writer(data, chunks)
    nbytes_target = dask.utils.parse_bytes(target)
    with dask.config.set({"gpuzarr.block-size.cpu": target}):
        x = gz.from_zarr_gpu(path, device="cpu")  # chunks="auto"
    _check_aligned(x, shape, chunks)
    itemsize = np.dtype(dtype).itemsize
    chunk_nbytes = math.prod(chunks) * itemsize
    block_nbytes = [math.prod(b) * itemsize for b in _block_shapes(x)]
    assert max(block_nbytes) <= max(nbytes_target, chunk_nbytes)
    # "about" the target: the largest block is not tiny next to it (unless the whole array is)
    assert max(block_nbytes) * 4 >= min(nbytes_target, expected.nbytes)
    assert_same(compute_checked(x), expected)


def _block_shapes(x: da.Array):
    return itertools.product(*x.chunks)


def test_auto_chunks_default_config_one_block_for_small_arrays(zarr_writer, fmt):
    data = make_data("float32", (30, 20), seed=14)
    path, expected = zarr_writer(data, (4, 3), zarr_format=fmt)
    x = gz.from_zarr_gpu(path, device="cpu")
    assert dask.config.get("gpuzarr.block-size.cpu") is not None
    assert x.numblocks == (1, 1)
    assert_same(compute_checked(x), expected)


def test_auto_chunks_follow_config_changes(zarr_writer):
    data = make_data("float64", (64, 16), seed=15)
    path, _ = zarr_writer(data, (2, 4))
    with dask.config.set({"gpuzarr.block-size.cpu": "1 KiB"}):
        small = gz.from_zarr_gpu(path, device="cpu")
    with dask.config.set({"gpuzarr.block-size.cpu": "4 KiB"}):
        large = gz.from_zarr_gpu(path, device="cpu")
    assert small.npartitions > large.npartitions
    assert max(math.prod(b) * 8 for b in _block_shapes(small)) <= 1024
    assert max(math.prod(b) * 8 for b in _block_shapes(large)) <= 4096
    # the GPU setting does not steer the CPU device
    with dask.config.set({"gpuzarr.block-size.gpu": "1 KiB"}):
        assert gz.from_zarr_gpu(path, device="cpu").numblocks == (1, 1)


@pytest.mark.parametrize("size", ["1 KiB", "3 KiB"])
def test_chunks_as_byte_string(zarr_writer, size):
    data = make_data("int32", (100, 12), seed=16)  # 4800 bytes: more than one block of either size
    path, expected = zarr_writer(data, (3, 4))
    x = gz.from_zarr_gpu(path, chunks=size, device="cpu")
    _check_aligned(x, data.shape, (3, 4))
    assert max(math.prod(b) * 4 for b in _block_shapes(x)) <= dask.utils.parse_bytes(size)
    assert x.npartitions > 1
    assert_same(compute_checked(x), expected)
