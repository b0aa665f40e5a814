"""The public writer: :func:`to_zarr_gpu` takes a dask, numpy or cupy array, or an ``xr.Dataset``.

Arrays go to :func:`gpuzarr_dist.array.write.to_zarr_gpu`, Datasets to
:func:`gpuzarr_dist.xarray.write.dataset_to_zarr_gpu` (which writes each data
variable through the array writer's public functions).
"""

from __future__ import annotations

from typing import Any

from gpuzarr_dist.array import write as array_write
from gpuzarr_dist.xarray.write import dataarray_to_dataset, dataset_to_zarr_gpu

#: :func:`to_zarr_gpu`'s keywords that it hands on to :func:`~gpuzarr_dist.xarray.write.dataset_to_zarr_gpu`
#: for an ``xr.Dataset`` (one list for both signatures; ``tests/test_write_folders.py`` checks them)
DATASET_KEYWORDS = ("codec", "level", "chunks", "shards", "overwrite", "compute", "storage_options", "crc32c", "device")
#: ``to_zarr_gpu``'s keywords that apply to one array only (refused with a Dataset)
ARRAY_ONLY_KEYWORDS = ("resume", "fill_value", "attributes", "dimension_names")


def to_zarr_gpu(
    x: Any,
    target: Any,
    component: str | None = None,
    *,
    codec: str = "zstd",
    level: int | None = None,
    chunks: Any = None,
    shards: Any = None,
    overwrite: bool = False,
    compute: bool = True,
    storage_options: dict | None = None,
    crc32c: bool = False,
    resume: bool = False,
    device: str = "auto",
    fill_value: Any = None,
    attributes: dict | None = None,
    dimension_names: Any = None,
) -> Any:
    """Write ``x`` as a Zarr v3 array that zarr-python and tensorstore read unchanged (or an xarray object as a group).

    Each dask block is one task that computes it, encodes all its chunks in
    one batch (nvCOMP on the GPU for cupy blocks, numcodecs threads for numpy
    blocks) and writes each chunk or shard atomically. Metadata is written
    first, through zarr-python.

    Parameters
    ----------
    x
        A dask array with cupy or numpy chunks (other arrays go through ``da.asarray``), or an
        ``xr.Dataset``: then ``component`` is the group, ``chunks``/``shards`` may be
        ``{dim: size}`` mappings (of the dataset's dimensions), and the data variables are
        CF-encoded as xarray would (see :func:`gpuzarr_dist.xarray.write.dataset_to_zarr_gpu`).
        An ``xr.DataArray`` is written as ``DataArray.to_zarr`` writes it: a group with the
        one variable (named, or ``__xarray_dataarray_variable__``), its coordinates and
        attributes, which ``xr.open_dataarray`` reads back.
    target
        A local path or ``file://`` URL, a remote URL (``s3://...``, through fsspec with
        ``storage_options``), a zarr store, or a ``zarr.Group`` (with ``component``).
    component
        The array's path inside the store or group (parent groups are created).
    codec
        ``"zstd"`` (default), ``"gzip"`` or ``"none"``.
    level
        Compression level for CPU encoding, recorded in the metadata. Default:
        zstd's own default (metadata level 0, i.e. 3), gzip 5. nvCOMP's zstd
        encoder on the GPU takes no level.
    chunks
        The Zarr chunk shape (inner chunks when sharded). Default: the dask
        block shape when a block is at most 16 MiB, else that block split into
        chunks of at most about 4 MiB that divide it; with ``shards``, inner
        chunks of at most about 1 MiB dividing the shard.
    shards
        ``None`` (not sharded), a shard shape, or ``True``/``"auto"``: one shard
        per dask block. The shard index (bytes + crc32c, at the end) is written
        by gpuzarr-dist.
    overwrite
        Replace whatever is at the target. Without it (and without ``resume``)
        an existing array or group raises :class:`~gpuzarr_dist.errors.ArrayExistsError`.
    compute
        ``True``: write now and return the ``zarr.Array``. ``False``: write the
        metadata now and return a 0-d dask array whose ``compute()`` writes
        the data and gives the bytes stored.
    storage_options
        For URLs: passed to fsspec (e.g. ``endpoint_url``, ``key``, ``secret``).
    crc32c
        Add a crc32c checksum codec after the compressor.
    resume
        Complete an interrupted write: the array at the target must have the
        metadata this call would write (else :class:`MetadataError` naming the
        fields); blocks whose objects all exist already are skipped, the others
        rewritten. Objects are written atomically, so an existing one is whole.
    device
        ``"auto"`` (GPU encode for cupy blocks, CPU for numpy), ``"cpu"`` or ``"gpu"``.
    fill_value, attributes, dimension_names
        Passed to zarr-python's ``create_array`` (for the xarray writer).
    """
    if type(x).__name__ in ("Dataset", "DataArray") and type(x).__module__.startswith("xarray"):
        given = locals()
        if resume or fill_value is not None or attributes is not None or dimension_names is not None:
            raise TypeError(f"{', '.join(ARRAY_ONLY_KEYWORDS[:-1])} and {ARRAY_ONLY_KEYWORDS[-1]} apply to arrays, "
                            "not to a Dataset or DataArray (xarray writes a Dataset's attributes and fill values from its encoding)")
        ds = dataarray_to_dataset(x) if type(x).__name__ == "DataArray" else x
        return dataset_to_zarr_gpu(ds, target, component, **{k: given[k] for k in DATASET_KEYWORDS})
    return array_write.to_zarr_gpu(
        x, target, component, codec=codec, level=level, chunks=chunks, shards=shards, overwrite=overwrite,
        compute=compute, storage_options=storage_options, crc32c=crc32c, resume=resume, device=device,
        fill_value=fill_value, attributes=attributes, dimension_names=dimension_names,
    )
