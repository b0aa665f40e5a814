"""Compressors and checksums (bytes -> bytes), decoded on the CPU through numcodecs, within bounds.

GPU batch decoders for the same names live in :mod:`gpuzarr_dist.cuda`.

Every decode here is bounded by a :class:`DecodeLimit` that the codec chain
gives (:func:`chain_limits`): the chunk's exact decoded size where the chain
fixes it (the compressor next to the ``bytes`` codec), else a bound. A frame
that states a larger size (zstd's frame content size, lz4's size prefix,
Blosc's header) is refused before anything is allocated; a stream that
states none (zstd without a content size, gzip, zlib) is decoded into a
buffer of the limit's size and refused as soon as it would pass it. So a
small chunk that expands to gigabytes costs no more memory than the chunk
should have decoded to.
"""

from __future__ import annotations

import gzip
import io
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import google_crc32c
import numcodecs
import numpy as np

from gpuzarr_dist.codecs.base import BytesBytesCodec

#: the extra bytes :func:`compressed_bound` allows beyond an eighth of the input
BOUND_SLACK = 64 << 10


def compressed_bound(nbytes: int) -> int:
    """The most bytes a compressor's output holds for ``nbytes`` of input: ``nbytes + nbytes // 8 + 64 KiB``.

    zstd, lz4, deflate, Blosc, bz2 and lzma all stay below it (their worst
    cases, stored or incompressible data, add well under 1% and a header).
    It bounds the decoded size of a codec whose output another compressor
    compressed, and the stored size of a chunk.
    """
    return nbytes + nbytes // 8 + BOUND_SLACK


@dataclass(frozen=True)
class DecodeLimit:
    """What one bytes -> bytes decode of a chunk may produce: exactly ``size`` bytes (``exact``) or at most ``size``."""

    size: int
    exact: bool

    def expected(self) -> str:
        return f"expected {self.size}" if self.exact else f"expected at most {self.size}"

    def refuse(self, stated: int) -> bool:
        """Whether a decoded size of ``stated`` bytes breaks the limit."""
        return stated != self.size if self.exact else stated > self.size

    def check(self, nbytes: int, what: str = "decoded to") -> None:
        """Raise ``ValueError`` where ``nbytes`` decoded bytes break the limit."""
        if self.refuse(nbytes):
            raise ValueError(f"{what} {nbytes} bytes, {self.expected()}")


def buffer_nbytes(buf: Any) -> int:
    """The bytes a decoded buffer (bytes-like or numpy array) holds."""
    nbytes = getattr(buf, "nbytes", None)
    return int(nbytes) if nbytes is not None else memoryview(buf).nbytes


def encoded_limit(codec: Any, limit: DecodeLimit) -> DecodeLimit:
    """The limit on ``codec``'s encoded output, given the limit on its decoded output.

    A codec states it with ``encoded_limit(limit)`` (crc32c: 4 bytes more,
    exactly); any other is taken as a compressor (:func:`compressed_bound`).
    """
    own = getattr(codec, "encoded_limit", None)
    if own is not None:
        return own(limit)
    return DecodeLimit(compressed_bound(limit.size), False)


def chain_limits(decoded: DecodeLimit, codecs: Sequence[Any]) -> tuple[list[DecodeLimit], DecodeLimit]:
    """The limit of each bytes -> bytes codec's decode (``codecs`` innermost first, as in the metadata), and
    the limit on the stored chunk; ``decoded`` is the limit on what the array -> bytes codec takes."""
    limits = []
    for codec in codecs:
        limits.append(decoded)
        decoded = encoded_limit(codec, decoded)
    return limits, decoded


def unsized_limit() -> DecodeLimit:
    """The limit where the chain fixes no decoded size: at most ``gpuzarr.max-unsized-chunk``."""
    from gpuzarr_dist.config import max_unsized_chunk_bytes

    return DecodeLimit(max_unsized_chunk_bytes(), False)


