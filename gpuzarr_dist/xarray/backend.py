"""xarray integration: ``engine="gpuzarr"`` and :func:`open_dataset`.

xarray's own zarr engine opens the store: metadata (consolidated when
present), groups, dimensions, coordinates, attributes, encodings and the CF
decoding plan all come from it, so a dataset opened here is the one
``xr.open_zarr`` gives. Then each numeric data variable is read by gpuzarr.
For :func:`open_dataset`, its lazily indexed zarr-python array is replaced by
a dask array from :func:`~gpuzarr_dist.from_zarr_gpu` (cupy chunks on the
GPU), and the CF decoding steps xarray chose for that
variable (``_Unsigned``, ``_FillValue``/``missing_value`` masking,
``scale_factor``/``add_offset`` unpacking, byte order, booleans) are applied to
it block by block, with the parameters xarray chose, in array operations that
run on the device holding the block. Coordinates stay with xarray's reader, in
host memory, as does any variable gpuzarr does not read as numbers: times and
timedeltas (decoded by pandas/cftime on the host), strings, and arrays whose
codecs gpuzarr cannot decode yet (with a warning).

Two entry points, the same variables, two kinds of data:

- :func:`open_dataset` returns the data variables as plain dask arrays
  (gpuzarr's blocks; cupy chunks on the GPU) with the CF decoding fused into
  each block's task. ``.load()``/``.compute()`` compute them: numpy arrays on
  the CPU, cupy arrays on the GPU (``.as_numpy()`` copies them to the host).
- ``xr.open_dataset(path, engine="gpuzarr")`` follows xarray's contract for a
  backend: the data variables are lazily indexed arrays, and reading any part
  of one (``.values``, ``.load()``, ``.compute()``, ``load_async()``,
  indexing) reads the Zarr chunks it needs in batches through gpuzarr
  (decoded on the GPU when the device is the GPU), then xarray applies its CF
  decoding in host memory: the data are numpy arrays, as from every xarray
  backend, and are read once when xarray caches them. xarray's ``chunks=``
  makes dask arrays over them as it does for ``engine="zarr"``: each of
  xarray's chunks is one batched gpuzarr read.
"""

from __future__ import annotations

import asyncio
import os
import warnings
from collections.abc import Hashable, Iterable, Mapping
from functools import partial
from typing import Any

import numpy as np
import xarray as xr
from xarray.backends import BackendArray, BackendEntrypoint
from xarray.backends.zarr import ZarrArrayWrapper, ZarrBackendEntrypoint
from xarray.coding import variables as _cf
from xarray.core import indexing

from gpuzarr_dist.array.read import from_zarr_gpu
from gpuzarr_dist.cuda.device import array_module, resolve_device
from gpuzarr_dist.errors import GpuZarrError, GroupNotFoundError, MetadataError, NotAGroupError
from gpuzarr_dist.stores.source import bad_document_error
from gpuzarr_dist.xarray.write import PENDING_DOCUMENT

try:  # xarray >= 2025.01 moved it to coding.common
    from xarray.coding.common import _ElementwiseFunctionArray
except ImportError:  # pragma: no cover - older xarray
    from xarray.coding.variables import _ElementwiseFunctionArray

__all__ = ["GpuZarrArray", "GpuZarrBackendEntrypoint", "open_dataset"]

#: decoded dtypes gpuzarr reads; times, timedeltas and strings stay with xarray
_NUMERIC = "biufc"


# --------------------------------------------------------------------------- CF steps on any device


def _mask(block: Any, encoded_fill_values: Iterable, decoded_fill_value: Any, dtype: Any) -> Any:
    """xarray's ``_apply_mask`` in array operations that numpy and cupy both have.

    The block is cast to ``dtype``; elements equal to any encoded fill value
    become ``decoded_fill_value`` (NaN for floats).
    """
    xp = array_module(block)
    data = block.astype(dtype, copy=True)
    if not encoded_fill_values:
        return data
    condition = False
    for fv in encoded_fill_values:
        condition |= data == fv
    return xp.where(condition, xp.asarray(decoded_fill_value, dtype=data.dtype), data)


