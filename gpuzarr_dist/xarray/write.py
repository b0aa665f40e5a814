"""Writing an ``xr.Dataset`` through GPU compression: ``to_zarr_gpu(dataset, target)``.

xarray writes what it is good at: the group, every variable's ``zarr.json``
(CF attributes, ``_FillValue``, dimension names, the codecs we choose),
coordinates and other in-memory variables, and consolidated metadata. The
dask-backed numeric data variables are then written by us: each is CF-encoded
lazily by xarray's own encoder with the parameters in its ``encoding``
(``scale_factor``/``add_offset`` packing, ``_FillValue`` masking, dtype), so
the encoding fuses into the write task and runs on the device for cupy
blocks, and :func:`gpuzarr_dist.array.write.write_array_graph` encodes and stores
each block in one batch. ``xr.open_zarr`` then reads back what it would have
read from ``ds.to_zarr``.
"""

from __future__ import annotations

import warnings
from typing import Any

import dask.array as da
import numpy as np
import xarray as xr
import zarr

from gpuzarr_dist.array.write import write_array_graph
from gpuzarr_dist.core.layout import plan_layout
from gpuzarr_dist.errors import ArrayExistsError
from gpuzarr_dist.stores.target import codec_objects, join_path, open_target

#: encoding entries about the source's storage, not the variable's CF encoding
_STORAGE_KEYS = frozenset({
    "chunks", "shards", "preferred_chunks", "compressor", "compressors", "filters", "serializer",
    "source", "original_shape", "write_empty_chunks", "cache_metadata", "zlib", "complevel", "fletcher32",
    "contiguous", "chunksizes", "shuffle", "endian", "blosc_shuffle", "szip_coding", "szip_pixels_per_block",
    "coordinates",  # xarray derives it from the dataset and refuses it as a zarr encoding
})


def _ours(var: xr.Variable) -> bool:
    """Whether a data variable is written by us: dask-backed and numeric once encoded."""
    return isinstance(var.data, da.Array) and np.dtype(var.dtype).kind in "biuf"


def _chunks_for(var: xr.Variable, chunks: Any) -> Any:
    if chunks is None or not isinstance(chunks, dict):
        return chunks
    return tuple(int(chunks.get(d, -1)) for d in var.dims)


def dataset_to_zarr_gpu(
    ds: xr.Dataset,
    target: Any,
    group: str | None = None,
    *,
    codec: str = "zstd",
    level: int | None = None,
    chunks: Any = None,
    shards: Any = None,
    overwrite: bool = False,
    compute: bool = True,
    storage_options: dict | None = None,
    crc32c: bool = False,
    device: str = "auto",
    consolidated: bool = True,
    encoding: dict | None = None,
) -> Any:
    """Write ``ds`` as a Zarr v3 group that ``xr.open_zarr`` reads back identical (see module doc).

    ``chunks`` is ``None`` (each variable's dask blocks, split as in
    :func:`~gpuzarr_dist.to_zarr_gpu`) or a ``{dim: size}`` mapping; ``shards``
    is ``None``, ``True`` (one shard per dask block) or a ``{dim: size}``
    mapping. ``encoding`` is xarray's per-variable encoding and wins over
    ``codec``/``chunks`` for the variables it names. Returns the opened
    ``zarr.Group``, or with ``compute=False`` a 0-d dask array whose
    ``compute()`` writes the data variables (the metadata and coordinates are
    written at once).
    """
    if not isinstance(ds, xr.Dataset):
        raise TypeError(f"dataset_to_zarr_gpu writes an xr.Dataset, not {type(ds).__name__}")
    t = open_target(target, group, storage_options)
    if overwrite:
        mode = "w"
    else:
        try:
            zarr.open(store=t.store, path=t.path, mode="r")
        except Exception as e:  # nothing there: zarr-python's not-found errors differ by version
            if not (isinstance(e, (FileNotFoundError, KeyError)) or "NotFound" in type(e).__name__):
                raise
        else:
            raise ArrayExistsError(f"{t.name}: a Zarr group or array exists there already (overwrite=True replaces it)")
        mode = "w-"
    encoding = {k: dict(v) for k, v in (encoding or {}).items()}
    compressors = codec_objects(codec, level, crc32c)
    ours: dict[str, da.Array] = {}
    eager = {}
    for name, var in ds.data_vars.items():
        if not _ours(var):
            if isinstance(var.data, da.Array):
                eager[name] = var.load()  # strings, times and such: small; xarray writes them
            continue
        # xarray replaces a variable's own encoding by the one passed for it: keep its CF part
        # (dtype, scale_factor, _FillValue, units...), drop what described the source's storage
        mine = {k: v for k, v in var.encoding.items() if k not in _STORAGE_KEYS}
        mine.update(encoding.get(name, {}))
        encoding[name] = mine
        encoded = xr.conventions.encode_cf_variable(var.variable.copy(deep=False), name=name)
        x = encoded.data
        var_chunks = mine.pop("chunks", None) or _chunks_for(var, chunks)
        var_shards = mine.pop("shards", None) or (_chunks_for(var, shards) if shards is not True else True)
        chunk, shard = plan_layout(x, var_chunks, var_shards)
        mine.setdefault("compressors", compressors or None)
        mine["chunks"] = chunk
        if shard is not None:
            mine["shards"] = shard
        ours[name] = x
    for name, var in eager.items():
        ds = ds.assign({name: var})
    # xarray writes every zarr.json, the coordinates and in-memory variables now; its delayed
    # store of our variables is dropped unrun: their data goes through write_array_graph.
    with warnings.catch_warnings():
        # consolidated metadata is what xarray reads fastest; zarr-python warns it is not in the v3 spec yet
        warnings.filterwarnings("ignore", "Consolidated metadata is currently not part")
        ds.to_zarr(
            t.store, group=t.path or None, mode=mode, compute=False, zarr_format=3, consolidated=consolidated,
            encoding=encoding, safe_chunks=False,
        )
    parts = []
    for name, x in ours.items():
        sub = open_target(t.store, join_path(t.path, name), None)
        sub.name = f"{t.name}/{name}"
        arr = zarr.open_array(store=t.store, path=sub.path, mode="r+")
        parts.append(write_array_graph(x, arr, sub, device=device))
    total = da.stack(parts).sum() if parts else da.zeros((), dtype=np.int64)
    if not compute:
        return total
    total.compute()
    return zarr.open_group(store=t.store, path=t.path or None, mode="r")
