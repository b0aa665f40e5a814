"""A failure on the shared threads leaves nothing running behind the error.

``Executor.map`` raises at the first failed result while later calls go on:
an object write's temporary file appeared after ``to_zarr_gpu`` had reported
the failure (``test_write_batches`` failed so once in CI), and reads could go
on into a staging buffer the caller had handed back, or through file
descriptors it had closed. ``runtime.threads.map_all`` waits for the running
calls and cancels the rest; these tests make the race certain with a slow
call beside a failing one.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import dask
import numpy as np
import pytest

from gpuzarr_dist.errors import ChunkReadError, ChunkWriteError
from gpuzarr_dist.runtime.threads import map_all


def test_map_all_waits_for_running_calls_and_cancels_the_rest():
    done, started = [], []
    gate = threading.Event()

    def call(i):
        started.append(i)
        if i == 0:
            gate.wait(5)  # the failure below happens while this call runs
            time.sleep(0.2)
            done.append(i)
            return i
        if i == 1:
            gate.set()
            raise ValueError("boom 1")
        return i

    with ThreadPoolExecutor(2) as pool:
        with pytest.raises(ValueError, match="boom 1"):
            map_all(pool, call, range(50))
        assert done == [0]  # finished before the error left
        n = len(started)
        time.sleep(0.1)
        assert len(started) == n  # nothing starts after the error left
        assert n < 50  # most calls were cancelled before they ran
        assert map_all(pool, lambda a, b: a * b, [1, 2, 3], [4, 5, 6]) == [4, 10, 18]  # as map, in order


def test_map_all_raises_the_first_failure_in_argument_order():
    def call(i):
        time.sleep(0.05 if i == 2 else 0.0)
        if i in (2, 5):
            raise KeyError(i)
        return i

    with ThreadPoolExecutor(4) as pool:
        with pytest.raises(KeyError) as e:
            map_all(pool, call, range(8))
    assert e.value.args == (2,)


def test_a_failed_batch_write_leaves_no_temporary_file_behind(tmp_path, monkeypatch):
    from gpuzarr_dist.stores.writer import LocalObjectWriter

    root = tmp_path / "out.zarr"
    root.mkdir()
    w = LocalObjectWriter(str(root), "out.zarr")
    original = LocalObjectWriter._create

    def create(self, folder, tmp):  # the slow object's temporary file exists while the bad one fails
        fd = original(self, folder, tmp)
        if os.path.basename(tmp).startswith(".1."):
            time.sleep(0.3)
        return fd

    monkeypatch.setattr(LocalObjectWriter, "_create", create)
    os.makedirs(root / "c" / "0" / "bad")  # a folder where an object must go: its rename fails
    # the slow object after the failing one: Executor.map raised at the failure while it was still being written
    items = [("c/0/bad", b"y" * 100), ("c/0/1", b"x" * 100)] + [(f"c/1/{i}", b"z") for i in range(20)]
    with dask.config.set({"gpuzarr.io-threads": 4}):
        with pytest.raises(ChunkWriteError, match="c/0/bad"):
            w.put_many(items)
    left = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".tmp")]
    assert left == []  # checked at once: the slow write had finished (and renamed its file) before the error
    assert (root / "c" / "0" / "1").read_bytes() == b"x" * 100


def test_a_failed_read_waits_for_the_other_reads_into_the_buffer(tmp_path, monkeypatch):
    from gpuzarr_dist.cuda import files as cufiles
    from gpuzarr_dist.stores.local import LocalChunkStore

    root = tmp_path / "a"
    (root / "c").mkdir(parents=True)
    for i in range(6):
        (root / "c" / str(i)).write_bytes(bytes([i]) * 1000)
    store = LocalChunkStore(str(root), "a")
    busy = {"n": 0, "after_error": 0}
    original = store._pread
    failed = threading.Event()

    def pread(fd, view, n):
        busy["n"] += 1
        try:
            if bytes(os.pread(fd, 1, 0)) == b"\x01":
                failed.set()
                raise OSError(5, "Input/output error")
            if bytes(os.pread(fd, 1, 0)) == b"\x03":
                failed.wait(5)
                time.sleep(0.2)  # still reading when chunk 1 has failed (and comes after it in order)
            return original(fd, view, n)
        finally:
            busy["n"] -= 1

    def read_slot(key, view, n):  # the retry of chunk 1 fails for good
        raise ChunkReadError("a", key, "OSError: [Errno 5] Input/output error")

    monkeypatch.setattr(store, "_pread", pread)
    monkeypatch.setattr(store, "read_slot", read_slot)
    bufs = []

    def staging(n):
        bufs.append(np.zeros(n, dtype=np.uint8))
        return bufs[-1]

    with dask.config.set({"gpuzarr.local-reads": "threads", "gpuzarr.io-threads": 4}):
        monkeypatch.setattr(cufiles, "cufile", lambda: None)
        with pytest.raises(ChunkReadError, match="c/1"):
            store.read_into([f"c/{i}" for i in range(6)], staging)
        assert busy["n"] == 0  # no read still writing into the buffer, or using a closed descriptor


def test_gather_all_cancels_the_rest_and_raises_the_first_failure_in_order():
    import asyncio

    from gpuzarr_dist.runtime.aio import gather_all

    state = {"slow_finished": False, "slow_cancelled": False}

    async def slow():
        try:
            await asyncio.sleep(5)
            state["slow_finished"] = True
        except asyncio.CancelledError:
            state["slow_cancelled"] = True
            raise

    async def fail(msg, delay):
        await asyncio.sleep(delay)
        raise ValueError(msg)

    async def ok(v):
        return v

    async def main():
        with pytest.raises(ValueError, match="first in order"):
            # both fail in the same turn of the loop: the first in argument order is raised, whichever came first
            await gather_all([slow(), fail("first in order", 0.0), fail("second", 0.0)])
        assert state == {"slow_finished": False, "slow_cancelled": True}  # cancelled, and over, before the error left
        assert await gather_all(ok(i) for i in range(5)) == [0, 1, 2, 3, 4]
        assert await gather_all([]) == []

    asyncio.run(main())