def _cast(block: Any, dtype: Any) -> Any:
    """``np.asarray(block, dtype=dtype)`` for numpy and cupy blocks (``_Unsigned``, byte order, booleans)."""
    return block.astype(dtype, copy=False)


class _OnHost:
    """Apply one of xarray's numpy-only decoding functions to a GPU block through host memory."""

    def __init__(self, func: Any):
        self.func = func

    def __call__(self, block: Any) -> Any:
        xp = array_module(block)
        if xp is np:
            return self.func(block)
        return xp.asarray(self.func(block.get()))

    def __repr__(self) -> str:
        return f"_OnHost({self.func!r})"


def _device_step(func: Any, device: str, name: Hashable) -> Any:
    """The block function for one of xarray's elementwise decoding functions."""
    if isinstance(func, partial) and not func.args:
        kw = func.keywords
        if func.func is getattr(_cf, "_apply_mask", None) and set(kw) == {
            "encoded_fill_values",
            "decoded_fill_value",
            "dtype",
        }:
            return partial(_mask, **kw)
        if func.func is getattr(_cf, "_scale_offset_decoding", None):
            return func  # astype, *= and += only: runs on numpy and cupy as it is
        if func.func is np.asarray and set(kw) == {"dtype"}:
            return partial(_cast, dtype=kw["dtype"])
    if device == "cpu":
        return func
    warnings.warn(
        f"variable {name!r}: xarray's decoding step {func!r} has no GPU version here; "
        "it runs on the host for each block",
        stacklevel=4,
    )
    return _OnHost(func)


def _decoding_chain(data: Any) -> tuple[list[tuple[Any, np.dtype]], indexing.LazilyIndexedArray] | None:
    """Unwrap xarray's lazy decoding wrappers down to the zarr array.

    Returns ``(steps, lazy)`` with the steps innermost first, each a
    ``(function or "cast", dtype)`` pair, and ``lazy`` the unindexed
    ``LazilyIndexedArray`` over xarray's ``ZarrArrayWrapper``; or None when the
    structure is not the one xarray's zarr engine builds (an indexed view, an
    unknown wrapper).
    """
    steps: list[tuple[Any, np.dtype]] = []
    while True:
        if isinstance(data, _ElementwiseFunctionArray):
            steps.append((data.func, data.dtype))
        elif isinstance(data, (_cf.NativeEndiannessArray, _cf.BoolTypeArray)):
            steps.append(("cast", data.dtype))
        elif isinstance(data, indexing.LazilyIndexedArray):
            if any(k != slice(None) for k in data.key.tuple):
                return None
            if not isinstance(data.array, ZarrArrayWrapper):
                return None
            steps.reverse()
            return steps, data
        else:
            return None
        data = data.array


class GpuZarrArray(BackendArray):
    """A Zarr array's encoded values, read through gpuzarr-dist, for xarray's lazy indexing.

    ``xr.open_dataset(..., engine="gpuzarr")`` puts it where xarray's zarr
    engine puts its ``ZarrArrayWrapper``: xarray's CF decoding wraps it and its
    caching and ``chunks=`` work as for ``engine="zarr"``. Each read of a
    selection (a slice or one list of indices per axis, which xarray's outer
    indexing reduces to) is a :func:`~gpuzarr_dist.from_zarr_gpu` dask array
    sliced to it and computed in the calling thread: only the Zarr chunks the
    selection touches are read, in one batch per block, and the result is a
    numpy array in host memory on either device.
    """

    __slots__ = ("_x", "dtype", "name", "shape")

    def __init__(self, x: Any, name: Hashable):
        self._x = x  # the dask array from from_zarr_gpu (numpy or cupy blocks)
        self.shape = x.shape
        self.dtype = x.dtype
        self.name = name

    def __repr__(self) -> str:
        return f"GpuZarrArray({self.name!r}, shape={self.shape}, dtype={self.dtype})"

    def _read(self, key: tuple) -> np.ndarray:
        out = self._x[key].compute(scheduler="sync")
        xp = array_module(out)
        return np.asarray(out) if xp is np else xp.asnumpy(out)

    def __getitem__(self, key: indexing.ExplicitIndexer) -> np.ndarray:
        return indexing.explicit_indexing_adapter(key, self.shape, indexing.IndexingSupport.OUTER_1VECTOR, self._read)

    async def async_getitem(self, key: indexing.ExplicitIndexer) -> np.ndarray:
        return await asyncio.to_thread(self.__getitem__, key)


