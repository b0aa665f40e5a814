#!/usr/bin/env python3
"""Cost of the zstd frame walk (``gpuzarr.gpu.zstd-check``) per mode, on the host build of the kernel source.

Builds ``ZSTD_FRAMES_SRC`` with the host C++ compiler (-O2, one thread, one
frame after another through ``zstd_frames``, the one-thread-per-frame walk) and times it on
ERA5-like chunks (``gpuzarr_dist.demo.make_era5_like``: float32 721 x 1440,
zstd level 0, about 3 MiB stored each), the chunks of a 64-chunk batch::

    python3 tools/zstd_walk_cost.py [--chunks 64] [--steps 8]

Prints seconds per batch and per chunk for each mode; exits 1 when the walk
flags a chunk libzstd writes (it must not).
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

HARNESS_MAIN = r"""
#include <chrono>
int main(int argc, char** argv) {
    int mode = atoi(argv[1]), reps = atoi(argv[2]);
    unsigned int n;
    static unsigned char* bufs[4096]; long long sizes[4096]; int count = 0;
    while (count < 4096 && fread(&n, 4, 1, stdin) == 1) {
        bufs[count] = (unsigned char*)malloc(n ? n : 1);
        if (n && fread(bufs[count], 1, n, stdin) != n) return 2;
        sizes[count++] = n;
    }
    blockDim.x = 1; threadIdx.x = 0; blockIdx.x = 0;
    long long off = 0, fcs, len; int deep, flagged = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < count; k++) {
            zstd_frames(bufs[k], &off, &sizes[k], 1, &fcs, &len, &deep, mode);
            flagged += deep != 0 || len != sizes[k];
        }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
    printf("%d %.6f\n", flagged, s);
    return 0;
}
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--chunks", type=int, default=64, help="chunks per batch (distinct ones repeated)")
    p.add_argument("--steps", type=int, default=8, help="distinct ERA5-like time steps to write")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    from gpuzarr_dist.cuda.kernels import ZSTD_CHECK_MODES, ZSTD_FRAMES_SRC
    from gpuzarr_dist.demo import make_era5_like
    from zstd_walk_host import PREAMBLE

    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        print("no C++ compiler")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        make_era5_like(os.path.join(tmp, "era5.zarr"), args.steps)
        files = sorted(os.path.join(dp, f) for dp, _, fs in os.walk(os.path.join(tmp, "era5.zarr"))
                       for f in fs if not f.endswith(".json"))
        chunks = [open(f, "rb").read() for f in files]
        chunks = [chunks[i % len(chunks)] for i in range(args.chunks)]
        src, exe = os.path.join(tmp, "walk.cpp"), os.path.join(tmp, "walk")
        with open(src, "w") as fh:
            fh.write(PREAMBLE + ZSTD_FRAMES_SRC + HARNESS_MAIN)
        subprocess.run([cxx, "-O2", "-o", exe, src], check=True)
        payload = b"".join(struct.pack("<I", len(c)) + c for c in chunks)
        mib = sum(map(len, chunks)) / 2**20
        print(f"{len(chunks)} chunks, {mib:.1f} MiB stored ({mib / len(chunks):.2f} MiB each), "
              f"{len(chunks) * 721 * 1440 * 4 / 2**20:.0f} MiB decoded")
        failed = 0
        for name, mode in ZSTD_CHECK_MODES.items():
            out = subprocess.run([exe, str(mode), str(args.reps)], input=payload, capture_output=True, check=True)
            flagged, secs = out.stdout.split()
            failed += int(flagged)
            print(f"  {name:<10} {float(secs) * 1e3:9.2f} ms per batch, {float(secs) * 1e6 / len(chunks):9.1f} us per "
                  f"chunk (one thread), flagged {int(flagged)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
