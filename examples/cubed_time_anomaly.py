"""Time mean and time anomaly of a (time, lat, lon) array under a per-task memory budget, with Cubed.

    python examples/cubed_time_anomaly.py [--device auto|gpu|cpu] [--allowed-mem "200 MB"]

Writes a small ERA5-like float32 store (zstd), then, through gpuzarr-dist's
Cubed variant, computes ``x.mean(0)`` and writes ``x - x.mean(0)`` to Zarr with
every task held under ``allowed_mem`` (device memory on the GPU), showing a
progress bar, and checks both against numpy.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

import gpuzarr_dist.cubed as gc  # before cubed: it picks cubed's array backend (cupy on the GPU)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="auto", choices=("auto", "gpu", "cpu"))
    p.add_argument("--allowed-mem", default=None, help="per-task budget (default: the array's size / 10)")
    p.add_argument("--time-steps", type=int, default=96)
    args = p.parse_args()

    import zarr

    work = tempfile.mkdtemp(prefix="cubed-anomaly-")
    src = os.path.join(work, "t2m.zarr")
    rng = np.random.default_rng(0)
    data = (280 + 10 * rng.standard_normal((args.time_steps, 181, 360))).astype("f4")
    z = zarr.create_array(src, shape=data.shape, chunks=(2, 91, 90), dtype="f4",
                          compressors=zarr.codecs.ZstdCodec(level=0))
    z[:] = data

    spec = gc.spec(args.allowed_mem or data.nbytes // 10, os.path.join(work, "tmp"), device=args.device)
    import cubed.array_api as xp

    x = gc.from_zarr_gpu(src, spec=spec)
    print(f"{data.nbytes / 1e6:.0f} MB array, allowed_mem {spec.allowed_mem / 1e6:.1f} MB per task "
          f"(reserved {spec.reserved_mem / 1e6:.1f} MB), blocks {x.chunksize}, device {spec.gpuzarr_device}")

    mean = xp.mean(x, axis=0).compute(callbacks=[gc.progress_bar()])
    out = os.path.join(work, "anomaly.zarr")
    # gc.to_zarr: like cubed.to_zarr, with Zarr chunks that divide the blocks (one batched encode per task)
    z = gc.to_zarr(x - xp.mean(x, axis=0), out, callbacks=[gc.progress_bar()])
    print(f"anomaly written with chunks {z.chunks}")

    mean = mean.get() if hasattr(mean, "get") else np.asarray(mean)
    ref = data.astype("f8").mean(0)
    np.testing.assert_allclose(mean, ref, rtol=1e-5, atol=1e-4)
    anomaly = zarr.open_array(out, mode="r")[:]
    anomaly = anomaly.get() if hasattr(anomaly, "get") else anomaly
    np.testing.assert_allclose(anomaly, data - ref, rtol=1e-5, atol=1e-3)
    print("mean and anomaly match numpy; stores under", work)


if __name__ == "__main__":
    main()