# --------------------------------------------------------------------------- blocks


def _check_blocks(blocks: Any, dims: Iterable[Hashable]) -> None:
    if isinstance(blocks, Mapping):
        unknown = [d for d in blocks if d not in set(dims)]
        if unknown:
            raise ValueError(f"blocks names dimensions the dataset does not have: {unknown}; its dimensions: {list(dims)}")


def _blocks_for(blocks: Any, dims: tuple[Hashable, ...]) -> Any:
    """``blocks`` for one variable: a mapping becomes a tuple in the variable's axis order."""
    if not isinstance(blocks, Mapping):
        return "auto" if blocks is None else blocks
    per_axis = tuple(blocks.get(d, "auto") for d in dims)
    return "auto" if all(isinstance(b, str) and b == "auto" for b in per_axis) else per_axis


# --------------------------------------------------------------------------- the dataset


def _read_with_gpuzarr(ds: xr.Dataset, device: str, blocks: Any, lazy: bool) -> xr.Dataset:
    """Read ``ds``'s numeric data variables through gpuzarr, in place.

    ``lazy=False``: each variable's data becomes a decoded gpuzarr dask array.
    ``lazy=True``: xarray's zarr array wrapper under the variable's lazy
    decoding becomes a :class:`GpuZarrArray`.
    """
    _check_blocks(blocks, ds.sizes)
    for name in ds.data_vars:
        var = ds.variables[name]
        if var.dtype.kind not in _NUMERIC:
            continue  # times, timedeltas, strings: decoded on the host by xarray
        found = _decoding_chain(var._data)
        if found is None:
            continue
        steps, lazy_array = found
        zarr_array = lazy_array.array.get_array()
        if zarr_array.dtype.kind not in _NUMERIC:
            continue
        var_blocks = _blocks_for(blocks, var.dims)
        try:
            x = from_zarr_gpu(zarr_array, chunks=var_blocks, device=device)
        except GpuZarrError as e:  # e.g. a codec gpuzarr cannot decode yet: xarray's reader keeps it
            warnings.warn(f"variable {name!r} is read by xarray's zarr engine instead of gpuzarr: {e}", stacklevel=3)
            continue
        if lazy:
            lazy_array.array = GpuZarrArray(x, name)
            continue
        for func, dtype in steps:
            fn = partial(_cast, dtype=dtype) if func == "cast" else _device_step(func, device, name)
            x = x.map_blocks(fn, dtype=dtype, meta=x._meta.astype(dtype))
        if x.dtype != var.dtype or x.shape != var.shape:  # pragma: no cover - a decoding xarray changed
            raise AssertionError(f"{name!r}: decoded to {x.dtype} {x.shape}, xarray expects {var.dtype} {var.shape}")
        var.data = x
    return ds


