"""Helpers for the byte-range tests: record the ranges a read asks its store for."""

from __future__ import annotations

import threading

import pytest


def record_ranges(mp: pytest.MonkeyPatch) -> dict[str, list]:
    """Patch every store's ranged reads; returns ``{"index": [ByteRange], "data": [MergedRead]}``.

    ``index`` holds the ranges ``read_ranges`` was asked for (shard indexes),
    ``data`` the merged reads ``read_ranges_into`` was asked for (inner chunks).
    Only the outermost call is recorded (a store's ``read_ranges_into`` may use
    its own ``read_ranges``).
    """
    from gpuzarr_dist.stores.base import ChunkStore

    log: dict[str, list] = {"index": [], "data": []}
    lock = threading.Lock()
    local = threading.local()
    for cls in [ChunkStore, *_subclasses(ChunkStore)]:
        for name, kind in (("read_ranges", "index"), ("read_ranges_into", "data")):
            if name not in cls.__dict__:
                continue

            def patched(self, reqs, *args, _orig=cls.__dict__[name], _kind=kind, **kwargs):
                outer = not getattr(local, "inside", False)
                if outer:
                    with lock:
                        log[_kind].extend(reqs)
                local.inside = True
                try:
                    return _orig(self, reqs, *args, **kwargs)
                finally:
                    if outer:
                        local.inside = False

            mp.setattr(cls, name, patched)
    return log


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)
