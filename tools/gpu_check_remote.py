"""GPU smoke check for byte-range shard reads and WindowSampler (run on the GPU machine).

Writes sharded arrays (index at the end and the start, zstd and gzip inner chunks,
missing inner chunks), reads them with device="gpu" through from_zarr_gpu and
WindowSampler, compares with zarr-python, and prints timings. Exits 1 on a mismatch.
"""

from __future__ import annotations

import sys
import tempfile
import time

import numpy as np
import zarr
import zarr.codecs as zc

import gpuzarr_dist as gz


def main() -> int:
    if not gz.gpu_available():
        print("no usable GPU")
        return 1
    ok = True
    rng = np.random.default_rng(0)
    data = (rng.standard_normal((16, 181, 360)) * 10).astype("float32")
    with tempfile.TemporaryDirectory() as d:
        for loc in ("end", "start"):
            for comp in (zc.ZstdCodec(), zc.GzipCodec()):
                path = f"{d}/{loc}-{comp.__class__.__name__}.zarr"
                a = zarr.create_array(path, shape=data.shape, dtype="float32", chunks=(4, 192, 384), compressors=None,
                                      fill_value=-1, serializer=zc.ShardingCodec(chunk_shape=(1, 64, 64),
                                      codecs=[zc.BytesCodec(), comp], index_location=loc))
                a[:, :100] = data[:, :100]  # the rest: missing inner chunks
                ref = zarr.open_array(path, mode="r")[...]
                x = gz.from_zarr_gpu(path, device="gpu")
                got = x.compute().get()
                same = np.array_equal(got, ref)
                sub = x[3:13, 50:150, 17:301].compute().get()
                same &= np.array_equal(sub, ref[3:13, 50:150, 17:301])
                s = gz.WindowSampler(path, (4, 32, 48), device="gpu")
                starts = s.random_starts(256, rng=1)
                s.sample(starts)
                t0 = time.perf_counter()
                w = s.sample(starts)
                dt = time.perf_counter() - t0
                wh = w.get()
                for k, (t, y, xx) in enumerate(starts):
                    same &= np.array_equal(wh[k], ref[t:t + 4, y:y + 32, xx:xx + 48])
                print(f"{path.rsplit('/', 1)[1]:<28} array+slice+256 windows equal: {same}; {256 / dt:.0f} windows/s")
                ok &= bool(same)
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
