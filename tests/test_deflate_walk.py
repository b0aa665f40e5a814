"""The deflate walk and the adler32 kernels that run on the GPU before and after nvCOMP, compiled for the host.

``gpuzarr_dist.cuda.deflate_walk`` holds CUDA sources that are plain C apart
from the CUDA markers; ``tests/helpers/deflate_walk_host.py`` builds them with a host
C++ compiler (AddressSanitizer where available: a read outside a stream fails
the test). zlib (Python's ``zlib``, numcodecs' GZip/Zlib/Blosc) is the
independent judge: the walk must pass every stream zlib writes, never reject
(as definitely bad) a stream zlib decodes, and together with the checksums
computed after the decode catch every damaged stream zlib rejects.
"""

from __future__ import annotations

import collections
import gzip
import struct
import zlib

import numcodecs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dev.replay_deflate import gzip_start
from gpuzarr_dist.codecs import blosc_frames as bf
from gpuzarr_dist.cuda.deflate_walk import (
    ADLER32_SEGMENT,
    DEFLATE_GZIP,
    DEFLATE_RAW,
    DEFLATE_WALK_REASONS,
    DEFLATE_ZLIB,
)
from tests.helpers.deflate_walk_host import HostKernels

#: walk results that send a stream to the CPU decoder rather than name it bad: the CPU accepts some of these
DEFERRED = (-22, -4)  # bytes after the deflate data (zlib ignores them; gzip reads them as another member), gzip reserved flags


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    k = HostKernels.build(str(tmp_path_factory.mktemp("deflate_walk")))
    if k is None:
        pytest.skip("no C++ compiler to build the kernel sources for the host")
    yield k
    k.close()