def array_bytes_limit(codec: Any, layout: Any) -> DecodeLimit:
    """The limit on what the array -> bytes ``codec`` takes for a chunk of ``layout``: exactly the chunk's bytes
    for ``bytes`` and a fixed-size data type, else :func:`unsized_limit`."""
    if getattr(codec, "name", None) == "bytes" and not layout.dtype.hasobject:
        return DecodeLimit(layout.nbytes, True)
    return unsized_limit()


def stored_size_limit(stored: DecodeLimit) -> int:
    """The most bytes a stored chunk may hold before it is refused unread, given the chain's limit on its stored
    size (:func:`chain_limits`): that limit, plus an eighth and 64 KiB more (:func:`compressed_bound`), so that a
    chunk a little too long still reaches its decoder, which says what is wrong with it."""
    return compressed_bound(stored.size)


def decode_within(codec: Any, data: Any, limit: DecodeLimit) -> Any:
    """``codec``'s decode of ``data`` within ``limit`` (``ValueError`` beyond it).

    A codec with a bounded decoder of its own (``decode_within``) never
    produces more than the limit; any other decodes first and is checked after.
    """
    own = getattr(codec, "decode_within", None)
    if own is not None:
        return own(data, limit)
    out = codec.decode(data)
    limit.check(buffer_nbytes(out))
    return out


def _flat(data: Any) -> memoryview:
    return memoryview(data).cast("B") if not isinstance(data, np.ndarray) else memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8))


class _Numcodecs(BytesBytesCodec):
    """A compressor whose CPU decode is a numcodecs codec (they release the GIL)."""

    numcodecs_cls: Any

    def __init__(self, **config: Any):
        super().__init__(**config)
        self._codec = self.numcodecs_cls()  # decoding needs no configuration

    def decode(self, data: Any) -> Any:
        return self._codec.decode(data)

    def encode(self, data: Any) -> Any:
        """Compress one chunk's bytes with the configured level (numcodecs releases the GIL)."""
        enc = self.__dict__.get("_encoder")
        if enc is None:
            enc = self._encoder = self.numcodecs_cls(**self.encode_options())
        return enc.encode(data)

    def encode_options(self) -> dict:
        """numcodecs constructor arguments from the metadata configuration."""
        return {k: v for k, v in self.config.items() if k == "level" and v is not None}


class Zstd(_Numcodecs):
    name = "zstd"
    gpu_decode = True
    numcodecs_cls = numcodecs.Zstd

    def decode_within(self, data: Any, limit: DecodeLimit) -> Any:
        """Decode within ``limit``: stated content sizes are checked first, and frames that state none decode
        into a buffer of the limit's size (exact limit) or only where their blocks cannot pass it."""
        view = _flat(data)
        if limit.exact and zstd_first_size(view) == limit.size:  # the usual chunk: one frame of the right size
            return self._codec.decode(view, out=np.empty(limit.size, dtype=np.uint8))
        stated, most = zstd_sizes(view, limit.size)
        if stated and limit.refuse(most):
            amount = f"at least {most}" if most > limit.size else str(most)
            raise ValueError(f"zstd frames state {amount} decoded bytes, {limit.expected()}")
        if limit.exact:  # numcodecs decodes exactly len(out) bytes where no size is stated, and fails otherwise
            try:
                return self._codec.decode(view, out=np.empty(limit.size, dtype=np.uint8))
            except RuntimeError as e:
                if stated:
                    raise
                raise ValueError(f"zstd frames that state no decoded size did not decode to {limit.size} bytes "
                                 f"within a buffer of that size ({e})") from None
        if most > limit.size:
            raise ValueError(f"zstd frames that state no decoded size may decode to more than {limit.size} bytes, "
                             f"{limit.expected()}")
        return self._codec.decode(view)  # at most ``most`` bytes

    def encode_options(self) -> dict:
        opts = super().encode_options()
        if self.config.get("checksum"):
            opts["checksum"] = True
        return opts


