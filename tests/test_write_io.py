"""The write path's I/O pieces: objects given as lists of buffers, split writes of large objects, short writes."""

from __future__ import annotations

import os

import dask.array as da
import numpy as np
import pytest
import zarr
from conftest import make_data

import gpuzarr_dist as gz
from gpuzarr_dist.errors import ChunkWriteError
from gpuzarr_dist.stores import writer as writer_mod
from gpuzarr_dist.stores.writer import LocalObjectWriter


def _pieces(seed: int, count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, int(rng.integers(0, 900)), dtype=np.uint8) for _ in range(count)]


@pytest.mark.parametrize("split", [False, True])
def test_list_of_buffers_is_stored_end_to_end(tmp_path, monkeypatch, split):
    """More pieces than one writev takes (IOV_MAX), some empty; split over threads at odd piece sizes."""
    monkeypatch.setattr(writer_mod, "SPLIT_WRITE_BYTES", 10_000)
    monkeypatch.setattr(writer_mod, "WRITE_PIECE_BYTES", 7_777)
    parts = _pieces(1, 2500)
    w = LocalObjectWriter(str(tmp_path))
    n = w.put("c/0", parts, split=split)
    want = np.concatenate(parts).tobytes()
    assert n == len(want)
    assert (tmp_path / "c" / "0").read_bytes() == want
    assert sorted(os.listdir(tmp_path / "c")) == ["0"]  # no temporary file left


def test_short_writes_are_resumed(tmp_path, monkeypatch):
    real = os.writev

    def at_most_5(fd, bufs):
        first = next((bytes(b) for b in bufs if len(b)), b"")
        return real(fd, [first[:5]])

    monkeypatch.setattr(os, "writev", at_most_5)
    parts = _pieces(2, 40)
    LocalObjectWriter(str(tmp_path)).put("x", parts)
    assert (tmp_path / "x").read_bytes() == np.concatenate(parts).tobytes()


def test_failed_split_write_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setattr(writer_mod, "SPLIT_WRITE_BYTES", 100)
    monkeypatch.setattr(writer_mod, "WRITE_PIECE_BYTES", 64)
    calls = []

    def fail_second(fd, bufs, offset):
        calls.append(offset)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return os.pwrite(fd, b"".join(bytes(b) for b in bufs), offset)

    monkeypatch.setattr(os, "pwritev", fail_second)
    w = LocalObjectWriter(str(tmp_path), "arr")
    with pytest.raises(ChunkWriteError, match=r"arr.*'s/0'.*No space left"):
        w.put_many([("s/0", _pieces(3, 30))])
    assert os.listdir(tmp_path / "s") == []


@pytest.mark.parametrize("shape,block,shards,chunks", [
    ((37, 20, 9), (16, 20, 9), True, (4, 6, 5)),   # edge shards, inner chunks outside the array
    ((32, 16), (16, 16), (16, 16), (2, 4)),
])
def test_sharded_write_with_split_pieces_reads_back_in_zarr_python(tmp_path, monkeypatch, shape, block, shards, chunks):
    """Shards written in several pieces by several threads are what zarr-python reads."""
    monkeypatch.setattr(writer_mod, "SPLIT_WRITE_BYTES", 256)
    monkeypatch.setattr(writer_mod, "WRITE_PIECE_BYTES", 100)
    data = make_data("float32", shape, seed=5)
    path = str(tmp_path / "s.zarr")
    gz.to_zarr_gpu(da.from_array(data, chunks=block), path, chunks=chunks, shards=shards, device="cpu", crc32c=True)
    np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], data)


@pytest.mark.gpu
@pytest.mark.parametrize("own_slots", [True, False])
@pytest.mark.parametrize("codec", ["zstd", "gzip"])
def test_gpu_batch_encode_packs_every_chunk(monkeypatch, own_slots, codec):
    """Many chunks of an odd byte count (tails not a multiple of 16), encoded into our slots and gathered by
    one kernel, or into nvCOMP's buffers: numcodecs decodes each to its input."""
    import cupy
    import numcodecs

    from gpuzarr_dist.codecs.pipeline import CodecPipeline
    from gpuzarr_dist.core.metadata import ArraySpec, CodecSpec
    from gpuzarr_dist.cuda import encode as gpu_encode
    from gpuzarr_dist.cuda.streams import thread_stream

    if not own_slots:
        monkeypatch.setattr(gpu_encode, "_max_compressed", lambda *a: None)
    data = make_data("int16", (300, 7, 37), seed=9, specials=False)  # 518-byte chunks
    data[::3] = 5  # some chunks compress to a few bytes
    spec = ArraySpec("g", (7, 37), (7, 37), np.dtype("int16"), np.int16(0), 3,
                     (CodecSpec("bytes", {"endian": "little"}), CodecSpec(codec, {"level": 0 if codec == "zstd" else 5}),
                      CodecSpec("crc32c")), "c", "/", "zarr.json")
    timings: dict[str, float] = {}
    out = gpu_encode.encode_batch_gpu(CodecPipeline(spec), cupy.asarray(data), [str(i) for i in range(300)],
                                      thread_stream(), timings=timings)
    dec = numcodecs.Zstd() if codec == "zstd" else numcodecs.GZip()
    crc = numcodecs.CRC32C()
    for o, want in zip(out, data):
        got = np.frombuffer(dec.decode(crc.decode(bytes(o))), dtype="<i2").reshape(7, 37)
        np.testing.assert_array_equal(got, want)
    assert {"encode", "d2h"} <= set(timings)