def _open_error(e: Exception, source: Any, group: str | None, storage_options: dict | None) -> Exception:
    """A clearer error for a store or group that is not there, or that is an array, or for metadata nested too
    deeply to parse; else ``e`` itself."""
    if isinstance(e, RecursionError):
        return MetadataError(f"{source}: a metadata document (.zmetadata, zarr.json, .zarray or .zattrs) is nested "
                             "too deeply to parse")
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if not isinstance(source, str):
        return e
    import zarr

    local = "://" not in source or source.startswith("file://")
    path = source.removeprefix("file://")
    if local and not os.path.exists(path):
        return GroupNotFoundError(source, f"No such Zarr store: {source!r}")
    if local and os.path.exists(os.path.join(path, *(group or "").strip("/").split("/"), PENDING_DOCUMENT)):
        where = f"group {group!r} in {source}" if group and group.strip("/") else source
        return MetadataError(f"{where}: a to_zarr_gpu write that did not finish (its group document is still "
                             f"{PENDING_DOCUMENT}); write it again: to_zarr_gpu replaces it")
    try:
        root = zarr.open(source, mode="r", storage_options=None if local else storage_options)
    except Exception:
        return e
    if isinstance(root, zarr.Array):
        return NotAGroupError(f"{source} is a Zarr array, not a group: read it with gpuzarr_dist.from_zarr_gpu")
    if not group or group.strip("/") == "":
        return e
    node = root.get(group.strip("/"))
    if node is None:
        groups = sorted(p for p, n in root.members(max_depth=None) if isinstance(n, zarr.Group))
        return GroupNotFoundError(source, f"No Zarr group {group!r} in {source}; groups there: {groups}")
    if isinstance(node, zarr.Array):
        return NotAGroupError(f"{group!r} in {source} is a Zarr array, not a group; open the group that holds it")
    return e


class GpuZarrBackendEntrypoint(BackendEntrypoint):
    """``xr.open_dataset(path, engine="gpuzarr", device=..., blocks=...)``.

    Opens the store with xarray's zarr engine and reads the data variables
    with gpuzarr-dist as lazily indexed arrays (:class:`GpuZarrArray`, see the
    module docstring): ``.load()``, ``.compute()``, ``load_async()`` and
    ``.values`` give numpy arrays, read once when xarray caches them. Backend
    arguments besides xarray's zarr ones:

    device
        ``"auto"`` (GPU when usable), ``"gpu"`` (chunks decoded on the GPU,
        then copied to host memory) or ``"cpu"``.
    blocks
        The unit of one batched read within a load: ``"auto"`` (whole
        multiples of the Zarr chunks of about ``gpuzarr.block-size.{cpu,gpu}``),
        a byte size (``"512 MiB"``), a mapping from dimension to block size
        (other dimensions ``"auto"``), or chunks passed to each variable's
        ``from_zarr_gpu``.
    """

    description = "Open Zarr stores with the data variables read and decoded in batches by gpuzarr-dist (GPU or CPU)"
    url = "https://github.com/gpuzarr-dist/gpuzarr-dist"
    supports_groups = False
    #: xarray derives this from the signature only for engines it lists (``list_engines``); set here, an
    #: engine passed as a class (``engine=GpuZarrBackendEntrypoint``) works in a fresh process too
    open_dataset_parameters = (
        "filename_or_obj", "mask_and_scale", "decode_times", "concat_characters", "decode_coords",
        "drop_variables", "use_cftime", "decode_timedelta", "group", "consolidated", "storage_options",
        "zarr_format", "use_zarr_fill_value_as_mask", "mode", "store", "cache_members", "device", "blocks",
    )
    #: True: lazily indexed arrays (xarray's backend contract); False: gpuzarr dask arrays (``open_dataset``)
    lazy = True

    def guess_can_open(self, filename_or_obj: Any) -> bool:
        return False  # never chosen unless asked for: engine="zarr" stays the default for .zarr

    def open_dataset(  # type: ignore[override]
        self,
        filename_or_obj: Any,
        *,
        mask_and_scale: bool = True,
        decode_times: Any = True,
        concat_characters: bool = True,
        decode_coords: Any = True,
        drop_variables: str | Iterable[str] | None = None,
        use_cftime: bool | None = None,
        decode_timedelta: Any = None,
        group: str | None = None,
        consolidated: bool | None = None,
        storage_options: dict | None = None,
        zarr_format: int | None = None,
        use_zarr_fill_value_as_mask: bool | None = None,
        mode: str = "r",
        store: Any = None,
        cache_members: bool = True,
        device: str = "auto",
        blocks: Any = "auto",
    ) -> xr.Dataset:
        dev = resolve_device(device)
        kwargs: dict[str, Any] = dict(
            mask_and_scale=mask_and_scale,
            decode_times=decode_times,
            concat_characters=concat_characters,
            decode_coords=decode_coords,
            drop_variables=drop_variables,
            use_cftime=use_cftime,
            decode_timedelta=decode_timedelta,
            group=group,
            consolidated=consolidated,
            storage_options=storage_options,
            zarr_format=zarr_format,
            mode=mode,
            store=store,
            cache_members=cache_members,
        )
        if use_zarr_fill_value_as_mask is not None:
            kwargs["use_zarr_fill_value_as_mask"] = use_zarr_fill_value_as_mask
        try:
            ds = ZarrBackendEntrypoint().open_dataset(filename_or_obj, **kwargs)
        except Exception as e:
            clear = _open_error(e, filename_or_obj, group, storage_options)
            if clear is e and isinstance(filename_or_obj, (str, os.PathLike)):
                clear = bad_document_error(os.fspath(filename_or_obj), e) or e
            if clear is e:
                raise
            raise clear from e
        try:
            return _read_with_gpuzarr(ds, dev, blocks, self.lazy)
        except BaseException:
            ds.close()
            raise


