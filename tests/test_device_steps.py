"""The GPU decode path's plug-ins (``gpuzarr_dist.cuda.steps``) against the codec classes, and the kernel sources.

Every compressor whose class says ``gpu_decode = True`` registers device steps
(crc32c, the one other bytes codec with the flag, is checked on the host by
the driver), and nothing else does; every source a step compiles is a
non-empty ``kernels/*.cu`` file of the package. Runs on the CPU: where cupy is
not installed, the device modules are imported against a stand-in (nothing
here launches a kernel).
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from importlib.resources import files

import pytest

import gpuzarr_dist
from gpuzarr_dist.codecs import registry as codec_registry
from gpuzarr_dist.codecs.base import Codec
from gpuzarr_dist.cuda.sources import source

PACKAGE = os.path.dirname(gpuzarr_dist.__file__)

#: the modules of ``gpuzarr_dist.cuda`` that import cupy on the decode path, and the registry
_DEVICE_MODULES = ("decode", "streams", "launch", "fallback", "nvcomp_calls", "steps", "codecs", "zstd", "lz4",
                   "deflate", "blosc")


@pytest.fixture
def steps(monkeypatch):
    """``gpuzarr_dist.cuda.steps`` with every codec module registered (against a cupy stand-in if needed)."""
    try:
        import cupy  # noqa: F401
    except ImportError:
        import gpuzarr_dist.cuda as package

        fake = types.ModuleType("cupy")
        fake.__getattr__ = lambda name: types.SimpleNamespace()  # attributes are only looked up in calls
        monkeypatch.setitem(sys.modules, "cupy", fake)
        for name in _DEVICE_MODULES:
            monkeypatch.delitem(sys.modules, f"gpuzarr_dist.cuda.{name}", raising=False)
            monkeypatch.delattr(package, name, raising=False)
    importlib.import_module("gpuzarr_dist.cuda.decode")  # registers the codecs through cuda.codecs
    return importlib.import_module("gpuzarr_dist.cuda.steps")


def _gpu_compressors() -> set[str]:
    """The names of the bytes codecs (every one the codec registry knows) whose class says ``gpu_decode``."""
    classes, todo = set(), [Codec]
    while todo:
        for c in todo.pop().__subclasses__():
            classes.add(c)
            todo.append(c)
    known = set(codec_registry.known_codecs())
    return {c.name for c in classes if "name" in vars(c) and c.name in known and c.gpu_decode and c.kind == "bytes_bytes"
            and c.name != "crc32c"}


def test_registered_codecs_are_the_gpu_decode_compressors(steps):
    assert set(steps.registered()) == _gpu_compressors() == {"zstd", "gzip", "zlib", "lz4", "blosc"}


def test_each_registration_names_its_codec_and_its_way_to_decode(steps):
    from gpuzarr_dist.cuda.nvcomp import ALGORITHMS

    for name, s in steps.registered().items():
        assert s.name == name
        assert (s.decode is None) == (s.algorithm is not None), name  # nvCOMP's call, or a decode of its own
        if s.algorithm is not None:
            assert s.algorithm in ALGORITHMS and s.head >= 0 and s.tail >= 0
    framing = {n: (s.algorithm, s.head, s.tail) for n, s in steps.registered().items() if s.decode is None}
    assert framing == {"zstd": ("Zstd", 0, 0), "gzip": ("Gzip", 0, 0), "zlib": ("Deflate", 2, 4), "lz4": ("LZ4", 4, 0)}
    assert steps.device_steps("snappy") is None


def test_every_registered_kernel_source_exists_and_is_not_empty(steps):
    named = {k for s in steps.registered().values() for k in s.kernels}
    assert named and all(s.kernels for s in steps.registered().values())
    folder = files("gpuzarr_dist.cuda") / "kernels"
    for k in sorted(named):
        assert (folder / k).is_file(), k
        assert source(k).strip(), k


def test_every_kernel_file_is_loaded_by_a_module():
    on_disk = sorted(p.name for p in (files("gpuzarr_dist.cuda") / "kernels").iterdir() if p.name.endswith(".cu"))
    assert on_disk
    code = ""
    for folder, _, names in os.walk(os.path.join(PACKAGE, "cuda")):
        code += "".join(open(os.path.join(folder, n)).read() for n in names if n.endswith(".py"))
    for name in on_disk:
        text = source(name)
        assert text.strip(), name
        assert f'source("{name}")' in code, f"{name} is loaded by no module"
        assert 'extern "C" __global__' in text or name == "cut_windows.cu", name  # that one: an elementwise body


def test_the_source_names_keep_the_files_text():
    from gpuzarr_dist.cuda import blosc_kernels, deflate_walk, kernels

    assert kernels.ZSTD_FRAMES_SRC == source("zstd_frames.cu")
    assert kernels.CRC32_SRC == source("crc32.cu") and kernels.XXH64_SRC == source("xxh64.cu")
    assert blosc_kernels.GATHER_SRC == source("blosc_gather.cu")
    assert blosc_kernels.UNSHUFFLE_SRC == source("blosc_unshuffle.cu")
    assert deflate_walk.DEFLATE_WALK_SRC == source("deflate_walk.cu")
    assert deflate_walk.ADLER32_SRC == source("adler32.cu")
