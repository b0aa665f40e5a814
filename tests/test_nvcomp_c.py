"""``gpuzarr.gpu.nvcomp-api``: nvCOMP's batched C API through ctypes (:mod:`gpuzarr_dist.codecs.nvcomp_c`).

CPU tests cover the setting and what happens without libnvcomp. The tests
marked ``gpu`` decode frames made by numcodecs from many threads at once
(each with its own stream) and compare with the data they were made from,
see a frame too large for its slot reported, and read arrays through both of
nvCOMP's interfaces against zarr-python.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import dask
import numpy as np
import pytest
import zarr.codecs as zc

import gpuzarr_dist as gz
from conftest import assert_same, make_data, reference, write_array
from gpuzarr_dist.codecs import nvcomp_c
from gpuzarr_dist.config import nvcomp_api


def test_setting():
    assert nvcomp_api() == "c"
    with dask.config.set({"gpuzarr.gpu.nvcomp-api": " Python "}):
        assert nvcomp_api() == "python"
    with dask.config.set({"gpuzarr.gpu.nvcomp-api": "rust"}), pytest.raises(ValueError, match="nvcomp-api"):
        nvcomp_api()


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

    from gpuzarr_dist.runtime.cuda import align, thread_stream

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
def test_a_frame_larger_than_its_slot_stays_inside_it_and_is_reported():
    """nvCOMP set no failure status for it (H200, nvCOMP 6.0); it must then report a short size, and leave the
    bytes after the slot alone: the caller's size check (``decode: sizes``) catches the frame."""
    import cupy

    from gpuzarr_dist.runtime.cuda import align, thread_stream

    stream = thread_stream()
    arrays, frames = _frames(3, 2)
    offs = [0, align(len(frames[0]))]
    host = np.zeros(offs[1] + len(frames[1]), dtype=np.uint8)
    for o, f in zip(offs, frames):
        host[o : o + len(f)] = np.frombuffer(f, dtype=np.uint8)
    slot, small = align(arrays[0].nbytes), arrays[1].nbytes // 2
    with stream:
        dev = cupy.asarray(host)
        out = cupy.zeros(3 * slot, dtype=cupy.uint8)
    try:
        sizes = nvcomp_c.decode("Zstd", stream, [dev.data.ptr + o for o in offs], [len(f) for f in frames],
                                [out.data.ptr, out.data.ptr + slot], [slot, small])
    except nvcomp_c.NvcompCallError as e:
        assert "frame 1" in str(e)
    else:
        assert sizes[0] == arrays[0].nbytes and sizes[1] != arrays[1].nbytes
    got = out.get(stream=stream)
    np.testing.assert_array_equal(got[: arrays[0].nbytes].view(np.float32).reshape(arrays[0].shape), arrays[0])
    assert not got[slot + small :].any()  # nothing written past the small slot


@pytest.mark.gpu
@pytest.mark.parametrize("api", ["c", "python"])
@pytest.mark.parametrize("codec", [zc.ZstdCodec(level=3), zc.GzipCodec(level=5)], ids=["zstd", "gzip"])
def test_both_interfaces_equal_zarr_python(tmp_path, api, codec):
    path = str(tmp_path / "a.zarr")
    data = make_data("float32", (64, 48, 40), seed=5, specials=False)
    write_array(path, data, (1, 48, 40), compressors=[codec], which="some")  # missing chunks: fill values
    expected = reference(path)
    with dask.config.set({"gpuzarr.gpu.nvcomp-api": api, "gpuzarr.gpu.min-batch": 0,
                          "scheduler": "threads", "num_workers": 8}):
        x = gz.from_zarr_gpu(path, device="gpu", chunks=(8, 48, 40))
        assert_same(x.compute().get(), expected)
