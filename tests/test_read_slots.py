"""``gpuzarr.gpu.read-slots``: at most N blocks of a process read their files at once, first come first served.

CPU tests cover the setting and the slot helper; the test marked ``gpu``
reads with one slot under many threads and compares with zarr-python.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import dask
import numpy as np
import pytest
import zarr.codecs as zc
from conftest import assert_same, make_data, reference, write_array

import gpuzarr_dist as gz
from gpuzarr_dist.config import gpu_read_slots
from gpuzarr_dist.runtime.threads import _FifoSemaphore, read_slot


def test_read_slots_setting():
    assert gpu_read_slots() == 1  # the default: one block reads at a time
    with dask.config.set({"gpuzarr.gpu.read-slots": "2"}):
        assert gpu_read_slots() == 2
    for off in (0, None):
        with dask.config.set({"gpuzarr.gpu.read-slots": off}):
            assert gpu_read_slots() == 0
    with dask.config.set({"gpuzarr.gpu.read-slots": -1}), pytest.raises(ValueError, match="read-slots"):
        gpu_read_slots()


def test_plan_turns_setting():
    from gpuzarr_dist.config import gpu_plan_turns

    assert gpu_plan_turns() is True  # the default: blocks that take read turns prepare one at a time
    for off in (False, "off", "0"):
        with dask.config.set({"gpuzarr.gpu.plan-turns": off}):
            assert gpu_plan_turns() is False
    with dask.config.set({"gpuzarr.gpu.plan-turns": "sometimes"}), pytest.raises(ValueError, match="plan-turns"):
        gpu_plan_turns()


def test_plan_and_read_slots_are_apart():
    """A block preparing (the ``plan`` slot) never keeps another from reading (the ``read`` slot)."""
    done = []

    def read() -> None:
        with read_slot(1):
            done.append(1)

    with read_slot(1, "plan"):
        t = threading.Thread(target=read)
        t.start()
        t.join(5)
        assert done == [1]


def test_read_slot_min_setting():
    from gpuzarr_dist.config import gpu_read_slot_min_bytes

    assert gpu_read_slot_min_bytes() == 16 * 2**20  # the default
    with dask.config.set({"gpuzarr.gpu.read-slot-min": "1 MiB"}):
        assert gpu_read_slot_min_bytes() == 2**20
    with dask.config.set({"gpuzarr.gpu.read-slot-min": 0}):
        assert gpu_read_slot_min_bytes() == 0
    with dask.config.set({"gpuzarr.gpu.read-slot-min": -1}), pytest.raises(ValueError, match="read-slot-min"):
        gpu_read_slot_min_bytes()


def _max_inside(n_slots: int, threads: int, hold: float = 0.01) -> int:
    inside, peak, lock = [0], [0], threading.Lock()

    def one(_):
        with read_slot(n_slots):
            with lock:
                inside[0] += 1
                peak[0] = max(peak[0], inside[0])
            time.sleep(hold)
            with lock:
                inside[0] -= 1

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(threads * 3)))
    return peak[0]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_read_slot_bounds_the_reads_in_flight(n):
    assert _max_inside(n, 8) == n


def test_no_slots_means_no_limit():
    assert _max_inside(0, 8, hold=0.05) > 3


def test_waiters_get_the_slot_in_the_order_they_asked():
    sem = _FifoSemaphore(1)
    sem.acquire()
    order, threads = [], []
    for i in range(6):
        def wait(i=i):
            sem.acquire()
            order.append(i)
            sem.release()

        t = threading.Thread(target=wait)
        t.start()
        threads.append(t)
        deadline = time.monotonic() + 5
        while len(sem._waiters) < i + 1 and time.monotonic() < deadline:  # queued before the next one starts
            time.sleep(0.001)
    sem.release()
    for t in threads:
        t.join(5)
    assert order == list(range(6))
    assert sem._free == 1 and not sem._waiters


def test_an_error_inside_gives_the_slot_back():
    for _ in range(3):
        with pytest.raises(RuntimeError), read_slot(1):
            raise RuntimeError("read failed")
    assert _max_inside(1, 4) == 1  # the slot is free again, and still only one


def test_only_local_files_take_turns(tmp_path):
    """Turns are for local files (their reads share the host's bandwidth), sharded or not; object stores and
    zarr-python stores keep every block's requests in flight (they are capped per process already)."""
    import zarr

    from gpuzarr_dist.stores.local import LocalChunkStore
    from gpuzarr_dist.stores.remote import ObjectChunkStore
    from gpuzarr_dist.stores.source import open_source
    from gpuzarr_dist.stores.zarrstore import ZarrChunkStore

    assert LocalChunkStore.read_turns and not ObjectChunkStore.read_turns and not ZarrChunkStore.read_turns
    path = str(tmp_path / "s.zarr")
    a = zarr.create_array(path, shape=(8, 8), chunks=(2, 2), shards=(4, 4), dtype="f4")
    a[...] = 1
    store, _ = open_source(path)
    assert type(store).__name__ == "ShardedChunkStore" and store.read_turns
    store.base = ObjectChunkStore.__new__(ObjectChunkStore)  # the same shards behind an object store
    assert not store.read_turns
    mem, _ = open_source(zarr.open_array(zarr.storage.MemoryStore(), mode="w", shape=(4,), chunks=(2,), dtype="f4"))
    assert isinstance(mem, ZarrChunkStore) and not mem.read_turns


def _count_concurrent_reads(monkeypatch, cls, hold: float, phase: str = "reads") -> list[int]:
    """Patch ``cls.read_into`` to count the calls at once in one ``phase``, holding each ``hold`` seconds there;
    returns ``[peak]`` (updated live). ``"reads"``: between their staging buffer and their return (the reads,
    which a block's read turn covers); ``"prepare"``: from their start to their staging buffer (keys, opens,
    sizes, which a block's plan turn covers)."""
    inside, peak, lock = [0], [0], threading.Lock()
    real = cls.read_into

    def enter() -> None:
        with lock:
            inside[0] += 1
            peak[0] = max(peak[0], inside[0])
        time.sleep(hold)

    def leave() -> None:
        with lock:
            inside[0] -= 1

    def read_into(self, keys, staging, *args, **kwargs):
        counted = [False]

        def staged(nbytes):
            if phase == "prepare":
                leave()
                counted[0] = False
            buf = staging(nbytes)  # the reader's: its read turn starts here
            if phase == "reads":
                enter()
                counted[0] = True
            return buf

        if phase == "prepare":
            enter()
            counted[0] = True
        try:
            return real(self, keys, staged, *args, **kwargs)
        finally:
            if counted[0]:
                leave()

    monkeypatch.setattr(cls, "read_into", read_into)
    return peak


@pytest.mark.gpu
def test_blocks_from_a_zarr_store_do_not_take_turns(monkeypatch):
    import zarr

    from gpuzarr_dist.stores.zarrstore import ZarrChunkStore

    data = make_data("float32", (64, 32, 40), seed=6, specials=False)
    z = zarr.create_array(zarr.storage.MemoryStore(), shape=data.shape, chunks=(2, 16, 20), dtype="f4",
                          compressors=[zc.ZstdCodec(level=1)])
    z[...] = data
    peak = _count_concurrent_reads(monkeypatch, ZarrChunkStore, 0.02)
    x = gz.from_zarr_gpu(z, device="gpu", chunks=(8, 32, 40))
    with dask.config.set({"gpuzarr.gpu.read-slots": 1, "scheduler": "threads", "num_workers": 8}):
        assert_same(x.compute().get(), z[...])
    assert peak[0] > 1


@pytest.mark.gpu
@pytest.mark.parametrize("slots", [0, 1, 2])
def test_read_slots_under_many_threads_equal_zarr_python(tmp_path, monkeypatch, slots):
    from gpuzarr_dist.stores.local import LocalChunkStore

    path = str(tmp_path / "a.zarr")
    data = make_data("float32", (64, 32, 40), seed=5, specials=False)
    write_array(path, data, (2, 16, 20), compressors=[zc.ZstdCodec(level=1)])
    expected = reference(path)
    peak = _count_concurrent_reads(monkeypatch, LocalChunkStore, 0.005)
    x = gz.from_zarr_gpu(path, device="gpu", chunks=(8, 32, 40))  # 8 blocks of 16 chunks
    # these blocks are 40 KB: read-slot-min 0 makes them take turns as large blocks do
    with dask.config.set({"gpuzarr.gpu.read-slots": slots, "gpuzarr.gpu.read-slot-min": 0, "scheduler": "threads",
                          "num_workers": 8}):
        for _ in range(3):
            assert_same(x.compute().get(), expected)
            got = x.astype("f8").mean(axis=0).compute().get()
            np.testing.assert_allclose(got, expected.astype("f8").mean(axis=0), rtol=1e-12, atol=1e-9)
    if slots:
        assert peak[0] == slots
    else:
        assert peak[0] > 2  # unlimited: blocks read together


@pytest.mark.gpu
@pytest.mark.parametrize("turns", [True, False])
def test_blocks_below_read_slot_min_take_no_turn(tmp_path, monkeypatch, turns):
    """A block of fewer stored bytes than ``gpuzarr.gpu.read-slot-min`` reads without a slot; a larger one takes one."""
    import os

    from gpuzarr_dist.stores.local import LocalChunkStore

    path = str(tmp_path / "a.zarr")
    data = make_data("float32", (64, 32, 40), seed=8, specials=False)
    write_array(path, data, (2, 16, 20), compressors=[zc.ZstdCodec(level=1)])
    expected = reference(path)
    stored = [os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs if f != "zarr.json"]
    block = 16 * max(stored)  # 8 blocks of 16 chunks: no block stores more than this
    # a staging buffer is at least a block's stored bytes (plus alignment): the smallest chunk x 16 is below every
    # block; 64 x the largest is above every buffer
    least = 16 * min(stored) if turns else 64 * max(stored)
    peak = _count_concurrent_reads(monkeypatch, LocalChunkStore, 0.005)
    x = gz.from_zarr_gpu(path, device="gpu", chunks=(8, 32, 40))
    with dask.config.set({"gpuzarr.gpu.read-slots": 1, "gpuzarr.gpu.read-slot-min": least, "scheduler": "threads",
                          "num_workers": 8}):
        for _ in range(3):
            assert_same(x.compute().get(), expected)
    assert block < 64 * max(stored)
    assert (peak[0] == 1) if turns else (peak[0] > 1)


@pytest.mark.gpu
@pytest.mark.parametrize("plan_turns", [True, False])
def test_blocks_prepare_one_at_a_time_with_plan_turns(tmp_path, monkeypatch, plan_turns):
    """With read slots on, blocks prepare their reads (up to their staging buffer) one at a time unless
    ``gpuzarr.gpu.plan-turns`` is off; values equal zarr-python's either way."""
    from gpuzarr_dist.stores.local import LocalChunkStore

    path = str(tmp_path / "a.zarr")
    data = make_data("float32", (64, 32, 40), seed=9, specials=False)
    write_array(path, data, (2, 16, 20), compressors=[zc.ZstdCodec(level=1)])
    expected = reference(path)
    peak = _count_concurrent_reads(monkeypatch, LocalChunkStore, 0.01, phase="prepare")
    x = gz.from_zarr_gpu(path, device="gpu", chunks=(8, 32, 40))
    with dask.config.set({"gpuzarr.gpu.read-slots": 1, "gpuzarr.gpu.read-slot-min": 0, "gpuzarr.gpu.plan-turns": plan_turns,
                          "scheduler": "threads", "num_workers": 8}):
        for _ in range(3):
            assert_same(x.compute().get(), expected)
    assert (peak[0] == 1) if plan_turns else (peak[0] > 1)
