"""Ordering on the GPU decode path, checked on the CPU with stand-in ``cupy`` and ``nvidia.nvcomp`` modules.

A batch that fails after its chunks' upload was queued must wait for its
stream before the error leaves ``decode_batch_gpu``: its pinned staging buffer
goes back to a pool shared by every thread, and the next block may be given
it and refill it while the copy still reads it. The checking kernels (the zstd
walk) launch on CuPy's *current* stream, so the batch's stream is made current
for the whole batch: on another, non-blocking stream a walk could read the
chunks before they arrive (issue 9: errors naming a good chunk as "not a zstd
frame" in the GPU fuzz run).
"""

from __future__ import annotations

import importlib
import sys
import types

import numpy as np
import pytest

try:
    import cupy  # noqa: F401

    HAVE_CUPY = True
except Exception:  # noqa: BLE001
    HAVE_CUPY = False

pytestmark = pytest.mark.skipif(HAVE_CUPY, reason="replaces cupy with a stand-in: run where cupy is not installed")


class FakeStream:
    """CuPy's stream bookkeeping (``cupy/cuda/stream.pyx``): ``use()`` sets the current stream and leaves the
    stack alone; ``with`` pushes, and on exit pops and makes current the stack's new top (at the bottom, the
    legacy null stream), not the stream that was current before the ``with``."""

    def __init__(self, log: list, name: str):
        self.log, self.name = log, name

    def synchronize(self):
        self.log.append(("sync", self.name))

    def use(self):
        _STATE["current"] = self
        return self

    def __enter__(self):
        _STATE["stack"].append(self)
        _STATE["current"] = self
        return self

    def __exit__(self, *exc):
        _STATE["stack"].pop()
        _STATE["current"] = _STATE["stack"][-1]


_STATE: dict = {"current": None, "stack": []}


class FakeDev:
    def __init__(self, a: np.ndarray, log: list):
        self.a, self.log = a, log
        self.data = types.SimpleNamespace(ptr=1 << 40)  # a device address, for pointer tables

    def set(self, host, stream=None):
        self.log.append(("upload", stream.name, _STATE["current"].name))
        self.a[...] = host

    def __getitem__(self, k):
        return FakeDev(self.a[k], self.log)

    def get(self):
        return self.a.copy()


#: the modules of ``gpuzarr_dist.cuda`` that the decode path imports and that import cupy, and the registry
_CUPY_MODULES = ("decode", "streams", "launch", "fallback", "nvcomp_calls", "steps", "codecs", "zstd", "lz4",
                 "deflate", "blosc")


@pytest.fixture
def gpu(monkeypatch):
    """``gpuzarr_dist.cuda.decode`` imported against stand-ins; ``(module, log, stream)``."""
    log: list = []
    fake = types.ModuleType("cupy")
    fake.uint8, fake.int64, fake.int32, fake.uint32 = np.uint8, np.int64, np.int32, np.uint32
    fake.empty = lambda n, dtype=np.uint8: FakeDev(np.empty(n, dtype=dtype), log)
    fake.asarray = lambda x: log.append(("tables", _STATE["current"].name)) or FakeDev(np.asarray(x), log)
    fake.cuda = types.SimpleNamespace(Stream=FakeStream, get_current_stream=lambda: _STATE["current"])
    fake.RawKernel = lambda src, name: None
    monkeypatch.setitem(sys.modules, "cupy", fake)
    nvidia = types.ModuleType("nvidia")
    nvidia.nvcomp = types.SimpleNamespace()
    monkeypatch.setitem(sys.modules, "nvidia", nvidia)
    import gpuzarr_dist.cuda as package

    for name in _CUPY_MODULES:  # imported again against the stand-ins, the registry of device steps with them
        monkeypatch.delitem(sys.modules, f"gpuzarr_dist.cuda.{name}", raising=False)
        monkeypatch.delattr(package, name, raising=False)
    mod = importlib.import_module("gpuzarr_dist.cuda.decode")
    # small tables go up by streams.upload (one driver call, queued on the stream it is given)
    monkeypatch.setattr(importlib.import_module("gpuzarr_dist.cuda.nvcomp_calls"), "upload",
                        lambda host, stream=None: log.append(("tables", (stream or _STATE["current"]).name))
                        or FakeDev(np.asarray(host), log))
    _STATE["stack"] = [FakeStream(log, "legacy null stream")]
    FakeStream(log, "caller's current stream").use()  # as thread_stream makes a thread's stream current
    return mod, log, FakeStream(log, "batch stream")


