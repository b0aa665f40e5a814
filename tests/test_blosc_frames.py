"""The Blosc1 frame plan of the GPU path, proven on the CPU against numcodecs (c-blosc 1.21).

Frames written by numcodecs for every inner codec, shuffle mode, type size,
compression level, block size and chunk size (below and above the block
size, incompressible data included) are taken apart by
:func:`plan_frames` and decoded by the reference executor, which runs the
GPU path's layout and index arithmetic; the CUDA kernels themselves are
compiled as C++ and run over the same plans where a compiler is present.
Everything must equal numcodecs' decode byte for byte.
"""

from __future__ import annotations

import ctypes
import functools
import shutil
import subprocess

import numcodecs
import numpy as np
import pytest

from gpuzarr_dist.codecs import blosc_frames as bf
from gpuzarr_dist.cuda.blosc_kernels import GATHER_SRC, UNSHUFFLE_SRC, segments
from gpuzarr_dist.errors import ChunkDecodeError

CNAMES = ["lz4", "lz4hc", "zlib", "zstd"]
SHUFFLES = [numcodecs.Blosc.NOSHUFFLE, numcodecs.Blosc.SHUFFLE, numcodecs.Blosc.BITSHUFFLE]
TYPESIZES = [1, 2, 4, 8, 3, 17]  # 3: odd; 17: above the 16 streams a block is split into
CLEVELS = [0, 1, 5, 9]
#: decoded chunk sizes (rounded down to whole elements): below the 128-byte minimum (stored whole),
#: one short block, around 64 KiB, several blocks with a short last one
SIZES = [100, 5000, 69999, 300001]


