"""``gpuzarr.gpu.min-batch``: GPU batches below it are decoded and encoded on the CPU, with the same results.

The suite runs with the key at 0 (conftest.py); these tests set it themselves.
Results are compared with zarr-python's reading of the same store.
"""

from __future__ import annotations

import dask
import dask.array as da
import numcodecs
import numpy as np
import pytest
import zarr
from conftest import make_data

import gpuzarr_dist as gz
from gpuzarr_dist.config import gpu_min_batch_bytes, gpu_min_batch_chunks


def test_default_and_parsing():
    with dask.config.set({"gpuzarr.gpu.min-batch": None}):
        assert gpu_min_batch_bytes() == 0
    assert dask.config.get("gpuzarr.gpu.min-batch") == 0  # the suite's setting (conftest.py)
    defaults = dask.config.defaults
    assert any(d.get("gpuzarr", {}).get("gpu", {}).get("min-batch") == "32 MiB" for d in defaults)
    with dask.config.set({"gpuzarr.gpu.min-batch": "32 MiB"}):
        assert gpu_min_batch_bytes() == 32 * 2**20
    with dask.config.set({"gpuzarr.gpu.min-batch": 4096}):
        assert gpu_min_batch_bytes() == 4096
    with dask.config.set({"gpuzarr.gpu.min-batch": -1}), pytest.raises(ValueError, match="min-batch"):
        gpu_min_batch_bytes()
    assert any(d.get("gpuzarr", {}).get("gpu", {}).get("min-batch-chunks") == 8 for d in defaults)
    with dask.config.set({"gpuzarr.gpu.min-batch-chunks": "12"}):
        assert gpu_min_batch_chunks() == 12
    with dask.config.set({"gpuzarr.gpu.min-batch-chunks": -2}), pytest.raises(ValueError, match="min-batch-chunks"):
        gpu_min_batch_chunks()


def _store(tmp_path, data, chunks):
    path = str(tmp_path / "a.zarr")
    a = zarr.create_array(path, shape=data.shape, chunks=chunks, dtype=data.dtype,
                          compressors=[zarr.codecs.ZstdCodec(level=1)])
    a[...] = data
    return path


def _forbid(monkeypatch, where, name):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{name} was called")

    monkeypatch.setattr(where, name, refuse)


def _count_nvcomp(monkeypatch) -> list[str]:
    """The algorithms of the nvCOMP decode calls the GPU decoder makes from now on (either interface; still made)."""
    import gpuzarr_dist.cuda.nvcomp_calls as g

    calls: list[str] = []
    real = g.decode_frames

    def counted(stream, parts):
        calls.append(parts[0].algorithm)
        return real(stream, parts)

    monkeypatch.setattr(g, "decode_frames", counted)
    return calls


@pytest.mark.gpu
def test_small_gpu_batches_decode_on_the_cpu(tmp_path, monkeypatch):
    """Below min-batch nvCOMP is never called; the block is still a cupy array equal to zarr-python's read."""
    import cupy

    import gpuzarr_dist.cuda.nvcomp_calls as g

    data = make_data("float32", (40, 50, 30), seed=3)
    path = _store(tmp_path, data, (10, 25, 30))
    expect = zarr.open_array(path, mode="r")[...]
    _forbid(monkeypatch, g, "decode_frames")
    with dask.config.set({"gpuzarr.gpu.min-batch": "1 MiB"}):  # a block here is 120 kB
        x = gz.from_zarr_gpu(path, device="gpu", chunks=(20, 50, 30))
        got = x.compute()
    assert isinstance(got, cupy.ndarray)
    np.testing.assert_array_equal(got.get(), expect)


@pytest.mark.gpu
def test_batches_at_min_batch_go_to_nvcomp(tmp_path, monkeypatch):
    """At or above min-batch the batch is nvCOMP's (its codec is asked for), with the same values."""
    data = make_data("float32", (40, 50, 30), seed=4)
    path = _store(tmp_path, data, (10, 25, 30))
    calls = _count_nvcomp(monkeypatch)
    block_bytes = 20 * 50 * 30 * 4
    with dask.config.set({"gpuzarr.gpu.min-batch": block_bytes}):
        got = gz.from_zarr_gpu(path, device="gpu", chunks=(20, 50, 30)).compute()
    assert calls and set(calls) == {"Zstd"}
    np.testing.assert_array_equal(got.get(), zarr.open_array(path, mode="r")[...])


@pytest.mark.gpu
@pytest.mark.parametrize("least", [4, 5])
def test_min_batch_chunks_sends_few_chunk_decodes_to_the_cpu(tmp_path, monkeypatch, least):
    """A block of 4 chunks goes to nvCOMP with min-batch-chunks 4 and to the CPU with 5; equal values both ways."""
    data = make_data("float32", (40, 50, 30), seed=7)
    path = _store(tmp_path, data, (10, 25, 30))
    calls = _count_nvcomp(monkeypatch)
    with dask.config.set({"gpuzarr.gpu.min-batch-chunks": least}):
        got = gz.from_zarr_gpu(path, device="gpu", chunks=(20, 50, 30)).compute()  # 2 x 2 chunks a block
    assert bool(calls) == (least == 4)
    np.testing.assert_array_equal(got.get(), zarr.open_array(path, mode="r")[...])


@pytest.mark.gpu
def test_damaged_small_batch_names_array_and_chunk(tmp_path):
    """A damaged chunk in a batch decoded on the CPU raises ChunkDecodeError naming the array and the chunk."""
    from gpuzarr_dist.errors import ChunkDecodeError

    data = make_data("float32", (20, 50, 30), seed=5)
    path = _store(tmp_path, data, (10, 25, 30))
    victim = tmp_path / "a.zarr" / "c" / "1" / "0" / "0"
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2 :] = bytes(len(raw) - len(raw) // 2)
    victim.write_bytes(bytes(raw))
    with dask.config.set({"gpuzarr.gpu.min-batch": "1 MiB"}), pytest.raises(ChunkDecodeError, match="c/1/0/0"):
        gz.from_zarr_gpu(path, device="gpu").compute()


@pytest.mark.gpu
@pytest.mark.parametrize("small", [True, False])
def test_small_gpu_blocks_encode_on_the_cpu(tmp_path, monkeypatch, small):
    """A cupy block below min-batch is encoded by numcodecs (nvCOMP's launch is made to fail); one at or above
    it by nvCOMP (the CPU encoder is made to fail). Both read back equal through zarr-python and numcodecs."""
    import cupy

    import gpuzarr_dist.cuda.write as wg
    from gpuzarr_dist.codecs.pipeline import CodecPipeline

    data = make_data("float32", (64, 70), seed=6)
    block_bytes = 32 * 70 * 4
    if small:
        _forbid(monkeypatch, wg, "launch_encode_gpu")
    else:
        from gpuzarr_dist.codecs.encode import CpuBlockEncoder

        _forbid(monkeypatch, CodecPipeline, "encode_batch")
        _forbid(monkeypatch, CpuBlockEncoder, "launch")
    x = da.from_array(data, chunks=(32, 70)).map_blocks(cupy.asarray)
    path = str(tmp_path / "out.zarr")
    with dask.config.set({"gpuzarr.gpu.min-batch": block_bytes + 1 if small else block_bytes}):
        gz.to_zarr_gpu(x, path, chunks=(8, 35))
    np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], data)
    stored = (tmp_path / "out.zarr" / "c" / "0" / "0").read_bytes()
    np.testing.assert_array_equal(np.frombuffer(numcodecs.Zstd().decode(stored), "<f4").reshape(8, 35), data[:8, :35])