def _batch(chain: str, chunks: list[bytes]):
    from dev import gpu_fuzz as gf
    from gpuzarr_dist.codecs.pipeline import CodecPipeline
    from gpuzarr_dist.stores.base import staging_layout

    pipe = CodecPipeline(gf._spec(chain))
    sizes = [len(c) for c in chunks]
    offsets, total = staging_layout(sizes, 256)
    host = np.zeros(max(total, 1), dtype=np.uint8)
    for c, o in zip(chunks, offsets):
        host[o : o + len(c)] = np.frombuffer(c, dtype=np.uint8)
    return pipe, host, offsets, sizes, [f"c/{j}/0" for j in range(len(chunks))]


def _good(chain: str) -> list[bytes]:
    from dev import gpu_fuzz as gf

    return gf.Pools(20261122).good[chain][:3]


def test_an_error_after_the_upload_waits_for_the_stream_and_the_walk_runs_on_the_batch_stream(gpu, monkeypatch):
    mod, log, stream = gpu
    from gpuzarr_dist.errors import ChunkDecodeError

    def walk(array, dev, offsets, sizes, keys, expected, dev_table=None):
        log.append(("walk", _STATE["current"].name))
        raise ChunkDecodeError(array, keys[2], "zstd frame states 1 decoded bytes, expected 2", "zstd")

    monkeypatch.setattr(importlib.import_module("gpuzarr_dist.cuda.zstd"), "zstd_frames", walk)
    pipe, host, offsets, sizes, keys = _batch("zstd", _good("zstd"))
    with pytest.raises(ChunkDecodeError, match="c/2/0"):
        mod.decode_batch_gpu(pipe, host, offsets, sizes, keys, stream)
    # the small tables go up first, then the chunks, on the batch's stream (tables after the chunks would wait
    # on the copy engine behind other threads' chunks)
    assert log == [("tables", "batch stream"), ("upload", "batch stream", "batch stream"), ("walk", "batch stream"),
                   ("sync", "batch stream")]
    # restored after the batch: CuPy's ``with stream:`` would leave the legacy null stream current here
    assert _STATE["current"].name == "caller's current stream"


def test_host_checks_reject_a_batch_before_its_upload_is_queued(gpu):
    mod, log, stream = gpu
    from gpuzarr_dist.errors import ChunkDecodeError

    pipe, host, offsets, sizes, keys = _batch("zlib", _good("zlib")[:2] + [b"\x78\x9c"])  # shorter than its framing
    with pytest.raises(ChunkDecodeError, match="c/2/0.*too short|too short"):
        mod.decode_batch_gpu(pipe, host, offsets, sizes, keys, stream)
    assert not [e for e in log if e[0] == "upload"]
    pipe, host, offsets, sizes, keys = _batch("gzip", _good("gzip")[:2] + [b"\x1f\x8b" + bytes(30)])  # bad method
    with pytest.raises(ChunkDecodeError, match="gzip compression method"):
        mod.decode_batch_gpu(pipe, host, offsets, sizes, keys, stream)
    assert not [e for e in log if e[0] == "upload"]


def test_settle_drops_the_error_of_its_own_sync(gpu):
    mod, log, stream = gpu

    class Lost(FakeStream):
        def synchronize(self):
            raise RuntimeError("cudaErrorIllegalAddress")

    mod.settle(Lost(log, "lost"))  # the error already being raised says more than the sync's
