"""gpuzarr-dist: GPU-batched Zarr reading and writing for dask.

``import gpuzarr_dist`` also makes :func:`from_zarr_gpu` available as
``dask.array.from_zarr_gpu``; :func:`open_dataset` (and xarray's
``engine="gpuzarr"``) opens a Zarr store as an xarray Dataset whose data
variables it reads. Importing needs no GPU and never imports cupy.
"""

from __future__ import annotations

import dask.array as _da

from . import config  # noqa: F401  (registers the gpuzarr.* config defaults)
from .errors import (
    ChunkDecodeError,
    ChunkReadError,
    DeviceUnavailableError,
    GpuZarrError,
    MetadataError,
    UnsupportedCodecError,
)
from .graph import from_zarr_gpu
from .runtime.device import gpu_available, resolve_device
from .xarray_backend import open_dataset
from .errors import GpuOutOfMemoryError

__version__ = "0.1.0"

_da.from_zarr_gpu = from_zarr_gpu

__all__ = [
    "ChunkDecodeError",
    "ChunkReadError",
    "DeviceUnavailableError",
    "GpuZarrError",
    "MetadataError",
    "UnsupportedCodecError",
    "__version__",
    "from_zarr_gpu",
    "gpu_available",
    "open_dataset",
    "resolve_device",
]
__all__ += ["GpuOutOfMemoryError"]
