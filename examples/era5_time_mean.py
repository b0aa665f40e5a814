"""Time mean of 2 m temperature from an ERA5-like Zarr store, the way a climate script writes it.

    python examples/era5_time_mean.py                       # makes a small store in a temporary folder
    python examples/era5_time_mean.py era5.zarr --component t2m --device cpu
    gpuzarr-dist demo --path era5.zarr && python examples/era5_time_mean.py era5.zarr

``import gpuzarr_dist`` makes ``dask.array.from_zarr_gpu`` available: a dask
array whose blocks are read and decoded in one batched task each, on the GPU
when one is usable (cupy chunks) and on the CPU otherwise (numpy chunks).
Without a store argument the script writes an ERA5-like one first
(``gpuzarr_dist.demo.make_era5_like``: float32 (time, 721, 1440), one chunk
per time step, zstd), 8 time steps, about 33 MB.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import dask.array as da
import numpy as np
import zarr

import gpuzarr_dist  # noqa: F401  (registers dask.array.from_zarr_gpu)
from gpuzarr_dist.demo import make_era5_like


def area_weighted_mean(field: np.ndarray, lat: np.ndarray | None) -> float:
    """Global mean of a (lat, lon) field, each row weighted by cos(latitude)."""
    if lat is None:
        return float(field.mean())
    w = np.cos(np.deg2rad(lat))[:, None]
    return float((field * w).sum() / (w.sum() * field.shape[1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("store", nargs="?", help="a Zarr store (default: write a small ERA5-like one)")
    p.add_argument("--component", help="the variable's array inside the store (default: t2m for the generated "
                   "store, none for a given one: the store is the array)")
    p.add_argument("--device", default="auto", choices=("auto", "gpu", "cpu"))
    p.add_argument("--time-steps", type=int, default=8, help="time steps of the generated store (default: 8)")
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="era5-example-") as tmp:
        store, component = args.store, args.component
        if store is None:
            store, component = os.path.join(tmp, "era5.zarr"), component or "t2m"
            make_era5_like(store, args.time_steps, component=component)
            print(f"wrote an ERA5-like store with {args.time_steps} time steps at {store}")

        # the analysis: a lazy dask array over the Zarr array, then the mean over time
        t2m = da.from_zarr_gpu(store, component=component, device=args.device)
        print(f"{component or store}: {t2m.dtype} {t2m.shape}, {t2m.npartitions} dask block(s) of {t2m.chunksize}")
        t0 = time.perf_counter()
        climatology = t2m.mean(axis=0).compute()
        seconds = time.perf_counter() - t0
        if not isinstance(climatology, np.ndarray):  # cupy on the GPU: copy to the host to print
            climatology = climatology.get()

        # latitude from the store's coordinate array, when it has one (read with zarr-python)
        try:
            lat = zarr.open_array(store, path="latitude", mode="r")[:]
        except Exception:  # no coordinate array: the ERA5 0.25 degree grid runs from 90N to 90S
            lat = np.linspace(90.0, -90.0, climatology.shape[0]) if climatology.shape[0] == 721 else None
        print(f"time mean computed in {seconds:.2f} s ({t2m.nbytes / seconds / 1e9:.2f} GB/s of decompressed data)")
        print(f"global mean 2 m temperature: {area_weighted_mean(climatology, lat):.2f} K"
              + (" (area-weighted)" if lat is not None else ""))
        print(f"warmest grid point: {climatology.max():.2f} K, coldest: {climatology.min():.2f} K")


if __name__ == "__main__":
    main()
