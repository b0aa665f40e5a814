"""The CUDA C sources of the device kernels: ``kernels/*.cu``, package data read with :mod:`importlib.resources`.

Imports nothing of cupy: the CPU tests compile the same text as C++ on the host.
"""

from __future__ import annotations

import functools
from importlib.resources import files


@functools.cache
def source(name: str) -> str:
    """The text of ``kernels/<name>`` (e.g. ``"zstd_frames.cu"``), read once per process."""
    return (files("gpuzarr_dist.cuda") / "kernels" / name).read_text(encoding="utf-8")
