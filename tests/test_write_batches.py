"""to_zarr_gpu's pipelined sub-batches (``gpuzarr.write.batch-size``): a block's chunks are encoded and
written in several batches of whole objects, the next batch's encode launched before this one's writes.

Results are read back by zarr-python and tensorstore and compared with numpy; failures part-way through a
block must name the chunk and leave no partial object.
"""

from __future__ import annotations

import os
import warnings

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from conftest import assert_same, dev, make_data

import gpuzarr_dist as gz
from gpuzarr_dist.array.write import BlockWriter
from gpuzarr_dist.core.layout import even_runs
from gpuzarr_dist.errors import ChunkEncodeError, ChunkWriteError

ts = pytest.importorskip("tensorstore")

pytestmark = pytest.mark.usefixtures("device")


def on_device(data: np.ndarray, chunks) -> da.Array:
    x = da.from_array(data, chunks=chunks)
    if dev() == "gpu":
        import cupy

        x = x.map_blocks(cupy.asarray, dtype=data.dtype)
    return x


def check_both(path: str, expected: np.ndarray) -> None:
    assert_same(zarr.open_array(path, mode="r")[...], expected)
    t = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": path}}, open=True).result()
    assert_same(t.read().result(), expected)


def leftovers(path: str) -> list[str]:
    return [n for _, _, names in os.walk(path) for n in names if n.endswith(".tmp")]


@pytest.fixture
def spy_batches(monkeypatch):
    """The sub-batches each block was written in: a list of lists of chunk keys, one list per block."""
    seen: list[list[list[str]]] = []
    original = BlockWriter.run_batches

    def run_batches(self, encoder, batches):
        seen.append([list(b.keys) for b in batches])
        return original(self, encoder, batches)

    monkeypatch.setattr(BlockWriter, "run_batches", run_batches)
    return seen


@pytest.fixture
def spy_objects(monkeypatch, spy_batches):
    """The object (chunk or shard) keys of each sub-batch, as ``spy_batches`` lists chunk keys."""
    seen: list[list[list[str]]] = []
    original = BlockWriter.run_batches  # already the spy of spy_batches

    def run_batches(self, encoder, batches):
        seen.append([list(b.object_keys) for b in batches])
        return original(self, encoder, batches)

    monkeypatch.setattr(BlockWriter, "run_batches", run_batches)
    return seen


def testeven_runs():
    assert even_runs(0, 0, 10) == []
    assert even_runs(5, 500, None) == [(0, 5)]  # off: one batch
    assert even_runs(5, 500, 0) == [(0, 5)]
    assert even_runs(5, 500, 1000) == [(0, 5)]
    assert even_runs(16, 16 * 560, 3 * 560) == [(0, 2), (2, 5), (5, 8), (8, 10), (10, 13), (13, 16)]
    assert even_runs(3, 3000, 1) == [(0, 1), (1, 2), (2, 3)]  # never less than one object per batch


@pytest.mark.parametrize("codec,crc", [("zstd", False), ("gzip", True), ("none", False), ("zstd", True)])
def test_sub_batches_read_back(tmp_path, spy_batches, codec, crc):
    """Blocks of 16 chunks (the last of 8, padded) in batches of 2-3 chunks: not a divisor of the block."""
    data = make_data("float32", (61, 70), seed=21)
    path = str(tmp_path / "out.zarr")
    with dask.config.set({"gpuzarr.write.batch-size": 3 * 4 * 35 * 4}):  # three chunks of (4, 35) float32
        gz.to_zarr_gpu(on_device(data, (32, 70)), path, chunks=(4, 35), codec=codec, crc32c=crc)
    check_both(path, data)
    sizes = sorted(len(b) for blocks in spy_batches for b in blocks)
    assert len(spy_batches) == 2 and all(len(blocks) > 1 for blocks in spy_batches)
    assert set(sizes) == {2, 3} and sum(sizes) == 16 + 16  # every chunk of both blocks, once
    keys = [k for blocks in spy_batches for b in blocks for k in b]
    assert len(set(keys)) == len(keys) == 32
    assert not leftovers(path)


