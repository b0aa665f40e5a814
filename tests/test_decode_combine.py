"""``gpuzarr.gpu.decode-combine``: nvCOMP decode calls made at the same time are joined into one.

CPU tests cover the setting and the queue's hand-over (:class:`gpuzarr_dist.cuda.combine.Combiner`)
with a stand-in call; the tests marked ``gpu`` read a zstd array from many threads with the
setting on and compare with zarr-python, with joined calls seen and with joined calls that fail.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import dask
import numpy as np
import pytest
import zarr.codecs as zc
from conftest import assert_same, make_data, reference, slow_calls, write_array

import gpuzarr_dist as gz
from gpuzarr_dist.config import gpu_decode_combine
from gpuzarr_dist.cuda.combine import Combiner, Request


def test_setting():
    assert gpu_decode_combine() is False  # off by default: nvCOMP's C calls overlap without joining
    for on in (True, "true", " On ", "1"):
        with dask.config.set({"gpuzarr.gpu.decode-combine": on}):
            assert gpu_decode_combine() is True
    with dask.config.set({"gpuzarr.gpu.decode-combine": "off"}):
        assert gpu_decode_combine() is False
    with dask.config.set({"gpuzarr.gpu.decode-combine": "maybe"}), pytest.raises(ValueError, match="decode-combine"):
        gpu_decode_combine()


def _doubling(batches: list):
    def execute(batch):
        batches.append([r.payload for r in batch])
        for r in batch:
            r.result = 2 * r.payload

    return execute


def test_a_thread_alone_calls_at_once():
    c, batches = Combiner(), []
    r = c.run(Request(21), _doubling(batches))
    assert r.result == 42 and r.error is None and batches == [[21]] and (c.calls, c.requests) == (1, 1)
    assert c.run(Request(5), _doubling(batches)).result == 10  # the lead was given back


def test_requests_queued_during_a_call_share_the_next_one():
    c, batches, go = Combiner(), [], threading.Event()
    doubling = _doubling(batches)

    def execute(batch):
        if not batches:  # the first call holds the GPU until the others have queued
            assert go.wait(10)
        doubling(batch)

    with ThreadPoolExecutor(6) as pool:
        first = pool.submit(c.run, Request(0), execute)
        while not c._busy:
            time.sleep(0.001)
        rest = [pool.submit(c.run, Request(i), execute) for i in range(1, 6)]
        deadline = time.monotonic() + 10
        while len(c._queue) < 5 and time.monotonic() < deadline:
            time.sleep(0.001)
        go.set()
        results = [f.result(timeout=10).result for f in [first, *rest]]
    assert results == [0, 2, 4, 6, 8, 10]
    assert batches[0] == [0] and sorted(batches[1]) == [1, 2, 3, 4, 5] and len(batches) == 2  # one joined call
    assert (c.calls, c.requests) == (2, 6)


def test_many_threads_each_get_their_own_result():
    c, batches = Combiner(), []
    doubling = _doubling(batches)

    def execute(batch):
        time.sleep(random.random() * 0.002)  # a call takes a while: others queue meanwhile
        doubling(batch)

    def one(i):
        return c.run(Request(i), execute).result

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(one, range(1600)))
    assert got == [2 * i for i in range(1600)]
    assert c.requests == 1600 and c.calls < 1600  # calls were joined
    assert sorted(p for b in batches for p in b) == list(range(1600))  # each request executed exactly once
    assert not c._busy and not c._queue


def test_counts_add_up_the_combiners_of_one_kind():
    from gpuzarr_dist.cuda.combine import combiner, counts

    kind = f"counted-{random.random()}"  # combiners are per process: keys of their own
    before = counts(kind)
    assert before == (0, 0)
    batches: list = []
    for gpu, n in ((0, 3), (1, 2)):
        for i in range(n):
            combiner((kind, gpu, "zstd")).run(Request(i), _doubling(batches))
    combiner(("other", 0)).run(Request(0), _doubling(batches))
    assert counts(kind) == (5, 5)  # one thread: every call alone, and only this kind's combiners
    assert counts("other")[0] >= 1


def test_a_call_that_raises_reaches_every_request_and_the_queue_goes_on():
    c = Combiner()

    def broken(batch):
        raise RuntimeError("the call failed")

    with ThreadPoolExecutor(8) as pool:
        reqs = list(pool.map(lambda i: c.run(Request(i), broken), range(40)))
    assert all(isinstance(r.error, RuntimeError) and r.result is None for r in reqs)
    assert c.run(Request(3), _doubling([])).result == 6  # not left busy


# -- on a GPU -------------------------------------------------------------------------------------


def _blocks_from_threads(path, threads=8):
    """Every block of ``path`` read by ``threads`` threads at once through one BlockReader, in block order."""
    from gpuzarr_dist.array.reader import BlockReader
    from gpuzarr_dist.stores.source import open_source

    store, spec = open_source(path)
    reader = BlockReader(store, spec, "gpu")
    sels = [(slice(t, t + 8), slice(None), slice(None)) for t in range(0, spec.shape[0], 8)]
    with ThreadPoolExecutor(threads) as pool:
        return [b.get() for b in pool.map(lambda s: reader[s], sels)]


@pytest.fixture(params=["c", "python"])
def api(request):
    """nvCOMP's interface (``gpuzarr.gpu.nvcomp-api``): the joined calls of either."""
    return request.param


