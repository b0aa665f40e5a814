"""The vectorised ``plan_frames`` against the per-frame one it replaced (same plans, same errors).

``plan_frames`` used to walk the frames of a batch in a Python loop (about 15
small numpy calls per frame), which under 16 dask worker threads cost 56 ms
a 64-chunk batch in GIL contention. It now parses every header at once. The
earlier implementation is kept here verbatim (``_header_v1``,
``plan_frames_v1``) as the reference: for valid batches every table of the
plan must be identical (values and dtypes); for damaged ones the error must
name the same chunk with the same message.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numcodecs
import numpy as np
import pytest
from test_blosc_frames import _data as _seeded_data
from test_blosc_frames import _encode

from gpuzarr_dist.codecs import blosc_frames as bf
from gpuzarr_dist.codecs.blosc_frames import (
    BIT_UNSHUFFLE,
    BYTE_UNSHUFFLE,
    COPY,
    DOBITSHUFFLE,
    DONT_SPLIT,
    DOSHUFFLE,
    FORMAT_VERSION,
    FORMATS,
    GPU_FORMATS,
    HEADER,
    MAX_BLOCKSIZE,
    MAX_SPLITS,
    MEMCPY_BLOCK,
    MEMCPYED,
    MIN_BUFFERSIZE,
    RAW,
    RESERVED,
    BloscPlan,
    _align,
)
from gpuzarr_dist.errors import ChunkDecodeError

# ---- the reference: plan_frames as it was before it was vectorised (copied unchanged, renamed) ----


def _header_v1(array: str, key: str, frame: np.ndarray, size: int, expected: int) -> tuple[int, int, int, int]:
    """Check one frame's header against c-blosc's rules; return (flags, typesize, blocksize, nblocks)."""

    def fail(why: str) -> ChunkDecodeError:
        return ChunkDecodeError(array, key, why, "blosc")

    if size < HEADER:
        raise fail(f"blosc frame of {size} bytes is shorter than its 16-byte header")
    h = frame[:HEADER].tobytes()
    version, flags, typesize = h[0], h[2], h[3]
    nbytes, blocksize, cbytes = (int.from_bytes(h[k : k + 4], "little", signed=True) for k in (4, 8, 12))
    if cbytes != size:
        raise fail(f"blosc header states {cbytes} compressed bytes, the chunk holds {size}")
    if version != 2:
        raise fail(f"blosc format version {version} (Blosc1 frames have version 2)")
    if flags & RESERVED:
        raise fail(f"blosc header flags {flags:#04x} use a reserved bit")
    if nbytes != expected:
        raise fail(f"blosc header states {nbytes} decoded bytes, expected {expected}")
    if nbytes == 0:
        return flags, max(typesize, 1), 1, 0
    # c-blosc checks typesize and blocksize before it looks at the memcpyed flag: a stored
    # frame with a damaged blocksize or a zero typesize is rejected too, not copied out
    if typesize == 0 or blocksize <= 0 or blocksize > nbytes or blocksize > MAX_BLOCKSIZE:
        raise fail(f"blosc header states typesize {typesize} and blocksize {blocksize} for {nbytes} bytes")
    if flags & MEMCPYED:
        if cbytes != nbytes + HEADER:
            raise fail(f"stored (memcpyed) blosc frame of {cbytes} bytes for {nbytes} decoded bytes")
        return flags, typesize, MEMCPY_BLOCK, -(-nbytes // MEMCPY_BLOCK)
    # blosc_d rejects a frame whose compressor format version (byte 1) is not the one it
    # knows (1 for every Blosc1 compressor); stored frames never reach that check
    if h[1] != FORMAT_VERSION:
        raise fail(f"blosc header states compressor format version {h[1]} for {FORMATS.get(flags >> 5, 'an unknown compressor')} "
                   f"(c-blosc writes and reads {FORMAT_VERSION})")
    nblocks = -(-nbytes // blocksize)
    if nblocks > (cbytes - HEADER) // 4:
        raise fail(f"blosc frame of {cbytes} bytes cannot hold the starts of its {nblocks} blocks")
    return flags, typesize, blocksize, nblocks


def plan_frames_v1(
    array: str,
    host: np.ndarray,
    offsets: Sequence[int],
    sizes: Sequence[int],
    keys: Sequence[str],
    expected: int,
    stride: int | None = None,
) -> BloscPlan:
    """Parse and check the frames of a batch (``host[offsets[i] : offsets[i] + sizes[i]]``); return its plan.

    Every size, offset and stream length is checked against the frame before
    anything runs, so a malformed frame raises :class:`ChunkDecodeError`
    naming the array and chunk key instead of reading or writing out of
    bounds. Chunk ``i`` is decoded to ``[i * stride, i * stride + expected)``
    of the output (``stride`` defaults to ``expected`` rounded up to 256).
    """
    n = len(offsets)
    stride = _align(max(expected, 1)) if stride is None else stride
    i64 = np.int64
    # per block: absolute start of its first stream's size field (or raw data), size, frame info
    b_chunk, b_pos, b_size, b_nsplits, b_mode, b_ts, b_dst, b_raw = [], [], [], [], [], [], [], []
    unsupported = None
    for i in range(n):
        o, s = int(offsets[i]), int(sizes[i])
        frame = host[o : o + s]
        flags, ts, blocksize, nblocks = _header_v1(array, keys[i], frame, s, expected)
        if nblocks == 0:
            continue
        j = np.arange(nblocks, dtype=i64)
        bsize = np.full(nblocks, blocksize, dtype=i64)
        leftover = expected % blocksize
        if leftover:
            bsize[-1] = leftover
        dst = i * stride + j * blocksize
        if flags & MEMCPYED:  # stored whole: raw blocks, nothing to unshuffle (c-blosc copies them)
            pos, nsplits, mode, raw = o + HEADER + j * blocksize, np.ones(nblocks, i64), COPY, True
        else:
            code = flags >> 5
            if code not in GPU_FORMATS:
                if code not in FORMATS:
                    raise ChunkDecodeError(array, keys[i], f"unknown blosc compressor code {code}", "blosc")
                unsupported = unsupported or FORMATS[code]
                continue
            starts = frame[HEADER : HEADER + 4 * nblocks].view("<i4").astype(i64)
            lo = HEADER + 4 * nblocks
            bad = np.flatnonzero((starts < lo) | (starts > s - 4))
            if bad.size:
                raise ChunkDecodeError(array, keys[i], f"blosc block {bad[0]} starts at {starts[bad[0]]}, outside "
                                       f"[{lo}, {s - 4}] of the {s}-byte frame", "blosc")
            pos = o + starts
            # c-blosc splits a block into typesize streams unless the frame says not to, the
            # typesize is large, the streams would be short, or it is the short last block
            split = (not flags & DONT_SPLIT) and ts <= MAX_SPLITS
            nsplits = np.where(split & (bsize // ts >= MIN_BUFFERSIZE) & (bsize == blocksize), ts, 1).astype(i64)
            if flags & DOSHUFFLE and ts > 1:
                mode = BYTE_UNSHUFFLE
            elif flags & DOBITSHUFFLE:
                mode = BIT_UNSHUFFLE  # per block, only where bsize >= typesize (below)
            else:
                mode = COPY
            raw = False
        modes = np.full(nblocks, mode, dtype=np.int8)
        if mode == BIT_UNSHUFFLE:
            modes[bsize < ts] = COPY
        b_chunk.append(np.full(nblocks, i, np.int32))
        b_pos.append(pos)
        b_size.append(bsize)
        b_nsplits.append(nsplits)
        b_mode.append(modes)
        b_ts.append(np.full(nblocks, ts, i64))
        b_dst.append(dst)
        b_raw.append(np.full(nblocks, raw))
    empty = np.zeros(0, i64)
    if unsupported or not b_pos:
        return BloscPlan(n, expected, stride, empty, empty, empty, np.zeros(0, np.int8), np.zeros(0, np.int32),
                         empty, empty, empty, empty, empty, np.zeros(0, np.int8), unsupported)
    chunk, pos, bsize, nsplits = (np.concatenate(v) for v in (b_chunk, b_pos, b_size, b_nsplits))
    mode, ts, dst, raw = (np.concatenate(v) for v in (b_mode, b_ts, b_dst, b_raw))
    neblock = bsize // nsplits
    bad = np.flatnonzero(neblock * nsplits != bsize)
    if bad.size:
        k = bad[0]
        raise ChunkDecodeError(array, keys[chunk[k]], f"blosc block of {bsize[k]} bytes does not split into "
                               f"{nsplits[k]} streams", "blosc")
    frame_end = np.asarray(offsets, i64)[chunk] + np.asarray(sizes, i64)[chunk]
    codes = np.asarray([int(host[offsets[c] + 2]) >> 5 for c in range(n)], dtype=np.int8)[chunk]
    # walk the streams of every block at once: split s of all blocks that have one
    maxs = int(nsplits.max())
    p_src = np.zeros((len(pos), maxs), i64)
    p_csize = np.zeros((len(pos), maxs), i64)
    cur = pos.copy()
    for s in range(maxs):
        act = np.flatnonzero((s < nsplits) & ~raw)
        if act.size == 0:
            break
        at = cur[act]
        short = np.flatnonzero(at + 4 > frame_end[act])
        if short.size:
            k = act[short[0]]
            raise ChunkDecodeError(array, keys[chunk[k]], f"blosc stream size field at byte {at[short[0]] - (frame_end[k] - sizes[chunk[k]])} "
                                   "is past the end of the frame", "blosc")
        b = host[at[:, None] + np.arange(4)].astype(np.uint32)
        cs = (b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16) | (b[:, 3] << 24)).astype(np.int32).astype(i64)
        at = at + 4
        bad = np.flatnonzero((cs <= 0) | (cs > neblock[act]) | (at + cs > frame_end[act]))
        if bad.size:
            k = act[bad[0]]
            c = cs[bad[0]]
            why = (f"blosc stream states {c} compressed bytes for {neblock[k]} decoded bytes"
                   if c <= 0 or c > neblock[k] else f"blosc stream of {c} bytes runs past the end of the frame")
            raise ChunkDecodeError(array, keys[chunk[k]], why, "blosc")
        short = np.flatnonzero((codes[act] == 3) & (cs < neblock[act]) & (cs <= 6))
        if short.size:
            k = act[short[0]]
            raise ChunkDecodeError(array, keys[chunk[k]], f"blosc zlib stream of {cs[short[0]]} bytes is shorter "
                                   "than a zlib header and checksum", "blosc")
        p_src[act, s] = at
        p_csize[act, s] = cs
        cur[act] = at + cs
    rows = np.flatnonzero(raw)
    p_src[rows, 0] = pos[rows]
    p_csize[rows, 0] = bsize[rows]
    mask = np.arange(maxs)[None, :] < nsplits[:, None]
    piece_src = p_src[mask]
    piece_csize = p_csize[mask]
    piece_dsize = np.broadcast_to(neblock[:, None], mask.shape)[mask]
    piece_codec = np.where(piece_csize == piece_dsize, RAW,
                           np.broadcast_to(codes[:, None], mask.shape)[mask]).astype(np.int8)
    piece_codec[np.repeat(raw, nsplits)] = RAW
    piece_chunk = np.repeat(chunk, nsplits).astype(np.int32)
    piece0 = np.concatenate([[0], np.cumsum(nsplits)[:-1]]).astype(i64)
    return BloscPlan(n, expected, stride, piece_src, piece_csize, piece_dsize, piece_codec, piece_chunk,
                     dst, bsize, piece0, neblock, ts, mode)


# ---- the comparison ----

CNAMES = ["lz4", "lz4hc", "zlib", "zstd"]
SHUFFLES = [numcodecs.Blosc.NOSHUFFLE, numcodecs.Blosc.SHUFFLE, numcodecs.Blosc.BITSHUFFLE]
TYPESIZES = [1, 2, 3, 4, 8, 17]
FIELDS = ["n", "nbytes", "stride", "piece_src", "piece_csize", "piece_dsize", "piece_codec", "piece_chunk",
          "block_dst", "block_size", "block_piece0", "block_neblock", "block_typesize", "block_mode", "unsupported"]


def _data(kind: str, nbytes: int, ts: int, rng: np.random.Generator) -> np.ndarray:
    """test_blosc_frames' payloads (random, zeros, smooth), drawn from ``rng``."""
    return _seeded_data(kind, nbytes, ts, int(rng.integers(2**31)))


