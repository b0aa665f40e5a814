"""Grouped means and grouped arithmetic over dask blocks, on the device that holds each block.

``groupby(obj, "time.month")`` stands in for ``obj.groupby("time.month")`` in
the two steps of a climatology and its anomaly::

    from gpuzarr_dist.xarray.groupby import groupby

    clim = groupby(t2m, "time.month").mean("time").persist()   # == t2m.groupby("time.month").mean("time")
    anom = groupby(t2m, "time.month") - clim                   # == t2m.groupby("time.month") - clim

and returns what xarray returns (dimensions, coordinates, name, attributes,
dtype), computed in a fixed number of tasks per dask block whatever the
number of groups, in array operations that numpy and cupy both have:

- ``mean``: one task per block sums the block's steps of each group it holds
  (contiguous runs of equal labels are summed as slices, in float64; with
  ``skipna`` the non-NaN values are counted the same way), a tree of tasks
  adds the per-block sums of each group, and one task per output block
  divides. A block's partial sums cover only the groups present in it.
- ``-``, ``+``, ``*``, ``/`` with a DataArray indexed by the group (a
  climatology): one task per block of ``obj``, each writing
  ``block[run] - other[group of the run]`` for each run of equal labels;
  the output has ``obj``'s blocks.

Everything else (other reductions, reductions over other dimensions, a
Dataset with variables lacking the grouped dimension, labels with missing
values, an operand whose other dimensions differ from ``obj``'s) is handed to
xarray's own ``obj.groupby(group)``. In-memory data (numpy or cupy) is
computed at once, as xarray would; dask-backed data stays lazy.
"""

from __future__ import annotations

import operator
from collections.abc import Hashable
from typing import Any

import dask
import dask.array as da
import numpy as np
import pandas as pd
import xarray as xr
from dask.array.utils import meta_from_array
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from gpuzarr_dist.array.optimize import thread_shares, worker_for
from gpuzarr_dist.array.read import cluster_nthreads
from gpuzarr_dist.config import cluster_placement
from gpuzarr_dist.cuda.device import array_module

__all__ = ["BlockGroupBy", "groupby"]

#: partial sums combined per task of the tree that adds the blocks' sums
SPLIT_EVERY = 8
#: the binary operators handled per block, by the name of the ufunc that applies them
_UFUNCS = {operator.sub: "subtract", operator.add: "add", operator.mul: "multiply", operator.truediv: "divide"}


# --------------------------------------------------------------------------- block functions (any device)


def _runs(codes: np.ndarray) -> list[tuple[int, int, int]]:
    """``(start, stop, code)`` of each run of equal codes (host integers)."""
    codes = np.asarray(codes)
    if codes.size == 0:
        return []
    edges = np.flatnonzero(codes[1:] != codes[:-1]) + 1
    starts = np.concatenate(([0], edges))
    stops = np.concatenate((edges, [codes.size]))
    return [(int(a), int(b), int(codes[a])) for a, b in zip(starts, stops)]


def _skips_nan(dtype: np.dtype, skipna: bool | None) -> bool:
    """Whether a mean of ``dtype`` skips NaNs (xarray's default: for floats and complex)."""
    return np.dtype(dtype).kind in "fc" and skipna is not False


def _sum_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.complex128 if np.dtype(dtype).kind == "c" else np.float64)


