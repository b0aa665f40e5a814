"""The GPU fuzz's deflate cases through the deflate walk, built for the host: what it keeps from nvCOMP.

For every case of ``dev/gpu_fuzz.py`` (same seed, same case generation) on a
chain whose data nvCOMP's Deflate decodes (zlib, gzip, zlib+crc32c,
gzip+crc32c, blosc-zlib), the damaged chunk goes through what the GPU path
does before nvCOMP, on the CPU: the outer crc32c, Blosc's frame checks
(:func:`plan_frames`), then the deflate walk of ``gpuzarr_dist.cuda.deflate_walk``
compiled with g++ (``tests/helpers/deflate_walk_host.py``) on each zlib / gzip stream.
Streams that pass it are checked as the device does after the decode (adler32,
or CRC-32 and size). Each verdict is compared with the reference decoders
(``gpu_fuzz.reference_decode``: google-crc32c, numcodecs). No GPU needed::

    python3 -m dev.replay_deflate --cases 12000 --seed 20261122

Prints counts per chain and exits 1 if the walk rejects a chunk the reference
decodes, or if a chunk the reference rejects passes the walk and the checksums.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import zlib

import numpy as np

from dev import gpu_fuzz as gf
from gpuzarr_dist.codecs import blosc_frames as bf
from gpuzarr_dist.cuda.deflate_walk import DEFLATE_GZIP, DEFLATE_ZLIB, walk_reason
from gpuzarr_dist.errors import ChunkDecodeError
from tests.helpers.deflate_walk_host import HostKernels

CHAINS = ("zlib", "gzip", "zlib+crc32c", "gzip+crc32c", "blosc-zlib")
DEFERRED = (-22, -4)  # to the CPU decoder, which may accept them (bytes after the end; gzip reserved flags)


def gzip_start(s: bytes) -> int:
    """Where the deflate data of a gzip member starts (the member's header is valid)."""
    flg, pos = s[3], 10
    if flg & 4:
        pos += 2 + int.from_bytes(s[pos : pos + 2], "little")
    for field in (8, 16):
        if flg & field:
            pos = s.index(b"\0", pos) + 1
    return pos + (2 if flg & 2 else 0)


def _checksum_catches(wrap: int, s: bytes) -> bool:
    """The device's check after the decode of a stream that passed the walk: adler32, or CRC-32 and size."""
    if wrap == DEFLATE_ZLIB:
        data = zlib.decompressobj(-15).decompress(s[2:-4])
        return zlib.adler32(data) != int.from_bytes(s[-4:], "big")
    data = zlib.decompressobj(-15).decompress(s[gzip_start(s) : -8])
    return zlib.crc32(data) != int.from_bytes(s[-8:-4], "little") or len(data) % 2**32 != int.from_bytes(s[-4:], "little")


def _header_rejects(codec: str, s: bytes, expected: int) -> bool:
    """The host checks before the walk (``cuda.deflate.bad_deflate_header``, the gzip member's stated size): definite errors."""
    if codec == "gzip":
        return len(s) < 18 or s[:3] != b"\x1f\x8b\x08" or int.from_bytes(s[-4:], "little") != expected % 2**32
    if len(s) < 6:
        return True
    cmf, flg = s[0], s[1]
    return (cmf & 15) != 8 or cmf >> 4 > 7 or (cmf * 256 + flg) % 31 != 0 or bool(flg & 0x20)


def verdict(host: HostKernels, chain: str, data: bytes, cpu_ok: bool) -> tuple[str, str | None]:
    """What the GPU path does with one damaged chunk before and after nvCOMP: ``(verdict, walk reason or None)``."""
    import google_crc32c

    c = gf.CHAINS[chain]
    expected = int(np.prod(c["shape"])) * np.dtype(c["dtype"]).itemsize
    if c["crc"]:
        if len(data) < 4 or google_crc32c.value(data[:-4]) != int.from_bytes(data[-4:], "little"):
            return "crc32c rejects", None
        data = data[:-4]
    if c["comp"] == "blosc":
        try:
            plan = bf.plan_frames("replay", np.frombuffer(data, np.uint8), [0], [len(data)], ["c/0"], expected)
        except ChunkDecodeError:
            return "frame checks reject", None
        if plan.unsupported:  # e.g. a flipped compressor code naming snappy: the batch is decoded on the CPU
            return f"to the CPU ({plan.unsupported} frames)", None
        other = {bf.FORMATS[int(k)] for k in np.unique(plan.piece_codec) if k not in (3, bf.RAW)}
        if other:  # a flipped compressor code: lz4 or zstd streams, checked by their own walks
            return f"not deflate ({', '.join(sorted(other))} streams)", None
        zl = np.flatnonzero(plan.piece_codec == 3)
        streams = [data[plan.piece_src[k] : plan.piece_src[k] + plan.piece_csize[k]] for k in zl]
        limits = [int(plan.piece_dsize[k]) for k in zl]
        wrap = DEFLATE_ZLIB
    else:
        if _header_rejects(c["comp"], data, expected):
            return "header checks reject", None
        streams, limits = [data], [expected]
        wrap = DEFLATE_GZIP if c["comp"] == "gzip" else DEFLATE_ZLIB
    results = host.walk(streams, wrap, limits) if streams else []
    flagged = [(r, n) for (r, _), n in zip(results, limits) if r != n]
    definite = [(r, n) for r, n in flagged if r not in DEFERRED]
    if definite:
        r, n = definite[0]
        return "walk rejects", walk_reason(r, n) if r < 0 else "decodes to another size"
    if flagged:
        return "walk defers to the CPU" + (", reference decodes" if cpu_ok else ", reference rejects"), None
    if any(_checksum_catches(wrap, s) for s in streams):
        return "passes the walk, checksum catches", None
    return "passes the walk and the checksums" + (", reference decodes" if cpu_ok else ", REFERENCE REJECTS"), None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dev.replay_deflate", description=__doc__.split("\n")[0])
    p.add_argument("--cases", type=int, default=12000)
    p.add_argument("--seed", type=int, default=20261122)
    p.add_argument("--show", type=int, nargs="*", default=[], help="print the verdict of these cases")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        host = HostKernels.build(tmp, sanitize=False)
        if host is None:
            print("no C++ compiler")
            return 2
        pools = gf.Pools(args.seed)
        counts = {c: collections.Counter() for c in CHAINS}
        reasons: collections.Counter = collections.Counter()
        failures = []
        for i in range(args.cases):
            chain = gf.batch_of(i)[0]
            if chain not in CHAINS:
                continue
            case = gf.make_case(args.seed, i, pools)
            try:
                gf.reference_decode(chain, case["data"])
                cpu_ok = True
            except Exception:  # noqa: BLE001 - whatever the reference libraries raise
                cpu_ok = False
            v, why = verdict(host, chain, case["data"], cpu_ok)
            tally = counts[chain]
            tally["cases"] += 1
            tally["reference rejects"] += not cpu_ok
            tally[v] += 1
            if why:
                reasons[why] += 1
            if (cpu_ok and v in ("walk rejects", "passes the walk, checksum catches")) or "REFERENCE REJECTS" in v:
                failures.append((i, chain, case["kind"], v, why))
            if i in args.show:
                print(f"case {i} {chain} {case['kind']}: reference {'decodes' if cpu_ok else 'rejects'}; {v} {why or ''}")
        host.close()
    print(f"deflate walk replay of {args.cases} cases, seed {args.seed}")
    for chain, tally in counts.items():
        print(f"  {chain}: {dict(tally)}")
    print("  walk rejections by reason: " + "; ".join(f"{k}: {v}" for k, v in reasons.most_common()))
    total = collections.Counter()
    for tally in counts.values():
        total.update(tally)
    print(f"TOTAL cases={total['cases']} reference-rejects={total['reference rejects']} "
          f"walk-rejects={total['walk rejects']} walk-defers={sum(v for k, v in total.items() if k.startswith('walk defers'))} "
          f"checksum-catches={total['passes the walk, checksum catches']} failures={len(failures)}")
    for f in failures[:30]:
        print("  FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