def _layout(frames: list[np.ndarray], rng: np.random.Generator, lead: int = 0):
    """Frames in one buffer at 256-byte aligned offsets (after ``lead`` bytes), garbage around them."""
    offsets, at = [], lead
    for f in frames:
        offsets.append(at)
        at = int(_align(at + f.size - lead)) + lead
    host = rng.integers(0, 256, at + int(rng.integers(0, 300)), dtype=np.uint8)
    for o, f in zip(offsets, frames):
        host[o : o + f.size] = f
    return host, offsets, [int(f.size) for f in frames]


def _random_batch(rng: np.random.Generator, cname: str, shuffle: int, ts: int | None = None):
    """A batch of frames of one decoded size: smooth, random (memcpyed) and zero chunks, mixed settings."""
    ts = int(rng.choice(TYPESIZES)) if ts is None else ts
    size = int(rng.choice([0, 5, 100, 1000, 5000, 40000, 69999, 131072, 300001]))
    nbytes = size // ts * ts
    frames = []
    for _ in range(int(rng.integers(1, 7))):
        kind = str(rng.choice(["smooth", "smooth", "random", "zeros"]))
        clevel = int(rng.choice([0, 1, 5, 9]))
        blocksize = int(rng.choice([0, 0, 256, 4096, 5000, 1 << 16]))
        if blocksize == 256 and nbytes > 5000:
            blocksize = 0
        frames.append(_encode(_data(kind, nbytes, ts, rng), ts, cname=cname, clevel=clevel, shuffle=shuffle,
                              blocksize=blocksize))
    return frames, nbytes


