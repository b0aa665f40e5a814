"""Monthly climatology and anomalies of air temperature, opened with ``gpuzarr_dist.open_dataset``.

    python examples/air_temperature_anomalies.py                  # makes a small store in a temporary folder
    python examples/air_temperature_anomalies.py air.zarr --device cpu --out anomalies.zarr

The workflow of xarray's air temperature tutorial: 4x daily surface air
temperature on a 25 x 53 grid over North America for two years, stored the
way NCEP reanalysis files store it (int16 packed with ``scale_factor=0.01``,
a ``_FillValue``, CF attributes). ``gz.open_dataset(...)`` gives the dataset
``xr.open_zarr`` gives, but ``air`` is a dask array read by gpuzarr-dist:
each dask task reads and decodes a whole block of Zarr chunks in one batch and
unpacks the int16 values where the block is, on the GPU when one is usable
(``--device auto``, the default) and on the CPU otherwise.

The climatology (12 maps) is computed once and kept where it was computed;
the anomalies ``air - climatology[month of each time step]`` then run as one
fused task per block. They are written back
with ``gpuzarr_dist.to_zarr_gpu`` (CF-encoded as xarray would, compressed on the
device: compute, encode and write are one task per block).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numcodecs
import numpy as np
import pandas as pd
import xarray as xr

import gpuzarr_dist as gz


def make_air_temperature_like(path: str, years: int = 2, seed: int = 0) -> None:
    """Write a synthetic copy of xarray's ``air_temperature`` tutorial dataset as a Zarr store."""
    time_ = pd.date_range("2013-01-01", periods=years * 1460, freq="6h")
    lat = np.arange(75.0, 14.9, -2.5, dtype="float32")
    lon = np.arange(200.0, 330.1, 2.5, dtype="float32")
    rng = np.random.default_rng(seed)
    season = -np.cos(2 * np.pi * (time_.day_of_year.to_numpy() - 15) / 365.25)[:, None, None]
    day = np.cos(2 * np.pi * (time_.hour.to_numpy() - 18) / 24)[:, None, None]
    air = (
        273.15 + 25 - 0.6 * (lat[None, :, None] - 15)          # warmer to the south
        + (8 + 0.25 * (lat[None, :, None] - 15)) * season      # stronger seasons to the north
        + 3 * day + rng.normal(0, 2.5, (time_.size, lat.size, lon.size))
    ).astype("float32")
    ds = xr.Dataset(
        {"air": (("time", "lat", "lon"), air, {
            "long_name": "4xDaily Air temperature at sigma level 995", "units": "degK", "precision": 2,
            "GRIB_id": 11, "GRIB_name": "TMP", "var_desc": "Air temperature", "dataset": "NMC Reanalysis",
            "level_desc": "Surface", "statistic": "Individual Obs", "parent_stat": "Other",
            "actual_range": [float(air.min()), float(air.max())]})},
        coords={"time": ("time", time_, {"long_name": "Time"}),
                "lat": ("lat", lat, {"standard_name": "latitude", "units": "degrees_north"}),
                "lon": ("lon", lon, {"standard_name": "longitude", "units": "degrees_east"})},
        attrs={"Conventions": "COARDS", "title": "4x daily NMC reanalysis (synthetic)",
               "description": "Data is from NMC initialized reanalysis (4x/day). These are the 0.9950 sigma "
                              "level values.", "platform": "Model"},
    )
    # zstd: a codec gpuzarr decodes on the GPU (xarray's default for Zarr v2, blosc, is decoded on the CPU)
    encoding = {"air": {"dtype": "int16", "scale_factor": 0.01, "_FillValue": -32767, "chunks": (730, 25, 53),
                        "compressors": [numcodecs.Zstd(level=3)]}}
    ds.to_zarr(path, mode="w", encoding=encoding, consolidated=True, zarr_format=2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("store", nargs="?", help="an air temperature Zarr store (default: write a synthetic one)")
    p.add_argument("--device", default="auto", choices=("auto", "gpu", "cpu"))
    p.add_argument("--out", help="where to write the anomalies (default: next to the generated store)")
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="air-example-") as tmp:
        store = args.store
        if store is None:
            store = os.path.join(tmp, "air_temperature.zarr")
            make_air_temperature_like(store)
            print(f"wrote a synthetic air temperature store at {store}")

        ds = gz.open_dataset(store, device=args.device)
        air = ds.air  # unpacked from int16 and masked on the device, lazily
        blocks = air.data
        print(f"air: {air.dtype} {dict(air.sizes)}, {blocks.npartitions} block(s) of {blocks.chunksize}, "
              f"{type(blocks._meta).__module__.split('.')[0]} chunks")

        t0 = time.perf_counter()
        # gz.groupby stands in for air.groupby: xarray hands grouped reductions to flox when it is
        # installed, and flox cannot reduce cupy blocks; the result is what xarray's groupby gives
        climatology = gz.groupby(air, "time.month").mean("time").compute()  # 12 maps, on the device
        anomalies = gz.groupby(air, "time.month") - climatology             # one task per block
        spread = anomalies.std(("lat", "lon")).compute()
        seconds = time.perf_counter() - t0

        clim = climatology.as_numpy()  # as_numpy copies cupy data to the host to print it
        print(f"climatology and anomalies in {seconds:.2f} s")
        print("monthly mean over the grid (K): " + " ".join(f"{v:.1f}" for v in clim.mean(("lat", "lon")).values))
        print(f"coldest January point: {float(clim.sel(month=1).min()):.1f} K, "
              f"warmest July point: {float(clim.sel(month=7).max()):.1f} K")
        print(f"anomaly spread over the grid, averaged over time: {float(spread.as_numpy().mean()):.2f} K")

        out = args.out or os.path.join(tmp, "air_anomalies.zarr")
        # drop_encoding: the coordinates' Zarr v2 encodings (codecs, chunks) do not carry over to a new store
        result = anomalies.rename("air_anomaly").to_dataset().drop_encoding()
        result["air_anomaly"].attrs = {"long_name": "air temperature anomaly from the monthly climatology",
                                       "units": "K"}
        gz.to_zarr_gpu(result, out, overwrite=True)  # one task per block: compute, encode on the device, write
        back = xr.open_dataset(out, engine="gpuzarr", device=args.device)
        print(f"wrote {out} with to_zarr_gpu; read back: {dict(back.air_anomaly.sizes)}, "
              f"mean {float(back.air_anomaly.mean().as_numpy()):+.3f} K")


if __name__ == "__main__":
    main()
