"""glibc's malloc thresholds raised by the first object-store client of a process (``runtime/malloc.py``):
checked in fresh processes against glibc's own accounting (``mallinfo2``: bytes in mmapped blocks)."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import pytest

from gpuzarr_dist.runtime import malloc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: in a fresh process: raise (or not) the thresholds, then malloc 13 MB as obstore does for a whole shard
PROBE = r"""
import ctypes, json, sys
import dask
dask.config.set({"gpuzarr.remote.malloc-thresholds": json.loads(sys.argv[1])})
from gpuzarr_dist.runtime import malloc

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
raised = malloc.raise_thresholds()
before = libc.mallinfo2().hblkhd
p = libc.malloc(13_000_000)
mapped = libc.mallinfo2().hblkhd - before
libc.free(p)
print(json.dumps({"raised": raised, "mapped": mapped, "again": malloc.raise_thresholds()}))
"""


def _glibc_with_mallinfo2() -> bool:
    libc = ctypes.CDLL(None)
    return hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallinfo2")


def _probe(setting, **env) -> dict:
    environ = {k: v for k, v in os.environ.items() if malloc.chosen_by_environment({k: v}) is None}
    environ.update(env, PYTHONPATH=ROOT + os.pathsep + environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(setting)], env=environ, capture_output=True,
                         text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not _glibc_with_mallinfo2(), reason="needs glibc 2.33+ (mallinfo2)")
def test_a_large_response_stays_in_the_heap_once_raised():
    got = _probe("auto")
    assert got == {"raised": True, "mapped": 0, "again": True}  # glibc counts no mmapped bytes for it


@pytest.mark.skipif(not _glibc_with_mallinfo2(), reason="needs glibc 2.33+ (mallinfo2)")
@pytest.mark.parametrize("setting, env", [(False, {}), ("auto", {"MALLOC_TRIM_THRESHOLD_": "65536"}),
                                          ("auto", {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=1048576"})])
def test_thresholds_are_left_alone_when_switched_off_or_chosen_by_the_environment(setting, env):
    got = _probe(setting, **env)
    assert got["raised"] is False and got["mapped"] >= 13_000_000  # glibc's default: mmapped


def test_which_environment_variables_count_as_a_choice():
    assert malloc.chosen_by_environment({}) is None
    assert malloc.chosen_by_environment({"MALLOC_MMAP_THRESHOLD_": "1"}) == "MALLOC_MMAP_THRESHOLD_"
    assert malloc.chosen_by_environment({"GLIBC_TUNABLES": "glibc.pthread.rseq=0"}) is None
    assert malloc.chosen_by_environment({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=9"}) == "GLIBC_TUNABLES"


def test_the_first_object_store_client_raises_them(monkeypatch):
    from gpuzarr_dist.stores import remote

    calls = []
    monkeypatch.setattr(remote.malloc, "raise_thresholds", lambda: calls.append(1) or True)
    monkeypatch.setattr(remote, "_clients", remote.OrderedDict())
    remote._client("k1", object)
    remote._client("k1", object)
    assert calls == [1]  # the second call finds the client: no new one, no second call
