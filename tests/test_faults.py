"""Injected faults in local chunk reads: transient errors are retried, then reported against the chunk;
GPU out-of-memory is reported with the block size and how to lower it."""

from __future__ import annotations

import errno
import os
import sys
import threading
import types

import dask
import numpy as np
import pytest
import zarr.codecs as zc
from conftest import assert_same, compute_checked, dev, make_data, reference, write_array

import gpuzarr_dist as gz
from gpuzarr_dist.cuda import files as cufiles
from gpuzarr_dist.stores.local import LocalChunkStore
from gpuzarr_dist.stores.retry import is_transient, with_retries

SHAPE, CHUNKS = (8, 6), (4, 3)


@pytest.fixture
def no_wait():
    with dask.config.set({"gpuzarr.io-retry-delay": 0}):
        yield


@pytest.fixture
def stored(tmp_path):
    path = str(tmp_path / "f.zarr")
    write_array(path, make_data("float32", SHAPE, seed=41), CHUNKS, compressors=[zc.ZstdCodec(level=1)])
    return path, reference(path)


class Faults:
    """Make reads of chosen chunk files fail: ``plan[key]`` errors are raised, one per attempt, then reads succeed."""

    def __init__(self, monkeypatch, plan: dict[str, list[OSError]]):
        self.plan = {k: list(v) for k, v in plan.items()}
        self.attempts: dict[str, int] = {}
        self.lock = threading.Lock()
        faults = self
        read_file, pread = LocalChunkStore._read_file, LocalChunkStore._pread

        def fail_for(path: str) -> None:
            key = next((k for k in faults.plan if path.endswith(os.path.join(*k.split("/")))), None)
            if key is None:
                return
            with faults.lock:
                faults.attempts[key] = faults.attempts.get(key, 0) + 1
                if faults.plan[key]:
                    raise faults.plan[key].pop(0)

        def fake_read_file(self, path):
            fail_for(path)
            return read_file(self, path)

        def fake_pread(self, fd, view, n):
            fail_for(os.readlink(f"/proc/self/fd/{fd}"))
            return pread(self, fd, view, n)

        monkeypatch.setattr(LocalChunkStore, "_read_file", fake_read_file)
        monkeypatch.setattr(LocalChunkStore, "_pread", fake_pread)
        monkeypatch.setattr(cufiles, "cufile", lambda: None)  # the GPU path reads with preadv here too


def eio() -> OSError:
    return OSError(errno.EIO, "Input/output error")


pytestmark = pytest.mark.usefixtures("device")


def test_transient_errors_are_retried_and_the_result_is_correct(monkeypatch, stored, no_wait):
    path, expected = stored
    faults = Faults(monkeypatch, {"c/1/0": [eio(), OSError(errno.EAGAIN, "busy")], "c/0/1": [TimeoutError(errno.ETIMEDOUT, "timed out")]})
    assert_same(compute_checked(gz.from_zarr_gpu(path, device=dev())), expected)
    assert faults.attempts["c/1/0"] == 3 and faults.attempts["c/0/1"] == 2
    assert not any(faults.plan.values())


def test_errors_that_outlast_the_retries_raise_chunk_read_error(monkeypatch, stored, no_wait):
    path, _ = stored
    faults = Faults(monkeypatch, {"c/1/1": [eio() for _ in range(10)]})
    with dask.config.set({"gpuzarr.io-retries": 2}):
        with pytest.raises(gz.ChunkReadError) as info:
            gz.from_zarr_gpu(path, device=dev()).compute()
    assert info.value.key == "c/1/1" and info.value.array == path
    assert "c/1/1" in str(info.value) and path in str(info.value)
    assert "Input/output error" in str(info.value) and "after 3 attempts" in str(info.value)
    assert faults.attempts["c/1/1"] >= 3


@pytest.mark.parametrize("error", [PermissionError(errno.EACCES, "Permission denied"), IsADirectoryError(errno.EISDIR, "Is a directory")])
def test_permanent_errors_are_not_retried(monkeypatch, stored, no_wait, error):
    path, _ = stored
    faults = Faults(monkeypatch, {"c/0/0": [error] * 10})
    with pytest.raises(gz.ChunkReadError) as info:
        gz.from_zarr_gpu(path, device=dev()).compute()
    assert info.value.key == "c/0/0"
    assert "attempts" not in str(info.value)
    # the GPU path opens then reads: a failed read is tried once more with a fresh handle, never more
    assert faults.attempts["c/0/0"] <= 2


def test_read_into_retries_per_slot_and_fills_the_right_bytes(monkeypatch, stored, no_wait):
    path, _ = stored
    Faults(monkeypatch, {"c/0/1": [eio()], "c/1/0": [eio(), eio()]})
    store = LocalChunkStore(path)
    keys = ["c/0/0", "c/0/1", "c/1/0", "c/1/1", "c/9/9"]
    buf, offsets, sizes = store.read_into(keys, lambda n: np.zeros(n, dtype=np.uint8), 256, 0)
    assert sizes[-1] == -1
    for key, off, n in zip(keys[:-1], offsets, sizes):
        with open(os.path.join(path, *key.split("/")), "rb") as f:
            assert bytes(buf[off : off + n]) == f.read(), key


def test_backoff_doubles_and_is_configurable():
    waits, calls = [], []

    def read():
        calls.append(1)
        raise eio()

    with dask.config.set({"gpuzarr.io-retries": 3, "gpuzarr.io-retry-delay": 0.25}):
        with pytest.raises(gz.ChunkReadError, match="after 4 attempts"):
            with_retries(read, "arr", "c/0", sleep=waits.append)
    assert waits == [0.25, 0.5, 1.0] and len(calls) == 4
    with dask.config.set({"gpuzarr.io-retries": 0}):
        with pytest.raises(gz.ChunkReadError):
            with_retries(read, "arr", "c/0", sleep=waits.append)
    assert len(calls) == 5


