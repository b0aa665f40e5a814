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

A write is complete when the group's ``zarr.json`` is there, and that
document is written last: xarray writes it with the others, it is moved aside
to ``zarr.json.gpuzarr-pending`` before any data variable is written, and
moved back once all are. Until then no reader (zarr-python, xarray,
gpuzarr-dist) opens the group. A write that raises removes everything it
created at the target; a write that was killed leaves the pending document,
which tells the next write to the same target to replace what is there.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Hashable, Mapping
from typing import Any

import dask.array as da
import numpy as np
import xarray as xr
import zarr

from gpuzarr_dist.array.write import FolderPrefetch, write_array_graph
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


#: the group's ``zarr.json`` while the group's data is being written (see the module docstring)
PENDING_DOCUMENT = "zarr.json.gpuzarr-pending"

#: encoding entries that name codecs; a Zarr v2 source's numcodecs objects there cannot go into a v3 array
_CODEC_KEYS = ("compressor", "compressors", "filters", "serializer")


def _v3_encoding(encoding: Mapping) -> dict:
    """``encoding`` without a Zarr v2 source's codecs (numcodecs objects), which a v3 array cannot take."""
    from zarr.abc.codec import Codec

    def v2(value: Any) -> bool:
        items = value if isinstance(value, (list, tuple)) else [value]
        return any(c is not None and not isinstance(c, (Codec, dict, str)) for c in items)

    return {k: v for k, v in encoding.items() if not (k == "compressor" or (k in _CODEC_KEYS and v2(v)))}


def _check_dims(what: str, mapping: Any, ds: xr.Dataset) -> None:
    if isinstance(mapping, Mapping):
        unknown = [d for d in mapping if d not in ds.dims]
        if unknown:
            raise ValueError(f"{what} names dimensions the dataset does not have: {unknown}; "
                             f"its dimensions: {list(ds.dims)}")


def dataarray_to_dataset(x: xr.DataArray) -> xr.Dataset:
    """The Dataset ``DataArray.to_zarr`` writes: the one variable, its coordinates and attributes.

    An unnamed array, or one named like one of its coordinates or dimensions,
    is stored as ``__xarray_dataarray_variable__`` (the original name in the
    group attribute ``__xarray_dataarray_name__``), so ``xr.open_dataarray``
    gives it back.
    """
    from xarray.backends.api import DATAARRAY_NAME, DATAARRAY_VARIABLE

    if x.name is None:
        return x.to_dataset(name=DATAARRAY_VARIABLE)
    if x.name in x.coords or x.name in x.dims:
        ds = x.to_dataset(name=DATAARRAY_VARIABLE)
        ds.attrs[DATAARRAY_NAME] = x.name
        return ds
    return x.to_dataset()


def _key(path: str, name: str) -> str:
    return join_path(path, name)


def _get(store: Any, key: str) -> bytes | None:
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    buf = sync(store.get(key, prototype=default_buffer_prototype()))
    return None if buf is None else buf.to_bytes()


def _set(store: Any, key: str, data: bytes) -> None:
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    sync(store.set(key, default_buffer_prototype().buffer.from_bytes(data)))


def _delete(store: Any, key: str) -> None:
    from zarr.core.sync import sync

    sync(store.delete(key))


#: how long a failed write's clean-up keeps trying while the blocks already being written finish
REMOVE_PATIENCE_S = 30.0


def _remove_all(target: Any) -> None:
    """Delete everything under the target's path (the whole store for ``""``), and its empty local folder.

    After a task failed, dask's local scheduler raises at once while the
    tasks already running finish their blocks, so a removal can meet a folder
    that is still being written: it is tried again until they are done
    (:data:`REMOVE_PATIENCE_S`).
    """
    import time

    from zarr.core.sync import sync

    deadline = time.monotonic() + REMOVE_PATIENCE_S
    while True:
        try:
            sync(target.store.delete_dir(target.path))
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    if target.local_root is not None:
        folder = os.path.join(target.local_root, *[p for p in target.path.split("/") if p])
        with contextlib.suppress(OSError):  # not empty (another writer's files) or gone: leave it
            os.rmdir(folder)


def _hold_back_group_document(store: Any, path: str) -> bytes:
    """Move the group's ``zarr.json`` to :data:`PENDING_DOCUMENT`; return its bytes."""
    doc = _get(store, _key(path, "zarr.json"))
    if doc is None:  # pragma: no cover - xarray wrote no group document
        raise RuntimeError(f"xarray wrote no group document at {path!r}")
    _set(store, _key(path, PENDING_DOCUMENT), doc)
    _delete(store, _key(path, "zarr.json"))
    return doc