class GZip(_Numcodecs):
    name = "gzip"
    gpu_decode = True
    numcodecs_cls = numcodecs.GZip

    def decode_within(self, data: Any, limit: DecodeLimit) -> Any:
        """Decode (as numcodecs does, through Python's ``gzip``) into a buffer of the limit's size, reading one
        byte more to tell a longer stream."""
        out = np.empty(limit.size, dtype=np.uint8)
        with gzip.GzipFile(fileobj=io.BytesIO(_flat(data)), mode="rb") as f:
            got = f.readinto(out)
            if f.read(1):
                raise ValueError(f"decoded to more than {limit.size} bytes, {limit.expected()}")
        limit.check(got)
        return out if got == limit.size else out[:got]


class Zlib(_Numcodecs):
    name = "zlib"
    gpu_decode = True
    numcodecs_cls = numcodecs.Zlib

    def decode_within(self, data: Any, limit: DecodeLimit) -> Any:
        """Decode as ``zlib.decompress`` does (bytes after the stream ignored), producing at most one byte more
        than the limit."""
        d = zlib.decompressobj()
        out = d.decompress(_flat(data), limit.size + 1)
        if len(out) > limit.size:
            raise ValueError(f"decoded to more than {limit.size} bytes, {limit.expected()}")
        if not d.eof:
            raise zlib.error("Error -5 while decompressing data: incomplete or truncated stream")
        limit.check(len(out))
        return out


class LZ4(_Numcodecs):
    """numcodecs LZ4: a 4-byte little-endian decompressed size, then an LZ4 block."""

    name = "lz4"
    gpu_decode = True
    numcodecs_cls = numcodecs.LZ4

    def decode_within(self, data: Any, limit: DecodeLimit) -> Any:
        """The size prefix checked against the limit before numcodecs allocates what it states."""
        view = _flat(data)
        if len(view) >= 4:
            stated = int.from_bytes(view[:4], "little", signed=True)
            if stated > 0 and limit.refuse(stated):
                raise ValueError(f"lz4 prefix states {stated} decoded bytes, {limit.expected()}")
        return self._codec.decode(view)


class Blosc(_Numcodecs):
    """Blosc1 frames; the frame header says how it was shuffled and compressed."""

    name = "blosc"
    gpu_decode = True  # lz4, lz4hc, zlib, zstd frames (codecs/gpu_blosc.py); blosclz and snappy fall back
    numcodecs_cls = numcodecs.Blosc

    def decode(self, data: Any) -> Any:
        # c-blosc trusts the header and reads past a truncated buffer: check its length first
        view = memoryview(data).cast("B")
        if len(view) < 16:
            raise ValueError(f"blosc frame of {len(view)} bytes is shorter than its 16-byte header")
        cbytes = int.from_bytes(view[12:16], "little")  # Blosc1 header: nbytes @4, blocksize @8, cbytes @12
        if cbytes != len(view):
            raise ValueError(f"blosc header states {cbytes} compressed bytes, the chunk holds {len(view)}")
        return self._codec.decode(view)

    def decode_within(self, data: Any, limit: DecodeLimit) -> Any:
        """The decoded size the header states checked against the limit before c-blosc allocates it."""
        view = _flat(data)
        if len(view) >= 16:
            stated = int.from_bytes(view[4:8], "little", signed=True)  # Blosc1 header: nbytes @4
            if limit.refuse(stated):
                raise ValueError(f"blosc header states {stated} decoded bytes, {limit.expected()}")
        return self.decode(view)


class Crc32c(BytesBytesCodec):
    """Zarr v3 ``crc32c``: the data followed by its CRC32C as 4 little-endian bytes."""

    name = "crc32c"
    gpu_decode = True

    def encoded_limit(self, limit: DecodeLimit) -> DecodeLimit:
        """Four bytes more than the data: exact where the data's size is."""
        return DecodeLimit(limit.size + 4, limit.exact)

    def decode(self, data: Any) -> Any:
        view = memoryview(data).cast("B")
        if len(view) < 4:
            raise ValueError(f"chunk of {len(view)} bytes is too short to hold a crc32c checksum")
        body, stored = view[:-4], int.from_bytes(view[-4:], "little")
        actual = crc32c_value(body)  # no copy of the chunk
        if actual != stored:
            raise ValueError(f"crc32c mismatch: stored {stored:#010x}, computed {actual:#010x}")
        return body

    def encode(self, data: Any) -> Any:
        body = memoryview(data).cast("B")
        return b"".join((body, crc32c_value(body).to_bytes(4, "little")))  # one copy of the chunk, not three