def test_transient_classification():
    assert is_transient(eio()) and is_transient(OSError(errno.ESTALE, "stale")) and is_transient(ConnectionResetError())
    assert is_transient(TimeoutError())
    for e in (FileNotFoundError(), PermissionError(), IsADirectoryError(), NotADirectoryError(), ValueError(),
              OSError(errno.ENAMETOOLONG, "x"), gz.ChunkReadError("a", "k", "r")):
        assert not is_transient(e), e


# --------------------------------------------------------------------------- GPU out of memory


def test_gpu_out_of_memory_names_the_block_and_how_to_shrink_it(monkeypatch, stored):
    """cupy's OutOfMemoryError during a block read becomes GpuOutOfMemoryError (tested with a stand-in module)."""
    path, _ = stored

    class OutOfMemoryError(MemoryError):  # cupy.cuda.memory.OutOfMemoryError's name and base
        pass

    fake = types.ModuleType("gpuzarr_dist.cuda.blocks")

    def read_plan_gpu(reader, plan):
        raise OutOfMemoryError("Out of memory allocating 1,073,741,824 bytes (allocated so far: 0 bytes).")

    fake.read_plan_gpu = read_plan_gpu
    monkeypatch.setitem(sys.modules, "gpuzarr_dist.cuda.blocks", fake)
    from gpuzarr_dist.array.reader import BlockReader
    from gpuzarr_dist.stores.source import open_source

    store, spec = open_source(path)
    reader = BlockReader(store, spec, "gpu")
    with pytest.raises(gz.GpuOutOfMemoryError) as info:
        reader[0:8, 0:6]
    msg = str(info.value)
    assert path in msg
    assert "(8, 6)" in msg and "192 B" in msg  # the block's shape and decoded size (8*6*4 bytes)
    assert "chunks=" in msg and "gpuzarr.block-size.gpu" in msg
    assert isinstance(info.value, MemoryError)
    assert isinstance(info.value.__cause__, OutOfMemoryError)


class _FakePool:
    """CuPy's default memory pool as far as :func:`release_cached_device_memory` uses it."""

    def __init__(self, cached: int):
        self.total, self.cached, self.freed = cached + 100, cached, 0

    def total_bytes(self) -> int:
        return self.total

    def free_all_blocks(self) -> None:
        self.total -= self.cached
        self.freed += 1
        self.cached = 0


@pytest.mark.parametrize("cached, fails", [(1 << 20, 1), (0, 1), (1 << 20, 2)])
def test_gpu_out_of_memory_retries_once_after_releasing_the_pool(request, monkeypatch, stored, cached, fails):
    """An allocation failure frees CuPy's cached blocks and reads the block again, once, also where this thread
    released nothing (another task's release may have freed the blocks); a second failure gives the
    GpuOutOfMemoryError (tested with stand-in modules)."""
    if "gpu" in request.node.keywords:
        pytest.skip("replaces cupy with a stand-in: run where cupy is not in use (the CPU parameter)")
    path, expected = stored

    class OutOfMemoryError(MemoryError):
        pass

    pool = _FakePool(cached)
    calls = []
    fake = types.ModuleType("gpuzarr_dist.cuda.blocks")

    def read_plan_gpu(reader, plan):
        calls.append(pool.cached)
        if len(calls) <= fails:
            raise OutOfMemoryError("Out of memory allocating 1,073,741,824 bytes")
        return reader.read_plan_cpu(plan)  # the right values, from the CPU path

    fake.read_plan_gpu = read_plan_gpu
    monkeypatch.setitem(sys.modules, "gpuzarr_dist.cuda.blocks", fake)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(get_default_memory_pool=lambda: pool))
    from gpuzarr_dist.array.reader import BlockReader
    from gpuzarr_dist.stores.source import open_source

    store, spec = open_source(path)
    reader = BlockReader(store, spec, "gpu")
    if fails == 1:
        np.testing.assert_array_equal(reader[0:8, 0:6], expected[0:8, 0:6])
        assert calls == [cached, 0] and pool.freed == 1  # the retry ran after the release
    else:
        with pytest.raises(gz.GpuOutOfMemoryError, match="block-size.gpu"):
            reader[0:8, 0:6]
        assert len(calls) == 2 and pool.freed == 1


@pytest.mark.gpu
def test_gpu_out_of_memory_on_the_device(tmp_path):
    """A block larger than the device's memory pool limit fails with the message, not a hang or a crash."""
    import cupy

    path = str(tmp_path / "big.zarr")
    write_array(path, np.ones((64, 256, 256), dtype="f4"), (8, 256, 256), compressors=[zc.ZstdCodec(level=1)])
    pool = cupy.get_default_memory_pool()
    old = pool.get_limit()
    pool.set_limit(size=4 * 2**20)  # 4 MiB: one 16 MiB block cannot fit
    try:
        x = gz.from_zarr_gpu(path, device="gpu", chunks=(64, 256, 256))
        with pytest.raises(gz.GpuOutOfMemoryError, match="block-size.gpu"):
            x.sum().compute(scheduler="threads")
    finally:
        pool.set_limit(size=old)
    assert float(gz.from_zarr_gpu(path, device="gpu", chunks=(8, 256, 256)).sum().compute()) == 64 * 256 * 256
