"""``gpuzarr.gpu.nvcomp-api``: nvCOMP's batched C API through ctypes (:mod:`gpuzarr_dist.cuda.nvcomp`).

CPU tests cover the setting and what happens without libnvcomp. The tests
marked ``gpu`` decode frames made by numcodecs from many threads at once
(each with its own stream) and compare with the data they were made from,
see a frame larger than its chunk named, and read arrays through both of
nvCOMP's interfaces against zarr-python.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import dask
import numpy as np
import pytest
import zarr.codecs as zc
from conftest import assert_same, make_data, reference, slow_calls, write_array

import gpuzarr_dist as gz
from gpuzarr_dist.config import encode_scratch_bytes, nvcomp_api
from gpuzarr_dist.cuda import nvcomp as nvcomp_c


def test_setting():
    assert nvcomp_api() == "c"
    with dask.config.set({"gpuzarr.gpu.nvcomp-api": " Python "}):
        assert nvcomp_api() == "python"
    with dask.config.set({"gpuzarr.gpu.nvcomp-api": "rust"}), pytest.raises(ValueError, match="nvcomp-api"):
        nvcomp_api()


def test_encode_scratch_setting():
    assert encode_scratch_bytes() == 2 << 30
    with dask.config.set({"gpuzarr.gpu.encode-scratch": "0"}):
        assert encode_scratch_bytes() is None
    with dask.config.set({"gpuzarr.gpu.encode-scratch": "-1"}), pytest.raises(ValueError, match="encode-scratch"):
        encode_scratch_bytes()


def test_chunks_per_call_from_the_fixed_and_per_chunk_scratch(monkeypatch):
    """nvCOMP's zstd encode scratch is a fixed part plus a part per chunk (about 1.13 GB + 5.6 MB per 4.17 MB
    chunk): as many chunks a call as the limit holds beyond the fixed part, at least one."""
    monkeypatch.setattr(nvcomp_c, "encode_scratch_size", lambda algorithm, n, nbytes: 1000 + 10 * n)
    assert nvcomp_c.chunks_per_call("Zstd", 4, 1100) == 10
    assert nvcomp_c.chunks_per_call("Zstd", 4, 1109) == 10
    assert nvcomp_c.chunks_per_call("Zstd", 4, 1005) == 1  # below even one chunk's scratch: one a call
    monkeypatch.setattr(nvcomp_c, "encode_scratch_size", lambda algorithm, n, nbytes: 37 * n)  # deflate: no fixed part
    assert nvcomp_c.chunks_per_call("Deflate", 4, 370) == 10


def test_decode_tables_rows_are_the_call_arguments_in_order():
    """The tables a batch copies up ahead of its chunks (``nvcomp_calls.small_tables``) hold rows in the order
    ``decode`` hands them to ``nvcompBatched<Algorithm>DecompressAsync``: input pointers, input bytes,
    output slot bytes, output pointers; written into a slice of a larger int64 table too."""
    ins, sizes, outs, slots = [1 << 40, (1 << 40) + 4096], [100, 200], [1 << 41, (1 << 41) + 8192], [8192, 8192]
    t = nvcomp_c.decode_tables(ins, sizes, outs, slots)
    assert t.dtype == np.uint64 and t.tolist() == [ins, sizes, slots, outs]
    host = np.zeros((6, 2), dtype=np.int64)
    nvcomp_c.decode_tables(ins, sizes, outs, slots, host[2:].view(np.uint64))
    assert host[2:].tolist() == [ins, sizes, slots, outs] and not host[:2].any()


def test_unknown_algorithm_is_named():
    with pytest.raises(ValueError, match="Snappy"):
        nvcomp_c.api("Snappy")


def test_without_libnvcomp_it_says_why(monkeypatch):
    def missing():
        raise OSError("libnvcomp.so.6: cannot open shared object file")

    monkeypatch.setattr(nvcomp_c, "_library", missing)
    monkeypatch.setattr(nvcomp_c, "_apis", {})
    monkeypatch.setattr(nvcomp_c, "_unavailable", [])
    assert nvcomp_c.available() is False
    assert "libnvcomp.so.6" in nvcomp_c.why_unavailable()
    assert nvcomp_c.available() is False  # tried once


def test_another_nvcomp_major_version_is_not_bound(monkeypatch):
    """The ctypes argument lists follow nvCOMP 6's headers: another major version keeps the Python ``Codec``."""
    import sys
    import types

    monkeypatch.setitem(sys.modules, "nvidia.nvcomp", types.SimpleNamespace(__version__="7.1.0"))
    monkeypatch.setattr(nvcomp_c, "_lib", [])
    monkeypatch.setattr(nvcomp_c, "_apis", {})
    monkeypatch.setattr(nvcomp_c, "_unavailable", [])
    assert nvcomp_c.available() is False
    assert "7.1.0" in nvcomp_c.why_unavailable() and "nvCOMP 6" in nvcomp_c.why_unavailable()