def _outcome(fn, *args, **kw):
    try:
        return "plan", fn(*args, **kw)
    except ChunkDecodeError as e:
        return "error", (type(e).__name__, e.array, e.key, e.codec, e.reason, str(e))
    except Exception as e:  # noqa: BLE001  (any other failure must be the same too)
        return "raised", (type(e).__name__, str(e))


def _assert_same(a, b, label: str) -> None:
    assert a[0] == b[0], f"{label}: {a[0]} {a[1]!r} vs {b[0]} {b[1]!r}"
    if a[0] != "plan":
        assert a[1] == b[1], label
        return
    for f in FIELDS:
        x, y = getattr(a[1], f), getattr(b[1], f)
        if isinstance(x, np.ndarray):
            assert isinstance(y, np.ndarray) and x.dtype == y.dtype and x.shape == y.shape, (label, f, x.dtype, y.dtype)
            np.testing.assert_array_equal(x, y, err_msg=f"{label}: {f}")
        else:
            assert x == y and type(x) is type(y), (label, f, x, y)


def _compare(host, offsets, sizes, keys, expected, label, stride=None):
    old = _outcome(plan_frames_v1, "arr", host, offsets, sizes, keys, expected, stride)
    new = _outcome(bf.plan_frames, "arr", host, offsets, sizes, keys, expected, stride)
    _assert_same(old, new, label)
    return new


