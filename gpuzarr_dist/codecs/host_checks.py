"""Host-side checks of a batch of stored chunks, vectorised over the batch (no cupy: tested on the CPU).

The GPU decoder (:mod:`.gpu`) checks framing and checksums of every chunk of a
batch before and after nvCOMP runs. A sharded block holds a thousand or more
small inner chunks; a Python loop per chunk (a few microseconds each, more
while 16 threads share the GIL) then costs as much as the decode. These
functions do the same checks with numpy over all chunks at once and name the
first bad chunk exactly as the per-chunk loops did.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from gpuzarr_dist.errors import ChunkDecodeError


def u32_at(host: np.ndarray, pos: Sequence[int] | np.ndarray, big: bool = False) -> np.ndarray:
    """The 4-byte unsigned integers of ``host`` (uint8) starting at each of ``pos``, as int64 (one gather)."""
    pos = np.asarray(pos, dtype=np.int64)
    if not len(pos):
        return np.empty(0, dtype=np.int64)
    b = host[pos[:, None] + np.arange(4)].astype(np.int64)
    shifts = np.array([24, 16, 8, 0] if big else [0, 8, 16, 24], dtype=np.int64)
    return np.bitwise_or.reduce(b << shifts, axis=1)


def first_true(mask: np.ndarray) -> int:
    """The index of the first true entry of ``mask``, or -1."""
    i = int(np.argmax(mask)) if len(mask) else 0
    return i if len(mask) and mask[i] else -1


def check_stated_sizes(codec: str, array: str, host: np.ndarray, offsets: Sequence[int], sizes: Sequence[int],
                       keys: Sequence[str], expected: int,
                       bad_header: Callable[[str, np.ndarray, int, int], str | None]) -> None:
    """Raise :class:`ChunkDecodeError` for the first chunk whose gzip/zlib header is invalid or whose gzip/lz4
    frame states a decoded size other than ``expected`` (zstd and the rest: nothing to check here).

    ``bad_header(codec, host, offset, size)`` gives the reason for a header; it
    runs only for chunks that the vectorised screen flags (a superset of the bad ones).
    """
    if codec not in ("gzip", "zlib", "lz4") or not len(offsets):
        return
    o = np.asarray(offsets, dtype=np.int64)
    n = np.asarray(sizes, dtype=np.int64)
    suspect = np.zeros(len(o), dtype=bool)  # header may be bad: bad_header decides
    stated_bad = np.zeros(len(o), dtype=bool)
    stated = np.full(len(o), -1, dtype=np.int64)
    if codec == "gzip":
        long_enough = n >= 18
        at = np.where(long_enough, o, 0)
        suspect = (~long_enough | (host[at] != 0x1F) | (host[at + 1] != 0x8B) | (host[at + 2] != 8)
                   | ((host[at + 3] & 0xE0) != 0))
        stated = np.where(long_enough, u32_at(host, np.where(long_enough, o + n - 4, 0)), -1)
        stated_bad = stated != expected % (1 << 32)
    elif codec == "zlib":
        long_enough = n >= 6
        at = np.where(long_enough, o, 0)
        cmf, flg = host[at].astype(np.int64), host[at + 1].astype(np.int64)
        suspect = (~long_enough | ((cmf & 0x0F) != 8) | ((cmf >> 4) > 7) | ((cmf * 256 + flg) % 31 != 0)
                   | ((flg & 0x20) != 0))
    else:  # lz4: numcodecs' 4-byte little-endian size prefix
        stated = u32_at(host, o)
        stated_bad = stated != expected
    for i in np.flatnonzero(suspect | stated_bad).tolist():  # in chunk order, as the per-chunk loop raised
        if suspect[i]:
            bad = bad_header(codec, host, int(o[i]), int(n[i]))
            if bad:
                raise ChunkDecodeError(array, keys[i], bad, codec)
        if stated_bad[i]:
            what = "gzip member" if codec == "gzip" else "lz4 prefix"
            raise ChunkDecodeError(array, keys[i], f"{what} states {int(stated[i])} decoded bytes, expected {expected}", codec)


#: verdicts of :func:`zstd_verdicts`, in the order the checks apply to one frame
ZSTD_OK, ZSTD_NOT_FRAME, ZSTD_HEADER_CUT, ZSTD_RESERVED_BLOCK, ZSTD_NO_SIZE, ZSTD_WRONG_SIZE, ZSTD_TRUNCATED, ZSTD_DEEP = range(8)


def zstd_verdicts(fcs: np.ndarray, length: np.ndarray, deep: np.ndarray, sizes: Sequence[int], expected: int) -> np.ndarray:
    """Each frame's verdict from the device walk's outputs (see :func:`gpuzarr_dist.cuda.zstd.zstd_frames`), all frames at once."""
    sz = np.asarray(sizes, dtype=np.int64)
    fcs, length, deep = np.asarray(fcs), np.asarray(length), np.asarray(deep)
    conditions = [
        fcs == -2,
        fcs == -3,
        length == -4,
        (fcs == -1) | (length < sz),
        fcs != expected,
        length > sz,
        deep != 0,
    ]
    return np.select(conditions, list(range(1, 8)), ZSTD_OK)


def zstd_first_error(verdicts: np.ndarray) -> int:
    """The first frame whose verdict stops the batch (anything but OK and DEEP), or -1."""
    return first_true((verdicts != ZSTD_OK) & (verdicts != ZSTD_DEEP))


def zstd_reason(verdict: int, fcs: int, length: int, size: int, expected: int) -> str:
    """The message for a definite zstd error ``verdict`` of one frame."""
    if verdict == ZSTD_NOT_FRAME:
        return "not a zstd frame (bad magic number or too short)"
    if verdict == ZSTD_HEADER_CUT:
        return "zstd frame header is truncated"
    if verdict == ZSTD_RESERVED_BLOCK:
        return "zstd frame has a block of the reserved type"
    if verdict == ZSTD_WRONG_SIZE:
        return f"zstd frame states {fcs} decoded bytes, expected {expected}"
    if verdict == ZSTD_TRUNCATED:
        return f"zstd frame is truncated: its blocks need {length} bytes, the chunk holds {size}"
    raise ValueError(f"zstd verdict {verdict} is not a definite error")


def trailer_mismatches(actual: np.ndarray, host: np.ndarray, positions: Sequence[int] | np.ndarray, big: bool = False,
                       wanted: np.ndarray | None = None) -> list[int]:
    """Indexes ``i`` (where ``wanted[i]``, if given) whose stored 4-byte value at ``positions[i]`` differs from ``actual[i]``."""
    stored = u32_at(host, positions, big)
    bad = np.asarray(actual, dtype=np.int64) != stored
    if wanted is not None:
        bad &= np.asarray(wanted, dtype=bool)
    return np.flatnonzero(bad).tolist()


def size_mismatches(actual: Sequence[int], expected: int) -> list[int]:
    """Indexes of chunks that decoded to a size other than ``expected``."""
    return np.flatnonzero(np.asarray(actual, dtype=np.int64) != expected).tolist()