def _frames(seed: int, n: int, shape=(16, 96, 80)) -> tuple[list[np.ndarray], list[bytes]]:
    import numcodecs

    rng = np.random.default_rng(seed)
    arrays = [np.cumsum(rng.standard_normal(shape, dtype=np.float32), axis=-1) for _ in range(n)]
    zs = numcodecs.Zstd(level=1)
    return arrays, [zs.encode(a) for a in arrays]


@pytest.mark.gpu
def test_threads_decode_their_frames_at_once():
    """16 threads, 10 calls of 24 frames each, every thread on its own stream: each decoded frame equals its source."""
    import cupy

    from gpuzarr_dist.cuda.streams import align, thread_stream

    def work(seed: int) -> int:
        stream = thread_stream()
        arrays, frames = _frames(seed, 24)
        offs = np.concatenate([[0], np.cumsum([align(len(f)) for f in frames])]).tolist()
        host = np.zeros(offs[-1], dtype=np.uint8)
        for o, f in zip(offs, frames):
            host[o : o + len(f)] = np.frombuffer(f, dtype=np.uint8)
        slot = align(arrays[0].nbytes)
        checked = 0
        for _ in range(10):
            with stream:
                dev = cupy.asarray(host)
                out = cupy.zeros(24 * slot, dtype=cupy.uint8)
            sizes = nvcomp_c.decode("Zstd", stream, [dev.data.ptr + o for o in offs[:-1]], [len(f) for f in frames],
                                    [out.data.ptr + i * slot for i in range(24)], [slot] * 24)
            assert sizes == [arrays[0].nbytes] * 24
            got = out.get(stream=stream).reshape(24, slot)[:, : arrays[0].nbytes]
            for i, a in enumerate(arrays):
                np.testing.assert_array_equal(got[i].view(np.float32).reshape(a.shape), a)
                checked += 1
        return checked

    with ThreadPoolExecutor(16) as pool:
        assert sum(pool.map(work, range(16))) == 16 * 10 * 24


@pytest.mark.gpu
@pytest.mark.parametrize("api", ["c", "python"])
def test_a_frame_larger_than_its_chunk_is_named_and_its_neighbours_are_right(tmp_path, api):
    """nvCOMP 6.0 reports success and the full size for a frame given half the slot it needs, so slots
    bound nothing: a frame stating more bytes than its chunk must be stopped before the call."""
    import pathlib

    import numcodecs

    path = str(tmp_path / "z.zarr")
    data = make_data("float32", (24, 40, 48), seed=8, specials=False)
    write_array(path, data, (1, 40, 48), compressors=[zc.ZstdCodec(level=1)])
    expected = reference(path)
    big = np.concatenate([data[3], data[4]]).astype("<f4")  # twice the chunk
    pathlib.Path(path, "c", "3", "0", "0").write_bytes(numcodecs.Zstd(level=1).encode(big))
    with dask.config.set({"gpuzarr.gpu.nvcomp-api": api, "gpuzarr.gpu.min-batch": 0}):
        with pytest.raises(gz.ChunkDecodeError) as info:
            gz.from_zarr_gpu(path, device="gpu", chunks=(24, 40, 48)).compute()
        assert info.value.key == "c/3/0/0"
        x = gz.from_zarr_gpu(path, device="gpu", chunks=(12, 40, 48))
        assert_same(x[12:].compute().get(), expected[12:])
        assert_same(x[:3].compute().get(), expected[:3])


@pytest.mark.gpu
@pytest.mark.parametrize("api", ["c", "python"])
@pytest.mark.parametrize("codec", [
    zc.ZstdCodec(level=3), zc.GzipCodec(level=5),
    zc.BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),
    zc.BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle"),
    zc.BloscCodec(cname="zlib", clevel=5, shuffle="noshuffle"),
], ids=["zstd", "gzip", "blosc-lz4", "blosc-zstd", "blosc-zlib"])
def test_both_interfaces_equal_zarr_python(tmp_path, monkeypatch, api, codec):
    """Each interface reads what zarr-python reads, 8 threads at once; ``c`` takes the C functions for zstd
    and for Blosc's gathered streams (256-byte aligned), ``python`` never does. (gzip's deflate streams
    start 10 bytes into a chunk, short of Deflate's alignment: the Python ``Codec`` decodes them.)"""
    path = str(tmp_path / "a.zarr")
    data = make_data("float32", (64, 48, 40), seed=5, specials=False)
    write_array(path, data, (1, 48, 40), compressors=[codec], which="some")  # missing chunks: fill values
    expected = reference(path)
    c_calls = []
    real = nvcomp_c.decode
    monkeypatch.setattr(nvcomp_c, "decode", lambda *a: c_calls.append(a[0]) or real(*a))
    with dask.config.set({"gpuzarr.gpu.nvcomp-api": api, "gpuzarr.gpu.min-batch": 0, "gpuzarr.gpu.min-batch-chunks": 0,
                          "scheduler": "threads", "num_workers": 8}):
        x = gz.from_zarr_gpu(path, device="gpu", chunks=(8, 48, 40))
        assert_same(x.compute().get(), expected)
    if api == "python":
        assert c_calls == []
    elif not isinstance(codec, zc.GzipCodec):
        assert len(c_calls) >= 8  # 8 blocks of 8 chunks, every other one written (no batch too small for nvCOMP)


