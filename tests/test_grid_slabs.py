"""``assemble.grid_slabs``: how a GPU read under a decode limit (the Cubed variant's ``BlockReader.decode_bytes``)
cuts its block into slabs of whole chunk-grid rows, each decoded by one nvCOMP call. Plan logic only: runs
without a GPU (the reads themselves are compared with zarr-python in ``test_gpu_place.py``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import write_array

from gpuzarr_dist.core.selection import grid_slabs, plan_selection
from gpuzarr_dist.stores.source import open_source

SHAPE, CHUNKS = (64, 10, 12), (2, 5, 6)  # float32 chunks of 240 bytes; the grid is 32 x 2 x 2


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("slabs") / "a.zarr")
    write_array(path, np.zeros(SHAPE, dtype="f4"), CHUNKS)
    return open_source(path)[1]


def _slabs(spec, box, limit):
    plan = plan_selection(spec, box)
    return plan, grid_slabs(plan, spec, plan.out_shape, limit)


def _check_cover(plan, slabs, per_row, limit, chunk_bytes=240):
    assert slabs[0][0] == 0 and slabs[-1][1] == len(plan.parts)
    assert all(a[1] == b[0] for a, b in zip(slabs, slabs[1:]))  # contiguous, in order
    assert all(lo % per_row == 0 and hi % per_row == 0 for lo, hi in slabs)  # whole rows of the grid
    assert all((hi - lo) * chunk_bytes <= limit or hi - lo == per_row for lo, hi in slabs)
    sizes = [hi - lo for lo, hi in slabs]
    assert max(sizes) - min(sizes) <= per_row  # even: no small last slab


def test_aligned_block_in_even_slabs(spec):
    plan, slabs = _slabs(spec, np.s_[0:60, :, :], limit=15 * 4 * 240)  # 30 rows of 4 chunks, 15 rows a slab
    assert slabs == [(0, 60), (60, 120)]
    _check_cover(plan, slabs, 4, 15 * 4 * 240)
    plan, slabs = _slabs(spec, np.s_[0:60, :, :], limit=14 * 4 * 240)  # 14 rows fit: 3 slabs of 10, not 14, 14, 2
    assert [hi - lo for lo, hi in slabs] == [40, 40, 40]
    _check_cover(plan, slabs, 4, 14 * 4 * 240)


def test_trimmed_block_at_the_edges(spec):
    """A block starting inside a chunk and ending at the array's edge (the Cubed reader's edge tiles)."""
    plan, slabs = _slabs(spec, np.s_[3:64, 2:10, 1:12], limit=8 * 4 * 240)
    assert slabs is not None and len(slabs) == math.ceil(31 / 8)
    _check_cover(plan, slabs, 4, 8 * 4 * 240)


def test_one_row_over_the_limit_is_a_slab_of_its_own(spec):
    plan, slabs = _slabs(spec, np.s_[0:8, :, :], limit=100)  # 4 rows of 960 bytes each
    assert slabs == [(0, 4), (4, 8), (8, 12), (12, 16)]


@pytest.mark.parametrize("box, limit", [
    (np.s_[0:60, :, :], None),  # no limit: one call
    (np.s_[0:60, :, :], 120 * 240),  # the block fits the limit
    (np.s_[0:60:3, :, :], 240),  # steps: not a grid read with step 1
    (np.s_[5, :, :], 240),  # one row of the grid over the limit: nothing to cut along the first axis
])
def test_one_call(spec, box, limit):
    assert _slabs(spec, box, limit)[1] is None
