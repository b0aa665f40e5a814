"""The pinned staging pool (``gpuzarr_dist.cuda.pinned``) on the CPU, with plain memory standing in for pinned.

What must hold: a buffer is never handed out while any array still views it
(the data a thread wrote stays its own), a free buffer serves later requests
of other sizes up to the reuse factor, and new memory is pinned only when no
free buffer holds a request.
"""

from __future__ import annotations

import gc
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from gpuzarr_dist.cuda.pinned import MIN_BYTES, REUSE_FACTOR, PinnedPool, size_class


class Owner:
    """What the allocator returns: owns ``nbytes`` of memory at ``ptr`` while it lives."""

    def __init__(self, nbytes: int) -> None:
        self.buf = np.empty(nbytes, dtype=np.uint8)
        self.ptr = self.buf.ctypes.data


class Allocator:
    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, nbytes: int) -> Owner:
        with self.lock:
            self.sizes.append(nbytes)
        return Owner(nbytes)


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_size_classes_are_powers_of_two_from_a_mib():
    assert size_class(0) == size_class(1) == MIN_BYTES
    assert size_class(MIN_BYTES + 1) == 2 * MIN_BYTES
    assert size_class(700_000_000) == 1 << 30
    assert size_class(1 << 30) == 1 << 30


def test_a_freed_buffer_serves_smaller_requests_within_the_factor():
    alloc = Allocator()
    pool = PinnedPool(alloc)
    big = pool.take(700_000_000 // 64)  # about 10.4 MiB: a 16 MiB buffer
    where = address(big)
    assert alloc.sizes == [16 << 20] and big.nbytes == 700_000_000 // 64
    del big
    gc.collect()
    smaller = pool.take(3 << 20)  # class 4 MiB: 16 MiB is within REUSE_FACTOR of it
    assert address(smaller) == where and len(alloc.sizes) == 1
    del smaller
    tiny = pool.take(1000)  # class 1 MiB: 16 MiB is more than REUSE_FACTOR times that
    assert 16 > REUSE_FACTOR and address(tiny) != where and alloc.sizes == [16 << 20, 1 << 20]
    larger = pool.take(17 << 20)  # larger than every free buffer
    assert alloc.sizes[-1] == 32 << 20
    assert pool.pins == 3 and pool.pinned_bytes == (16 + 1 + 32) << 20
    del tiny, larger
    assert pool.free_bytes() == (16 + 1 + 32) << 20
    assert pool.release() == (16 + 1 + 32) << 20 and pool.free_bytes() == 0 and pool.pinned_bytes == 0


def test_a_buffer_is_not_reused_while_a_view_of_it_lives():
    pool = PinnedPool(Allocator())
    a = pool.take(5 << 20)
    a[:] = 7
    view = a[100:200]  # the caller keeps only a slice (as a copy in flight would)
    where = address(a)
    del a
    gc.collect()
    b = pool.take(5 << 20)
    assert address(b) != where
    b[:] = 9
    np.testing.assert_array_equal(view, np.full(100, 7, dtype=np.uint8))
    del view, b
    gc.collect()
    c = pool.take(4 << 20)  # both buffers (8 MiB each) free now: one of them, nothing new pinned
    assert c.nbytes == 4 << 20 and pool.pins == 2


def test_the_smallest_free_buffer_that_holds_a_request_is_taken():
    alloc = Allocator()
    pool = PinnedPool(alloc)
    held = [pool.take(n) for n in (9 << 20, 3 << 20, 17 << 20)]  # 16, 4 and 32 MiB
    where = {a.nbytes: address(a) for a in held}
    del held
    gc.collect()
    first = pool.take(2 << 20)
    second = pool.take(5 << 20)
    third = pool.take(5 << 20)
    assert address(first) == where[3 << 20]  # 4 MiB, not 16 or 32
    assert address(second) == where[9 << 20]  # 16 MiB: 4 is taken, 16 is the smallest left
    assert address(third) == where[17 << 20]
    assert len(alloc.sizes) == 3


@pytest.mark.parametrize("threads", [8])
def test_threads_never_share_a_buffer_and_pin_only_what_is_in_flight(threads):
    alloc = Allocator()
    pool = PinnedPool(alloc)
    rng = np.random.default_rng(0)
    sizes = rng.integers(1 << 18, 12 << 20, size=400).tolist()
    barrier = threading.Barrier(threads)

    def work(i: int) -> int:
        if i < threads:
            barrier.wait()
        a = pool.take(sizes[i])
        mark = np.uint8(i % 251)
        a[:] = mark
        for _ in range(3):  # other threads take and fill buffers meanwhile
            threading.Event().wait(0.0005)
            if not (a == mark).all():
                return 1
        return 0

    with ThreadPoolExecutor(threads) as ex:
        bad = sum(ex.map(work, range(len(sizes))))
    assert bad == 0
    # at most one buffer in flight per thread at a time, and each pinned buffer is at most 16 MiB
    assert pool.pinned_bytes <= 4 * threads * (16 << 20)
    assert pool.pins < len(sizes) / 4
    gc.collect()
    assert pool.free_bytes() == pool.pinned_bytes


@pytest.mark.gpu
def test_staging_buffers_copy_up_intact_from_threads_and_are_reused_across_sizes():
    """On a GPU: eight threads fill staging buffers of changing sizes, copy them up on their own streams
    and compare what arrived with numpy's copy; buffers of a larger block serve the smaller blocks after it."""
    import cupy

    from gpuzarr_dist.cuda.streams import pinned_staging, staging_pool, thread_stream

    pool = staging_pool()
    sizes = [600 << 20, 150 << 20, 70 << 20, 300 << 20]
    together = threading.Barrier(8)

    def one(args: tuple[int, int]) -> bool:
        i, n = args
        stream = thread_stream()
        host = pinned_staging(n)
        if n == sizes[0]:
            together.wait(timeout=60)  # the first eight buffers are all in use at once: eight are pinned
        host[:] = np.random.default_rng(i).integers(0, 256, n, dtype=np.uint8)
        expected = host.copy()  # numpy's own copy, made before the upload
        dev = cupy.empty(n, dtype=cupy.uint8)
        dev.set(host, stream=stream)
        stream.synchronize()
        return bool((dev[:: 4099].get() == expected[:: 4099]).all()) and int(dev[-1].get()) == int(expected[-1])

    with ThreadPoolExecutor(8) as ex:
        assert all(ex.map(one, [(i, sizes[0]) for i in range(8)]))
        gc.collect()
        pins = pool.pins
        for n in sizes[1:]:  # later blocks of other sizes find the 1 GiB buffers free
            assert all(ex.map(one, [(i, n) for i in range(16)]))
            gc.collect()
    assert pool.pins == pins


def test_reserve_pins_ahead_and_counts_what_is_free():
    alloc = Allocator()
    pool = PinnedPool(alloc)
    assert pool.reserve(3, 700_000_000 // 64) == 3 * (16 << 20)
    assert alloc.sizes == [16 << 20] * 3 and pool.free_bytes() == 3 * (16 << 20)
    assert pool.reserve(3, 700_000_000 // 64) == 0  # already free: nothing new pinned
    held = [pool.take(10 << 20) for _ in range(3)]
    assert len(alloc.sizes) == 3  # the reads took the reserved buffers
    del held