@pytest.mark.parametrize("shuffle", SHUFFLES, ids=["noshuffle", "shuffle", "bitshuffle"])
@pytest.mark.parametrize("cname", CNAMES)
def test_same_plans_as_the_per_frame_version(cname, shuffle):
    rng = np.random.default_rng(1000 + 10 * CNAMES.index(cname) + shuffle)
    seen = {"memcpyed": 0, "compressed": 0, "empty": 0, "split": 0, "raw": 0, "bit": 0, "byte": 0}
    for t in range(40):
        frames, nbytes = _random_batch(rng, cname, shuffle, ts=TYPESIZES[t % len(TYPESIZES)])
        lead = int(rng.choice([0, 0, 4, 13]))
        host, offsets, sizes = _layout(frames, rng, lead)
        stride = None if t % 3 else int(_align(max(nbytes, 1))) + 256 * int(rng.integers(0, 3))
        keys = [f"{t}.{i}" for i in range(len(frames))]
        kind, plan = _compare(host, offsets, sizes, keys, nbytes, f"{cname} {shuffle} batch {t}", stride)
        assert kind == "plan", plan
        seen["memcpyed"] += sum(bool(f[2] & MEMCPYED) and nbytes > 0 for f in frames)
        seen["compressed"] += sum(not f[2] & MEMCPYED for f in frames)
        seen["empty"] += nbytes == 0
        seen["split"] += int((plan.block_neblock < plan.block_size).sum())
        seen["raw"] += int((plan.piece_codec == RAW).sum())
        seen["bit"] += int((plan.block_mode == BIT_UNSHUFFLE).sum())
        seen["byte"] += int((plan.block_mode == BYTE_UNSHUFFLE).sum())
    assert seen["memcpyed"] and seen["compressed"] and seen["empty"] and seen["raw"], seen
    if shuffle == numcodecs.Blosc.SHUFFLE:
        assert seen["byte"], seen
    if shuffle == numcodecs.Blosc.BITSHUFFLE:
        assert seen["bit"], seen
    if cname in ("lz4", "lz4hc") and shuffle != numcodecs.Blosc.NOSHUFFLE:
        assert seen["split"], seen