def crc32c_value(buf: Any) -> int:
    """The CRC32C of a bytes-like object without copying it (google_crc32c takes bytes or read-only numpy arrays)."""
    if isinstance(buf, bytes):
        return google_crc32c.value(buf)
    view = np.frombuffer(buf, dtype=np.uint8)
    view.flags.writeable = False
    return google_crc32c.value(view)



# -- zstd frame headers ---------------------------------------------------------------------------

ZSTD_MAGIC = 0xFD2FB528
#: the most bytes one compressed zstd block decodes to (RFC 8878: Block_Maximum_Size)
ZSTD_BLOCK_MAX = 128 << 10


def _zstd_header(view: memoryview, pos: int) -> tuple[int, int | None, bool]:
    """``(end of the header, stated content size or None, has a checksum)`` of the zstd frame at ``pos``."""
    n = len(view)
    if n - pos < 5 or int.from_bytes(view[pos : pos + 4], "little") != ZSTD_MAGIC:
        raise ValueError("not a zstd frame (bad magic number or too short)")
    fhd = view[pos + 4]
    fcs_flag, single, dict_flag = fhd >> 6, (fhd >> 5) & 1, fhd & 3
    if fhd & 0x08:
        raise ValueError("zstd frame header sets its reserved bit")
    fcs_bytes = (1 if single else 0, 2, 4, 8)[fcs_flag]
    at = pos + 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
    end = at + fcs_bytes
    if end > n:
        raise ValueError("zstd frame header is truncated")
    if not fcs_bytes:
        return end, None, bool(fhd & 4)
    size = int.from_bytes(view[at:end], "little") + (256 if fcs_bytes == 2 else 0)
    return end, size, bool(fhd & 4)


def zstd_first_size(view: memoryview) -> int | None:
    """The content size the first zstd frame of ``view`` states, or None (none stated, or not a zstd frame)."""
    try:
        return _zstd_header(view, 0)[1]
    except ValueError:
        return None


def zstd_sizes(view: memoryview, cap: int) -> tuple[bool, int]:
    """``(stated, most)`` for the zstd frames of ``view``, read from their headers without decoding.

    ``most`` is the most bytes they decode to: the content sizes the frames
    state, and for a frame that states none, each block's own size (raw and
    RLE blocks) or :data:`ZSTD_BLOCK_MAX` (compressed ones). ``stated``:
    every frame read states its size (``most`` is then their exact total).
    Stops reading once ``most`` passes ``cap``. Raises ``ValueError`` for
    bytes that are not zstd frames (skippable frames count as none).
    """
    pos, n, most, stated = 0, len(view), 0, True
    while pos < n and most <= cap:
        if n - pos >= 8 and int.from_bytes(view[pos : pos + 4], "little") & 0xFFFFFFF0 == 0x184D2A50:
            pos += 8 + int.from_bytes(view[pos + 4 : pos + 8], "little")  # a skippable frame
            continue
        pos, size, checksum = _zstd_header(view, pos)
        if size is not None:
            most += size
            if most > cap:
                break
        else:
            stated = False
        while True:  # the blocks: 3-byte headers (last flag, type, size)
            if pos + 3 > n:
                raise ValueError("zstd frame is truncated")
            head = int.from_bytes(view[pos : pos + 3], "little")
            last, kind, bsize = head & 1, (head >> 1) & 3, head >> 3
            pos += 3
            if kind == 3:
                raise ValueError("zstd frame has a block of the reserved type")
            if size is None:
                most += bsize if kind != 2 else ZSTD_BLOCK_MAX
            pos += 1 if kind == 1 else bsize
            if last or (size is None and most > cap):
                break
        pos += 4 if checksum else 0
    if pos > n and most <= cap:
        raise ValueError("zstd frame is truncated")
    return stated, most
