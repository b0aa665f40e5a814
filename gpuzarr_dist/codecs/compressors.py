"""Compressors and checksums (bytes -> bytes), decoded on the CPU through numcodecs.

GPU batch decoders for the same names live in :mod:`.gpu`.
"""

from __future__ import annotations

from typing import Any

import google_crc32c
import numcodecs
import numpy as np

from gpuzarr_dist.codecs.base import BytesBytesCodec


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

    def encode_options(self) -> dict:
        opts = super().encode_options()
        if self.config.get("checksum"):
            opts["checksum"] = True
        return opts


class GZip(_Numcodecs):
    name = "gzip"
    gpu_decode = True
    numcodecs_cls = numcodecs.GZip


class Zlib(_Numcodecs):
    name = "zlib"
    gpu_decode = True
    numcodecs_cls = numcodecs.Zlib


class LZ4(_Numcodecs):
    """numcodecs LZ4: a 4-byte little-endian decompressed size, then an LZ4 block."""

    name = "lz4"
    gpu_decode = True
    numcodecs_cls = numcodecs.LZ4


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


class Crc32c(BytesBytesCodec):
    """Zarr v3 ``crc32c``: the data followed by its CRC32C as 4 little-endian bytes."""

    name = "crc32c"
    gpu_decode = True

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