def _block_sums(block: Any, codes: np.ndarray, axis: int, skipna: bool) -> tuple[np.ndarray, Any, Any]:
    """One block's sums per group: ``(groups, sums, counts)``.

    ``groups``: the sorted group codes present in the block (host). ``sums``:
    ``(len(groups), *other dims)`` in float64 (complex128), on the block's
    device. ``counts``: the values counted per group, the same shape on the
    device when NaNs are skipped, else per group on the host.
    """
    xp = array_module(block)
    codes = np.asarray(codes)
    view = xp.moveaxis(block, axis, 0)
    groups = np.unique(codes[codes >= 0])
    row = {int(g): k for k, g in enumerate(groups)}
    rest = view.shape[1:]
    sums = xp.zeros((len(groups), *rest), dtype=_sum_dtype(block.dtype))
    if skipna:
        counts = xp.zeros((len(groups), *rest), dtype=np.int32)  # values per element: fewer than 2**31 steps
    else:
        counts = np.bincount(codes[codes >= 0], minlength=int(groups[-1]) + 1 if len(groups) else 0)[groups]
    for start, stop, g in _runs(codes):
        if g < 0:
            continue
        part = view[start:stop]
        k = row[g]
        if skipna:
            sums[k] += xp.nansum(part, axis=0, dtype=sums.dtype)
            counts[k] += (~xp.isnan(part)).sum(axis=0, dtype=np.int32)
        else:
            sums[k] += part.sum(axis=0, dtype=sums.dtype)
    return groups, sums, counts


def _combine(parts: list[tuple[np.ndarray, Any, Any]]) -> tuple[np.ndarray, Any, Any]:
    """Add partial ``(groups, sums, counts)`` of the same output block, group by group."""
    if len(parts) == 1:
        return parts[0]
    groups = np.unique(np.concatenate([p[0] for p in parts]))
    row = {int(g): k for k, g in enumerate(groups)}
    first, first_counts = parts[0][1], parts[0][2]
    xp, cxp = array_module(first), array_module(first_counts)
    sums = xp.zeros((len(groups), *first.shape[1:]), dtype=first.dtype)
    counts = cxp.zeros((len(groups), *first_counts.shape[1:]), dtype=first_counts.dtype)
    for part_groups, part_sums, part_counts in parts:
        for k, g in enumerate(part_groups):
            sums[row[int(g)]] += part_sums[k]
            counts[row[int(g)]] += part_counts[k]
    return groups, sums, counts


def _finalize_mean(part: tuple[np.ndarray, Any, Any], ngroups: int, axis: int, dtype: np.dtype,
                   skipna: bool) -> Any:
    """The means ``sums / counts`` of every group (NaN where nothing was counted), the group axis at ``axis``."""
    groups, sums, counts = part
    xp = array_module(sums)
    out = xp.full((ngroups, *sums.shape[1:]), np.nan, dtype=dtype)
    for k, g in enumerate(groups):
        if skipna:  # counts per element, where the sums are
            n = counts[k]
            out[int(g)] = xp.where(n > 0, sums[k] / xp.where(n > 0, n, 1), np.nan).astype(dtype)
        else:  # one count per group, on the host
            out[int(g)] = (sums[k] / int(counts[k])).astype(dtype)
    return xp.moveaxis(out, 0, axis)


def _apply_block(block: Any, other: Any, codes: np.ndarray, axis: int, ufunc: str, reflexive: bool,
                 out_dtype: np.dtype) -> Any:
    """``ufunc(block[run], other[group of the run])`` run by run (``other`` indexed by group on ``axis``)."""
    xp = array_module(block)
    func = getattr(xp, ufunc)
    out = xp.empty(block.shape, dtype=out_dtype)
    src, dst, by_group = xp.moveaxis(block, axis, 0), xp.moveaxis(out, axis, 0), xp.moveaxis(other, axis, 0)
    for start, stop, g in _runs(codes):
        lhs, rhs = src[start:stop], by_group[g]
        func(*((rhs, lhs) if reflexive else (lhs, rhs)), out=dst[start:stop])
    return out


# --------------------------------------------------------------------------- dask graphs


