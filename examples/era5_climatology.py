"""Climatology and anomalies of ERA5-like 2 m temperature, opened with ``gpuzarr_dist.open_dataset``.

    python examples/era5_climatology.py                       # makes a small store in a temporary folder
    python examples/era5_climatology.py era5.zarr --device cpu --out t2m_anomaly.zarr
    python examples/era5_climatology.py --time-steps 120 --device gpu

The store is a group holding ``t2m`` (time, latitude, longitude) float32 on
the ERA5 0.25 degree grid (721 x 1440, one Zarr chunk per time step, zstd)
next to its coordinates, as ``gpuzarr_dist.demo.make_era5_like`` writes it
(8 time steps, 33 MB, when no store is given). ``gz.open_dataset(...)``
reads ``t2m`` with gpuzarr-dist: a dask task per block of
time steps reads and decodes all of its chunks in one batch, on the GPU when
one is usable (``--device auto``, the default: cupy chunks) and on the CPU
otherwise. Coordinates are read by xarray into host memory.

The climatology is the mean map over the period (``t2m.mean("time")``,
computed once, kept on the device); the anomalies ``t2m - climatology`` run
fused with the read, one task per block. Their area-weighted mean over each
hemisphere per time step takes a zonal mean on the device and weights the 721
latitude rows by cos(latitude) on the host. The anomalies are written
back with ``gpuzarr_dist.to_zarr_gpu`` (compressed on the device: compute, encode
and write are one task per block).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import xarray as xr

import gpuzarr_dist as gz
from gpuzarr_dist.demo import make_era5_like


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("store", nargs="?", help="an ERA5-like Zarr group with t2m (default: write a small one)")
    p.add_argument("--variable", default="t2m")
    p.add_argument("--device", default="auto", choices=("auto", "gpu", "cpu"))
    p.add_argument("--time-steps", type=int, default=8, help="time steps of the generated store (default: 8)")
    p.add_argument("--out", help="where to write the anomalies (default: a temporary folder)")
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="era5-example-") as tmp:
        store = args.store
        if store is None:
            store = os.path.join(tmp, "era5.zarr")
            make_era5_like(store, args.time_steps, component=args.variable)
            print(f"wrote an ERA5-like store with {args.time_steps} time steps at {store}")

        ds = gz.open_dataset(store, device=args.device, consolidated=False)
        t2m = ds[args.variable]
        blocks = t2m.data
        print(f"{args.variable}: {t2m.dtype} {dict(t2m.sizes)}, {blocks.npartitions} block(s) of {blocks.chunksize}, "
              f"{type(blocks._meta).__module__.split('.')[0]} chunks")

        t0 = time.perf_counter()
        climatology = t2m.mean("time").compute()                # one map, kept where it was computed
        anomaly = t2m - climatology                             # fused with the read, one task per block
        zonal = anomaly.mean("longitude").compute().as_numpy()  # (time, latitude), copied to the host
        seconds = time.perf_counter() - t0

        weights = np.cos(np.deg2rad(zonal.latitude))
        north = zonal.where(zonal.latitude > 0).weighted(weights).mean("latitude")
        south = zonal.where(zonal.latitude < 0).weighted(weights).mean("latitude")
        clim = climatology.as_numpy()
        print(f"climatology and anomalies in {seconds:.2f} s "
              f"({2 * t2m.nbytes / seconds / 1e9:.2f} GB/s of decompressed data over the two passes)")
        print(f"climatology: global mean {float(clim.weighted(np.cos(np.deg2rad(clim.latitude))).mean()):.2f} K, "
              f"from {float(clim.min()):.1f} to {float(clim.max()):.1f} K")
        for name, series in (("northern", north), ("southern", south)):
            print(f"{name} hemisphere mean anomaly per time step (K): "
                  + " ".join(f"{v:+.2f}" for v in series.values[:12]) + (" ..." if series.size > 12 else ""))

        out = args.out or os.path.join(tmp, "t2m_anomaly.zarr")
        result = anomaly.rename(f"{args.variable}_anomaly").to_dataset().drop_encoding()
        result[f"{args.variable}_anomaly"].attrs = {"long_name": "2 metre temperature anomaly from the period mean",
                                                    "units": "K"}
        gz.to_zarr_gpu(result, out, overwrite=True)  # one task per block: compute, encode on the device, write
        back = xr.open_dataset(out, engine="gpuzarr", device=args.device)
        print(f"wrote {out} with to_zarr_gpu; read back: {dict(back[f'{args.variable}_anomaly'].sizes)}")


if __name__ == "__main__":
    main()
