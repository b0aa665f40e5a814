"""Blosc1 frames taken apart on the host: a flat plan of compressed streams and blocks to unshuffle.

A Blosc1 frame (c-blosc 1.x, Zarr v2's default compressor) is a 16-byte header::

    0 version (2)   1 codec version   2 flags   3 typesize
    4 nbytes (decoded size)   8 blocksize   12 cbytes (frame size)      (int32, little endian)

then, unless the frame is stored whole (flag ``MEMCPYED``: the data follows
the header as it is), one int32 start offset per block and the blocks. A
block holds ``nsplits`` streams, each an int32 compressed size and the bytes
of one compressed stream (or the stream stored raw, when its compressed size
equals its decoded size); ``nsplits`` is the typesize where the block was
split (one stream per byte plane), else 1. The decoded streams of a block,
concatenated, are the block byte-shuffled or bit-shuffled (flags), or the
block itself.

:func:`plan_frames` turns a batch of frames into numpy tables: one row per
stream ("piece": where its bytes are, how large it is compressed and decoded,
its inner codec) and one row per block (where it goes in the output, how to
undo its shuffle, which pieces hold it). :func:`place` lays pieces out in one
working buffer (aligned starts for the batched decoders). The GPU executor
(:mod:`.gpu_blosc`) and the CPU reference executor here
(:func:`decode_plan_cpu`) run the same plan and the same index arithmetic, so
the CPU tests against numcodecs prove everything except the kernels.

The rules follow c-blosc 1.21's ``blosc_d`` and
``blosc_run_decompression_with_context`` (the version numcodecs bundles).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpuzarr_dist.errors import ChunkDecodeError

HEADER = 16
MEMCPYED, DOSHUFFLE, DOBITSHUFFLE, RESERVED, DONT_SPLIT = 0x2, 0x1, 0x4, 0x8, 0x10
MIN_BUFFERSIZE, MAX_SPLITS, MAX_BLOCKSIZE = 128, 16, (1 << 31) - 1 - 16
#: Blosc1 compressor format codes (flags >> 5) -> name; lz4 and lz4hc share code 1
FORMATS = {0: "blosclz", 1: "lz4", 2: "snappy", 3: "zlib", 4: "zstd"}
#: format codes decoded by nvCOMP (the others go to the CPU)
GPU_FORMATS = {1: "LZ4", 3: "Deflate", 4: "Zstd"}
#: ``cname`` values of the codec configuration the GPU path decodes
GPU_CNAMES = ("lz4", "lz4hc", "zlib", "zstd")
#: the compressor format version (header byte 1) c-blosc 1.x writes and accepts for every compressor
FORMAT_VERSION = 1
RAW = -1  # piece codec of a stream stored uncompressed
#: block modes
COPY, BYTE_UNSHUFFLE, BIT_UNSHUFFLE = 0, 1, 2
#: memcpyed frames are cut into blocks of this size (they have no blocks of their own)
MEMCPY_BLOCK = 1 << 16
ALIGN = 256


def _align(n: int | np.ndarray) -> int | np.ndarray:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class BloscPlan:
    """Pieces (streams) and blocks of a batch of frames; offsets are into the input buffer.

    ``unsupported`` names a compressor in the batch that has no GPU decoder
    (blosclz, snappy): the batch is then decoded on the CPU and the tables are empty.
    """

    n: int
    nbytes: int
    stride: int
    piece_src: np.ndarray  # int64: start of the stream's bytes (after its 4-byte size)
    piece_csize: np.ndarray  # int64: stored bytes of the stream
    piece_dsize: np.ndarray  # int64: decoded bytes of the stream
    piece_codec: np.ndarray  # int8: format code (1 lz4, 3 zlib, 4 zstd) or RAW
    piece_chunk: np.ndarray  # int32: index of the chunk in the batch (for errors)
    block_dst: np.ndarray  # int64: start in the output (chunk * stride + block * blocksize)
    block_size: np.ndarray  # int64: decoded bytes of the block
    block_piece0: np.ndarray  # int64: first piece of the block
    block_neblock: np.ndarray  # int64: decoded bytes per piece of the block
    block_typesize: np.ndarray  # int64
    block_mode: np.ndarray  # int8: COPY, BYTE_UNSHUFFLE or BIT_UNSHUFFLE
    unsupported: str | None = None

    @property
    def npieces(self) -> int:
        return len(self.piece_src)

    @property
    def nblocks(self) -> int:
        return len(self.block_dst)


def _header(array: str, key: str, frame: np.ndarray, size: int, expected: int) -> tuple[int, int, int, int]:
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


def _frame_error(array: str, key: str, frame: np.ndarray, size: int, expected: int) -> None:
    """Raise the error of the first per-frame check one frame fails (header, compressor code, block starts).

    :func:`plan_frames` runs these checks on every frame at once; this scalar
    form gives the message for the frame they flag, in c-blosc's order.
    """
    flags, _, _, nblocks = _header(array, key, frame, size, expected)
    if nblocks == 0 or flags & MEMCPYED:
        return
    code = flags >> 5
    if code not in GPU_FORMATS:
        if code not in FORMATS:
            raise ChunkDecodeError(array, key, f"unknown blosc compressor code {code}", "blosc")
        return
    starts = frame[HEADER : HEADER + 4 * nblocks].view("<i4").astype(np.int64)
    lo = HEADER + 4 * nblocks
    bad = np.flatnonzero((starts < lo) | (starts > size - 4))
    if bad.size:
        raise ChunkDecodeError(array, key, f"blosc block {bad[0]} starts at {starts[bad[0]]}, outside "
                               f"[{lo}, {size - 4}] of the {size}-byte frame", "blosc")


def _i32_at(host: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The little-endian int32 at each byte position ``at`` of ``host``, as int64 (one gather)."""
    b = host[at[:, None] + np.arange(4)]
    return np.ascontiguousarray(b).view("<i4")[:, 0].astype(np.int64)