def test_batch_size_off_is_one_batch_per_block(tmp_path, spy_batches):
    data = make_data("int16", (40, 30), seed=22)
    path = str(tmp_path / "out.zarr")
    with dask.config.set({"gpuzarr.write.batch-size": None}):
        gz.to_zarr_gpu(on_device(data, (20, 30)), path, chunks=(5, 10))
    check_both(path, data)
    assert [len(blocks) for blocks in spy_batches] == [1, 1]


def test_sharded_blocks_in_batches_of_whole_shards(tmp_path, spy_batches, spy_objects):
    """8 shards per block, batches of 3 shards: a shard's inner chunks are not contiguous in the block's
    chunk order, each shard is written once, whole, and the partial edge shard reads back too."""
    data = make_data("float64", (57, 70), seed=23)  # the edge shard's second chunk row lies outside
    path = str(tmp_path / "out.zarr")
    with dask.config.set({"gpuzarr.write.batch-size": 3 * 2 * 4 * 35 * 8}):  # three shards of 2 chunks
        gz.to_zarr_gpu(on_device(data, (32, 70)), path, chunks=(4, 35), shards=(8, 35))
    check_both(path, data)
    assert all(len(blocks) == 3 for blocks in spy_batches)  # 8 shards (4 in the edge block) in 3 batches
    # a batch holds every inner chunk of each of its shards, and no other: shard keys "c/i/j", chunk keys
    # "c/i/j[a,b]" (two inner chunks per shard except in the edge shard, whose second row lies outside)
    shard_keys = [k for blocks in spy_objects for b in blocks for k in b]
    assert len(shard_keys) == len(set(shard_keys)) == 16
    for blocks, objects in zip(spy_batches, spy_objects):
        for keys, shards in zip(blocks, objects):
            assert {k.split("[")[0] for k in keys} == set(shards)
            assert len(keys) == 2 * len(shards) - sum(k.startswith("c/7/") for k in shards)
    files = [n for _, _, names in os.walk(path) for n in names if n != "zarr.json"]
    assert len(files) == 8 * 2  # 8 shard rows x 2 shard columns, each written once


def _one_block_writer_error(tmp_path, data, bad: str, how: str, monkeypatch):
    """Write one block of 32 chunks (4, 35) in 4 batches of 8 with chunk ``bad`` failing ``how``."""
    path = str(tmp_path / "out.zarr")
    if how == "encode":
        from gpuzarr_dist.codecs.encode import CpuBlockEncoder
        from gpuzarr_dist.codecs.pipeline import CodecPipeline

        if dev() == "gpu":  # the GPU path encodes on the CPU only where nvCOMP refuses: make it
            import gpuzarr_dist.cuda.write as wg

            def refuse(pipeline, chunks, keys, stream):
                raise ChunkEncodeError(pipeline.array, keys[0], "refused here", "zstd")

            monkeypatch.setattr(wg, "launch_encode_gpu", refuse)
        original = CodecPipeline.encode_chunk

        def encode_chunk(self, chunk, key):
            if key == bad:
                raise ChunkEncodeError(self.array, key, "ValueError: boom", "zstd")
            return original(self, chunk, key)

        monkeypatch.setattr(CodecPipeline, "encode_chunk", encode_chunk)
        assert CpuBlockEncoder  # the CPU encoder calls encode_chunk once per chunk
    lazy = gz.to_zarr_gpu(on_device(data, (64, 70)), path, chunks=(4, 35), compute=False)  # zarr.json only
    if how == "write":  # a folder where the chunk file must go: the rename over it fails
        os.makedirs(os.path.join(path, *bad.split("/")))
    with dask.config.set({"gpuzarr.write.batch-size": 8 * 4 * 35 * 4}):  # 4 batches of 8 chunks
        lazy.compute(scheduler="sync")
    return path


