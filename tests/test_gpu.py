"""GPU-only behaviour: results are cupy arrays, per-thread streams under concurrent load,
the CPU fallback for codecs without a GPU decoder, and the stream synchronisation
added to GPU graphs. (The conformance, slicing, error and tensorstore suites
also run on the GPU device through the ``device`` fixture.)"""

from __future__ import annotations

import threading
import warnings

import numcodecs
import numpy as np
import pytest
import zarr
import zarr.codecs as zc
from conftest import make_data, write_array

import gpuzarr_dist as gz

pytestmark = pytest.mark.gpu


@pytest.fixture
def era5ish(tmp_path):
    """A float32 (T, 48, 64) zstd array, one chunk per time step, written by zarr-python."""
    rng = np.random.default_rng(5)
    t = 400
    data = (280 + 10 * rng.standard_normal((t, 48, 64))).astype("f4")
    path = str(tmp_path / "era5ish.zarr")
    write_array(path, data, (1, 48, 64), compressors=[zc.ZstdCodec(level=0)])
    return path, zarr.open_array(path, mode="r")[...]


def test_blocks_are_cupy_arrays(era5ish):
    import cupy

    path, expected = era5ish
    x = gz.from_zarr_gpu(path, device="gpu", chunks=(50, 48, 64))
    assert isinstance(x._meta, cupy.ndarray)
    block = x.blocks[1].compute()
    assert isinstance(block, cupy.ndarray)
    np.testing.assert_array_equal(block.get(), expected[50:100])


@pytest.mark.parametrize("workers", [1, 8])
def test_concurrent_threads_hundreds_of_batches(era5ish, workers):
    """8 dask threads, 200 blocks of 2 chunks each, three reductions: equal to numpy every time."""
    import dask

    path, expected = era5ish
    x = gz.from_zarr_gpu(path, device="gpu", chunks=(2, 48, 64))
    assert x.npartitions == 200
    with dask.config.set(scheduler="threads", num_workers=workers):
        for _ in range(3):
            m, s, a = dask.compute((x * 2 + 1).mean(axis=0), x.sum(axis=(1, 2)), (x - 273.15).max())
            np.testing.assert_allclose(m.get(), (expected.astype("f8") * 2 + 1).mean(axis=0), rtol=1e-5)
            np.testing.assert_allclose(s.get(), expected.astype("f8").sum(axis=(1, 2)), rtol=1e-5)
            assert float(a) == pytest.approx(float(expected.max() - np.float32(273.15)), rel=1e-6)


def test_each_thread_has_its_own_stream(era5ish):
    from gpuzarr_dist.array.reader import BlockReader
    from gpuzarr_dist.cuda.streams import thread_stream
    from gpuzarr_dist.stores.source import open_source

    path, expected = era5ish
    store, spec = open_source(path)
    reader = BlockReader(store, spec, "gpu")
    ptrs, errors = {}, []

    def work(i: int) -> None:
        try:
            for k in range(20):
                sl = slice((i * 20 + k) % 390, (i * 20 + k) % 390 + 10)
                np.testing.assert_array_equal(reader[sl].get(), expected[sl])
                ptrs.setdefault(i, set()).add(thread_stream().ptr)
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert all(len(p) == 1 for p in ptrs.values())  # one stream for the thread's life
    streams = {next(iter(p)) for p in ptrs.values()}
    assert len(streams) == 8 and 0 not in streams  # distinct, none is the legacy default stream


