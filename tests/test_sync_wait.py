"""``gpuzarr.gpu.sync-wait``: how threads wait for the GPU, set on the GPU's CUDA context.

On the CPU (CI) ``gpuzarr_dist.cuda.streams`` is imported against a stand-in
``cupy`` and a stand-in CUDA driver that keeps a primary context's flags as the
real one does; the flag values are CUDA's (``cuda.h``: ``CU_CTX_SCHED_SPIN``
0x1, ``_YIELD`` 0x2, ``_BLOCKING_SYNC`` 0x4, ``CU_CTX_MAP_HOST`` 0x8). On a GPU
the setting is read back from the driver, in a fresh process (it is a setting
of the whole process's context).
"""

from __future__ import annotations

import ctypes
import importlib
import os
import subprocess
import sys
import types

import dask
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

try:
    import cupy  # noqa: F401

    HAVE_CUPY = True
except Exception:  # noqa: BLE001
    HAVE_CUPY = False


def test_setting_is_checked():
    from gpuzarr_dist import config

    assert config.gpu_sync_wait() == "auto"  # CUDA's own choice unless asked
    with dask.config.set({"gpuzarr.gpu.sync-wait": " Blocking "}):
        assert config.gpu_sync_wait() == "blocking"
    with dask.config.set({"gpuzarr.gpu.sync-wait": "sleep"}):
        with pytest.raises(ValueError, match="sync-wait must be one of auto, spin, yield, blocking, not 'sleep'"):
            config.gpu_sync_wait()


class FakeDriver:
    """The driver calls apply_sync_wait makes, on one device whose primary context is active and current."""

    def __init__(self, flags: int = 0x8, fail: str | None = None):
        self.primary = flags  # the runtime makes primary contexts with CU_CTX_MAP_HOST
        self.live = flags
        self.calls: list[str] = []
        self.fail = fail

    def _rc(self, name: str) -> int:
        self.calls.append(name)
        return 1 if name == self.fail else 0

    def cuDeviceGet(self, out, ordinal):
        ctypes.cast(out, ctypes.POINTER(ctypes.c_int))[0] = ordinal
        return self._rc("cuDeviceGet")

    def cuDevicePrimaryCtxGetState(self, dev, flags, active):
        ctypes.cast(flags, ctypes.POINTER(ctypes.c_uint))[0] = self.primary
        ctypes.cast(active, ctypes.POINTER(ctypes.c_int))[0] = 1
        return self._rc("cuDevicePrimaryCtxGetState")

    def cuDevicePrimaryCtxSetFlags_v2(self, dev, flags):
        self.primary = flags.value
        return self._rc("cuDevicePrimaryCtxSetFlags_v2")

    def cuCtxGetCurrent(self, out):
        ctypes.cast(out, ctypes.POINTER(ctypes.c_void_p))[0] = 0x1234
        return self._rc("cuCtxGetCurrent")

    def cuCtxGetFlags(self, out):
        ctypes.cast(out, ctypes.POINTER(ctypes.c_uint))[0] = self.live
        return self._rc("cuCtxGetFlags")

    def cuCtxSetFlags(self, flags):
        self.live = flags.value
        return self._rc("cuCtxSetFlags")


@pytest.fixture
def cuda(monkeypatch):
    """``gpuzarr_dist.cuda.streams`` against a stand-in cupy (device 0) and the stand-in driver."""
    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(Device=lambda *a: types.SimpleNamespace(id=0))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.delitem(sys.modules, "gpuzarr_dist.cuda.streams", raising=False)
    mod = importlib.import_module("gpuzarr_dist.cuda.streams")
    driver = FakeDriver()
    monkeypatch.setattr(mod, "_driver", lambda: driver)
    yield mod, driver
    sys.modules.pop("gpuzarr_dist.cuda.streams", None)  # the stand-in module never outlives the test


@pytest.mark.skipif(HAVE_CUPY, reason="replaces cupy with a stand-in: run where cupy is not installed")
def test_auto_leaves_the_context_alone(cuda):
    mod, driver = cuda
    assert mod.apply_sync_wait() == "auto"
    assert driver.calls == []  # no driver call at all on the default


@pytest.mark.skipif(HAVE_CUPY, reason="replaces cupy with a stand-in: run where cupy is not installed")
def test_blocking_sets_the_scheduling_bits_and_keeps_the_others(cuda):
    mod, driver = cuda
    with dask.config.set({"gpuzarr.gpu.sync-wait": "blocking"}):
        assert mod.apply_sync_wait() == "blocking"
        assert driver.primary == 0x8 | 0x4 and driver.live == 0x8 | 0x4  # later contexts and the live one
        assert mod.context_sync_wait() == "blocking"
        n = len(driver.calls)
        mod.apply_sync_wait()
        assert len(driver.calls) == n  # applied once
    with dask.config.set({"gpuzarr.gpu.sync-wait": "yield"}):
        mod.apply_sync_wait()
        assert driver.primary == 0x8 | 0x2 and driver.live == 0x8 | 0x2
    mod.apply_sync_wait()  # back to the default: CUDA's heuristic again
    assert driver.primary == 0x8 and driver.live == 0x8 and mod.context_sync_wait() == "auto"


@pytest.mark.skipif(HAVE_CUPY, reason="replaces cupy with a stand-in: run where cupy is not installed")
def test_a_failing_driver_call_is_loud(cuda):
    mod, driver = cuda
    driver.fail = "cuCtxSetFlags"
    from gpuzarr_dist.errors import GpuZarrError

    with dask.config.set({"gpuzarr.gpu.sync-wait": "spin"}):
        with pytest.raises(GpuZarrError, match=r"cuCtxSetFlags\(0x1\) failed with error 1 .*sync-wait"):
            mod.apply_sync_wait()
        driver.fail = None
        assert mod.apply_sync_wait() == "spin"  # not recorded as applied after the failure: tried again
        assert driver.live == 0x8 | 0x1


SCRIPT = r"""
import threading, dask, cupy
from gpuzarr_dist.cuda import streams as cuda
out = {}
def run(mode):
    with dask.config.set({"gpuzarr.gpu.sync-wait": mode}):
        s = cuda.thread_stream()
        a = cupy.arange(1 << 20, dtype=cupy.float32)
        total = float(a.sum())  # a kernel and a wait for it, under the new setting
        s.synchronize()
        out[mode] = (cuda.context_sync_wait(), total)
for mode in ("blocking", "yield", "spin"):
    t = threading.Thread(target=run, args=(mode,)); t.start(); t.join()
print(out)
"""


@pytest.mark.gpu
def test_the_driver_reports_the_wait_that_was_set():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert r.returncode == 0, r.stderr[-3000:]
    out = eval(r.stdout.strip().splitlines()[-1])
    expect = float(np.arange(1 << 20, dtype=np.float64).sum())
    for mode in ("blocking", "yield", "spin"):
        got, total = out[mode]
        assert got == mode, out
        assert abs(total - expect) / expect < 1e-6