def _hide_from_ancestors(store: Any, path: str) -> list[str]:
    """Take ``path`` and what is under it out of the consolidated metadata of the groups above it.

    xarray consolidates the metadata of the groups above the one it writes
    too, so they would open the group before its data is there. Returns the
    paths of the groups changed, to consolidate again once the write is done.
    """
    if not path:
        return []
    parts = path.split("/")
    changed = []
    for i in range(len(parts)):
        above, rel = "/".join(parts[:i]), "/".join(parts[i:])
        raw = _get(store, _key(above, "zarr.json"))
        if raw is None:
            continue
        doc = json.loads(raw)
        listed = (doc.get("consolidated_metadata") or {}).get("metadata")
        if not isinstance(listed, dict):
            continue
        kept = {k: v for k, v in listed.items() if not (k == rel or k.startswith(rel + "/"))}
        if len(kept) != len(listed):
            doc["consolidated_metadata"]["metadata"] = kept
            _set(store, _key(above, "zarr.json"), json.dumps(doc, indent=2).encode())
            changed.append(above)
    return changed


def _finish(block: Any, store: Any, path: str, doc: bytes, ancestors: list[str]) -> Any:
    """Write the group's ``zarr.json`` back (the write is complete), drop the pending copy, consolidate above."""
    _set(store, _key(path, "zarr.json"), doc)
    _delete(store, _key(path, PENDING_DOCUMENT))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Consolidated metadata is currently not part")
        for above in ancestors:
            zarr.consolidate_metadata(store, path=above or None, zarr_format=3)
    return block


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
    mapping; a mapping naming a dimension the dataset does not have raises
    ``ValueError``. ``encoding`` is xarray's per-variable encoding and wins over
    ``codec``/``chunks`` for the variables it names. Codecs in a variable's
    ``encoding`` that only Zarr v2 takes (numcodecs objects, as a v2 source
    gives) are dropped: the data variables are written with ``codec``, the
    other variables with zarr-python's default codecs.

    The group's ``zarr.json`` is written last (see the module docstring): a
    write that raises removes what it created at the target and re-raises,
    so a retry starts afresh; one that was killed leaves a store no reader
    opens, which the next write to the target replaces. Returns the opened
    ``zarr.Group``, or with ``compute=False`` a 0-d dask array whose
    ``compute()`` writes the data variables and then the group's
    ``zarr.json`` (the other metadata and the coordinates are written at once).
    """
    if not isinstance(ds, xr.Dataset):
        raise TypeError(f"dataset_to_zarr_gpu writes an xr.Dataset, not {type(ds).__name__}")
    _check_dims("chunks", chunks, ds)
    _check_dims("shards", shards, ds)
    t = open_target(target, group, storage_options)
    if _get(t.store, _key(t.path, PENDING_DOCUMENT)) is not None and _get(t.store, _key(t.path, "zarr.json")) is None:
        _remove_all(t)  # an interrupted write of ours: nothing there opens, replace it
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
    ours: dict[Hashable, da.Array] = {}
    ds = ds.copy(deep=False)  # encodings changed below are the copy's
    for name, var in ds.variables.items():
        if not (name in ds.data_vars and _ours(var)):
            var.encoding = _v3_encoding(var.encoding)
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
    held_back = False
    try:
        # xarray writes every zarr.json, the coordinates and in-memory variables now; its delayed
        # store of our variables is dropped unrun: their data goes through write_array_graph.
        with warnings.catch_warnings():
            # consolidated metadata is what xarray reads fastest; zarr-python warns it is not in the v3 spec yet
            warnings.filterwarnings("ignore", "Consolidated metadata is currently not part")
            ds.to_zarr(
                t.store, group=t.path or None, mode=mode, compute=False, zarr_format=3, consolidated=consolidated,
                encoding=encoding, safe_chunks=False,
            )
        doc = _hold_back_group_document(t.store, t.path)
        held_back = True
        ancestors = _hide_from_ancestors(t.store, t.path)
        parts = []
        folders = FolderPrefetch()  # the chunks' folders made ahead while the data computes (compute=True only)
        for name, x in ours.items():
            sub = open_target(t.store, join_path(t.path, str(name)), None)
            sub.name = f"{t.name}/{name}"
            arr = zarr.open_array(store=t.store, path=sub.path, mode="r+")
            parts.append(write_array_graph(x, arr, sub, device=device, folders=folders))
        total = da.stack(parts).sum() if parts else da.zeros((), dtype=np.int64)
        total = total.map_blocks(_finish, store=t.store, path=t.path, doc=doc, ancestors=ancestors,
                                 dtype=total.dtype, meta=total._meta)
        if not compute:
            return total
        with folders:
            total.compute()
    except BaseException as e:
        # what this call created goes, so the target is as if never written; but not what another writer
        # created there meanwhile (zarr refuses mode "w-" before it writes anything)
        refused = isinstance(e, (zarr.errors.ContainsGroupError, zarr.errors.ContainsArrayError)) and not held_back
        if not refused:
            try:
                _remove_all(t)
                _hide_from_ancestors(t.store, t.path)  # xarray may have consolidated it above before it failed
            except Exception as cleanup:  # the write's own error is the one to see
                e.add_note(f"{t.name}: removing what the failed write created also failed ({cleanup}); "
                           "delete the target before writing it again")
        raise
    return zarr.open_group(store=t.store, path=t.path or None, mode="r")