@pytest.fixture
def zstd_array(tmp_path):
    path = str(tmp_path / "a.zarr")
    data = make_data("float32", (96, 64, 80), seed=9, specials=False)
    write_array(path, data, (1, 64, 80), compressors=[zc.ZstdCodec(level=1)])  # blocks of 8 chunks: nvCOMP batches
    return path


@pytest.mark.gpu
def test_joined_calls_equal_zarr_python(zstd_array, monkeypatch, api):
    from gpuzarr_dist.cuda import combine
    from gpuzarr_dist.cuda import nvcomp_calls as gpu
    expected = reference(zstd_array)
    slow_calls(monkeypatch, gpu, "execute_joined")  # the other threads' blocks queue behind a call and join the next
    monkeypatch.setattr(combine, "_combiners", {})
    with dask.config.set({"gpuzarr.gpu.decode-combine": True, "gpuzarr.gpu.min-batch": 0,
                          "gpuzarr.gpu.nvcomp-api": api}):
        for _ in range(3):
            got = _blocks_from_threads(zstd_array)
            assert_same(np.concatenate(got), expected)
        x = gz.from_zarr_gpu(zstd_array, device="gpu", chunks=(8, 64, 80))
        with dask.config.set({"scheduler": "threads", "num_workers": 8}):
            mean = x.astype("f8").mean(axis=0).compute().get()
    np.testing.assert_allclose(mean, expected.astype("f8").mean(axis=0), rtol=1e-12, atol=1e-9)
    (c,) = combine._combiners.values()
    assert c.requests > c.calls  # calls were joined


@pytest.mark.gpu
def test_a_failed_joined_call_decodes_each_block_alone(zstd_array, monkeypatch, api):
    """nvCOMP failing on a joined call (stand-in: any call of more than one block's 8 frames) costs a second call
    per block, not a wrong value or an error for the blocks around a bad one."""
    from gpuzarr_dist.cuda import combine
    from gpuzarr_dist.cuda import nvcomp_calls as gpu
    expected = reference(zstd_array)
    real_decode, joined = gpu.decode_frames, []

    def fails_when_joined(stream, parts):
        frames = sum(p.n for p in parts)
        if frames > 8:
            joined.append(frames)
            raise RuntimeError("stand-in nvCOMP failure on a joined call")
        return real_decode(stream, parts)

    monkeypatch.setattr(gpu, "decode_frames", fails_when_joined)
    slow_calls(monkeypatch, gpu, "execute_joined")
    monkeypatch.setattr(combine, "_combiners", {})
    with dask.config.set({"gpuzarr.gpu.decode-combine": True, "gpuzarr.gpu.min-batch": 0,
                          "gpuzarr.gpu.nvcomp-api": api}):
        got = _blocks_from_threads(zstd_array)
    assert_same(np.concatenate(got), expected)
    assert joined  # the joined calls did fail, and every block was decoded again alone