def _data(kind: str, nbytes: int, ts: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "random":  # incompressible: streams and frames stored raw
        return rng.integers(0, 256, nbytes, dtype=np.uint8)
    if kind == "zeros":
        return np.zeros(nbytes, np.uint8)
    # smooth values, as in climate fields: compressible after shuffling
    n = nbytes // ts
    v = (1000 * np.sin(np.arange(n) / 97.0) + rng.normal(0, 3, n)).astype(np.int64)
    b8 = v.astype("<i8").view(np.uint8).reshape(n, 8)
    return np.ascontiguousarray(b8[:, np.arange(ts) % 8]).reshape(-1)


def _encode(raw: np.ndarray, ts: int, **kw) -> np.ndarray:
    dtype = {1: "u1", 2: "<u2", 4: "<u4", 8: "<u8"}.get(ts, f"V{ts}")
    return np.frombuffer(numcodecs.Blosc(**kw).encode(raw.view(dtype)), np.uint8)


def _batch(frames: list[np.ndarray], lead: int = 0) -> tuple[np.ndarray, list[int], list[int]]:
    """Frames in one host buffer at 256-byte aligned offsets, as the stores stage them."""
    offsets, at = [], 0
    for f in frames:
        at = bf._align(at + lead) - lead if offsets else lead
        offsets.append(at)
        at += f.size
    host = np.full(at + 64, 0xEE, np.uint8)  # garbage around the frames must not leak in
    for o, f in zip(offsets, frames):
        host[o : o + f.size] = f
    return host, offsets, [f.size for f in frames]


def _combos(size: int):
    """(typesize, clevel, data kind, forced blocksize) combinations for one chunk size."""
    for ts in TYPESIZES:
        for clevel in CLEVELS:
            yield ts, clevel, "smooth", 0
        yield from ((ts, 1, "random", 0), (ts, 9, "random", 0), (ts, 5, "zeros", 0))
        for blocksize in (256, 5000, 1 << 16):
            if blocksize == 256 and size > 5000:  # thousands of tiny blocks: slow in the CPU reference
                continue
            yield ts, 5, "smooth", blocksize


@functools.cache
def _cases(cname: str, shuffle: int) -> list:
    """[(nbytes, [(label, raw, frame)])]: batches of frames encoded by numcodecs, one per decoded size."""
    out = []
    for size in SIZES:
        batches: dict[int, list] = {}
        for seed, (ts, clevel, kind, blocksize) in enumerate(_combos(size)):
            nbytes = size // ts * ts
            raw = _data(kind, nbytes, ts, seed)
            frame = _encode(raw, ts, cname=cname, clevel=clevel, shuffle=shuffle, blocksize=blocksize)
            batches.setdefault(nbytes, []).append((f"ts={ts} clevel={clevel} {kind} blocksize={blocksize}", raw, frame))
        out.extend(batches.items())
    return out


def _check(plan_out: np.ndarray, plan: bf.BloscPlan, items) -> None:
    for i, (label, raw, frame) in enumerate(items):
        got = plan_out[i * plan.stride : i * plan.stride + raw.size]
        expected = np.frombuffer(numcodecs.Blosc().decode(frame), np.uint8)
        np.testing.assert_array_equal(expected, raw)  # numcodecs round trip (the reference)
        if not np.array_equal(got, expected):
            bad = int(np.flatnonzero(got != expected)[0])
            raise AssertionError(f"{label}: first differing byte {bad} of {raw.size} (flags {frame[2]:#04x})")


@pytest.mark.parametrize("shuffle", SHUFFLES, ids=["noshuffle", "shuffle", "bitshuffle"])
@pytest.mark.parametrize("cname", CNAMES)
def test_plan_decodes_like_numcodecs(cname, shuffle):
    seen = {"split": 0, "raw": 0, "memcpyed": 0, "compressed": 0, "byte": 0, "bit": 0}
    for nbytes, items in _cases(cname, shuffle):
        host, offsets, sizes = _batch([f for _, _, f in items])
        keys = [f"0.{i}" for i in range(len(items))]
        plan = bf.plan_frames("t2m", host, offsets, sizes, keys, nbytes)
        assert plan.unsupported is None
        _check(bf.decode_plan_cpu(plan, host), plan, items)
        seen["split"] += int((plan.block_neblock < plan.block_size).sum())
        seen["raw"] += int((plan.piece_codec == bf.RAW).sum())
        seen["compressed"] += int((plan.piece_codec != bf.RAW).sum())
        seen["memcpyed"] += sum(bool(f[2] & bf.MEMCPYED) for _, _, f in items)
        seen["byte"] += int((plan.block_mode == bf.BYTE_UNSHUFFLE).sum())
        seen["bit"] += int((plan.block_mode == bf.BIT_UNSHUFFLE).sum())
    # the matrix reaches every path of the plan it should (else the comparison proves less than it claims)
    assert seen["raw"] and seen["memcpyed"] and seen["compressed"], seen
    if shuffle == numcodecs.Blosc.SHUFFLE:
        assert seen["byte"] and (seen["split"] or cname in ("zstd",)), seen
    if shuffle == numcodecs.Blosc.BITSHUFFLE:
        assert seen["bit"], seen


def test_every_compressed_stream_is_what_nvcomp_expects():
    """zstd streams state their decoded size (else the GPU could not bound them); lz4/zlib streams are whole."""
    raw = _data("smooth", 300084, 4, 1)
    for cname in CNAMES:
        frame = _encode(raw, 4, cname=cname, clevel=5, shuffle=1)
        plan = bf.plan_frames("a", frame, [0], [frame.size], ["0"], raw.size)
        comp = np.flatnonzero(plan.piece_codec != bf.RAW)
        assert comp.size
        for p in comp:
            s = frame[plan.piece_src[p] : plan.piece_src[p] + plan.piece_csize[p]]
            if cname == "zstd":
                assert s[:4].tobytes() == b"\x28\xb5\x2f\xfd" and s[4] >> 6 != 0  # magic; frame content size present
            if cname == "zlib":
                assert (int(s[0]) * 256 + int(s[1])) % 31 == 0 and s[0] & 0x0F == 8  # RFC 1950 header


def test_typesize_one_and_odd_sizes_with_a_batch_lead():
    """Frames after a lead (as with other framing) and of odd sizes decode in one batch."""
    raw = [_data("smooth", 77777, 1, s) for s in range(5)]
    frames = [_encode(r, 1, cname="lz4", clevel=c, shuffle=2) for r, c in zip(raw, [0, 1, 3, 5, 9])]
    host, offsets, sizes = _batch(frames, lead=4)
    plan = bf.plan_frames("a", host, offsets, sizes, [str(i) for i in range(5)], 77777, stride=77824)
    out = bf.decode_plan_cpu(plan, host)
    for i, r in enumerate(raw):
        np.testing.assert_array_equal(out[i * 77824 : i * 77824 + r.size], r)


def test_blosclz_and_snappy_frames_are_left_to_the_cpu():
    raw = _data("smooth", 69976, 4, 3)
    lz4 = _encode(raw, 4, cname="lz4", clevel=5, shuffle=1)
    blz = _encode(raw, 4, cname="blosclz", clevel=5, shuffle=1)
    host, offsets, sizes = _batch([lz4, blz])
    plan = bf.plan_frames("a", host, offsets, sizes, ["0", "1"], raw.size)
    assert plan.unsupported == "blosclz" and plan.npieces == 0 and plan.nblocks == 0
    stored = _encode(raw, 4, cname="blosclz", clevel=0, shuffle=1)  # memcpyed: no compressor needed
    plan = bf.plan_frames("a", stored, [0], [stored.size], ["0"], raw.size)
    assert plan.unsupported is None
    np.testing.assert_array_equal(bf.decode_plan_cpu(plan, stored)[: raw.size], raw)


def _corrupt(frame: np.ndarray, at: int, value: bytes) -> np.ndarray:
    f = frame.copy()
    f[at : at + len(value)] = np.frombuffer(value, np.uint8)
    return f


def _i32(v: int) -> bytes:
    return int(v).to_bytes(4, "little", signed=True)


@pytest.fixture(scope="module")
def good():
    raw = _data("smooth", 300084, 4, 2)
    frame = _encode(raw, 4, cname="lz4", clevel=5, shuffle=1, blocksize=16384)
    plan = bf.plan_frames("a", frame, [0], [frame.size], ["0"], raw.size)
    assert plan.nblocks > 2 and (plan.block_neblock < plan.block_size).any()
    return raw, frame


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda f: f[:10], "shorter than its 16-byte header"),
        (lambda f: f[:-7], "compressed bytes, the chunk holds"),
        (lambda f: _corrupt(f, 0, b"\x03"), "format version 3"),
        (lambda f: _corrupt(f, 2, bytes([f[2] | 0x08])), "reserved bit"),
        (lambda f: _corrupt(f, 4, _i32(300084 - 4)), "decoded bytes, expected 300084"),
        (lambda f: _corrupt(f, 8, _i32(0)), "blocksize 0"),
        (lambda f: _corrupt(f, 8, _i32(1)), "cannot hold the starts"),
        (lambda f: _corrupt(f, 20, _i32(3)), "block 1 starts at 3"),
        (lambda f: _corrupt(f, 20, _i32(f.size - 2)), "block 1 starts at"),
        (lambda f: _corrupt(f, int.from_bytes(f[20:24].tobytes(), "little"), _i32(1 << 20)), "compressed bytes for"),
        (lambda f: _corrupt(f, int.from_bytes(f[20:24].tobytes(), "little"), _i32(-5)), "-5 compressed bytes"),
        (lambda f: _corrupt(f, 2, bytes([(f[2] & 0x1F) | (6 << 5)])), "unknown blosc compressor code 6"),
        (lambda f: _corrupt(f, 2, bytes([f[2] | 0x02])), "stored (memcpyed) blosc frame"),
    ],
    ids=["header-cut", "truncated", "version", "reserved-flag", "nbytes", "blocksize-0", "bstarts-room",
         "bstart-low", "bstart-high", "stream-size", "stream-negative", "compressor", "memcpyed-size"],
)
def test_malformed_frames_name_array_and_chunk(good, mutate, message):
    raw, frame = good
    bad = mutate(frame)
    frames = [frame, bad, frame]
    host, offsets, sizes = _batch(frames)
    with pytest.raises(ChunkDecodeError) as e:
        bf.plan_frames("t2m", host, offsets, sizes, ["3.0", "3.1", "3.2"], raw.size)
    assert e.value.array == "t2m" and e.value.key == "3.1" and e.value.codec == "blosc"
    assert message in str(e.value)


