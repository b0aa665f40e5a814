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
from numbers import Integral
from typing import Any, NamedTuple

import numpy as np

from gpuzarr_dist.core.metadata import ArraySpec


class ChunkPart(NamedTuple):
    """One chunk's share of a selection (a named tuple: a block of a sharded array plans a thousand or
    more, and a frozen dataclass cost several times more to build)."""

    coords: tuple[int, ...]
    chunk_sel: tuple[slice, ...]  # within the decoded chunk
    out_sel: tuple[slice, ...]  # within the output (before integer axes are dropped)


class Plan:
    """A selection's chunks: the C-ordered product of each axis's pieces ``(chunk index, slice in the chunk,
    slice of the output)``.

    :attr:`parts` (one :class:`ChunkPart` per chunk) is built the first time
    it is asked for. The GPU read of a whole or trimmed grid never asks: it
    takes the chunk coordinates as one array (:meth:`coords`) and the grid's
    corners (:attr:`first`, :attr:`last`), so a block of thousands of inner
    chunks makes no per-chunk objects: tens of thousands of tuples alive in
    several blocks at once set off Python's full garbage collections (about
    100 ms each, the GIL held).
    """

    __slots__ = ("out_shape", "final_index", "axes", "_parts")

    def __init__(self, out_shape: tuple[int, ...], final_index: tuple[Any, ...],
                 axes: tuple[tuple[tuple[int, slice, slice], ...], ...]):
        self.out_shape = out_shape  # every axis kept (integer axes have length 1)
        self.final_index = final_index  # applied at the end: drops integer axes, flips negative steps
        self.axes = axes  # per axis: (chunk index, slice within the chunk, slice of the output) of each chunk
        self._parts: tuple[ChunkPart, ...] | None = None

    def __repr__(self) -> str:
        return f"Plan(out_shape={self.out_shape}, chunks={self.n_parts})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Plan) and (self.out_shape, self.final_index, self.axes)
                == (other.out_shape, other.final_index, other.axes))

    __hash__ = None  # type: ignore[assignment]

    @property
    def n_parts(self) -> int:
        """How many chunks the selection touches."""
        return math.prod(len(a) for a in self.axes)

    @property
    def parts(self) -> tuple[ChunkPart, ...]:
        """One :class:`ChunkPart` per chunk, in C order (built once, when first asked for)."""
        if self._parts is None:
            # zip(*combo) transposes a chunk's per-axis entries in C; a 0-d array has one chunk and no axes
            self._parts = (tuple(ChunkPart(*zip(*combo)) for combo in itertools.product(*self.axes)) if self.axes
                           else (ChunkPart((), (), ()),))
        return self._parts

    def coords(self) -> np.ndarray:
        """The chunk coordinates of every part, ``(n_parts, ndim)`` int64, in C order (no per-part objects)."""
        nd = len(self.axes)
        if not nd:
            return np.zeros((1, 0), dtype=np.int64)
        per_axis = [np.fromiter((c for c, _, _ in a), dtype=np.int64, count=len(a)) for a in self.axes]
        return np.stack(np.meshgrid(*per_axis, indexing="ij"), axis=-1).reshape(-1, nd)

    @property
    def first(self) -> ChunkPart:
        """The first part (every axis's first piece)."""
        return ChunkPart(*zip(*(a[0] for a in self.axes))) if self.axes else ChunkPart((), (), ())

    @property
    def last(self) -> ChunkPart:
        """The last part (every axis's last piece)."""
        return ChunkPart(*zip(*(a[-1] for a in self.axes))) if self.axes else ChunkPart((), (), ())

    def rows(self, lo: int, hi: int) -> Plan:
        """The parts ``lo:hi`` (in C order) as a plan, where they are whole rows of the first axis."""
        per_row = self.n_parts // len(self.axes[0])
        if lo % per_row or hi % per_row:
            raise ValueError(f"parts {lo}:{hi} are not whole rows of {per_row} chunks")
        first = self.axes[0][lo // per_row : hi // per_row]
        extent = first[-1][2].stop - first[0][2].start
        return Plan((extent, *self.out_shape[1:]), self.final_index, (first, *self.axes[1:]))


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


def plan_selection(spec: ArraySpec, index: Any, memory: tuple[int, str] | None = None) -> Plan:
    """The chunks ``spec``'s array needs for ``index``, and where each lands.

    ``memory``: ``(bytes, what)``, the memory the block must fit in (see
    :func:`gpuzarr_dist.cuda.device.block_memory`); a larger block raises
    :class:`~gpuzarr_dist.errors.BlockTooLargeError` before anything is planned.
    """
    axes = _normalize(index, spec.shape)
    out_shape = tuple(max(0, -(-(stop - start) // step)) for start, stop, step, _, _ in axes)
    if memory is not None:
        check_block_fits(spec, out_shape, *memory)
    final = tuple(0 if is_int else (slice(None, None, -1) if rev else slice(None)) for _, _, _, is_int, rev in axes)
    per_axis = tuple(tuple(_axis_parts(start, stop, step, c)) for (start, stop, step, _, _), c in zip(axes, spec.chunk_shape))
    return Plan(out_shape, final, per_axis)


def check_block_fits(spec: ArraySpec, shape: tuple[int, ...], memory: int, what: str) -> None:
    """Raise :class:`~gpuzarr_dist.errors.BlockTooLargeError` where a block of ``shape`` holds more bytes than
    ``memory`` (``what``: which memory, for the message). Planning such a block (one entry per chunk) could take
    minutes, and it could never be allocated."""
    nbytes = math.prod(shape) * spec.dtype.itemsize
    if nbytes <= memory:
        return
    from dask.utils import format_bytes

    from gpuzarr_dist.errors import BlockTooLargeError

    raise BlockTooLargeError(
        spec.name,
        f"{spec.name}: a block of shape {tuple(shape)} ({format_bytes(nbytes)} of {spec.dtype}) cannot fit in "
        f"{what} ({format_bytes(memory)}). Read the array in smaller blocks: from_zarr_gpu(..., chunks=...) with "
        f"fewer elements per block (a multiple of the Zarr chunk shape {tuple(spec.chunk_shape)}), or select less.",
    )


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
    return all(s.step in (None, 1) for axis in plan.axes for _, s, _ in axis)


def whole_chunk_grid(plan: Plan, chunk_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> bool:
    """Whether the plan is a full grid of whole chunks tiling the output (the usual aligned block)."""
    return all(
        s.start == 0 and s.stop == c and s.step in (None, 1)
        for axis, c in zip(plan.axes, chunk_shape)
        for _, s, _ in axis
    ) and all(o % c == 0 for o, c in zip(out_shape, chunk_shape))


def grid_slabs(plan: Plan, spec: ArraySpec, out_shape: tuple[int, ...], limit: int | None) -> list[tuple[int, int]] | None:
    """``(lo, hi)`` ranges of ``plan.parts``, whole rows of its chunk grid along the first axis, of at most
    ``limit`` decoded bytes each (one row at least); ``None`` where the block is decoded in one call: no
    ``limit``, the block within it, one row of the grid, or a plan that is not a C-ordered grid of chunks
    read with step 1 (missing chunks are the caller's test)."""
    if limit is None or plan.n_parts < 2 or not out_shape:
        return None
    chunk_bytes = spec.dtype.itemsize * math.prod(spec.chunk_shape)
    if plan.n_parts * chunk_bytes <= limit:
        return None
    whole = whole_chunk_grid(plan, spec.chunk_shape, out_shape)
    if not (whole or (len(out_shape) == len(spec.chunk_shape) and unit_step_grid(plan))):
        return None
    first, last = plan.first, plan.last
    grid = [b - a + 1 for a, b in zip(first.coords, last.coords)]
    if math.prod(grid) != plan.n_parts or grid[0] == 1:  # not a whole grid, or one row: nothing to cut
        return None
    per_row = plan.n_parts // grid[0]
    most = max(1, limit // (per_row * chunk_bytes))  # rows a slab may hold
    count = -(-grid[0] // most)
    rows = -(-grid[0] // count)  # even slabs (75 rows in two: 38 and 37, not 37, 37 and 1)
    return [(r * per_row, min(grid[0], r + rows) * per_row) for r in range(0, grid[0], rows)]
