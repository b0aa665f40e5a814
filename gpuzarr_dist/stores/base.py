"""The interface every chunk source implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any


def staging_layout(sizes: Sequence[int], align: int, lead: int = 0) -> tuple[list[int], int]:
    """Offsets for chunks of ``sizes`` (-1: missing) in one buffer, each ``offset + lead`` aligned; and the total."""
    pad = (-lead) % align
    offsets, total = [], 0
    for n in sizes:
        offsets.append(total + pad)
        total += 0 if n < 0 else (pad + n + align - 1) // align * align
    return offsets, total


def check_key(array: str, key: str) -> str:
    """``key`` if it is a relative key that stays inside the array's folder; a :class:`ChunkReadError` otherwise.

    Keys are built from integers and a separator checked in the metadata, so
    this never fails for a valid array; it is the last guard before a key
    becomes a path or an object name (no ``..``, ``.`` or empty parts, no
    absolute paths, backslashes or NUL bytes).
    """
    parts = key.split("/")
    if (not key or key.startswith("/") or "\\" in key or "\x00" in key
            or any(p in ("", ".", "..") for p in parts)):
        from ..errors import ChunkReadError

        raise ChunkReadError(array, key, "chunk key would point outside the array's folder; refusing to read it")
    return key


class ChunkStore(ABC):
    """Reads the stored bytes of many chunks of one array at once.

    Implementations must be picklable and hold no open handles or GPU state,
    since dask ships them to workers inside task arguments.
    """

    #: what to call the array in messages
    array: str

    @abstractmethod
    def read_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """The bytes of each chunk key (relative to the array), ``None`` where absent."""

    def read_into(self, keys: Sequence[str], staging: "Callable[[int], Any]", align: int = 256, lead: int = 0) -> tuple[Any, list[int], list[int]]:
        """Read chunks into one staging buffer at ``align``-ed offsets.

        ``staging(nbytes)`` returns a writable uint8 buffer of at least
        ``nbytes`` (pinned host memory on the GPU path). Chunk ``i`` lands at
        ``offsets[i]``, chosen so that ``offsets[i] + lead`` is a multiple of
        ``align`` (``lead`` skips a codec's framing header). Returns
        ``(buffer, offsets, sizes)``; a missing chunk has size -1. This
        generic version reads with :meth:`read_many` and copies; local files
        override it to read straight into the buffer.
        """
        raw = self.read_many(keys)
        sizes = [-1 if b is None else len(b) for b in raw]
        offsets, total = staging_layout(sizes, align, lead)
        buf = staging(total)
        for b, off in zip(raw, offsets):
            if b is not None:
                buf[off : off + len(b)] = memoryview(b).cast("B")
        return buf, offsets, sizes

    @abstractmethod
    def token(self) -> str:
        """A string that identifies the location, for dask task names (no credentials)."""