def test_stream_running_past_the_frame_end_is_caught(good):
    raw, frame = good
    # the last block's last stream: enlarge its size field so the stream runs past the end
    plan = bf.plan_frames("a", frame, [0], [frame.size], ["0"], raw.size)
    last = plan.npieces - 1
    at = int(plan.piece_src[last]) - 4
    grown = min(int(plan.piece_dsize[last]), int(plan.piece_csize[last]) + 50)
    bad = _corrupt(frame, at, _i32(grown))
    with pytest.raises(ChunkDecodeError, match="runs past the end of the frame"):
        bf.plan_frames("a", bad, [0], [bad.size], ["0"], raw.size)



def _numcodecs_rejects(frame: np.ndarray) -> bool:
    try:
        numcodecs.Blosc().decode(frame.tobytes())
    except RuntimeError:
        return True
    return False


@pytest.fixture(scope="module")
def stored():
    """A frame numcodecs stores whole (memcpyed): incompressible data, as the GPU fuzz's 16400-byte cases."""
    raw = _data("random", 16384, 4, 7)
    frame = _encode(raw, 4, cname="lz4", clevel=5, shuffle=1, blocksize=0)
    assert frame[2] & bf.MEMCPYED and frame.size == raw.size + bf.HEADER
    plan = bf.plan_frames("a", frame, [0], [frame.size], ["0"], raw.size)
    np.testing.assert_array_equal(bf.decode_plan_cpu(plan, frame)[: raw.size], raw)
    return raw, frame