def test_same_plans_for_mixed_and_edge_batches():
    rng = np.random.default_rng(7)
    raw = _data("smooth", 69996, 4, rng)
    lz4 = _encode(raw, 4, cname="lz4", clevel=5, shuffle=1)
    blz = _encode(raw, 4, cname="blosclz", clevel=5, shuffle=1)
    blz_stored = _encode(raw, 4, cname="blosclz", clevel=0, shuffle=1)
    zstd = _encode(raw, 4, cname="zstd", clevel=5, shuffle=2)
    zlib_ = _encode(raw, 4, cname="zlib", clevel=9, shuffle=0)
    stored = _encode(_data("random", 69996, 4, rng), 4, cname="lz4", clevel=5, shuffle=1)
    assert stored[2] & MEMCPYED and blz_stored[2] & MEMCPYED
    batches = {
        "blosclz after lz4": [lz4, blz, zstd],
        "blosclz first": [blz, lz4],
        "stored blosclz only": [blz_stored, stored],
        "every codec": [lz4, zstd, zlib_, stored, blz_stored],
        "one frame": [zlib_],
    }
    for label, frames in batches.items():
        host, offsets, sizes = _layout(frames, rng)
        kind, plan = _compare(host, offsets, sizes, [str(i) for i in range(len(frames))], raw.size, label)
        assert kind == "plan"
        assert (plan.unsupported == "blosclz") == ("blosclz after" in label or "blosclz first" in label)
    empty = _encode(np.zeros(0, np.uint8), 4, cname="lz4", clevel=5, shuffle=1)
    for k in (1, 5):
        host, offsets, sizes = _layout([empty] * k, rng)
        kind, plan = _compare(host, offsets, sizes, [str(i) for i in range(k)], 0, f"{k} empty")
        assert kind == "plan" and plan.nblocks == 0 and plan.unsupported is None
    host = np.zeros(0, np.uint8)
    _compare(host, [], [], [], 100, "no frames")
    # the frame alone as the host buffer (nothing after it), as the fuzz tools plan them
    for f in (lz4, stored, blz, _encode(raw[:4], 4, cname="lz4", clevel=5, shuffle=1)):
        _compare(f.copy(), [0], [f.size], ["c"], raw.size if f.size > 40 else 4, "alone")


