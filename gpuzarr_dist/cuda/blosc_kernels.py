"""The Blosc kernels' sources (``kernels/blosc_*.cu``), kept apart from cupy so the CPU tests can compile and run them.

:mod:`.blosc` launches them with CuPy; ``tests/test_blosc_frames.py``
compiles the same source as C++ with a loop over ``blockIdx``/``threadIdx``
(the kernels use no shared memory and no barriers, so a sequential run is
one valid schedule) and checks it against numcodecs on the CPU.
"""

from __future__ import annotations

import numpy as np

from gpuzarr_dist.cuda.sources import source

#: bytes of output one CUDA block of the unshuffle kernel writes
SEGMENT = 1 << 15

GATHER_SRC = source("blosc_gather.cu")

UNSHUFFLE_SRC = source("blosc_unshuffle.cu")


def segments(block_size: np.ndarray, seg_len: int = SEGMENT) -> tuple[np.ndarray, np.ndarray]:
    """(block index, start byte) of each ``seg_len``-byte segment of every block: one CUDA block each."""
    nseg = -(-np.asarray(block_size, dtype=np.int64) // seg_len)
    seg_block = np.repeat(np.arange(len(nseg), dtype=np.int64), nseg)
    seg_start = (np.arange(len(seg_block), dtype=np.int64) - np.repeat(np.cumsum(nseg) - nseg, nseg)) * seg_len
    return seg_block, seg_start
