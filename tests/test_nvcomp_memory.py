"""``gpuzarr.gpu.nvcomp-memory``: nvCOMP's device buffers from CuPy's pool (default) or nvCOMP's own allocator.

On the CPU (CI) ``gpuzarr_dist.runtime.cuda`` is imported against stand-in
``cupy`` and ``nvidia.nvcomp`` modules that record what is asked of them. On a
GPU, fresh processes decode a zstd array under each setting: the values equal
zarr-python's, and with ``cupy`` nvCOMP's scratch shows in CuPy's pool.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import types

import dask
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

try:
    import cupy  # noqa: F401

    HAVE_CUPY = True
except Exception:  # noqa: BLE001
    HAVE_CUPY = False


def test_setting_is_checked():
    from gpuzarr_dist import config

    assert config.gpu_nvcomp_memory() == "cupy"
    with dask.config.set({"gpuzarr.gpu.nvcomp-memory": " NVCOMP "}):
        assert config.gpu_nvcomp_memory() == "nvcomp"
    with dask.config.set({"gpuzarr.gpu.nvcomp-memory": "rmm"}):
        with pytest.raises(ValueError, match="nvcomp-memory must be one of cupy, nvcomp, not 'rmm'"):
            config.gpu_nvcomp_memory()


class _Stream:
    def __init__(self, ptr):
        self.ptr = ptr


@pytest.fixture
def fakes(monkeypatch):
    """The module against a stand-in cupy (a current stream, ``alloc``, ``ExternalStream``) and nvCOMP."""
    log: dict = {"allocators": [], "allocs": []}
    current = [_Stream(7)]

    class ExternalStream:
        def __init__(self, ptr):
            self.ptr = ptr

        def __enter__(self):
            self.saved = current[0]
            current[0] = _Stream(self.ptr)

        def __exit__(self, *exc):
            current[0] = self.saved

    def alloc(n):
        log["allocs"].append((n, current[0].ptr))
        return types.SimpleNamespace(ptr=1000 + len(log["allocs"]), size=n)

    fake_cupy = types.ModuleType("cupy")
    fake_cupy.cuda = types.SimpleNamespace(get_current_stream=lambda: current[0], alloc=alloc,
                                           ExternalStream=ExternalStream)
    nvidia = types.ModuleType("nvidia")
    nvcomp = types.ModuleType("nvidia.nvcomp")
    nvcomp.set_device_allocator = log["allocators"].append
    ext = types.ModuleType("nvidia.nvcomp.external_memory")

    class ExternalMemory:
        def __init__(self, mem, stream):
            self.mem, self.stream = mem, stream

        @property
        def ptr(self):
            return self.mem.ptr

    ext.ExternalMemory = ExternalMemory
    nvidia.nvcomp = nvcomp
    nvcomp.external_memory = ext
    for name, mod in (("cupy", fake_cupy), ("nvidia", nvidia), ("nvidia.nvcomp", nvcomp),
                      ("nvidia.nvcomp.external_memory", ext)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.delitem(sys.modules, "gpuzarr_dist.runtime.cuda", raising=False)
    mod = importlib.import_module("gpuzarr_dist.runtime.cuda")
    yield mod, log
    sys.modules.pop("gpuzarr_dist.runtime.cuda", None)  # the stand-in module never outlives the test


@pytest.mark.skipif(HAVE_CUPY, reason="replaces cupy with a stand-in: run where cupy is not installed")
def test_cupy_pool_is_given_once_and_cannot_be_taken_back(fakes):
    mod, log = fakes
    from gpuzarr_dist.errors import GpuZarrError

    with dask.config.set({"gpuzarr.gpu.nvcomp-memory": "nvcomp"}):
        assert mod.apply_nvcomp_memory() == "nvcomp"
    assert log["allocators"] == []  # nvCOMP's own allocator: nothing set
    assert mod.apply_nvcomp_memory() == "cupy" and mod.apply_nvcomp_memory() == "cupy"
    assert log["allocators"] == [mod.nvcomp_buffer]  # set once
    with dask.config.set({"gpuzarr.gpu.nvcomp-memory": "nvcomp"}):
        with pytest.raises(GpuZarrError, match="cannot go back to its own allocator.*new process"):
            mod.apply_nvcomp_memory()


@pytest.mark.skipif(HAVE_CUPY, reason="replaces cupy with a stand-in: run where cupy is not installed")
def test_buffers_come_from_the_pool_on_nvcomps_stream(fakes):
    mod, log = fakes
    s7, s9 = _Stream(7), _Stream(9)
    a = mod.nvcomp_buffer(100, s7)  # the thread's current stream: taken as is
    b = mod.nvcomp_buffer(200, s9)  # another stream: the pool's block for that stream
    assert log["allocs"] == [(100, 7), (200, 9)]
    assert a.ptr == a.mem.ptr and a.stream is s7 and b.stream is s9  # the stream lives as long as the buffer
    mod.nvcomp_buffer(300, s7)
    assert log["allocs"][-1] == (300, 7)  # the current stream was restored after the other one


SCRIPT = r"""
import sys, dask, numpy as np, zarr, cupy
import gpuzarr_dist as gz
from cupy.cuda import memory_hook