def _mutations(frame: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One random damage of the kinds the checks look at (header fields, block starts, stream sizes, length)."""
    f = frame.copy()
    if f.size < HEADER:
        return np.concatenate([f, np.full(int(rng.integers(0, 20)), 2, np.uint8)])
    what = int(rng.integers(0, 8))
    if what == 0:  # one header byte
        f[int(rng.integers(0, min(HEADER, f.size)))] = rng.integers(0, 256)
    elif what == 1:  # one header int32 field set to something near the truth or wild
        k = int(rng.choice([4, 8, 12]))
        v = int.from_bytes(f[k : k + 4].tobytes(), "little", signed=True)
        v = int(rng.choice([0, -1, 1, v + 1, v - 1, v * 2, v // 2, 2**31 - 1, -(2**31)]))
        v = (v + 2**31) % 2**32 - 2**31  # wrapped to int32
        f[k : k + 4] = np.frombuffer(v.to_bytes(4, "little", signed=True), np.uint8)
    elif what == 2:  # truncated or extended
        f = f[: int(rng.integers(0, f.size))] if rng.random() < 0.7 else np.concatenate([f, np.zeros(7, np.uint8)])
    elif what in (3, 4) and f.size > 20:  # a block start or a stream size field: a nearby int32 made wrong
        at = HEADER + 4 * int(rng.integers(0, 4)) if what == 3 else int(rng.integers(HEADER, f.size - 4))
        at = min(at, f.size - 4)
        v = int(rng.choice([0, -5, 3, f.size - 2, f.size + 100, 1 << 20, 7]))
        f[at : at + 4] = np.frombuffer(v.to_bytes(4, "little", signed=True), np.uint8)
    elif what == 5:  # the flags: codec bits, memcpyed, dont-split, shuffles
        f[2] ^= np.uint8(1 << int(rng.integers(0, 8)))
    elif what == 6:  # the typesize
        f[3] = rng.choice([0, 1, 3, 5, 16, 17, 255])
    else:  # random bytes anywhere
        for _ in range(int(rng.integers(1, 20))):
            f[int(rng.integers(0, f.size))] = rng.integers(0, 256)
    return f


def _stream_size_fields(frame: np.ndarray, nbytes: int) -> list[int]:
    """Positions of the stream size fields of a frame (from the reference plan; none if it is already bad)."""
    kind, plan = _outcome(plan_frames_v1, "a", frame, [0], [frame.size], ["0"], nbytes)
    if kind != "plan":
        return []
    return [int(p) - 4 for p, c in zip(plan.piece_src, plan.piece_codec) if p - 4 >= HEADER]


@pytest.mark.parametrize("cname", CNAMES)
def test_same_errors_for_damaged_frames(cname):
    """Batches with one or several damaged frames: the same chunk and message, or the same plan."""
    rng = np.random.default_rng(2000 + CNAMES.index(cname))
    outcomes = {"plan": 0, "error": 0, "raised": 0}
    messages = set()
    for t in range(400):
        shuffle = int(rng.choice(SHUFFLES))
        frames, nbytes = _random_batch(rng, cname, shuffle, ts=int(rng.choice([1, 2, 4, 4, 8, 3, 17])))
        if nbytes == 0 and t % 4:
            continue
        frames = list(frames)
        for _ in range(int(rng.integers(1, 4))):
            i = int(rng.integers(0, len(frames)))
            if rng.random() < 0.4 and frames[i].size > 24 and not frames[i][2] & MEMCPYED:
                # a stream size field, found through the plan: the walk's checks
                fields = _stream_size_fields(frames[i], nbytes)
                at = fields[int(rng.integers(0, len(fields)))] if fields else HEADER
                v = int(rng.choice([0, -3, 1, 5, 6, 1 << 20, frames[i].size]))
                f = frames[i].copy()
                f[at : at + 4] = np.frombuffer(v.to_bytes(4, "little", signed=True), np.uint8)
                frames[i] = f
            else:
                frames[i] = _mutations(frames[i], rng)
        host, offsets, sizes = _layout(frames, rng)
        keys = [f"{t}.{i}" for i in range(len(frames))]
        kind, got = _compare(host, offsets, sizes, keys, nbytes, f"{cname} damaged batch {t}")
        outcomes[kind] += 1
        if kind == "error":
            messages.add(re.sub(r"-?\d+", "#", got[4]))
    # the damage reaches the checks (else the comparison proves less than it claims)
    assert outcomes["error"] > 100 and outcomes["plan"] > 10, outcomes
    assert len(messages) >= 10, sorted(messages)


def test_first_bad_frame_wins_across_check_kinds(tmp_path):
    """Several bad frames: header and block-start checks report the first bad frame in the batch; the
    checks of the streams come after them (a bad header later in the batch wins over a bad stream earlier)."""
    rng = np.random.default_rng(3)
    raw = _data("smooth", 300084, 4, rng)
    good = _encode(raw, 4, cname="lz4", clevel=5, shuffle=1, blocksize=16384)
    plan = plan_frames_v1("a", good, [0], [good.size], ["0"], raw.size)
    stream0 = int(plan.piece_src[0]) - 4

    def put(f, at, v):
        f = f.copy()
        f[at : at + 4] = np.frombuffer(int(v).to_bytes(4, "little", signed=True), np.uint8)
        return f

    bad_start = put(good, 20, 3)
    bad_version = good.copy()
    bad_version[0] = 3
    bad_stream = put(good, stream0, 1 << 20)
    bad_code = good.copy()
    bad_code[2] = (good[2] & 0x1F) | (6 << 5)
    cases = {
        "start then header": ([good, bad_start, bad_version], "1"),
        "header then start": ([bad_version, bad_start], "0"),
        "stream then header": ([bad_stream, good, bad_version], "2"),
        "stream then start": ([bad_stream, bad_start], "1"),
        "code then stream": ([bad_stream, bad_code], "1"),
        "two streams": ([good, bad_stream, bad_stream], "1"),
    }
    for label, (frames, key) in cases.items():
        host, offsets, sizes = _layout(frames, rng)
        kind, got = _compare(host, offsets, sizes, [str(i) for i in range(len(frames))], raw.size, label)
        assert kind == "error" and got[2] == key, (label, got)


def test_same_outcome_at_the_checks_boundaries():
    """Each check's limit and the values either side of it (the random damage rarely lands on them)."""
    rng = np.random.default_rng(11)
    raw = _data("smooth", 300084, 4, rng)
    good = _encode(raw, 4, cname="lz4", clevel=5, shuffle=1, blocksize=16384)
    stored = _encode(_data("random", 16384, 4, rng), 4, cname="lz4", clevel=5, shuffle=1)
    zl = _encode(raw, 4, cname="zlib", clevel=5, shuffle=1, blocksize=16384)
    assert stored[2] & MEMCPYED

    def i32(f, k):
        return int.from_bytes(f[k : k + 4].tobytes(), "little", signed=True)

    def put(f, k, v):
        f = f.copy()
        f[k : k + 4] = np.frombuffer(int(v).to_bytes(4, "little", signed=True), np.uint8)
        return f

    variants = []
    for frame in (good, zl):
        nbytes, blocksize, size = i32(frame, 4), i32(frame, 8), frame.size
        nblocks = -(-nbytes // blocksize)
        lo = HEADER + 4 * nblocks
        variants += [put(frame, 20, v) for v in (lo - 1, lo, size - 5, size - 4, size - 3)]
        variants += [put(frame, 8, v) for v in (nbytes - 1, nbytes, nbytes + 1, 1, 2, 128, 129, MAX_BLOCKSIZE,
                                                MAX_BLOCKSIZE + 1)]
        plan = plan_frames_v1("a", frame, [0], [size], ["0"], nbytes)
        at = int(plan.piece_src[1]) - 4
        variants += [put(frame, at, v) for v in (0, 1, 6, 7, int(plan.piece_dsize[1]), int(plan.piece_dsize[1]) + 1,
                                                 size - at - 4, size - at - 3)]
    nb = i32(stored, 4)
    variants += [put(stored, 12, v) for v in (nb + HEADER - 1, nb + HEADER, nb + HEADER + 1)]
    variants += [put(stored, 8, v) for v in (nb, nb + 1, 0, MAX_BLOCKSIZE + 1)]
    for k, v in enumerate(variants):
        expected = raw.size if v.size > 20000 else i32(stored, 4)
        host, offsets, sizes = _layout([v], rng)
        _compare(host, offsets, sizes, ["0"], expected, f"variant {k}")
        _compare(v.copy(), [0], [v.size], ["0"], expected, f"variant {k} alone")
