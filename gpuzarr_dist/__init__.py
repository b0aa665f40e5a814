"""gpuzarr-dist: GPU-batched Zarr reading and writing for dask.

``import gpuzarr_dist`` also makes :func:`from_zarr_gpu` available as
``dask.array.from_zarr_gpu``; :func:`open_dataset` (and xarray's
``engine="gpuzarr"``) opens a Zarr store as an xarray Dataset whose data
variables it reads. Importing needs no GPU, and no module of gpuzarr-dist imports
cupy at import (``dask.array`` itself does, where cupy is installed).
"""

from __future__ import annotations

import dask.array as _da

from gpuzarr_dist import config  # noqa: F401  (registers the gpuzarr.* config defaults)
from gpuzarr_dist.api import to_zarr_gpu
from gpuzarr_dist.array.read import from_zarr_gpu
from gpuzarr_dist.array.windows import WindowSampler, sample_windows
from gpuzarr_dist.cuda.device import gpu_available, resolve_device
from gpuzarr_dist.errors import (
    ArrayExistsError,
    ArrayNotFoundError,
    BlockTooLargeError,
    ChunkDecodeError,
    ChunkEncodeError,
    ChunkReadError,
    ChunkWriteError,
    ComponentNotFoundError,
    DeviceUnavailableError,
    GpuOutOfMemoryError,
    GpuZarrError,
    GroupNotFoundError,
    MetadataError,
    MissingDependencyError,
    NotAGroupError,
    NotAnArrayError,
    UnsupportedCodecError,
    UnsupportedDtypeError,
)
from gpuzarr_dist.xarray.backend import open_dataset
from gpuzarr_dist.xarray.groupby import groupby

__version__ = "0.1.0"

_da.from_zarr_gpu = from_zarr_gpu

__all__ = [
    "ArrayExistsError",
    "ArrayNotFoundError",
    "BlockTooLargeError",
    "ChunkDecodeError",
    "ChunkEncodeError",
    "ChunkWriteError",
    "ChunkReadError",
    "ComponentNotFoundError",
    "DeviceUnavailableError",
    "GpuOutOfMemoryError",
    "GpuZarrError",
    "GroupNotFoundError",
    "MetadataError",
    "MissingDependencyError",
    "NotAGroupError",
    "NotAnArrayError",
    "UnsupportedCodecError",
    "UnsupportedDtypeError",
    "__version__",
    "from_zarr_gpu",
    "gpu_available",
    "groupby",
    "open_dataset",
    "resolve_device",
    "to_zarr_gpu",
    "WindowSampler",
    "sample_windows",
    "start_cluster",
]


def __getattr__(name: str):
    # start_cluster imports distributed's cluster machinery: load it on first use, not at import
    if name == "start_cluster":
        from gpuzarr_dist.distributed.cluster import start_cluster

        return start_cluster
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
