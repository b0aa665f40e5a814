"""Assemble a block from decoded chunks: which chunks a selection needs, and where each goes.

A selection is a tuple of integers and slices (any step) over the array. The
plan lists, for every chunk the selection touches, the part of the chunk it
needs and the place in the output it fills; edge chunks are trimmed by the
same arithmetic, and chunks absent from the store are filled with the array's
fill value. The plan is device-neutral: the CPU and GPU paths place chunks
with the same slices.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from numbers import Integral
from typing import Any, NamedTuple

import numpy as np

from .metadata import ArraySpec


class ChunkPart(NamedTuple):
    """One chunk's share of a selection (a named tuple: a block of a sharded array plans a thousand or
    more, and a frozen dataclass cost several times more to build)."""

    coords: tuple[int, ...]
    chunk_sel: tuple[slice, ...]  # within the decoded chunk
    out_sel: tuple[slice, ...]  # within the output (before integer axes are dropped)


@dataclass(frozen=True)
class Plan:
    out_shape: tuple[int, ...]  # every axis kept (integer axes have length 1)
    final_index: tuple[Any, ...]  # applied at the end: drops integer axes, flips negative steps
    parts: tuple[ChunkPart, ...]


def _normalize(index: Any, shape: tuple[int, ...]) -> list[tuple[int, int, int, bool, bool]]:
    """Per axis: ``(start, stop, step>0, is_integer, reversed)``."""
    if not isinstance(index, tuple):
        index = (index,)
    if any(i is Ellipsis for i in index):
        k = index.index(Ellipsis)
        index = index[:k] + (slice(None),) * (len(shape) - len(index) + 1) + index[k + 1 :]
    if len(index) > len(shape):
        raise IndexError(f"too many indices: {len(index)} for an array of {len(shape)} dimensions")
    index = tuple(index) + (slice(None),) * (len(shape) - len(index))
    out = []
    for i, n in zip(index, shape):
        if isinstance(i, (Integral, np.integer)):
            j = int(i) + n if int(i) < 0 else int(i)
            if not 0 <= j < n:
                raise IndexError(f"index {int(i)} is out of bounds for an axis of size {n}")
            out.append((j, j + 1, 1, True, False))
        elif isinstance(i, slice):
            start, stop, step = i.indices(n)
            if step > 0:
                cnt = max(0, math.ceil((stop - start) / step))
                out.append((start, start + max(cnt - 1, 0) * step + (1 if cnt else 0), step, False, False))
            else:  # the same elements in increasing order, flipped at the end
                cnt = max(0, math.ceil((stop - start) / step))
                last = start + (cnt - 1) * step
                out.append((last, start + 1, -step, False, True) if cnt else (0, 0, 1, False, False))
        else:
            raise TypeError(f"only integers and slices index a Zarr block reader, got {type(i).__name__}")
    return out


def _axis_parts(start: int, stop: int, step: int, chunk: int) -> list[tuple[int, slice, slice]]:
    """Chunks along one axis touched by ``range(start, stop, step)``: (chunk index, in-chunk slice, out slice)."""
    if stop <= start:
        return []
    parts = []
    for c in range(start // chunk, (stop - 1) // chunk + 1):
        lo, hi = c * chunk, min(stop, (c + 1) * chunk)
        k0 = max(0, -(-(lo - start) // step))
        k1 = -(-(hi - start) // step)
        if k0 < k1:
            first = start + k0 * step - lo
            last = start + (k1 - 1) * step - lo
            parts.append((c, slice(first, last + 1, step), slice(k0, k1)))
    return parts


def plan_selection(spec: ArraySpec, index: Any) -> Plan:
    """The chunks ``spec``'s array needs for ``index``, and where each lands."""
    axes = _normalize(index, spec.shape)
    out_shape = tuple(max(0, -(-(stop - start) // step)) for start, stop, step, _, _ in axes)
    final = tuple(0 if is_int else (slice(None, None, -1) if rev else slice(None)) for _, _, _, is_int, rev in axes)
    per_axis = [_axis_parts(start, stop, step, c) for (start, stop, step, _, _), c in zip(axes, spec.chunk_shape)]
    # one (coords, chunk slices, out slices) triple per chunk: zip(*combo) transposes a chunk's
    # per-axis entries in C (a sharded 64-step block has over a thousand chunks)
    # (a 0-d array has one chunk and no axes)
    parts = tuple(ChunkPart(*zip(*combo)) for combo in itertools.product(*per_axis)) if per_axis else (ChunkPart((), (), ()),)
    return Plan(out_shape, final, parts)


def split_fancy(index: Any, shape: tuple[int, ...]) -> tuple[Any, Any]:
    """Split an index with integer arrays or boolean masks into a box and a rest.

    Returns ``(box, rest)``: ``box`` is a tuple of slices (the bounding box of
    the fancy axes, the other entries unchanged) and ``rest`` the index that,
    applied to the box, gives what ``index`` gives on the whole array; ``rest``
    is ``None`` when ``index`` holds no fancy entries.
    """
    if not isinstance(index, tuple):
        index = (index,)
    if not any(isinstance(i, (list, np.ndarray)) or hasattr(i, "__array__") for i in index):
        return index, None
    if any(i is Ellipsis for i in index):
        k = index.index(Ellipsis)
        index = index[:k] + (slice(None),) * (len(shape) - len(index) + 1) + index[k + 1 :]
    box, rest = [], []
    for ax, i in enumerate(index):
        if isinstance(i, (list, np.ndarray)) or hasattr(i, "__array__"):
            arr = np.asarray(i)
            if arr.dtype == bool:
                if arr.shape != (shape[ax],):
                    raise IndexError(f"boolean index of shape {arr.shape} does not match axis {ax} of size {shape[ax]}")
                arr = np.flatnonzero(arr)
            if arr.size and (arr.min() < -shape[ax] or arr.max() >= shape[ax]):
                raise IndexError(f"index out of bounds for axis {ax} of size {shape[ax]}")
            arr = np.where(arr < 0, arr + shape[ax], arr).astype(np.intp)
            lo, hi = (int(arr.min()), int(arr.max()) + 1) if arr.size else (0, 0)
            box.append(slice(lo, hi))
            rest.append(arr - lo)
        elif isinstance(i, slice):
            box.append(i)
            rest.append(slice(None))
        else:
            box.append(i)
    return tuple(box), tuple(rest)


def finish(out: Any, plan: Plan) -> Any:
    """Drop integer axes and undo negative steps (works for numpy and cupy arrays)."""
    if all(f == slice(None) for f in plan.final_index):
        return out
    res = out[plan.final_index]
    return np.asarray(res) if isinstance(res, np.generic) else res


# -- plans as grids of chunks (the GPU read places whole grids with one kernel) ------------------


def unit_step_grid(plan: Plan) -> bool:
    """Whether the plan's chunks form a C-ordered grid read with step 1 (a block trimmed at the array's edge)."""
    return all(isinstance(s, slice) and s.step in (None, 1) for part in plan.parts for s in part.chunk_sel)


def whole_chunk_grid(plan: Plan, chunk_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> bool:
    """Whether the plan is a full grid of whole chunks tiling the output (the usual aligned block)."""
    return all(
        s.start == 0 and s.stop == c and s.step in (None, 1)
        for part in plan.parts
        for s, c in zip(part.chunk_sel, chunk_shape)
    ) and all(o % c == 0 for o, c in zip(out_shape, chunk_shape))


class SubPlan(NamedTuple):
    """The parts of one slab of a plan (what the placement kernels read of a plan)."""

    parts: tuple


def grid_slabs(plan: Plan, spec: ArraySpec, out_shape: tuple[int, ...], limit: int | None) -> list[tuple[int, int]] | None:
    """``(lo, hi)`` ranges of ``plan.parts``, whole rows of its chunk grid along the first axis, of at most
    ``limit`` decoded bytes each (one row at least); ``None`` where the block is decoded in one call: no
    ``limit``, the block within it, one row of the grid, or a plan that is not a C-ordered grid of chunks
    read with step 1 (missing chunks are the caller's test)."""
    if limit is None or len(plan.parts) < 2 or not out_shape:
        return None
    chunk_bytes = spec.dtype.itemsize * math.prod(spec.chunk_shape)
    if len(plan.parts) * chunk_bytes <= limit:
        return None
    whole = whole_chunk_grid(plan, spec.chunk_shape, out_shape)
    if not (whole or (len(out_shape) == len(spec.chunk_shape) and unit_step_grid(plan))):
        return None
    first, last = plan.parts[0], plan.parts[-1]
    grid = [b - a + 1 for a, b in zip(first.coords, last.coords)]
    if math.prod(grid) != len(plan.parts) or grid[0] == 1:  # not a whole grid, or one row: nothing to cut
        return None
    per_row = len(plan.parts) // grid[0]
    most = max(1, limit // (per_row * chunk_bytes))  # rows a slab may hold
    count = -(-grid[0] // most)
    rows = -(-grid[0] // count)  # even slabs (75 rows in two: 38 and 37, not 37, 37 and 1)
    return [(r * per_row, min(grid[0], r + rows) * per_row) for r in range(0, grid[0], rows)]