class _DaskBackend(GpuZarrBackendEntrypoint):
    """The engine :func:`open_dataset` uses: data variables as gpuzarr dask arrays."""

    lazy = False


def _unwrap(ds: xr.Dataset) -> xr.Dataset:
    """Take the dask arrays back out of the wrappers xarray's ``open_dataset`` puts around every variable."""
    for var in ds.variables.values():
        data = var._data
        while isinstance(data, (indexing.MemoryCachedArray, indexing.CopyOnWriteArray)):
            data = data.array
        if isinstance(data, indexing.DaskIndexingAdapter):
            var.data = data.array
    return ds


def open_dataset(
    source: Any,
    *,
    device: str = "auto",
    chunks: Any = "auto",
    group: str | None = None,
    consolidated: bool | None = None,
    storage_options: dict | None = None,
    **xarray_kwargs: Any,
) -> xr.Dataset:
    """An xarray Dataset over a Zarr store, its data variables read by gpuzarr-dist.

    The same dataset as ``xr.open_zarr(source)`` (variables, coordinates,
    attributes, encodings and CF decoding: packed integers unpacked,
    ``_FillValue``/``missing_value`` masked, times decoded), except that each
    numeric data variable is a dask array built by :func:`from_zarr_gpu`: one
    task per block reads and decodes all of the block's Zarr chunks in one
    batch, and the CF decoding runs on the block where it is (cupy chunks on
    the GPU). Coordinates are read by xarray into host memory. ``.load()`` and
    ``.compute()`` compute the dask arrays: numpy arrays on the CPU, cupy
    arrays (left on the device) on the GPU.

    Parameters
    ----------
    source
        A path or URL of a Zarr store (formats 2 and 3), or a zarr store.
    device
        ``"auto"`` (GPU when usable, else CPU), ``"gpu"`` or ``"cpu"``.
    chunks
        gpuzarr's block sizes, not xarray's chunks: ``"auto"`` (default: whole
        multiples of the Zarr chunks of about ``gpuzarr.block-size.{cpu,gpu}``),
        a byte size (``"512 MiB"``), a mapping from dimension name to block
        size (dimensions left out are sized automatically), or chunks passed
        as they are to each variable's ``from_zarr_gpu``.
    group
        The group inside the store to open.
    consolidated
        Use consolidated metadata: None (default) when present, True to
        require it, False to ignore it.
    storage_options
        Passed to fsspec for remote URLs.
    **xarray_kwargs
        Passed to :func:`xarray.open_dataset`: ``decode_cf``,
        ``mask_and_scale``, ``decode_times``, ``decode_timedelta``,
        ``drop_variables``, ``zarr_format`` and the like.
    """
    for key in ("engine", "blocks", "backend_kwargs", "chunked_array_type", "from_array_kwargs"):
        if key in xarray_kwargs:
            raise TypeError(f"open_dataset() does not take {key}=")
    ds = xr.open_dataset(
        source,
        engine=_DaskBackend,
        chunks=None,
        device=device,
        blocks=chunks,
        group=group,
        consolidated=consolidated,
        storage_options=storage_options,
        **xarray_kwargs,
    )
    return _unwrap(ds)