@pytest.mark.parametrize("how", ["encode", "write"])
def test_failure_in_a_middle_batch_names_the_chunk_and_leaves_no_partial_object(tmp_path, monkeypatch, how):
    data = make_data("float32", (64, 70), seed=24)
    bad = "c/10/1"  # chunk 21 of 32 in block order: in the third of four batches
    err = ChunkEncodeError if how == "encode" else ChunkWriteError
    with warnings.catch_warnings():  # the GPU case warns (once per process) that it encodes on the CPU
        warnings.simplefilter("ignore")
        with pytest.raises(err) as info:
            _one_block_writer_error(tmp_path, data, bad, how, monkeypatch)
    msg = str(info.value)
    assert bad in msg and "out.zarr" in msg
    path = str(tmp_path / "out.zarr")
    assert not leftovers(path)
    a = zarr.open_array(path, mode="r")
    present = {tuple(int(v) for v in k.split("/")[1:]) for k in _chunk_files(path)}
    # batches 1 and 2 (chunks 0-15: rows 0-7) were written whole before the failure; batch 4 never was
    assert {(r, c) for r in range(8) for c in range(2)} <= present
    assert not any(r >= 12 for r, _ in present)
    assert_same(a[:32], data[:32])


def _chunk_files(path: str) -> list[str]:
    out = []
    for d, _, names in os.walk(path):
        for n in names:
            if n != "zarr.json" and not n.endswith(".tmp") and not os.path.isdir(os.path.join(d, n)):
                out.append(os.path.relpath(os.path.join(d, n), path).replace(os.sep, "/"))
    return out


def test_write_failure_waits_for_the_launched_encode(tmp_path, monkeypatch):
    """A write that fails while the next batch's encode runs: that encode is waited for (abandon) before the
    error leaves the task, so no encode thread still works on the block's buffers."""
    from gpuzarr_dist.codecs.encode import CpuBlockEncoder

    calls = []
    original = CpuBlockEncoder.abandon

    def abandon(self, pending):
        original(self, pending)
        calls.append(all(f.done() for f in pending if hasattr(f, "done")))

    monkeypatch.setattr(CpuBlockEncoder, "abandon", abandon)
    if dev() == "gpu":
        pytest.skip("the CPU encoder's hand-off is what this checks")
    data = make_data("float32", (64, 70), seed=25)
    with pytest.raises(ChunkWriteError, match="c/2/0"):
        _one_block_writer_error(tmp_path, data, "c/2/0", "write", monkeypatch)
    assert calls == [True]


@pytest.mark.gpu
def test_gpu_batches_encode_on_the_device_and_overlap(tmp_path, spy_batches, monkeypatch):
    """cupy blocks in several sub-batches: all encoded by nvCOMP (the CPU encoders fail here), launched
    before the previous batch's writes, read back equal."""
    import cupy

    import gpuzarr_dist.cuda.write as wg
    from gpuzarr_dist.codecs.encode import CpuBlockEncoder
    from gpuzarr_dist.codecs.pipeline import CodecPipeline

    def no_cpu(self, *args, **kwargs):
        raise AssertionError("encoded on the CPU")

    monkeypatch.setattr(CodecPipeline, "encode_batch", no_cpu)
    monkeypatch.setattr(CpuBlockEncoder, "launch", no_cpu)
    events = []
    launch, finish = wg.launch_encode_gpu, wg.finish_encode_gpu
    monkeypatch.setattr(wg, "launch_encode_gpu", lambda *a, **k: (events.append("launch"), launch(*a, **k))[1])
    monkeypatch.setattr(wg, "finish_encode_gpu", lambda p: (events.append("finish"), finish(p))[1])
    data = make_data("float32", (256, 720), seed=26)
    x = da.from_array(data, chunks=(128, 720)).map_blocks(cupy.asarray)
    path = str(tmp_path / "out.zarr")
    with dask.config.set({"gpuzarr.write.batch-size": "100 KiB", "scheduler": "sync"}):
        gz.to_zarr_gpu(x, path, chunks=(8, 360), codec="zstd", crc32c=True)
    check_both(path, data)
    assert all(len(blocks) >= 3 for blocks in spy_batches)
    # per block: launch 0, finish 0, launch 1, (write 0), finish 1, launch 2, ...: each launch before the writes
    assert events[:3] == ["launch", "finish", "launch"]
    assert events.count("launch") == events.count("finish") == sum(len(b) for b in spy_batches)