@pytest.mark.parametrize(
    "at, value, message",
    [
        (8, _i32(0), "blocksize 0"),
        (8, _i32(-1), "blocksize -1"),
        (8, _i32(16385), "blocksize 16385"),  # one more than the decoded size
        (8, _i32(2**31 - 1), "blocksize 2147483647"),
        (3, b"\x00", "typesize 0"),
    ],
    ids=["blocksize-0", "blocksize-negative", "blocksize-above-nbytes", "blocksize-max", "typesize-0"],
)
def test_stored_frames_get_the_header_checks_c_blosc_makes(stored, at, value, message):
    # c-blosc checks typesize and blocksize before the memcpyed flag; the plan used to copy such frames out
    # (60 of the 78 silent wrong values of the GPU fuzz, seed 20261122, were these)
    raw, frame = stored
    bad = _corrupt(frame, at, value)
    assert _numcodecs_rejects(bad)
    host, offsets, sizes = _batch([frame, bad])
    with pytest.raises(ChunkDecodeError) as e:
        bf.plan_frames("t2m", host, offsets, sizes, ["0.0", "0.1"], raw.size)
    assert e.value.array == "t2m" and e.value.key == "0.1" and e.value.codec == "blosc"
    assert message in str(e.value)


def test_stored_frames_ignore_the_compressor_version_byte(stored):
    # c-blosc never reads byte 1 of a memcpyed frame: the plan must not reject it either
    raw, frame = stored
    other = _corrupt(frame, 1, b"\x07")
    assert bytes(numcodecs.Blosc().decode(other.tobytes())) == raw.tobytes()
    plan = bf.plan_frames("a", other, [0], [other.size], ["0"], raw.size)
    np.testing.assert_array_equal(bf.decode_plan_cpu(plan, other)[: raw.size], raw)


@pytest.mark.parametrize("cname", CNAMES + ["blosclz"])
@pytest.mark.parametrize("version", [0, 2, 0xC1])
def test_compressor_format_version_must_be_one(cname, version):
    # blosc_d answers -9 to a compressor format version it does not know (4 silent cases of the GPU fuzz)
    raw = _data("smooth", 20000, 4, 3)
    frame = _encode(raw, 4, cname=cname, clevel=5, shuffle=1, blocksize=0)
    assert not frame[2] & bf.MEMCPYED and frame[1] == bf.FORMAT_VERSION
    bad = _corrupt(frame, 1, bytes([version]))
    assert _numcodecs_rejects(bad)
    with pytest.raises(ChunkDecodeError, match=f"compressor format version {version}") as e:
        bf.plan_frames("t2m", bad, [0], [bad.size], ["1.2"], raw.size)
    assert e.value.key == "1.2"


# ---- the CUDA kernels, compiled as C++ and run sequentially over the same plans ----

_PRELUDE = r"""
struct Dim3 { unsigned int x, y, z; };
static Dim3 blockIdx, threadIdx, gridDim, blockDim;
#define __global__
"""

