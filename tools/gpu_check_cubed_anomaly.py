"""Check the Cubed variant's time anomaly (``gc.to_zarr``, cubed's default fusion) on many steps, several runs.

Written in session 18 to hunt a race. Reading a block and allocating it only
after its decode had returned gave wrong values: 1 to 3 of the anomaly's 80
tasks per run wrote whole tiles as if the mean were 0. The change was never
committed; the committed read allocates the block first. The race showed at
none of the 3 steps ``bench cubed`` then compared (it now compares 33). The
findings on an H200, 8 threads, 2400 steps of (8, 181, 360) chunks:

- wrong in 21 of 32 runs with the change (2 of 3 with every other change of
  that session switched off);
- clean in 21 runs with the block allocated before the decode (the session's
  start, two earlier commits, the committed code), and in 3 with a
  device-wide synchronisation between the decode and the allocation;
- still wrong when nvCOMP's scratch of the decode was kept alive until the
  thread's next decode (so it is not late writes into the scratch);
- clean when every block read was followed by a reduction on it
  (``--verify``; the extra synchronisation hid it).

The cause, found in session 19: CuPy's ``with stream:`` restores on exit the
top of a stack that ``Stream.use()`` (how ``thread_stream`` made a thread's
stream current) never pushes, so after the first decode every reading thread
was on the legacy null stream, unordered with our non-blocking streams; the
placement and the user's kernels ran there. Fixed by ``runtime.cuda.on_stream``
(ad16ba5): with the block allocated after the decode, 0 of 5 runs wrong (3 of 4
before). This script is the check to rerun after any change to the GPU read's
allocations, streams or pools: it prints the wrong elements in 30 steps
spread over the array, per run (all must be 0), and exits 1 otherwise.

    python3 tools/gpu_check_cubed_anomaly.py [--path /tmp/cb] [--steps 2400] [--runs 3] [--threads 8]
        [--chunks 480] [--local-reads threads] [--verify] [--device cpu]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--path", default="/tmp/cb")
    ap.add_argument("--steps", type=int, default=2400)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--chunks", type=int, help="time steps per block (default: from_zarr_gpu's)")
    ap.add_argument("--local-reads", help="gpuzarr.local-reads for the run (e.g. threads: no kvikio)")
    ap.add_argument("--verify", action="store_true", help="check every block read on the device as it comes")
    ap.add_argument("--device", default="gpu", help="cpu: a dry run of the script's logic without a GPU")
    args = ap.parse_args()

    import gpuzarr_dist.cubed as gc

    gc.use_backend(args.device)  # before anything imports cubed
    import dask
    import zarr

    from gpuzarr_dist.bench.cubed import _host, write_data

    shape = (args.steps, 721, 1440)
    ref = write_data(args.path, shape, (8, 181, 360))
    if args.local_reads:
        dask.config.set({"gpuzarr.local-reads": args.local_reads})
    odd: list = []
    if args.verify:  # the data are 220-300 K; partial sums and counts are positive
        import gpuzarr_dist.array.reader as rd

        real = rd.BlockReader.__getitem__

        def checked(self, index):
            b = real(self, index)
            lo = float(b.min()) if b.size else 1e9
            if lo < (150 if str(self.spec.name).endswith("x.zarr") else 0.5):
                odd.append((str(self.spec.name)[-40:], str(index)[:80], lo))
                print("odd read", odd[-1], flush=True)
            return b

        rd.BlockReader.__getitem__ = checked
    allowed = int(np.prod(shape)) * 4 // 10
    work = tempfile.mkdtemp(dir=args.path)
    spec = gc.spec(allowed, work, device=args.device)
    spec.executor.max_workers = args.threads
    import cubed.array_api as xp

    chunks = (args.chunks, 181, 360) if args.chunks else "auto"
    x = gc.from_zarr_gpu(os.path.join(args.path, "x.zarr"), spec=spec, chunks=chunks)
    xa = zarr.open_array(os.path.join(args.path, "x.zarr"), mode="r")
    sampled = range(0, shape[0], max(1, shape[0] // 30))
    wrong = []
    try:
        for run in range(args.runs):
            out_path = os.path.join(work, f"a{run}.zarr")
            gc.to_zarr(x - xp.mean(x, axis=0), out_path)
            out = zarr.open_array(out_path, mode="r")
            bad = 0
            for t in sampled:
                d = np.abs(_host(out[t]).astype("f8") - (_host(xa[t]).astype("f8") - ref))
                bad += int((d > 1e-3).sum())
            wrong.append(bad)
            shutil.rmtree(out_path, ignore_errors=True)
            print(f"run {run}: {bad} wrong elements in {len(sampled)} steps", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"blocks of {x.chunks[0][0]} steps, {args.threads} threads: wrong elements per run {wrong}"
          + (f"; odd reads {len(odd)}" if args.verify else ""))
    return 1 if any(wrong) or odd else 0


if __name__ == "__main__":
    raise SystemExit(main())
