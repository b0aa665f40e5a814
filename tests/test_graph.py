"""The dask graph: one read task per block, fused with what follows it."""

from __future__ import annotations

import pickle
import threading

import dask
import numpy as np
import pytest
from conftest import assert_same, compute_checked, make_data
from dask._task_spec import DataNode, GraphNode

import gpuzarr_dist as gz
from gpuzarr_dist.array.reader import BlockReader

SHAPE, CHUNKS = (24, 20), (4, 5)
N = (24 // 4) * (20 // 5)  # blocks when dask blocks are the Zarr chunks


def _holds_reader(obj, depth: int = 0) -> bool:
    """Whether a task (or anything nested in it: fused subgraphs, containers) holds a BlockReader."""
    if depth > 50:
        return False
    if isinstance(obj, BlockReader):
        return True
    if isinstance(obj, DataNode):
        return _holds_reader(obj.value, depth + 1)
    if isinstance(obj, GraphNode):
        parts = [getattr(obj, a, None) for a in ("func", "args", "kwargs")]
        return any(_holds_reader(p, depth + 1) for p in parts if p is not None)
    if isinstance(obj, dict):
        return any(_holds_reader(v, depth + 1) for v in obj.values())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return any(_holds_reader(v, depth + 1) for v in obj)
    func = getattr(obj, "func", None)  # functools.partial
    if func is not None and hasattr(obj, "args"):
        return _holds_reader(func, depth + 1) or _holds_reader(obj.args, depth + 1)
    return False


@pytest.fixture(params=[3, 2], ids=["v3", "v2"])
def graph_array(zarr_writer, request):
    data = make_data("float64", SHAPE, seed=41, specials=False)
    return zarr_writer(data, CHUNKS, zarr_format=request.param, which="some", fill_value=0.5)


def test_one_task_per_block_before_fusion(graph_array):
    path, _ = graph_array
    x = gz.from_zarr_gpu(path, chunks=CHUNKS, device="cpu")
    assert x.npartitions == N
    graph = dict(x.__dask_graph__())
    assert len(graph) == N
    assert sum(_holds_reader(t) for t in graph.values()) == N


def test_read_fuses_with_elementwise_and_reduction(graph_array, monkeypatch):
    path, expected = graph_array
    x = gz.from_zarr_gpu(path, chunks=CHUNKS, device="cpu")
    y = (x * 2 + 1).mean(axis=0)

    unoptimised = dict(y.__dask_graph__())
    (yo,) = dask.optimize(y)
    optimised = dict(yo.__dask_graph__())

    # unfused: a read, a multiply, an add and a partial mean per block, plus the tree
    assert len(unoptimised) >= 3 * N
    # fused: one task per block (read + decode + x*2+1 + partial mean), plus the reduction tree
    assert N <= len(optimised) < 2 * N
    readers = [k for k, t in optimised.items() if _holds_reader(t)]
    assert len(readers) == N

    # and at run time each block is read exactly once, by one call
    calls = []
    lock = threading.Lock()
    original = BlockReader.__getitem__

    def getitem(self, index):
        with lock:
            calls.append(index)
        return original(self, index)

    monkeypatch.setattr(BlockReader, "__getitem__", getitem)
    (got,) = dask.compute(yo, scheduler="sync")
    assert len(calls) == N
    np.testing.assert_allclose(got, (expected * 2 + 1).mean(axis=0), rtol=1e-12)


def test_auto_chunks_fuse_to_block_count(zarr_writer):
    data = make_data("int32", (60, 16), seed=42)
    path, expected = zarr_writer(data, (3, 4))
    with dask.config.set({"gpuzarr.block-size.cpu": "768 B"}):
        x = gz.from_zarr_gpu(path, device="cpu")
    n = x.npartitions
    assert n > 1
    y = (x - 3).sum(axis=1)
    (yo,) = dask.optimize(y)
    optimised = dict(yo.__dask_graph__())
    assert n <= len(optimised) < 2 * n
    assert sum(_holds_reader(t) for t in optimised.values()) == n
    assert_same(compute_checked(yo), (expected - 3).sum(axis=1))


def test_names_are_deterministic_and_distinct(zarr_writer):
    a_path, _ = zarr_writer(make_data("int16", (6, 6), seed=43), (3, 3))
    b_path, _ = zarr_writer(make_data("int16", (6, 6), seed=44), (3, 3))
    a1 = gz.from_zarr_gpu(a_path, device="cpu")
    a2 = gz.from_zarr_gpu(a_path, device="cpu")
    b = gz.from_zarr_gpu(b_path, device="cpu")
    assert a1.name == a2.name
    assert a1.name != b.name
    assert gz.from_zarr_gpu(a_path, chunks=(3, 3), device="cpu").name != a1.name


def test_array_and_reader_pickle(graph_array):
    path, expected = graph_array
    x = gz.from_zarr_gpu(path, chunks=CHUNKS, device="cpu")
    x.compute()  # a used reader (with its codec pipeline built) must pickle as well
    x2 = pickle.loads(pickle.dumps(x))
    assert_same(compute_checked(x2), expected)
    assert_same(compute_checked(x2[5:19, 3]), expected[5:19, 3])


def test_gpu_graph_optimisation_adds_only_a_stream_sync():
    """Graphs that read GPU arrays get each task wrapped in a stream sync; results and task count unchanged."""
    import dask.array as da

    from gpuzarr_dist.array.optimize import GPU_LAYER_PREFIX, _then_sync, optimize

    data = np.arange(600.0).reshape(20, 30)
    x = da.from_array(data, chunks=(5, 10), name=GPU_LAYER_PREFIX + "fake")
    y = (x * 2 + 1).mean(axis=0)
    plain = dict(dask.optimize(y)[0].__dask_graph__())
    wrapped = optimize(y.__dask_graph__(), y.__dask_keys__())
    assert len(wrapped) == len(plain)
    assert all(getattr(v, "func", None) is _then_sync for v in wrapped.values() if hasattr(v, "func"))
    with dask.config.set(array_optimize=optimize):
        np.testing.assert_allclose(y.compute(), (data * 2 + 1).mean(axis=0))