class Peak(memory_hook.MemoryHook):
    name = "peak"
    def __init__(self):
        self.live, self.cur, self.peak = {}, 0, 0
    def malloc_postprocess(self, device_id, size, mem_size, mem_ptr, pmem_id):
        self.live[mem_ptr] = mem_size; self.cur += mem_size; self.peak = max(self.peak, self.cur)
    def free_postprocess(self, device_id, mem_size, mem_ptr, pmem_id):
        self.cur -= self.live.pop(mem_ptr, 0)

path, mode = sys.argv[1], sys.argv[2]
with dask.config.set({"gpuzarr.gpu.nvcomp-memory": mode, "scheduler": "sync"}):
    x = gz.from_zarr_gpu(path, device="gpu")
    with Peak() as h:
        got = x.compute()
    same = bool(np.array_equal(got.get(), zarr.open_array(path, mode="r")[...]))
    back = "no error"
    if mode == "cupy":
        try:
            with dask.config.set({"gpuzarr.gpu.nvcomp-memory": "nvcomp"}):
                x.compute()
        except Exception as e:
            back = type(e).__name__ + ": " + str(e)
print(repr((same, h.peak, x.nbytes, back)))
"""


@pytest.mark.gpu
def test_scratch_is_in_cupys_pool_and_values_equal_zarr(tmp_path):
    import numpy as np
    import zarr
    import zarr.codecs as zc

    path = str(tmp_path / "a.zarr")
    data = np.random.default_rng(3).standard_normal((160, 256, 256)).astype("float32")
    zarr.create_array(path, shape=data.shape, chunks=(1, 256, 256), dtype="f4",
                      compressors=[zc.ZstdCodec(level=1)])[...] = data  # one block, 160 chunks of 256 KiB: one nvCOMP batch
    out = {}
    for mode in ("cupy", "nvcomp"):  # each in a fresh process: the allocator is a setting of the process
        r = subprocess.run([sys.executable, "-c", SCRIPT, path, mode], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
        assert r.returncode == 0, r.stderr[-3000:]
        out[mode] = eval(r.stdout.strip().splitlines()[-1])
    for mode, (same, peak, nbytes, _) in out.items():
        assert same, mode
    # our own buffers: compressed bytes, decoded chunks, the block (about 3x the data); nvCOMP's zstd
    # scratch (measured: about 3.2x the decoded bytes of 2-4 MB chunks) joins them in the pool only with "cupy"
    assert out["nvcomp"][1] < 4 * out["nvcomp"][2], out
    assert out["cupy"][1] > out["nvcomp"][1] + out["cupy"][2] // 2, out
    assert "nvcomp-memory" in out["cupy"][3] and "new process" in out["cupy"][3], out