@pytest.mark.parametrize("codec", ["zstd-one-chunk", "zstd-batch", "zlib", "lz4-blosc", "none"])
def test_reads_and_writes_leave_the_threads_stream_current(tmp_path, codec):
    """After a block read and a block write, CuPy's current stream is still the thread's own stream.

    CuPy's ``with stream:`` restores, on exit, the bottom of its stream stack
    (the legacy null stream), not the stream ``thread_stream`` made current
    with ``use()``. Placement kernels and the user's computation would then
    run on the null stream, outside what the read synchronises, and a read
    that allocates its block after the decode would give wrong tiles in the
    Cubed variant's anomaly. Each codec here takes another
    decode path (one chunk: the CPU's small batch; more: nvCOMP; zlib: the deflate walk;
    Blosc: the gathered streams; none: no compressor).
    """
    import cupy

    from gpuzarr_dist.array.reader import BlockReader
    from gpuzarr_dist.array.write import BlockWriter
    from gpuzarr_dist.core.metadata import spec_from_zarr_metadata
    from gpuzarr_dist.cuda.streams import thread_stream
    from gpuzarr_dist.stores.source import open_source
    from gpuzarr_dist.stores.target import open_target

    data = make_data("float32", (64, 40, 30), seed=9, specials=False)
    compressors = {"zstd-one-chunk": [zc.ZstdCodec(level=1)], "zstd-batch": [zc.ZstdCodec(level=1)],
                   "zlib": None, "lz4-blosc": None, "none": None}[codec]
    path = str(tmp_path / "a.zarr")
    if codec == "zlib":
        write_array(path, data, (2, 40, 30), zarr_format=2, compressors=numcodecs.Zlib(level=1))
    elif codec == "lz4-blosc":
        write_array(path, data, (2, 40, 30), zarr_format=2, compressors=numcodecs.Blosc(cname="lz4", shuffle=1))
    else:
        write_array(path, data, (2, 40, 30), compressors=compressors)
    store, spec = open_source(path)
    reader = BlockReader(store, spec, "gpu")
    out_path = str(tmp_path / "b.zarr")
    zarr.create_array(out_path, shape=data.shape, chunks=(2, 40, 30), dtype="f4", compressors=[zc.ZstdCodec(level=1)])
    target = open_target(out_path, None, None)
    z = zarr.open_array(out_path, mode="r")
    writer = BlockWriter(spec_from_zarr_metadata(z.metadata, target.name), target.writer(target.name),
                         tuple((n,) for n in data.shape), "gpu")
    seen, errors = [], []

    def work() -> None:
        try:
            s = thread_stream()
            sel = np.s_[0:2] if codec == "zstd-one-chunk" else np.s_[:]
            block = reader[sel]
            seen.append(("read", cupy.cuda.get_current_stream() is s))
            np.testing.assert_array_equal(block.get(), data[sel])
            writer.write(block * 1, (0, 0, 0))
            seen.append(("write", cupy.cuda.get_current_stream() is s))
            assert cupy.cuda.get_current_stream().ptr != 0
        except Exception as e:  # reported below
            errors.append(e)

    import dask

    # one chunk under min-batch-chunks 2: the batch is decoded on the CPU and copied up (the suite's default is 0)
    with dask.config.set({"gpuzarr.gpu.min-batch-chunks": 2 if codec == "zstd-one-chunk" else 0}):
        t = threading.Thread(target=work)
        t.start()
        t.join()
    assert not errors, errors
    assert seen == [("read", True), ("write", True)]
    sel = np.s_[0:2] if codec == "zstd-one-chunk" else np.s_[:]
    np.testing.assert_array_equal(zarr.open_array(out_path, mode="r")[sel], data[sel])


def test_user_computations_run_on_the_threads_streams(era5ish):
    """The function fused after a read runs on the worker thread's own stream, never the legacy null stream."""
    import cupy
    import dask

    path, expected = era5ish
    x = gz.from_zarr_gpu(path, device="gpu", chunks=(10, 48, 64))
    ptrs = set()

    def where(b):
        ptrs.add(cupy.cuda.get_current_stream().ptr)
        return b * 2

    with dask.config.set(scheduler="threads", num_workers=4):
        # dtype and meta given: dask would otherwise call ``where`` on small arrays in this (main) thread to
        # learn them, on whatever stream this thread has (the null stream when no earlier test read here)
        got = x.map_blocks(where, dtype=x.dtype, meta=x._meta).sum(axis=0).compute()
    np.testing.assert_allclose(got.get(), expected.astype("f8").sum(axis=0) * 2, rtol=1e-5)
    assert ptrs and 0 not in ptrs


def test_codec_without_gpu_decoder_falls_back_once_with_warning(tmp_path):
    data = make_data("int16", (40, 30), seed=3)
    path = str(tmp_path / "blosc.zarr")
    write_array(path, data, (10, 10), zarr_format=2, compressors=numcodecs.Blosc(cname="blosclz", shuffle=2))
    from gpuzarr_dist.cuda import blocks as reader_gpu

    reader_gpu._warned.discard("blosc (blosclz)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = gz.from_zarr_gpu(path, device="gpu", chunks=(10, 30)).compute()
    msgs = [str(w.message) for w in caught if "no GPU decoder" in str(w.message)]
    assert len(msgs) == 1 and "'blosc (blosclz)'" in msgs[0]
    np.testing.assert_array_equal(got.get(), zarr.open_array(path, mode="r")[...])


def test_gpu_graphs_synchronise_every_task(era5ish):
    import dask

    from gpuzarr_dist.array.optimize import _then_sync

    path, _ = era5ish
    y = gz.from_zarr_gpu(path, device="gpu", chunks=(100, 48, 64)).mean(axis=0)
    (opt,) = dask.optimize(y)
    tasks = [v for v in dict(opt.__dask_graph__()).values() if hasattr(v, "func")]
    assert tasks and all(t.func is _then_sync for t in tasks)
    cpu = gz.from_zarr_gpu(path, device="cpu").mean(axis=0)
    (opt,) = dask.optimize(cpu)
    assert not any(getattr(v, "func", None) is _then_sync for v in dict(opt.__dask_graph__()).values())