def _payloads(rng: np.random.Generator) -> dict:
    return {
        "zeros": lambda n: bytes(n),
        "random": lambda n: rng.bytes(n),
        "smooth-f4": lambda n: np.cumsum(rng.standard_normal(n // 4 + 1)).astype("f4").tobytes()[:n],
        "text": lambda n: (b"the quick brown fox %d jumps " * (n // 20 + 1))[:n],
        "quantised": lambda n: (rng.integers(0, 4, n) * 60).astype("u1").tobytes(),
    }


def _zlib(data: bytes, level: int, strategy: int = zlib.Z_DEFAULT_STRATEGY, wbits: int = 15, mem: int = 8) -> bytes:
    c = zlib.compressobj(level, zlib.DEFLATED, wbits, mem, strategy)
    return c.compress(data) + c.flush()


STRATEGIES = [zlib.Z_DEFAULT_STRATEGY, zlib.Z_FILTERED, zlib.Z_HUFFMAN_ONLY, zlib.Z_RLE, zlib.Z_FIXED]


def _zlib_corpus() -> list[tuple[bytes, int]]:
    rng = np.random.default_rng(0)
    out = []
    for size in [0, 1, 100, 5000, 70_000]:
        for make in _payloads(rng).values():
            data = make(size)
            for level in range(10):
                for strategy in STRATEGIES:
                    out.append((_zlib(data, level, strategy), size))
            for wbits in range(9, 16):
                for mem in (1, 9):
                    out.append((_zlib(data, 6, wbits=wbits, mem=mem), size))
    for make in _payloads(rng).values():  # larger: stored blocks of 64 KiB, many Huffman blocks
        data = make(400_000)
        for level in (0, 1, 6, 9):
            out.append((_zlib(data, level), len(data)))
    return out


def test_every_stream_zlib_writes_passes_the_walk_and_the_adler32_kernel(host):
    corpus = _zlib_corpus()
    results = host.walk([s for s, _ in corpus], DEFLATE_ZLIB, [n for _, n in corpus])
    bad = [(i, len(s), n, r) for i, ((s, n), r) in enumerate(zip(corpus, results)) if r != (n, len(s) - 4)]
    assert len(corpus) > 600 and bad == []
    raw = host.walk([s[2:-4] for s, _ in corpus[::7]], DEFLATE_RAW, [n for _, n in corpus[::7]])
    assert raw == [(n, len(s) - 6) for s, n in corpus[::7]]
    decoded = [zlib.decompress(s) for s, _ in corpus[::5]]
    assert host.adler32(decoded, ADLER32_SEGMENT) == [int.from_bytes(s[-4:], "big") for s, _ in corpus[::5]]


def _gzip_member(data: bytes, *, name: bytes | None = None, comment: bytes | None = None, extra: bytes | None = None,
                 hcrc: bool = False, level: int = 6) -> bytes:
    """A gzip member with the optional header fields of RFC 1952 (Python's gzip writes FNAME at most)."""
    flg = (2 if hcrc else 0) | (4 if extra is not None else 0) | (8 if name is not None else 0) | (16 if comment is not None else 0)
    head = bytes([0x1F, 0x8B, 8, flg]) + struct.pack("<I", 1234567) + bytes([0, 3])
    if extra is not None:
        head += struct.pack("<H", len(extra)) + extra
    if name is not None:
        head += name + b"\0"
    if comment is not None:
        head += comment + b"\0"
    if hcrc:
        head += struct.pack("<H", zlib.crc32(head) & 0xFFFF)
    c = zlib.compressobj(level, zlib.DEFLATED, -15)
    return head + c.compress(data) + c.flush() + struct.pack("<II", zlib.crc32(data), len(data) & 0xFFFFFFFF)


def _gzip_corpus() -> list[tuple[bytes, int]]:
    rng = np.random.default_rng(1)
    out = []
    for size in [0, 1, 3000, 70_000]:
        for make in _payloads(rng).values():
            data = make(size)
            for level in (1, 5, 9):
                out.append((bytes(numcodecs.GZip(level=level).encode(data)), size))
            out.append((gzip.compress(data, mtime=0), size))
            out.append((_gzip_member(data, name=b"era5.nc"), size))
            out.append((_gzip_member(data, name=b"", comment=b"a comment"), size))
            out.append((_gzip_member(data, extra=b"AB\x04\x00xyzw", hcrc=True), size))
            out.append((_gzip_member(data, extra=b"", name=b"x", comment=b"", hcrc=True, level=0), size))
    return out


def test_every_gzip_member_passes_the_walk(host):
    corpus = _gzip_corpus()
    for s, n in corpus:  # the hand-built headers are valid: the CPU decoder reads them
        assert len(numcodecs.GZip().decode(s)) == n
    results = host.walk([s for s, _ in corpus], DEFLATE_GZIP, [n for _, n in corpus])
    assert [r for (s, n), r in zip(corpus, results) if r != (n, len(s) - 8)] == []


def _blosc_streams(frames: list[bytes], expected: int) -> list[tuple[bytes, int]]:
    """The zlib streams of Blosc frames, as the GPU path finds them (:func:`blosc_frames.plan_frames`)."""
    host = np.frombuffer(b"".join(frames), np.uint8)
    offsets = np.concatenate([[0], np.cumsum([len(f) for f in frames])[:-1]]).tolist()
    plan = bf.plan_frames("blosc-test", host, offsets, [len(f) for f in frames], [f"c/{i}" for i in range(len(frames))],
                          expected)
    zl = np.flatnonzero(plan.piece_codec == 3)
    return [(host[plan.piece_src[p] : plan.piece_src[p] + plan.piece_csize[p]].tobytes(), int(plan.piece_dsize[p]))
            for p in zl]


def _blosc_corpus() -> list[tuple[bytes, int]]:
    rng = np.random.default_rng(2)
    streams = []
    n = 40_000
    for dtype in ("u1", "<u2", "<f4", "<f8"):
        for shuffle in (numcodecs.Blosc.NOSHUFFLE, numcodecs.Blosc.SHUFFLE, numcodecs.Blosc.BITSHUFFLE):
            for clevel, blocksize in ((1, 0), (5, 4096), (9, 16384)):
                arrays = [np.cumsum(rng.standard_normal(n // np.dtype(dtype).itemsize)).astype(dtype),
                          (rng.integers(0, 3, n // np.dtype(dtype).itemsize)).astype(dtype)]
                codec = numcodecs.Blosc(cname="zlib", clevel=clevel, shuffle=shuffle, blocksize=blocksize)
                streams += _blosc_streams([bytes(codec.encode(a)) for a in arrays], n)
    return streams


def test_every_blosc_zlib_stream_passes_the_walk_and_its_adler32_matches(host):
    streams = _blosc_corpus()
    assert len(streams) > 200
    assert {d for _, d in streams} != {max(d for _, d in streams)}  # short last blocks and split streams too
    results = host.walk([s for s, _ in streams], DEFLATE_ZLIB, [d for _, d in streams])
    assert [r for (s, d), r in zip(streams, results) if r != (d, len(s) - 4)] == []
    decoded = [zlib.decompress(s) for s, _ in streams]
    assert host.adler32(decoded, ADLER32_SEGMENT) == [int.from_bytes(s[-4:], "big") for s, _ in streams]


def test_adler32_kernel_matches_zlib_at_every_segment_boundary(host):
    rng = np.random.default_rng(3)
    bufs = []
    for seg in (1, 7, 4096):
        lens = [0, 1, seg - 1, seg, seg + 1, 2 * seg, 3 * seg - 1] if seg > 1 else [0, 1, 2, 5000]
        bufs += [(rng.bytes(n), seg) for n in lens]
    lens = [0, 1, 5551, 5552, 5553, 65521, 65522, 1 << 20] + rng.integers(0, 1 << 20, 6).tolist()
    bufs += [(rng.bytes(int(n)), ADLER32_SEGMENT) for n in lens]
    bufs += [(b"\xff" * int(n), ADLER32_SEGMENT) for n in (4095, 4096, 1 << 20)]  # the largest sums per segment
    bufs += [(b"\xff" * 9000, 65536), (rng.bytes(300_000), 65536)]
    for seg in {s for _, s in bufs}:
        data = [b for b, s in bufs if s == seg]
        assert host.adler32(data, seg) == [zlib.adler32(b) for b in data]


# --------------------------------------------------------------------------- damaged streams


def _mutate(rng: np.random.Generator, s: bytes) -> bytes:
    b = bytearray(s)
    kind = int(rng.integers(6))
    if kind == 0:
        for _ in range(int(rng.integers(1, 4))):
            i = rng.integers(len(b))
            b[i] ^= 1 << int(rng.integers(8))
    elif kind == 1:
        b = b[: int(rng.integers(len(b)))]
    elif kind == 2:
        i = int(rng.integers(len(b)))
        b[i : i + int(rng.integers(2, 32))] = rng.bytes(int(rng.integers(2, 32)))
    elif kind == 3:
        b[int(rng.integers(len(b)))] = int(rng.integers(256))
    elif kind == 4:  # near the start: block headers and code descriptions
        b[int(rng.integers(min(len(b), 40)))] = int(rng.integers(256))
    else:
        b += rng.bytes(int(rng.integers(1, 12)))
    return bytes(b)


def _cpu(wrap: int, s: bytes, n: int) -> bool:
    try:
        out = numcodecs.Zlib().decode(s) if wrap == DEFLATE_ZLIB else numcodecs.GZip().decode(s)
    except Exception:  # noqa: BLE001 - whatever zlib / gzip raise
        return False
    return len(out) == n


def _checksums_catch(wrap: int, s: bytes, n: int) -> bool:
    """Whether the checks after nvCOMP's decode (adler32, or CRC-32 and size) reject a stream the walk passed."""
    if wrap == DEFLATE_ZLIB:
        data = zlib.decompressobj(-15).decompress(s[2:-4])
        return zlib.adler32(data) != int.from_bytes(s[-4:], "big")
    data = zlib.decompressobj(-15).decompress(s[gzip_start(s) : -8])
    return zlib.crc32(data) != int.from_bytes(s[-8:-4], "little") or len(data) != int.from_bytes(s[-4:], "little")


def _judge(host: HostKernels, wrap: int, cases: list[tuple[bytes, int]], counts: dict) -> None:
    results = host.walk([s for s, _ in cases], wrap, [n for _, n in cases])
    for (s, n), (length, end) in zip(cases, results):
        cpu_ok = _cpu(wrap, s, n)
        if length == n:  # to nvCOMP, then the checksums
            assert end == len(s) - (4 if wrap == DEFLATE_ZLIB else 8)
            if cpu_ok:
                counts["passed, zlib decodes it"] += 1
            else:
                assert _checksums_catch(wrap, s, n), f"passed the walk and the checksums, zlib rejects: {s[:32].hex()}"
                counts["passed, the checksum after the decode catches it"] += 1
        elif length in DEFERRED:
            counts["deferred to the CPU, zlib decodes it" if cpu_ok else "deferred to the CPU, zlib rejects it"] += 1
        else:
            assert length >= 0 or length in DEFLATE_WALK_REASONS
            assert not cpu_ok, f"walk result {length} for a stream zlib decodes: {s[:32].hex()}"
            counts["rejected by the walk"] += 1


def test_damaged_streams_the_walk_rejects_zlib_rejects_and_the_catch_rate(host):
    """Seeded mutations of zlib, gzip and Blosc zlib streams: no false rejection; walk + checksums catch all."""
    rng = np.random.default_rng(4)
    zl = [(s, n) for s, n in _zlib_corpus() if 0 < n <= 70_000]
    gz = [(s, n) for s, n in _gzip_corpus() if n <= 70_000]
    blosc = _blosc_corpus()
    report = {}
    for name, wrap, pool, k in (("zlib", DEFLATE_ZLIB, zl, 2500), ("gzip", DEFLATE_GZIP, gz, 1200),
                                ("blosc-zlib", DEFLATE_ZLIB, blosc, 800)):
        cases = [(_mutate(rng, s), n) for s, n in (pool[i] for i in rng.integers(len(pool), size=k))]
        counts = collections.Counter()
        _judge(host, wrap, cases, counts)
        kept = counts["rejected by the walk"] + counts["deferred to the CPU, zlib rejects it"]
        rejected_by_zlib = kept + counts["passed, the checksum after the decode catches it"]
        report[name] = (dict(counts), kept / max(1, rejected_by_zlib))
    print("\n" + "\n".join(f"{k}: the walk keeps {r:.1%} of the streams zlib rejects from nvCOMP (the checksums after "
                            f"the decode catch the rest); {c}" for k, (c, r) in report.items()))
    for name, (counts, rate) in report.items():
        assert counts["rejected by the walk"] > 100, name
        assert rate > 0.6, (name, rate)  # the rest is valid deflate that decodes to other bytes (bit flips in literals)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.data())
def test_hypothesis_edits_never_make_the_walk_reject_what_zlib_decodes(host, data):
    pool = _HYP_POOL
    s, n = pool[data.draw(st.integers(0, len(pool) - 1), label="stream")]
    b = bytearray(s)
    for _ in range(data.draw(st.integers(1, 4), label="edits")):
        op = data.draw(st.sampled_from(["set", "flip", "cut", "insert", "delete"]), label="op")
        if not b:
            break
        i = data.draw(st.integers(0, len(b) - 1), label="at")
        if op == "set":
            b[i] = data.draw(st.integers(0, 255))
        elif op == "flip":
            b[i] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "cut":
            del b[i:]
        elif op == "insert":
            b[i:i] = data.draw(st.binary(min_size=1, max_size=8))
        else:
            del b[i : i + data.draw(st.integers(1, 8))]
    counts = collections.Counter()
    _judge(host, DEFLATE_ZLIB, [(bytes(b), n)], counts)


def _hyp_pool() -> list[tuple[bytes, int]]:
    rng = np.random.default_rng(5)
    out = []
    for make in _payloads(rng).values():
        data = make(3000)
        for level, strategy in ((1, 0), (6, zlib.Z_FILTERED), (9, zlib.Z_FIXED), (0, 0), (6, zlib.Z_HUFFMAN_ONLY)):
            out.append((_zlib(data, level, strategy), len(data)))
    return out


_HYP_POOL = _hyp_pool()


def test_fuzz_summary_counts_the_deflate_walks_rejections():
    import collections as _c

    from dev import gpu_fuzz as gf
    from gpuzarr_dist.cuda.deflate_walk import walk_reason

    by_check = _c.Counter({gf._category(DEFLATE_WALK_REASONS[-19]): 3,
                           gf._category(f"blosc zlib stream: {DEFLATE_WALK_REASONS[-21]}"): 2,
                           gf._category(walk_reason(100, 4096)): 1,
                           gf._category("zlib adler32 checksum does not match the decoded data"): 7})
    fields = dict(kv.split("=") for kv in gf.summary_line(_c.Counter(), by_check, 10, 2).split()[1:])
    assert fields["rejected-by-deflate-walk"] == "6" and fields["rejected-by-walk"] == "0"


def test_deflate_walk_threads_config():
    import dask.config

    from gpuzarr_dist.config import deflate_walk_threads

    assert deflate_walk_threads() == 0  # "auto"
    with dask.config.set({"gpuzarr.gpu.deflate-walk-threads": 32}):
        assert deflate_walk_threads() == 32
    with dask.config.set({"gpuzarr.gpu.deflate-walk-threads": 0}), pytest.raises(ValueError):
        with dask.config.set({"gpuzarr.gpu.deflate-walk-threads": 4096}):
            deflate_walk_threads()


def test_blosc_matrix_zlib_streams_pass_the_walk_and_their_adler32(host):
    """Every zlib stream of the Blosc test matrix (type sizes, levels, block sizes, data kinds; short last blocks)."""
    from test_blosc_frames import SHUFFLES, _cases

    streams = []
    for shuffle in SHUFFLES:
        for nbytes, items in _cases("zlib", shuffle):
            streams += _blosc_streams([bytes(f) for _, _, f in items], nbytes)
    assert len(streams) > 100
    results = host.walk([s for s, _ in streams], DEFLATE_ZLIB, [d for _, d in streams])
    assert [r for (s, d), r in zip(streams, results) if r != (d, len(s) - 4)] == []
    decoded = [zlib.decompress(s) for s, _ in streams]
    assert host.adler32(decoded, ADLER32_SEGMENT) == [int.from_bytes(s[-4:], "big") for s, _ in streams]


def test_deflate_check_config_is_walk_by_default_and_validated():
    import dask

    from gpuzarr_dist.config import deflate_check

    assert deflate_check() == "walk"
    with dask.config.set({"gpuzarr.gpu.deflate-check": " OFF "}):
        assert deflate_check() == "off"
    with dask.config.set({"gpuzarr.gpu.deflate-check": "sometimes"}), pytest.raises(ValueError, match="deflate-check"):
        deflate_check()