def grouped_mean(x: da.Array, codes: np.ndarray, ngroups: int, axis: int, *, skipna: bool | None = None,
                 split_every: int = SPLIT_EVERY) -> da.Array:
    """The mean of ``x`` over ``axis`` per group: ``codes[i]`` (0 <= code < ``ngroups``) is step ``i``'s group.

    A dask array with ``axis`` replaced by one of length ``ngroups`` (one
    block along it), NaN for a group with no value counted. One task per
    block of ``x``, a tree of ``split_every``-way additions per output block,
    one division per output block. On a cluster whose blocks are placed
    (``gpuzarr.cluster.placement``, two or more workers), the tree's first
    level adds only blocks placed on the same worker, so each worker's partial
    sums (``ngroups`` times a block's size) cross to another worker once.
    """
    codes = np.asarray(codes, dtype=np.int64)
    if codes.shape != (x.shape[axis],):
        raise ValueError(f"{len(codes)} group codes for an axis of length {x.shape[axis]}")
    nan = _skips_nan(x.dtype, skipna)
    out_dtype = x.dtype if x.dtype.kind in "fc" else np.dtype(np.float64)  # xarray's: integers give float64
    token = tokenize(x.name, codes, ngroups, axis, nan, split_every)
    chunk_name, comb_name, name = f"groupby-sums-{token}", f"groupby-combine-{token}", f"groupby-mean-{token}"
    bounds = np.cumsum((0, *x.chunks[axis]))
    block_codes = [codes[bounds[i]:bounds[i + 1]] for i in range(len(x.chunks[axis]))]
    other_blocks = [range(len(c)) for i, c in enumerate(x.chunks) if i != axis]
    owners = _block_workers(x.numblocks)
    dsk: dict = {}
    for rest in np.ndindex(*[len(r) for r in other_blocks]):
        def key(i: int, rest: tuple = rest) -> tuple:
            return (*rest[:axis], i, *rest[axis:])

        level = []
        for i in range(len(x.chunks[axis])):
            k = (chunk_name, *key(i))
            dsk[k] = (_block_sums, (x.name, *key(i)), block_codes[i], axis, nan)
            level.append(k)
        depth = 0
        if owners is not None and len(level) > 1:  # first, the blocks of each worker's run, among themselves
            nxt = []
            for j, run in enumerate(_runs_of(level, [owners[key(i)] for i in range(len(level))], split_every)):
                k = (comb_name, depth, *key(j))
                dsk[k] = (_combine, run)
                nxt.append(k)
            level, depth = nxt, depth + 1
        while len(level) > 1:
            nxt = []
            for j in range(0, len(level), split_every):
                k = (comb_name, depth, *key(j // split_every))
                dsk[k] = (_combine, level[j:j + split_every])
                nxt.append(k)
            level, depth = nxt, depth + 1
        dsk[(name, *key(0))] = (_finalize_mean, level[0], ngroups, axis, out_dtype, nan)
    chunks = tuple((ngroups,) if i == axis else c for i, c in enumerate(x.chunks))
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=[x])
    return da.Array(graph, name, chunks, meta=meta_from_array(x._meta, ndim=x.ndim, dtype=out_dtype))


def _block_workers(numblocks: tuple[int, ...]) -> np.ndarray | None:
    """The worker (an index) that block placement gives each block of an array of ``numblocks`` blocks on this
    process's distributed client, or None where blocks are not placed (no client, one worker, placement off).

    The same rule as :class:`~gpuzarr_dist.distributed.placement.BlockPlacement`: blocks in C order, consecutive
    runs in proportion to the workers' threads. The read tasks are placed by it; where work stealing moves one,
    its partial sums cross once more.
    """
    if not cluster_placement():
        return None
    nthreads = {w: n for w, n in cluster_nthreads().items() if n > 0}
    if len(nthreads) < 2:
        return None
    workers, bounds = thread_shares(nthreads)
    index = {w: i for i, w in enumerate(workers)}
    count = int(np.prod(numblocks))
    return np.array([index[worker_for(p, count, bounds, workers)] for p in range(count)]).reshape(numblocks)


def _runs_of(keys: list, owners: list, split_every: int) -> list[list]:
    """``keys`` cut where their owner changes, and each run into pieces of at most ``split_every``."""
    out: list[list] = []
    start = 0
    for i in range(1, len(keys) + 1):
        if i == len(keys) or owners[i] != owners[start]:
            out.extend(keys[j:min(j + split_every, i)] for j in range(start, i, split_every))
            start = i
    return out


def grouped_apply(x: da.Array, other: da.Array, codes: np.ndarray, axis: int, op: Any = operator.sub,
                  reflexive: bool = False) -> da.Array:
    """``op(x, other[codes])`` along ``axis`` (``other``'s ``axis`` indexes groups), one task per block of ``x``.

    ``other`` has ``x``'s shape except along ``axis``; ``op`` is one of
    ``operator.sub``, ``add``, ``mul`` and ``truediv``; ``reflexive`` swaps
    the operands.
    """
    codes = np.asarray(codes, dtype=np.int64)
    if codes.shape != (x.shape[axis],):
        raise ValueError(f"{len(codes)} group codes for an axis of length {x.shape[axis]}")
    if other.ndim != x.ndim or any(o != s for i, (o, s) in enumerate(zip(other.shape, x.shape)) if i != axis):
        raise ValueError(f"an operand of shape {other.shape} does not match {x.shape} outside axis {axis}")
    if codes.size and (codes.min() < 0 or codes.max() >= other.shape[axis]):
        raise ValueError(f"group codes outside 0..{other.shape[axis] - 1}")
    ufunc = _UFUNCS[op]
    probe = op(np.ones(1, dtype=other.dtype), np.ones(1, dtype=x.dtype)) if reflexive else \
        op(np.ones(1, dtype=x.dtype), np.ones(1, dtype=other.dtype))
    dtype = probe.dtype
    idx = tuple(range(x.ndim))
    other_idx = tuple(x.ndim if i == axis else i for i in idx)
    codes_da = da.from_array(codes, chunks=(x.chunks[axis],))
    return da.blockwise(
        _apply_block, idx, x, idx, other, other_idx, codes_da, (axis,),
        axis=axis, ufunc=ufunc, reflexive=reflexive, out_dtype=dtype, dtype=dtype, concatenate=True,
        meta=meta_from_array(x._meta, ndim=x.ndim, dtype=dtype), token=f"groupby-{ufunc}",
    )


# --------------------------------------------------------------------------- the xarray face


def _as_dask(data: Any) -> tuple[da.Array, bool]:
    """``data`` as a dask array, and whether it was one."""
    if isinstance(data, da.Array):
        return data, True
    return da.from_array(data, chunks=data.shape, asarray=False), False


class BlockGroupBy:
    """``obj.groupby(group)`` for the operations listed in the module docstring; the rest is xarray's."""

    def __init__(self, obj: xr.DataArray | xr.Dataset, group: Hashable | xr.DataArray):
        if not isinstance(obj, (xr.DataArray, xr.Dataset)):
            raise TypeError(f"groupby takes an xarray DataArray or Dataset, not {type(obj).__name__}")
        self.obj = obj
        self.group = group
        labels = obj[group] if not isinstance(group, xr.DataArray) else group
        if labels.ndim != 1:
            raise ValueError(f"groupby here groups along one dimension; {getattr(labels, 'name', group)!r} has "
                             f"dimensions {labels.dims}")
        self.dim = labels.dims[0]
        self.name = labels.name if labels.name is not None else "group"
        self.labels = labels
        values = np.asarray(labels.values)
        codes, uniques = pd.factorize(values, sort=True)
        self.codes = np.asarray(codes, dtype=np.int64)
        self.uniques = np.asarray(uniques)
        self.complete = bool((self.codes >= 0).all())  # no missing labels

    def __repr__(self) -> str:
        return f"BlockGroupBy({self.name!r} over {self.dim!r}, {len(self.uniques)} groups)"

    def _xarray(self) -> Any:
        return self.obj.groupby(self.group)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._xarray(), name)

    # -- mean

    def _dims_ok(self, dim: Any) -> bool:
        if dim is None or dim is ...:
            return dim is None
        dims = (dim,) if isinstance(dim, Hashable) and not isinstance(dim, (list, tuple)) else tuple(dim)
        return dims == (self.dim,)

    def mean(self, dim: Any = None, *, skipna: bool | None = None, keep_attrs: bool | None = None,
             **kwargs: Any) -> xr.DataArray | xr.Dataset:
        """``obj.groupby(group).mean(dim)``: one task per block (see the module docstring)."""
        if kwargs or not self.complete or not self._dims_ok(dim):
            return self._xarray().mean(dim, skipna=skipna, keep_attrs=keep_attrs, **kwargs)
        if isinstance(self.obj, xr.Dataset):
            if not all(self.dim in v.dims for v in self.obj.data_vars.values()):
                return self._xarray().mean(dim, skipna=skipna, keep_attrs=keep_attrs)
            # xarray puts the group's dimension first in each variable of a Dataset
            out = {k: self._mean_array(v, skipna, keep_attrs).transpose(self.name, ...)
                   for k, v in self.obj.data_vars.items()}
            return xr.Dataset(out, attrs=dict(self.obj.attrs) if keep_attrs is not False else {})
        return self._mean_array(self.obj, skipna, keep_attrs)

    def _mean_array(self, arr: xr.DataArray, skipna: bool | None, keep_attrs: bool | None) -> xr.DataArray:
        axis = arr.get_axis_num(self.dim)
        data, lazy = _as_dask(arr.data)
        result = grouped_mean(data, self.codes, len(self.uniques), axis, skipna=skipna)
        if not lazy:
            (result,) = dask.compute(result, scheduler="sync")
        dims = tuple(self.name if d == self.dim else d for d in arr.dims)
        coords = {k: v for k, v in arr.coords.items() if self.dim not in v.dims}
        coords[self.name] = self.uniques
        return xr.DataArray(result, dims=dims, coords=coords, name=arr.name,
                            attrs=dict(arr.attrs) if keep_attrs is not False else {})

    # -- arithmetic with a DataArray indexed by the group

    def _binary(self, other: Any, op: Any) -> Any:
        def fallback() -> Any:
            return op(self._xarray(), other)

        obj = self.obj
        if not (isinstance(obj, xr.DataArray) and isinstance(other, xr.DataArray) and self.complete):
            return fallback()
        if self.name not in other.dims:
            return fallback()  # xarray says what is wrong
        want = [self.name if d == self.dim else d for d in obj.dims]
        if set(other.dims) != set(want) or any(other.sizes[d] != obj.sizes[d] for d in want if d != self.name):
            return fallback()
        for d in want:
            if d != self.name and d in other.indexes and d in obj.indexes and not other.indexes[d].equals(obj.indexes[d]):
                return fallback()
        if self.name in other.indexes and not np.array_equal(np.asarray(other.indexes[self.name]), self.uniques):
            other = other.reindex({self.name: self.uniques})  # missing groups give NaN, as in xarray
        other = other.transpose(*want)
        axis = obj.get_axis_num(self.dim)
        x, lazy = _as_dask(obj.data)
        y, _ = _as_dask(other.data)
        result = grouped_apply(x, y, self.codes, axis, op)
        if not lazy:
            (result,) = dask.compute(result, scheduler="sync")
        coords = dict(obj.coords.items())
        coords[self.name] = (self.dim, self.uniques[self.codes])
        name = obj.name if other.name == obj.name else None
        return xr.DataArray(result, dims=obj.dims, coords=coords, name=name, attrs=dict(obj.attrs))

    def __sub__(self, other: Any) -> Any:
        return self._binary(other, operator.sub)

    def __add__(self, other: Any) -> Any:
        return self._binary(other, operator.add)

    def __mul__(self, other: Any) -> Any:
        return self._binary(other, operator.mul)

    def __truediv__(self, other: Any) -> Any:
        return self._binary(other, operator.truediv)


def groupby(obj: xr.DataArray | xr.Dataset, group: Hashable | xr.DataArray) -> BlockGroupBy:
    """``obj.groupby(group)`` whose ``mean`` and arithmetic run as a fixed number of tasks per dask block.

    ``group``: a coordinate or virtual variable name (``"time.month"``) or a
    1-D DataArray of labels along one dimension. See the module docstring for
    what runs here and what is handed to xarray.
    """
    return BlockGroupBy(obj, group)
