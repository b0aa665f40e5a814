"""LZ4 (numcodecs' framing) on the device: the stated size checked on the host, every block's sequences walked
before nvCOMP decodes it.

Registers the codec's device steps (:mod:`.steps`). Only imported on the GPU
path: importing it imports cupy.
"""

from __future__ import annotations

from collections.abc import Sequence

import cupy
import numpy as np

from gpuzarr_dist.codecs import host_checks
from gpuzarr_dist.cuda.launch import frame_table, kernel, walk_launch
from gpuzarr_dist.cuda.sources import source
from gpuzarr_dist.cuda.steps import Batch, DeviceSteps, Suspects, register

#: the ``lz4_block_length`` kernel: one thread walks one LZ4 block's sequences
LZ4_CHECK_SRC = source("lz4_check.cu")


def lz4_lengths(dev: cupy.ndarray, offsets: Sequence[int], sizes: Sequence[int], limit: int,
                dev_table: cupy.ndarray | None = None) -> np.ndarray:
    """The decoded length each LZ4 block on the device describes (negative: malformed), one kernel for all.

    nvCOMP 6 decodes a truncated or corrupted LZ4 block without an error and
    may write past its output slot; walking the sequences first catches both.
    ``dev_table`` as in :func:`.zstd.zstd_frames`.
    """
    k = kernel("lz4_block_length", LZ4_CHECK_SRC)
    n = len(offsets)
    offs, lens = frame_table(offsets, sizes, dev_table)
    out = cupy.empty(n, dtype=cupy.int64)
    k(*walk_launch(n), (dev, offs, lens, np.int64(limit), np.int32(n), out))
    return out.get()


def _no_header(codec: str, host: np.ndarray, o: int, n: int) -> None:
    """An LZ4 block has no header to check (only its 4-byte size prefix, which the stated-size check reads)."""
    return None


def _check_host(array: str, host: np.ndarray, offsets: Sequence[int], sizes: Sequence[int], keys: Sequence[str],
                expected: int) -> None:
    """The size numcodecs' 4-byte prefix states, checked on the host before launching (see
    :func:`..codecs.host_checks.check_stated_sizes`): nvCOMP trusts it, and a block larger than its output slot
    was seen writing into the next slot."""
    host_checks.check_stated_sizes("lz4", array, host, offsets, sizes, keys, expected, _no_header)


def _check_frames(b: Batch) -> Suspects | None:
    lengths = lz4_lengths(b.dev, b.in_offs, b.in_sizes, b.expected, b.frames)
    bad = host_checks.size_mismatches(lengths, b.expected)
    return [(i, f"malformed lz4 block (code {lengths[i]})") for i in bad] if bad else None


STEPS = register(DeviceSteps("lz4", "LZ4", 4, 0, kernels=("lz4_check.cu",), check_host=_check_host,
                             check_frames=_check_frames))
