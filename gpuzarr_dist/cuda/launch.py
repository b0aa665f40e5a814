"""Compiled kernels and their launch shapes: the cache every device step takes its kernels from.

Only imported on the GPU path: importing it imports cupy.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import cupy
import numpy as np

from gpuzarr_dist.cuda.streams import upload

_kernels: dict[tuple[str, ...], cupy.RawKernel] = {}
_kernels_lock = threading.Lock()


def kernel(name: str, src: str, options: tuple[str, ...] = ()) -> cupy.RawKernel:
    """A checking kernel, compiled once per process (and set of compiler ``options``) and launched from any thread."""
    key = (name, *options)
    k = _kernels.get(key)
    if k is None:
        with _kernels_lock:
            k = _kernels.setdefault(key, cupy.RawKernel(src, name, options=options))
    return k


#: threads per CUDA block of the walks that check streams before nvCOMP (one thread per stream); see
#: :func:`walk_launch`. One: each stream's walk gets a multiprocessor slot of its own instead of sharing a
#: warp with 31 others that diverge from it (Blosc-lz4 reads about 12% faster than with 64; zstd the same).
WALK_THREADS = 1


def walk_launch(n: int) -> tuple[tuple[int], tuple[int]]:
    """Grid and block of a walk over ``n`` streams, one thread each, :data:`WALK_THREADS` to a CUDA block."""
    t = WALK_THREADS
    return ((n + t - 1) // t,), (t,)


def frame_table(offsets: Sequence[int], sizes: Sequence[int],
                dev_table: cupy.ndarray | None) -> tuple[cupy.ndarray, cupy.ndarray]:
    """The frames' offsets and sizes on the device as int64 (``dev_table``'s two rows, or copied up now)."""
    if dev_table is None:
        dev_table = upload(np.asarray([offsets, sizes], dtype=np.int64).reshape(2, len(offsets)))
    return dev_table[0], dev_table[1]
