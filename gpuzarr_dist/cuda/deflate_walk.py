"""CUDA sources that check deflate data on the device before nvCOMP decodes it (no cupy needed to import).

The sources are ``kernels/deflate_walk.cu`` and ``kernels/adler32.cu`` (:func:`.sources.source`).

nvCOMP 6.0's Deflate decoder trusts its input: on a GPU fuzz run (12,000
damaged chunks) it hung 13 times, always on a truncated or overwritten deflate
stream, and a hang inside nvCOMP cannot be interrupted. ``DEFLATE_WALK_SRC``
is a full inflate that writes nothing (RFC 1951: block headers, stored
blocks, fixed and dynamic Huffman codes, every symbol and distance), one
thread per stream, so a stream whose structure is invalid never reaches
nvCOMP. It also reads the zlib (RFC 1950) and gzip (RFC 1952) wrappers, and
requires the deflate data to end exactly where the trailer starts.

What the walk cannot see is a stream that is valid deflate but decodes to
other bytes: the checksums after the decode catch those (``ADLER32_SRC`` for
zlib and Blosc's zlib streams, the CRC-32 kernel of :mod:`.kernels` for gzip).

Both sources are plain C apart from the ``__global__``/``__device__`` markers
and the thread index: the tests compile them with a host C++ compiler and run
them on the CPU against zlib.
"""

from __future__ import annotations

from gpuzarr_dist.cuda.sources import source

#: ``wrap`` argument of ``deflate_walk``: what surrounds the deflate data
DEFLATE_RAW, DEFLATE_ZLIB, DEFLATE_GZIP = 0, 1, 2

#: negative results of ``deflate_walk``: why a stream is kept from nvCOMP
DEFLATE_WALK_REASONS: dict[int, str] = {
    -1: "stream shorter than its header and trailer",
    -2: "zlib header is invalid (method, window size, check bits or preset dictionary)",
    -3: "not a gzip member (magic bytes or compression method)",
    -4: "gzip header has reserved flag bits set",
    -5: "gzip header's optional fields (extra, name, comment, header CRC) run past the member",
    -6: "deflate block of the reserved type 3",
    -7: "deflate stored block lengths do not match (LEN != ~NLEN)",
    -8: "deflate stored block runs past the end of the data",
    -9: "deflate dynamic block states too many length or distance codes",
    -10: "deflate code-length code is oversubscribed or incomplete",
    -11: "deflate code-length repeat (16) with no previous length",
    -12: "deflate code-length repeat runs past the number of codes",
    -13: "deflate code lengths use an invalid code",
    -14: "deflate literal/length code has no end-of-block code",
    -15: "deflate literal/length code is oversubscribed or incomplete",
    -16: "deflate distance code is oversubscribed or incomplete",
    -17: "deflate data uses an invalid literal/length code",
    -18: "deflate data uses an invalid distance code",
    -19: "deflate distance reaches before the start of the output",
    -20: "deflate data decodes to more bytes than the chunk holds",
    -21: "deflate data is truncated (runs past the end of the stream)",
    -22: "deflate data ends before the trailer (bytes between the end of the data and the checksum)",
}

DEFLATE_WALK_SRC = source("deflate_walk.cu")

#: bytes of decoded data each thread of :data:`ADLER32_SRC`'s ``adler32_segments`` sums
ADLER32_SEGMENT = 4096

ADLER32_SRC = source("adler32.cu")


def walk_reason(code: int, expected: int | None = None) -> str:
    """The message for one result of ``deflate_walk`` that keeps a stream from nvCOMP."""
    if code >= 0:
        return f"deflate data decodes to {code} bytes, expected {expected}"
    return DEFLATE_WALK_REASONS.get(code, f"deflate walk code {code}")
