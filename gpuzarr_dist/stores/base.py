"""The interface every chunk source implements."""

from __future__ import annotations

import stat
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from gpuzarr_dist.stores.ranges import ByteRange, MergedRead


def staging_layout(sizes: Sequence[int], align: int, lead: int = 0) -> tuple[list[int], int]:
    """Offsets for chunks of ``sizes`` (-1: missing) in one buffer, each ``offset + lead`` aligned; and the total."""
    pad = (-lead) % align
    offsets, total = [], 0
    for n in sizes:
        offsets.append(total + pad)
        total += 0 if n < 0 else (pad + n + align - 1) // align * align
    return offsets, total


def stored_refusal(mode: int, size: int, limit: int | None, what: str = "chunk") -> str | None:
    """Why a stored chunk of file type ``mode`` (``st_mode``) and ``size`` bytes must not be read, or ``None``.

    Only regular files are read (a device such as ``/dev/zero``, a pipe or a socket never ends, or blocks);
    and none larger than ``limit`` (see :attr:`ChunkStore.object_limit`).
    """
    if not stat.S_ISREG(mode):
        kinds = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a pipe"),
                 (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))
        kind = next((name for test, name in kinds if test(mode)), "not a regular file")
        return f"the {what}'s file is {kind}, not a regular file; refusing to read it"
    if limit is not None and size > limit:
        return (f"the {what}'s file holds {size} bytes, more than a {what} of this array can take stored "
                f"({limit} bytes: its decoded size, what its codecs may add, and a margin); refusing to read it")
    return None


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
        from gpuzarr_dist.errors import ChunkReadError

        raise ChunkReadError(array, key, "chunk key would point outside the array's folder; refusing to read it")
    return key


class ChunkStore(ABC):
    """Reads the stored bytes of many chunks of one array at once.

    Implementations must be picklable and hold no open handles or GPU state,
    since dask ships them to workers inside task arguments.
    """

    #: what to call the array in messages
    array: str

    #: the most bytes one stored chunk may hold, or ``None`` (no limit): a chunk object larger than this is
    #: refused with :class:`~gpuzarr_dist.errors.ChunkReadError` before it is read (local files: before any
    #: allocation). The block reader sets it from the codec chain (``CodecPipeline.stored_limit``: the chunk's
    #: decoded size plus what its codecs may add, plus a margin); byte ranges of shards are bounded by their
    #: index instead.
    object_limit: int | None = None

    @abstractmethod
    def read_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """The bytes of each chunk key (relative to the array), ``None`` where absent."""

    def read_into(self, keys: Sequence[str], staging: Callable[[int], Any], align: int = 256, lead: int = 0) -> tuple[Any, list[int], list[int]]:
        """Read chunks into one staging buffer at ``align``-ed offsets.

        ``staging(nbytes)`` returns a writable uint8 buffer of at least
        ``nbytes`` (pinned host memory on the GPU path). Chunk ``i`` lands at
        ``offsets[i]``, chosen so that ``offsets[i] + lead`` is a multiple of
        ``align`` (``lead`` skips a codec's framing header). Returns
        ``(buffer, offsets, sizes)``; a missing chunk has size -1. This
        generic version reads with :meth:`read_many` and copies; local files
        override it to read straight into the buffer.
        """
        from gpuzarr_dist.stores.copies import Move, scatter

        raw = self.read_many(keys)
        sizes = [-1 if b is None else len(b) for b in raw]
        offsets, total = staging_layout(sizes, align, lead)
        buf = staging(total)
        scatter(buf, [Move(off, b, 0, n) for b, off, n in zip(raw, offsets, sizes) if n > 0])
        return buf, offsets, sizes

    #: gap below which ranges of one object are read together (``gpuzarr.shards.merge-gap`` overrides it):
    #: small for local files (a system call is cheap), larger for object stores (a request is not)
    merge_gap_default: int = 64 * 1024

    #: a call that needs every inner chunk of a shard reads that shard object whole, in one request that
    #: also brings its index (instead of an index read, then a range read): for object stores, where a
    #: request costs a round trip; local files read the index and scatter the ranges into place instead
    whole_shards: bool = False

    #: the GPU path's blocks take turns reading from this store (``gpuzarr.gpu.read-slots``): local files,
    #: whose reads share the host's bandwidth (measured); not object stores, whose requests in flight are
    #: capped per process already (``gpuzarr.remote.concurrency``), and where one block may not fill them
    read_turns: bool = False

    #: an object store (requests over a network, capped per process): ``chunks="auto"`` blocks are at most
    #: ``gpuzarr.remote.block-size``, so that blocks decode while the process's other requests are in flight
    object_store: bool = False

    @contextmanager
    def held(self, keys: Sequence[str]) -> Iterator[None]:
        """Inside the ``with`` block, this thread's :meth:`read_ranges` and :meth:`read_ranges_into` calls on
        ``keys`` reuse what one opening of them gives (local files: a block's shard files opened once for its
        index reads and its range reads, not twice). Nothing here."""
        yield

    def read_ranges(self, requests: Sequence[ByteRange]) -> list[Any]:
        """The bytes of each :class:`~.ranges.ByteRange`, ``None`` where the object is absent.

        A range that runs past the end of its object gives the bytes up to the
        end (fewer than asked, possibly none); a suffix range longer than the
        object gives the whole object. Callers check the lengths and name what
        was short. This generic version reads whole objects with
        :meth:`read_many`; stores that can read ranges override it.
        """
        keys = list(dict.fromkeys(r.key for r in requests))
        whole = dict(zip(keys, self.read_many(keys)))
        out: list[Any] = []
        for key, off, n in requests:
            data = whole[key]
            if data is None:
                out.append(None)
                continue
            view = memoryview(data).cast("B")
            out.append(view[max(0, len(view) + off) :] if off < 0 else view[off : off + n])
        return out

    def prepare_ranges(self, reads: Sequence[MergedRead], nbytes: int) -> Any:
        """What :meth:`read_ranges_into` can work out for ``reads`` into a buffer of ``nbytes`` before that
        buffer exists (a GPU block asks before its read turn); passed back to it as ``prepared``. Nothing here."""
        return None

    def read_ranges_into(self, reads: Sequence[MergedRead], buf: Any, prepared: Any = None) -> list[int]:
        """Read each merged range and put each of its pieces at ``piece.dest`` in ``buf``.

        Returns, per read, the number of bytes the object held from the read's
        offset on (at most the read's length; -1 where the object is absent).
        Pieces past that point are left unwritten: the caller checks. This
        generic version copies from :meth:`read_ranges`; local files scatter
        straight into ``buf``.
        """
        from gpuzarr_dist.stores.copies import Move, scatter

        got = self.read_ranges([ByteRange(r.key, r.offset, r.length) for r in reads])
        sizes, moves = [], []
        for r, data in zip(reads, got):
            if data is None:
                sizes.append(-1)
                continue
            have = len(memoryview(data).cast("B"))
            for off, n, dest in r.pieces:
                lo = off - r.offset
                moves.append(Move(dest, data, lo, max(0, min(n, have - lo))))
            sizes.append(have)
        scatter(buf, moves)
        return sizes

    @abstractmethod
    def token(self) -> str:
        """A string that identifies the location, for dask task names (no credentials)."""
