"""``runtime.cuda.upload``: small host tables reach the device whole, in the stream's order, and the host array
may be reused the moment the call returns (the driver staged its bytes), as numpy's own copy of it says."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

#: a kernel that keeps its stream busy for about ``cycles`` clock ticks, so that work queued after it waits
_SPIN = r"""
extern "C" __global__ void spin(long long cycles, long long* sink) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
    sink[0] = t0;
}
"""


@pytest.mark.parametrize("dtype", ["int64", "uint64", "uint8", "int32", "float64"])
def test_values_shape_and_dtype_arrive(dtype):
    import cupy

    from gpuzarr_dist.cuda.streams import thread_stream, upload

    rng = np.random.default_rng(1)
    host = rng.integers(0, 200, size=(3, 517)).astype(dtype)
    stream = thread_stream()
    dev = upload(host, stream)
    stream.synchronize()
    assert isinstance(dev, cupy.ndarray) and dev.dtype == host.dtype and dev.shape == host.shape
    np.testing.assert_array_equal(dev.get(), host)


def test_empty_and_strided_tables():
    from gpuzarr_dist.cuda.streams import thread_stream, upload

    stream = thread_stream()
    assert upload(np.zeros(0, dtype=np.int64), stream).shape == (0,)
    base = np.arange(40, dtype=np.int64).reshape(4, 10)
    view = base[:, ::3]  # not contiguous: copied to a contiguous array first
    dev = upload(view)  # the current stream
    stream.synchronize()
    np.testing.assert_array_equal(dev.get(), view)


def test_the_host_array_may_change_as_soon_as_the_call_returns_while_the_copy_waits_in_its_stream():
    import cupy

    from gpuzarr_dist.cuda.streams import on_stream, thread_stream, upload

    stream = thread_stream()
    sink = cupy.zeros(1, dtype=cupy.int64)
    spin = cupy.RawKernel(_SPIN, "spin")
    rate = cupy.cuda.runtime.deviceGetAttribute(cupy.cuda.runtime.cudaDevAttrClockRate, 0) * 1000
    host = np.arange(1 << 16, dtype=np.int64)
    want = host.copy()
    with on_stream(stream):
        spin((1,), (1,), (np.int64(rate // 20), sink))  # about 50 ms of queued work ahead of the copy
    dev = upload(host, stream)
    host[:] = -1  # at once: the copy has not run yet on the device, and must not see this
    del host
    stream.synchronize()
    np.testing.assert_array_equal(dev.get(), want)


def test_a_refused_copy_is_an_error_naming_the_call(monkeypatch):
    from gpuzarr_dist.cuda import streams as cuda
    from gpuzarr_dist.errors import GpuZarrError

    monkeypatch.setattr(cuda, "_memcpy_htod", lambda: (lambda *a: 1))  # CUDA_ERROR_INVALID_VALUE
    with pytest.raises(GpuZarrError, match="cuMemcpyHtoDAsync .*error 1"):
        cuda.upload(np.arange(4, dtype=np.int64), cuda.thread_stream())
