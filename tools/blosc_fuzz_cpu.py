"""The GPU fuzz's blosc cases run through the GPU path's plan on the CPU: which ones c-blosc rejects but the plan decodes.

For every blosc-chain case of ``tools/gpu_fuzz.py`` (same seed, same case
generation), the frame is planned by :func:`plan_frames` and run by the CPU
reference executor (:func:`decode_plan_cpu`: the GPU path's layout and
arithmetic, CPU codecs in place of nvCOMP), then compared with numcodecs'
Blosc (c-blosc). Prints the cases the plan decodes and c-blosc rejects
("silent") or decodes differently ("differs"), and exits 1 if there are any.
No GPU needed::

    python3 tools/blosc_fuzz_cpu.py --cases 12000 --seed 20261122

The CPU executor decodes zlib streams as raw deflate without their adler32,
as nvCOMP does; lz4 streams through liblz4 (stricter than nvCOMP may be).
"""

import argparse
import collections
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_fuzz as gf  # noqa: E402  (puts the repository first on sys.path)

from gpuzarr_dist.codecs import blosc_frames as bf  # noqa: E402
from gpuzarr_dist.errors import ChunkDecodeError  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", type=int, default=12000)
    p.add_argument("--seed", type=int, default=20261122)
    args = p.parse_args(argv)
    import google_crc32c

    pools = gf.Pools(args.seed)
    counts: collections.Counter = collections.Counter()
    for i in range(args.cases):
        chain = gf.batch_of(i)[0]
        c = gf.CHAINS[chain]
        if c["comp"] != "blosc":
            continue
        case = gf.make_case(args.seed, i, pools)
        data = case["data"]
        frame = data
        if c["crc"]:  # the crc32c check runs first on both paths
            if len(data) < 4 or google_crc32c.value(data[:-4]) != int.from_bytes(data[-4:], "little"):
                continue
            frame = data[:-4]
        expected = int(np.prod(c["shape"])) * np.dtype(c["dtype"]).itemsize
        host = np.frombuffer(frame, np.uint8)
        try:
            plan = bf.plan_frames("fuzz", host, [0], [len(frame)], ["c"], expected)
            if plan.unsupported:  # blosclz / snappy: decoded by c-blosc itself
                continue
            got = bf.decode_plan_cpu(plan, host)[:expected].tobytes()
        except (ChunkDecodeError, ValueError, RuntimeError, zlib_error()):
            continue
        try:
            ref = gf.reference_decode(chain, data).tobytes()
        except Exception as e:  # c-blosc (or the size check) rejects it
            verdict, why = "silent", repr(e)
        else:
            if ref == got:
                continue
            verdict, why = "differs", ""
        counts[chain] += 1
        h = frame[:16]
        print(f"{verdict} case {i} {chain} {case['kind']} {len(data)} bytes: version {h[0]}/{h[1]} flags {h[2]:#04x} "
              f"typesize {h[3]} nbytes {int.from_bytes(h[4:8], 'little', signed=True)} "
              f"blocksize {int.from_bytes(h[8:12], 'little', signed=True)} {why}")
    print(f"{sum(counts.values())} cases the plan decodes and c-blosc does not: {dict(counts)}")
    return 1 if counts else 0


def zlib_error():
    import zlib

    return zlib.error


if __name__ == "__main__":
    sys.exit(main())