#: format code (0..7, the flags' top 3 bits) -> known to Blosc1 / decoded on the GPU
_KNOWN_CODE = np.isin(np.arange(8), list(FORMATS))
_GPU_CODE = np.isin(np.arange(8), list(GPU_FORMATS))


def _empty_plan(n: int, expected: int, stride: int, unsupported: str | None) -> BloscPlan:
    empty = np.zeros(0, np.int64)
    return BloscPlan(n, expected, stride, empty, empty, empty, np.zeros(0, np.int8), np.zeros(0, np.int32),
                     empty, empty, empty, empty, empty, np.zeros(0, np.int8), unsupported)


def plan_frames(
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

    It runs on every dask worker thread for every block, so it makes a fixed
    number of numpy calls whatever the batch's size (no loop over frames or
    blocks, only over the at most 16 streams of a block): under many threads
    a per-frame loop spent most of its time waiting for the GIL. All headers
    are read with one gather and checked at once; where several frames are
    bad, the first of them in the batch is reported, with the message of
    :func:`_header` (checks in c-blosc's order) or of its block starts.
    """
    n = len(offsets)
    stride = _align(max(expected, 1)) if stride is None else stride
    i64 = np.int64
    if n == 0:
        return _empty_plan(n, expected, stride, None)
    off = np.asarray(offsets, i64)
    size = np.asarray(sizes, i64)
    # every header at once: an (n, 16) gather (frames too short for one fail the first check; any bytes do)
    whole = size >= HEADER
    at = np.where(whole, off, 0)[:, None] + np.arange(HEADER)
    hdr = host[np.minimum(at, max(host.size - 1, 0))] if host.size else np.zeros((n, HEADER), np.uint8)
    hdr = np.ascontiguousarray(hdr)
    hdr[~whole] = 0
    version, fversion = hdr[:, 0], hdr[:, 1]
    flags, ts = hdr[:, 2].astype(i64), hdr[:, 3].astype(i64)
    nbytes, blocksize, cbytes = hdr.view("<i4")[:, 1:].astype(i64).T
    memcpyed = (flags & MEMCPYED) != 0
    code = flags >> 5
    # _header's checks, every frame at once
    bad = ~whole | (cbytes != size) | (version != 2) | ((flags & RESERVED) != 0) | (nbytes != expected)
    filled = nbytes != 0
    bad |= filled & ((ts == 0) | (blocksize <= 0) | (blocksize > nbytes) | (blocksize > MAX_BLOCKSIZE))
    bad |= filled & memcpyed & (cbytes != nbytes + HEADER)
    compressed = filled & ~memcpyed
    bad |= compressed & (fversion != FORMAT_VERSION)
    bs = np.where(memcpyed, MEMCPY_BLOCK, np.maximum(blocksize, 1))
    nblocks = -(-nbytes // bs)
    bad |= compressed & (nblocks > (cbytes - HEADER) // 4)
    bad |= compressed & ~_KNOWN_CODE[code]
    unsupported = compressed & ~bad & ~_GPU_CODE[code]
    # the blocks of the frames that pass: chunk, index in the frame, size, where its bytes start
    nblocks = np.where(filled & ~bad & ~unsupported, nblocks, 0)
    total = int(nblocks.sum())
    chunk = np.repeat(np.arange(n, dtype=np.int32), nblocks)
    first = np.cumsum(nblocks) - nblocks
    j = np.arange(total, dtype=i64) - first[chunk]
    raw = memcpyed[chunk]
    blocksize_b, ts_b, o_b, s_b = bs[chunk], ts[chunk], off[chunk], size[chunk]
    # the block starts of compressed frames (a stored frame's blocks read its first bytes, unused:
    # its data may be shorter than the starts would be)
    starts = _i32_at(host, np.where(raw, o_b, o_b + HEADER + 4 * j))
    lo = HEADER + 4 * nblocks[chunk]
    bad_start = ~raw & ((starts < lo) | (starts > s_b - 4))
    if bad_start.any():
        bad[chunk[bad_start]] = True
    if bad.any():
        i = int(np.argmax(bad))
        o, s = int(off[i]), int(size[i])
        _frame_error(array, keys[i], host[o : o + s], s, expected)
        raise AssertionError(f"plan_frames flagged frame {i} ({keys[i]!r}) that the per-frame checks pass")
    if unsupported.any():
        return _empty_plan(n, expected, stride, FORMATS[int(code[np.argmax(unsupported)])])
    if total == 0:
        return _empty_plan(n, expected, stride, None)
    bsize = blocksize_b.copy()
    leftover = expected % bs
    last = (first + nblocks - 1)[(nblocks > 0) & (leftover != 0)]
    bsize[last] = leftover[chunk[last]]
    dst = chunk.astype(i64) * stride + j * blocksize_b
    # stored frames: raw blocks, nothing to unshuffle (c-blosc copies them)
    pos = np.where(raw, o_b + HEADER + j * blocksize_b, o_b + starts)
    # c-blosc splits a block into typesize streams unless the frame says not to, the
    # typesize is large, the streams would be short, or it is the short last block
    split = ((flags & DONT_SPLIT) == 0) & (ts <= MAX_SPLITS) & ~memcpyed
    nsplits = np.where(split[chunk] & (bsize // ts_b >= MIN_BUFFERSIZE) & (bsize == blocksize_b), ts_b, 1)
    fmode = np.where(memcpyed, COPY, np.where(((flags & DOSHUFFLE) != 0) & (ts > 1), BYTE_UNSHUFFLE,
                                              np.where((flags & DOBITSHUFFLE) != 0, BIT_UNSHUFFLE, COPY)))
    mode = fmode.astype(np.int8)[chunk]
    mode[(mode == BIT_UNSHUFFLE) & (bsize < ts_b)] = COPY  # bit shuffle only where bsize >= typesize
    neblock = bsize // nsplits
    bad = np.flatnonzero(neblock * nsplits != bsize)
    if bad.size:
        k = bad[0]
        raise ChunkDecodeError(array, keys[chunk[k]], f"blosc block of {bsize[k]} bytes does not split into "
                               f"{nsplits[k]} streams", "blosc")
    frame_end = o_b + s_b
    codes = code.astype(np.int8)[chunk]
    # walk the streams of every block at once: split s of all blocks that have one
    maxs = int(nsplits.max())
    p_src = np.zeros((total, maxs), i64)
    p_csize = np.zeros((total, maxs), i64)
    cur = pos.copy()
    for s in range(maxs):
        act = np.flatnonzero((s < nsplits) & ~raw)
        if act.size == 0:
            break
        at = cur[act]
        short = np.flatnonzero(at + 4 > frame_end[act])
        if short.size:
            k = act[short[0]]
            raise ChunkDecodeError(array, keys[chunk[k]], f"blosc stream size field at byte {at[short[0]] - (frame_end[k] - s_b[k])} "
                                   "is past the end of the frame", "blosc")
        cs = _i32_at(host, at)
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
                     dst, bsize, piece0, neblock, ts_b, mode)


@dataclass
class Placement:
    """Where each piece's bytes sit in one working buffer that starts with the input frames.

    Compressed pieces are gathered (``gather_src`` -> ``gather_dst``,
    ``gather_len`` bytes; zlib without its 2-byte header and 4-byte adler32,
    so nvCOMP's Deflate reads it) to aligned starts after the input, and
    decoded to aligned slots after those (``decode_at``). ``piece_at`` is where
    each piece's decoded bytes are: its slot, or its stored bytes for raw
    pieces. ``total`` is the working buffer's size.
    """

    gather_src: np.ndarray
    gather_dst: np.ndarray
    gather_len: np.ndarray
    decode_at: np.ndarray  # -1 for raw pieces
    piece_at: np.ndarray
    total: int


def place(plan: BloscPlan, in_total: int) -> Placement:
    """Lay out the pieces of ``plan`` after ``in_total`` bytes of input (all starts 256-byte aligned)."""
    comp = np.flatnonzero(plan.piece_codec != RAW)
    zl = plan.piece_codec[comp] == 3
    gsrc = plan.piece_src[comp] + np.where(zl, 2, 0)
    glen = plan.piece_csize[comp] - np.where(zl, 6, 0)
    slots = _align(glen)
    base = _align(in_total)
    gdst = base + np.concatenate([[0], np.cumsum(slots)[:-1]]).astype(np.int64) if comp.size else np.zeros(0, np.int64)
    base += int(slots.sum())
    dslots = _align(plan.piece_dsize[comp])
    dat = base + np.concatenate([[0], np.cumsum(dslots)[:-1]]).astype(np.int64) if comp.size else np.zeros(0, np.int64)
    total = base + int(dslots.sum())
    decode_at = np.full(plan.npieces, -1, np.int64)
    decode_at[comp] = dat
    piece_at = np.where(decode_at >= 0, decode_at, plan.piece_src)
    return Placement(gsrc, gdst, glen, decode_at, piece_at, max(total, 1))


def unshuffle_sources(plan: BloscPlan, piece_at: np.ndarray, b: int) -> np.ndarray:
    """For block ``b``, the working-buffer index each output byte is read from (the kernel's arithmetic).

    Byte shuffle: output byte ``e * ts + k`` (element e, byte k) comes from
    shuffled byte ``k * (bsize // ts) + e``; the ``bsize % ts`` trailing bytes
    are not shuffled. The shuffled block is the concatenation of its pieces
    (``neblock`` bytes each). Bit shuffle is resolved per bit by
    :func:`bit_unshuffle_block`; this gives the byte sources of the copy parts.
    """
    size, ts, mode = int(plan.block_size[b]), int(plan.block_typesize[b]), int(plan.block_mode[b])
    d = np.arange(size, dtype=np.int64)
    if mode == BYTE_UNSHUFFLE:
        nq = size // ts
        e, k = d // ts, d % ts
        p = np.where(e < nq, k * nq + e, d)
    else:
        p = d
    return _tmp_index(plan, piece_at, b, p)


def _tmp_index(plan: BloscPlan, piece_at: np.ndarray, b: int, p: np.ndarray) -> np.ndarray:
    """Working-buffer index of byte ``p`` of block ``b``'s concatenated decoded streams."""
    neblock = int(plan.block_neblock[b])
    s = p // neblock
    return piece_at[plan.block_piece0[b] + s] + (p - s * neblock)


def bit_unshuffle_block(plan: BloscPlan, piece_at: np.ndarray, b: int, buf: np.ndarray) -> np.ndarray:
    """Block ``b`` bit-unshuffled from ``buf`` (the kernel's arithmetic, vectorised).

    c-blosc bit-shuffles ``n = bsize // ts`` elements only when ``n % 8 == 0``
    (else the block was stored as it is); the ``bsize % ts`` trailing bytes
    are copied. Shuffled, bit ``r = 8 * k + q`` (byte k, bit q) of element e is
    bit ``e % 8`` of byte ``r * n / 8 + e / 8``.
    """
    size, ts = int(plan.block_size[b]), int(plan.block_typesize[b])
    n = size // ts
    d = np.arange(size, dtype=np.int64)
    if n % 8:
        return buf[_tmp_index(plan, piece_at, b, d)]
    e, k = d // ts, d % ts
    inside = e < n
    out = np.zeros(size, np.uint8)
    for q in range(8):
        p = (8 * k + q) * (n // 8) + e // 8
        p = np.where(inside, p, 0)
        bit = (buf[_tmp_index(plan, piece_at, b, p)] >> (e % 8).astype(np.uint8)) & 1
        out |= (bit << q).astype(np.uint8)
    rest = ~inside
    out[rest] = buf[_tmp_index(plan, piece_at, b, d[rest])]
    return out


def _lz4_block_decode(src: bytes, n: int) -> bytes:
    """A raw LZ4 block (no frame, no size prefix) decoded to ``n`` bytes, through numcodecs' LZ4."""
    import numcodecs

    return bytes(numcodecs.LZ4().decode(n.to_bytes(4, "little") + src))


def working_buffer(plan: BloscPlan, pl: Placement, host: np.ndarray, in_total: int) -> np.ndarray:
    """The working buffer as the device holds it after the upload: the input frames, then zeros."""
    buf = np.zeros(pl.total, np.uint8)
    buf[:in_total] = host[:in_total]
    return buf


def gather_cpu(pl: Placement, buf: np.ndarray) -> None:
    """Copy every compressed stream to its aligned start (the gather kernel's work)."""
    for gs, gd, gl in zip(pl.gather_src, pl.gather_dst, pl.gather_len):
        buf[gd : gd + gl] = buf[gs : gs + gl]


def decode_pieces_cpu(plan: BloscPlan, pl: Placement, buf: np.ndarray) -> None:
    """Decode every gathered stream into its slot with CPU libraries (nvCOMP's work on the device).

    The inputs are what nvCOMP is given: a raw LZ4 block (decoded through
    numcodecs' LZ4 with its size prefix added), raw deflate (zlib's header
    and checksum already cut off), a zstd frame. Each decodes to at most its
    slot's size (and one byte more for deflate, to tell a longer stream).
    """
    from gpuzarr_dist.codecs.compressors import DecodeLimit, Zstd

    zstd = Zstd()
    comp = np.flatnonzero(plan.piece_codec != RAW)
    for j, p in enumerate(comp):
        data = buf[pl.gather_dst[j] : pl.gather_dst[j] + pl.gather_len[j]].tobytes()
        n = int(plan.piece_dsize[p])
        code = int(plan.piece_codec[p])
        if code == 1:
            out = _lz4_block_decode(data, n)  # into ``n`` bytes
        elif code == 3:
            out = zlib.decompressobj(-15).decompress(data, n + 1)  # one byte more tells a longer stream
        else:
            out = bytes(zstd.decode_within(data, DecodeLimit(n, True)))
        if len(out) != n:
            raise ValueError(f"piece {p} decoded to {len(out)} bytes, expected {n}")
        buf[pl.decode_at[p] : pl.decode_at[p] + n] = np.frombuffer(out, np.uint8)


def unshuffle_cpu(plan: BloscPlan, pl: Placement, buf: np.ndarray) -> np.ndarray:
    """Every block of the output from the decoded streams (the unshuffle kernel's work, vectorised)."""
    result = np.zeros(plan.n * plan.stride, np.uint8)
    for b in range(plan.nblocks):
        dst, size = int(plan.block_dst[b]), int(plan.block_size[b])
        if plan.block_mode[b] == BIT_UNSHUFFLE:
            result[dst : dst + size] = bit_unshuffle_block(plan, pl.piece_at, b, buf)
        else:
            result[dst : dst + size] = buf[unshuffle_sources(plan, pl.piece_at, b)]
    return result


def decode_plan_cpu(plan: BloscPlan, host: np.ndarray, in_total: int | None = None) -> np.ndarray:
    """Run ``plan`` on the CPU with the GPU path's layout and arithmetic: the reference executor.

    Returns ``n * stride`` bytes (chunk i at ``i * stride``): the steps of
    :mod:`.gpu_blosc` (upload, gather, decode, unshuffle) done by
    :func:`working_buffer`, :func:`gather_cpu`, :func:`decode_pieces_cpu` and
    :func:`unshuffle_cpu`. Used by the tests to prove the plan against
    numcodecs; not a fast path.
    """
    in_total = int(host.size) if in_total is None else in_total
    pl = place(plan, in_total)
    buf = working_buffer(plan, pl, host, in_total)
    gather_cpu(pl, buf)
    decode_pieces_cpu(plan, pl, buf)
    return unshuffle_cpu(plan, pl, buf)