@pytest.mark.gpu
def test_threads_encode_chunks_numcodecs_decodes():
    """16 threads, 5 zstd encodes of 12 chunks each through the C API, each thread on its own stream and scratch,
    half of them in calls of 5 chunks: numcodecs decodes every chunk back to its source."""
    import cupy
    import numcodecs

    from gpuzarr_dist.cuda.streams import align, thread_stream

    def work(seed: int) -> int:
        stream = thread_stream()
        arrays, _ = _frames(seed, 12)
        nbytes = arrays[0].nbytes
        stride, cap = align(nbytes), nvcomp_c.max_compressed_size("Zstd", nbytes)
        slot = align(cap)
        per_call = 12 if seed % 2 else 5
        scratch_bytes = nvcomp_c.encode_scratch_size("Zstd", per_call, nbytes)
        checked = 0
        with stream:
            scratch = cupy.empty(scratch_bytes, dtype=cupy.uint8)
        for _ in range(5):
            with stream:
                src = cupy.zeros(12 * stride, dtype=cupy.uint8)
                for i, a in enumerate(arrays):
                    src[i * stride : i * stride + nbytes] = cupy.asarray(a).view(cupy.uint8).reshape(-1)
                out = cupy.empty(12 * slot, dtype=cupy.uint8)
            sizes = nvcomp_c.encode("Zstd", stream, [src.data.ptr + i * stride for i in range(12)], [nbytes] * 12,
                                    [out.data.ptr + i * slot for i in range(12)], scratch.data.ptr, scratch_bytes,
                                    per_call)
            host = out.get(stream=stream)
            for i, a in enumerate(arrays):
                assert 0 < sizes[i] <= cap
                frame = host[i * slot : i * slot + sizes[i]].tobytes()
                np.testing.assert_array_equal(np.frombuffer(numcodecs.Zstd().decode(frame), "<f4").reshape(a.shape), a)
                checked += 1
        return checked

    with ThreadPoolExecutor(16) as pool:
        assert sum(pool.map(work, range(16))) == 16 * 5 * 12


@pytest.mark.gpu
def test_too_little_scratch_is_refused_before_the_call():
    import cupy

    from gpuzarr_dist.cuda.streams import thread_stream

    stream = thread_stream()
    with stream:
        src = cupy.zeros(1 << 20, dtype=cupy.uint8)
        out = cupy.empty(2 << 20, dtype=cupy.uint8)
        scratch = cupy.empty(1 << 20, dtype=cupy.uint8)
    with pytest.raises(ValueError, match="scratch are too few"):
        nvcomp_c.encode("Zstd", stream, [src.data.ptr], [1 << 20], [out.data.ptr], scratch.data.ptr, 1 << 20, 1)


@pytest.mark.gpu
def test_threads_writes_join_in_the_process_scratch(tmp_path, monkeypatch):
    """8 threads writing blocks at once: their encodes join (fewer calls than blocks), the process keeps one
    scratch buffer, and zarr-python reads back every value."""
    import cupy
    import dask.array as da
    import zarr

    from gpuzarr_dist.cuda import combine
    from gpuzarr_dist.cuda import encode as gpu_encode
    slow_calls(monkeypatch, gpu_encode, "_execute_encodes")
    monkeypatch.setattr(combine, "_combiners", {})
    data = make_data("float32", (128, 50, 60), seed=12, specials=False)
    x = da.from_array(data, chunks=(8, 50, 60)).map_blocks(cupy.asarray)
    path = str(tmp_path / "out.zarr")
    with dask.config.set({"gpuzarr.gpu.min-batch": 0, "gpuzarr.gpu.min-batch-chunks": 0,
                          "scheduler": "threads", "num_workers": 8}):
        gz.to_zarr_gpu(x, path, codec="zstd", chunks=(2, 50, 60))
    np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], data)
    (c,) = [v for k, v in combine._combiners.items() if k[0] == "encode"]
    assert c.requests == 16 and c.calls < c.requests
    assert gpu_encode.workspace_bytes() >= nvcomp_c.encode_scratch_size("Zstd", 1, 2 * 50 * 60 * 4)


@pytest.mark.gpu
@pytest.mark.parametrize("api", ["c", "python"])
@pytest.mark.parametrize("codec", ["zstd", "gzip"])
def test_writes_through_both_interfaces_read_back_with_zarr_python(tmp_path, api, codec):
    import cupy
    import dask.array as da
    import zarr

    data = make_data("float32", (96, 50, 60), seed=11, specials=False)
    x = da.from_array(data, chunks=(16, 50, 60)).map_blocks(cupy.asarray)
    path = str(tmp_path / "out.zarr")
    with dask.config.set({"gpuzarr.gpu.nvcomp-api": api, "gpuzarr.gpu.min-batch": 0,
                          "scheduler": "threads", "num_workers": 8}):
        gz.to_zarr_gpu(x, path, codec=codec, chunks=(2, 25, 30))
    np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], data)
