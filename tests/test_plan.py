"""``assemble.Plan``: a selection's chunks as per-axis pieces, with ``parts`` built only when asked for.

Every plan assembles, chunk by chunk, what numpy's own indexing gives; its
coordinate array, corners and row slices agree with its parts; and the GPU
read's questions (coordinates, grid checks, slabs) leave the parts unbuilt.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpuzarr_dist.core.metadata import ArraySpec
from gpuzarr_dist.core.selection import Plan, finish, grid_slabs, plan_selection, unit_step_grid, whole_chunk_grid


def _spec(shape, chunks, dtype="int64"):
    return ArraySpec(name="plan-test", shape=tuple(shape), chunk_shape=tuple(chunks), dtype=np.dtype(dtype),
                     fill_value=0, zarr_format=3, codecs=(), key_prefix="c", key_separator="/", metadata_key="zarr.json")


def _assemble(data, chunks, plan):
    out = np.full(plan.out_shape, -1, dtype=data.dtype)
    for part in plan.parts:
        lo = [c * n for c, n in zip(part.coords, chunks)]
        chunk = data[tuple(slice(a, a + n) for a, n in zip(lo, chunks))]
        full = np.zeros(chunks, dtype=data.dtype)  # edge chunks padded, as stored chunks are
        full[tuple(slice(0, s) for s in chunk.shape)] = chunk
        out[part.out_sel] = full[part.chunk_sel]
    return finish(out, plan)


SELECTIONS = [
    (slice(None), slice(None), slice(None)),
    (slice(3, 17), slice(1, 30, 4), slice(None, None, -3)),
    (5, slice(2, 9), slice(10, 11)),
    (slice(None, None, 7), 0, slice(None)),
    (slice(4, 4), slice(None), slice(None)),
]


@pytest.mark.parametrize("index", SELECTIONS)
def test_a_plan_assembles_what_numpy_indexing_gives(index):
    data = np.arange(19 * 33 * 14).reshape(19, 33, 14)
    chunks = (4, 5, 6)
    plan = plan_selection(_spec(data.shape, chunks), index)
    np.testing.assert_array_equal(_assemble(data, chunks, plan), data[index])
    assert plan.n_parts == len(plan.parts)


@pytest.mark.parametrize("index", SELECTIONS)
def test_coords_corners_and_rows_agree_with_the_parts(index):
    plan = plan_selection(_spec((19, 33, 14), (4, 5, 6)), index)
    parts = plan.parts
    np.testing.assert_array_equal(plan.coords(), np.array([p.coords for p in parts], dtype=np.int64).reshape(-1, 3))
    if not parts:
        return
    assert plan.first == parts[0] and plan.last == parts[-1]
    per_row = plan.n_parts // len(plan.axes[0])
    for lo in range(0, plan.n_parts, per_row):
        for hi in range(lo + per_row, plan.n_parts + 1, per_row):
            assert plan.rows(lo, hi).parts == parts[lo:hi]
    if per_row > 1:
        with pytest.raises(ValueError, match="whole rows"):
            plan.rows(1, per_row)


def test_a_zero_dimensional_plan_has_one_chunk():
    plan = plan_selection(_spec((), ()), ())
    assert plan.n_parts == 1 and plan.parts[0].coords == () and plan.coords().shape == (1, 0)


def test_the_gpu_reads_questions_leave_the_parts_unbuilt():
    """A sharded block of 3528 inner chunks: the grid checks, coordinates and slabs build no per-chunk objects
    (they set off full garbage collections of 100 ms with 5 such blocks at once)."""
    spec = _spec((960, 721, 1440), (1, 256, 256), "float32")
    plan = plan_selection(spec, (slice(196, 392), slice(None), slice(None)))
    assert plan.n_parts == 196 * 3 * 6
    coords = plan.coords()
    assert coords.shape == (3528, 3) and tuple(coords[0]) == (196, 0, 0) and tuple(coords[-1]) == (391, 2, 5)
    assert not whole_chunk_grid(plan, spec.chunk_shape, plan.out_shape) and unit_step_grid(plan)
    slabs = grid_slabs(plan, spec, plan.out_shape, 256 << 20)
    assert slabs and slabs[0][0] == 0 and slabs[-1][1] == 3528
    rows = plan.rows(*slabs[1])
    assert rows.first.out_sel[0].start == slabs[1][0] // 18 and rows.n_parts == slabs[1][1] - slabs[1][0]
    assert plan._parts is None and rows._parts is None
    aligned = plan_selection(spec, (slice(0, 4), slice(0, 512), slice(0, 1280)))
    assert whole_chunk_grid(aligned, spec.chunk_shape, aligned.out_shape) and aligned._parts is None


def test_plans_compare_by_their_pieces():
    spec = _spec((10, 10), (3, 4))
    a, b = plan_selection(spec, (slice(1, 9), slice(None))), plan_selection(spec, (slice(1, 9), slice(None)))
    assert a == b and a != plan_selection(spec, (slice(1, 8), slice(None))) and "chunks=" in repr(a)
    assert isinstance(a, Plan)
