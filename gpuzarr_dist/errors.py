"""Exceptions raised by gpuzarr-dist.

Every error that concerns stored data names the array and the chunk key (or the
metadata document and field), so a failure in one task of a large graph can be
traced to the object in the store that caused it.
"""

from __future__ import annotations


class GpuZarrError(Exception):
    """Base class of every error raised by gpuzarr-dist."""


class MetadataError(GpuZarrError, ValueError):
    """Zarr metadata that cannot be read or is inconsistent.

    The message names the metadata document (``zarr.json`` or ``.zarray``) and,
    where known, the field.
    """


class UnsupportedCodecError(MetadataError, NotImplementedError):
    """A codec named in the metadata that no decoder in the registry handles."""

    def __init__(self, codec: str, array: str, known: list[str] | None = None, reason: str | None = None):
        self.codec = codec
        self.array = array
        hint = f" Known codecs: {', '.join(sorted(known))}." if known else ""
        super().__init__(f"{array}: {reason or 'unknown codec'} {codec!r}.{hint}")


class _ChunkCodecError(GpuZarrError, ValueError):
    """A chunk that a codec chain failed on; names the array, the chunk key and the codec."""

    verb = "process"

    def __init__(self, array: str, key: str, reason: str, codec: str | None = None):
        self.array = array
        self.key = key
        self.codec = codec
        self.reason = reason
        where = f" with codec {codec!r}" if codec else ""
        super().__init__(f"{array}: chunk {key!r} failed to {self.verb}{where}: {reason}")


class ChunkDecodeError(_ChunkCodecError):
    """A stored chunk that failed to decode (corrupt, truncated, wrong size, bad checksum)."""

    verb = "decode"


class DeviceUnavailableError(GpuZarrError, RuntimeError):
    """``device="gpu"`` was asked for where no usable GPU stack is installed."""


class ChunkReadError(GpuZarrError, OSError):
    """Reading a chunk's bytes from the store failed (after any retries)."""

    def __init__(self, array: str, key: str, reason: str):
        self.array = array
        self.key = key
        self.reason = reason
        super().__init__(f"{array}: reading chunk {key!r} failed: {reason}")


class ChunkEncodeError(_ChunkCodecError):
    """A chunk that failed to encode while writing (names the array, the chunk key and the codec)."""

    verb = "encode"


class ArrayExistsError(GpuZarrError, FileExistsError):
    """``to_zarr_gpu`` found an array or group at the target and was not told to overwrite or resume."""


class ChunkWriteError(GpuZarrError, OSError):
    """Writing a stored object (chunk or shard) to the store failed."""

    def __init__(self, array: str, key: str, reason: str):
        self.array = array
        self.key = key
        super().__init__(f"{array}: writing {key!r} failed: {reason}")


class GpuOutOfMemoryError(GpuZarrError, MemoryError):
    """The GPU ran out of memory while reading a block; the message says the block size and how to lower it."""

    def __init__(self, array: str, message: str):
        self.array = array
        super().__init__(message)


class UnsupportedDtypeError(GpuZarrError, TypeError):
    """A data type the chosen device cannot hold (strings, bytes, structured or object arrays on the GPU).

    Raised when the graph is built; the message names the array and the data
    type and says to read it with ``device="cpu"``.
    """

    def __init__(self, array: str, dtype: object, device: str = "gpu"):
        self.array = array
        self.dtype = dtype
        super().__init__(
            f"{array}: data type {dtype} cannot be read on the {device.upper()} device (CuPy holds only numbers "
            f"and bools); open it with device=\"cpu\""
        )


class BlockTooLargeError(GpuZarrError, MemoryError):
    """A block larger than the memory of the device that reads it, refused before it is planned or allocated;
    the message names the array, the block's shape and bytes, and how to read smaller blocks."""

    def __init__(self, array: str, message: str):
        self.array = array
        super().__init__(message)