_DRIVERS = r"""
extern "C" void run_gather(unsigned grid, unsigned block, unsigned char* buf, const long long* src,
                           const long long* dst, const long long* len, long long n) {
    gridDim.x = grid; blockDim.x = block;
    for (blockIdx.x = 0; blockIdx.x < grid; blockIdx.x++)
        for (threadIdx.x = 0; threadIdx.x < block; threadIdx.x++) blosc_gather(buf, src, dst, len, n);
}
extern "C" void run_unshuffle(unsigned grid, unsigned block, const unsigned char* buf, unsigned char* out,
        const long long* piece_at, const long long* dst, const long long* size, const long long* piece0,
        const long long* neblock, const long long* typesize, const long long* mode, const long long* seg_block,
        const long long* seg_start, long long nseg, long long seg_len) {
    gridDim.x = grid; blockDim.x = block;
    for (blockIdx.x = 0; blockIdx.x < grid; blockIdx.x++)
        for (threadIdx.x = 0; threadIdx.x < block; threadIdx.x++)
            blosc_unshuffle(buf, out, piece_at, dst, size, piece0, neblock, typesize, mode, seg_block,
                            seg_start, nseg, seg_len);
}
"""


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler to run the CUDA kernels' source on the CPU")
    d = tmp_path_factory.mktemp("kernels")
    (d / "k.cpp").write_text(_PRELUDE + GATHER_SRC + UNSHUFFLE_SRC + _DRIVERS)
    subprocess.run([cxx, "-O2", "-shared", "-fPIC", "-o", str(d / "k.so"), str(d / "k.cpp")], check=True)
    return ctypes.CDLL(str(d / "k.so"))


def _ptr(a: np.ndarray):
    assert a.flags.c_contiguous
    return a.ctypes.data_as(ctypes.c_void_p)


def _run_kernels(lib, plan: bf.BloscPlan, host: np.ndarray, grid: int, seg_len: int) -> np.ndarray:
    """The GPU executor's steps with the compiled kernels (nvCOMP's step done by CPU libraries)."""
    in_total = host.size
    pl = bf.place(plan, in_total)
    buf = bf.working_buffer(plan, pl, host, in_total)
    i64 = lambda a: np.ascontiguousarray(a, dtype=np.int64)  # noqa: E731
    gsrc, gdst, glen = i64(pl.gather_src), i64(pl.gather_dst), i64(pl.gather_len)
    lib.run_gather(grid, 7, _ptr(buf), _ptr(gsrc), _ptr(gdst), _ptr(glen), ctypes.c_longlong(len(gsrc)))
    bf.decode_pieces_cpu(plan, pl, buf)
    seg_block, seg_start = segments(plan.block_size, seg_len)
    tables = [i64(t) for t in (pl.piece_at, plan.block_dst, plan.block_size, plan.block_piece0,
                               plan.block_neblock, plan.block_typesize, plan.block_mode, seg_block, seg_start)]
    out = np.full(plan.n * plan.stride, 0xAB, np.uint8)
    lib.run_unshuffle(grid, 5, _ptr(buf), _ptr(out), *map(_ptr, tables), ctypes.c_longlong(len(seg_block)),
                      ctypes.c_longlong(seg_len))
    return out


@pytest.mark.parametrize("cname", CNAMES)
def test_cuda_kernels_decode_like_numcodecs(kernels, cname):
    """The kernels' own source over the matrix; small grids and segments exercise the grid-stride loops."""
    for shuffle in SHUFFLES:
        for nbytes, items in _cases(cname, shuffle):
            if nbytes > 70000:
                items = items[::5]  # the sequential run is slow; the CPU reference covers all of them
            host, offsets, sizes = _batch([f for _, _, f in items])
            plan = bf.plan_frames("a", host, offsets, sizes, [str(i) for i in range(len(items))], nbytes)
            out = _run_kernels(kernels, plan, host, grid=3, seg_len=4096 + 13)
            _check(out, plan, items)


def test_cuda_kernel_harness_can_fail(kernels):
    """A plan with one block's mode changed must come out wrong: the comparison is not vacuous."""
    raw = _data("smooth", 69984, 4, 9)
    for shuffle in (1, 2):
        frame = _encode(raw, 4, cname="lz4", clevel=5, shuffle=shuffle)
        plan = bf.plan_frames("a", frame, [0], [frame.size], ["0"], raw.size)
        np.testing.assert_array_equal(_run_kernels(kernels, plan, frame, 2, 1000)[: raw.size], raw)
        plan.block_mode[0] = bf.COPY
        assert not np.array_equal(_run_kernels(kernels, plan, frame, 2, 1000)[: raw.size], raw)
