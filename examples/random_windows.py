"""Random training windows from a sharded climate-like store, the way a data loader reads them.

    python examples/random_windows.py                        # makes a small sharded store first
    python examples/random_windows.py era5_sharded.zarr --window 4,128,128 --batches 200 --device gpu

``gpuzarr_dist.WindowSampler`` reads a batch of equally shaped windows at
random places in one batched read and one batched decode (one nvCOMP call on
the GPU), and ``sampler.batches(...)`` keeps several such calls in flight
while the loop works on the batch it holds. A batch reads each chunk once
however many of its windows share it, so larger batches read more windows
per second (see the performance page of the documentation). Without a store argument the
script writes a float32 (time, lat, lon) array on a 192 x 384 grid with
zarr-python, sharded (4 time steps x the grid per shard, inner chunks of one
time step x 64 x 64, zstd). The first batch is checked against zarr-python's own reading of the
same boxes.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import zarr
import zarr.codecs as zc

import gpuzarr_dist as gz


def write_sharded(path: str, steps: int = 16, ny: int = 192, nx: int = 384) -> None:
    """A small sharded climate-like array (a 192 x 384 grid): a latitude profile plus noise, one shard per 4 steps."""
    rng = np.random.default_rng(0)
    lat = np.linspace(90, -90, ny)
    field = (250 + 30 * np.cos(np.deg2rad(lat)))[None, :, None] + rng.standard_normal((steps, ny, nx)) * 3
    a = zarr.create_array(path, shape=field.shape, dtype="float32", chunks=(4, ny, nx), fill_value=np.nan,
                          serializer=zc.ShardingCodec(chunk_shape=(1, 64, 64),
                                                      codecs=[zc.BytesCodec(), zc.ZstdCodec(level=0)]),
                          compressors=None)
    a[...] = field.astype("float32")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("store", nargs="?", help="a Zarr array (default: write a small sharded one)")
    p.add_argument("--window", default="4,64,64", help="window shape, comma separated (default 4,64,64)")
    p.add_argument("--batch", type=int, default=32, help="windows per batch (default 32)")
    p.add_argument("--batches", type=int, default=20, help="batches to read (default 20)")
    p.add_argument("--in-flight", type=int, default=2, help="sampler calls in flight (default 2)")
    p.add_argument("--device", default="auto", choices=("auto", "gpu", "cpu"))
    args = p.parse_args()
    window = tuple(int(v) for v in args.window.split(","))

    with tempfile.TemporaryDirectory(prefix="windows-example-") as tmp:
        store = args.store
        if store is None:
            store = os.path.join(tmp, "era5_sharded.zarr")
            write_sharded(store)
            print(f"wrote a sharded climate-like array at {store}")
        sampler = gz.WindowSampler(store, window, device=args.device)
        print(sampler)
        rng = np.random.default_rng(42)
        asked = [sampler.random_starts(args.batch, rng=rng) for _ in range(args.batches)]

        t0 = time.perf_counter()
        means = []
        for i, batch in enumerate(sampler.batches(iter(asked), in_flight=args.in_flight)):
            host = batch.get() if hasattr(batch, "get") else batch  # cupy on the GPU
            if i == 0:  # the first batch, box by box, against zarr-python
                z = zarr.open_array(store, mode="r")
                for w, s in zip(host, asked[0]):
                    np.testing.assert_array_equal(w, z[tuple(slice(int(a), int(a) + n) for a, n in zip(s, window))])
            means.append(float(np.nanmean(host)))  # stands in for a training step
        seconds = time.perf_counter() - t0
    n = args.batch * args.batches
    print(f"{n} windows {window} in {args.batches} batches on {sampler.device}: {n / seconds:,.0f} windows/s; "
          f"first batch identical to zarr-python's; mean of the batch means {np.mean(means):.2f} K")


if __name__ == "__main__":
    main()
