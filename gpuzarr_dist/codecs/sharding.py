"""The index of a Zarr v3 shard (``sharding_indexed``): where each inner chunk's bytes are.

The index is a ``(*chunks_per_shard, 2)`` uint64 array of (offset, nbytes)
pairs in C order, encoded with the index codecs (``bytes`` and, usually,
``crc32c``) and stored at the start or the end of the shard. An inner chunk
that was never written has both entries set to 2**64 - 1.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gpuzarr_dist.codecs.compressors import crc32c_value
from gpuzarr_dist.codecs.pipeline import CodecPipeline
from gpuzarr_dist.core.metadata import ArraySpec
from gpuzarr_dist.errors import ChunkDecodeError, MetadataError

MISSING = np.uint64(2**64 - 1)


class ShardIndex:
    """Decodes shard indexes of one sharded array."""

    def __init__(self, spec: ArraySpec):
        per = spec.chunks_per_shard
        #: the index lies in the C order of the transposed shard's grid where a transpose precedes the sharding
        self.order = spec.shard_transpose
        self.grid = tuple(per[o] for o in self.order) if self.order else per
        index_spec = ArraySpec(
            name=f"{spec.name} (shard index)",
            shape=(*self.grid, 2),
            chunk_shape=(*self.grid, 2),
            dtype=np.dtype("uint64"),
            fill_value=np.uint64(0),
            zarr_format=3,
            codecs=spec.shard_index_codecs,
            key_prefix="c",
            key_separator="/",
            metadata_key="zarr.json",
        )
        self.pipeline = CodecPipeline(index_spec)
        extra = 0
        for codec in self.pipeline.bytes_bytes:
            if codec.name != "crc32c":
                raise MetadataError(
                    f"{spec.name}: zarr.json sharding index_codecs: {codec.name!r} is not supported by gpuzarr-dist (only bytes and crc32c are)"
                )
            extra += 4
        self.array = spec.name
        self.count = math.prod(per)
        self.nbytes = self.count * 16 + extra
        self.at_end = spec.shard_index_location == "end"

    def decode(self, raw: Any, key: str) -> np.ndarray:
        """``(count, 2)`` int64 offsets and sizes from the encoded index bytes of shard ``key`` (-1 rows where absent).

        Raises :class:`ChunkDecodeError` naming the shard for an index that is
        truncated, fails its checksum, or holds offsets no object can have.
        """
        view = memoryview(raw).cast("B")
        if len(view) != self.nbytes:
            raise ChunkDecodeError(self.array, key, f"shard index is truncated: {len(view)} of its {self.nbytes} bytes")
        index = self._to_array_order(self.pipeline.decode_chunk(view, f"{key} (index)").reshape(self.count, 2))
        missing = (index[:, 0] == MISSING) & (index[:, 1] == MISSING)
        present = ~missing
        if (index[present] >= np.uint64(2**62)).any():
            raise ChunkDecodeError(self.array, key, "shard index holds an offset or size past any object's end")
        out = index.astype(np.int64, copy=True)
        out[missing] = -1
        return out

    def decode_many(self, raws: list[Any], keys: list[str]) -> list[np.ndarray | None]:
        """:meth:`decode` of each of ``raws`` (``None`` stays ``None``), numpy over all of them at once.

        For the usual index codecs (``bytes``, then ``crc32c`` or nothing) the
        indexes are checked and read as one array, not one by one through the
        codec pipeline (about 2 ms of Python, the GIL held, for a block's 56
        shard indexes). A row that fails a check
        is decoded again by :meth:`decode`, which raises its error.
        """
        present = [i for i, r in enumerate(raws) if r is not None]
        out: list[np.ndarray | None] = [None] * len(raws)
        fast = self._plain()
        if fast is None or len(present) < 2:
            for i in present:
                out[i] = self.decode(raws[i], keys[i])
            return out
        dtype, n_crc = fast
        views = [memoryview(raws[i]).cast("B") for i in present]
        for i, v in zip(present, views):
            if len(v) != self.nbytes:
                self.decode(raws[i], keys[i])  # raises: truncated
        block = np.frombuffer(b"".join(views), dtype=np.uint8).reshape(len(present), self.nbytes)
        end = self.nbytes
        for _ in range(n_crc):  # the outermost checksum is the last 4 bytes; each covers what precedes it
            stored = block[:, end - 4 : end].copy().view("<u4").reshape(-1)
            for j in range(len(present)):
                if crc32c_value(block[j, : end - 4]) != int(stored[j]):
                    self.decode(raws[present[j]], keys[present[j]])  # raises: checksum
            end -= 4
        index = block[:, : self.count * 16].copy().view(dtype).reshape(len(present), self.count, 2).astype(np.uint64)
        if self.order:
            index = np.stack([self._to_array_order(ix) for ix in index]) if len(index) else index
        missing = (index[..., 0] == MISSING) & (index[..., 1] == MISSING)
        far = ((index >= np.uint64(2**62)) & ~missing[..., None]).any(axis=(1, 2))
        for j in np.flatnonzero(far).tolist():
            self.decode(raws[present[j]], keys[present[j]])  # raises: an offset past any object's end
        rows = index.astype(np.int64)
        rows[missing] = -1
        for j, i in enumerate(present):
            out[i] = rows[j]
        return out

    def _to_array_order(self, index: np.ndarray) -> np.ndarray:
        """``(count, 2)`` index rows in the transposed grid's C order -> in the array grid's C order."""
        if not self.order:
            return index
        nd = len(self.order)
        back = [int(a) for a in np.argsort(self.order)]
        return np.ascontiguousarray(index.reshape(*self.grid, 2).transpose(*back, nd)).reshape(self.count, 2)

    def _plain(self) -> tuple[str, int] | None:
        """``(uint64 dtype string, number of crc32c layers)`` where the index codecs are ``bytes`` and crc32c
        checksums only (what :meth:`decode_many` reads in one go), else ``None``."""
        p = self.pipeline
        if p.array_array or p.array_bytes.name != "bytes" or any(c.name != "crc32c" for c in p.bytes_bytes):
            return None
        endian = getattr(p.array_bytes, "endian", "little") or "little"
        return ("<u8" if endian == "little" else ">u8"), len(p.bytes_bytes)

    def raw_range(self, size: int | None = None) -> tuple[int, int]:
        """``(offset, length)`` of the index inside a shard: a suffix (negative offset) when at the end and ``size`` is unknown."""
        if not self.at_end:
            return 0, self.nbytes
        return (size - self.nbytes, self.nbytes) if size is not None else (-self.nbytes, self.nbytes)

    def raw_of(self, shard: Any) -> memoryview:
        """The encoded index inside a whole shard's bytes (fewer bytes than the index if the shard is that short)."""
        view = memoryview(shard).cast("B")
        return view[max(0, len(view) - self.nbytes) :] if self.at_end else view[: self.nbytes]

    def locate(self, shard: Any, key: str) -> np.ndarray:
        """``(count, 2)`` offsets and sizes of the inner chunks in a whole ``shard`` (-1 rows where absent)."""
        view = memoryview(shard).cast("B")
        if len(view) < self.nbytes:
            raise ChunkDecodeError(self.array, key, f"shard of {len(view)} bytes is shorter than its {self.nbytes}-byte index")
        out = self.decode(self.raw_of(view), key)
        present = out[:, 0] >= 0
        if present.any() and (out[present, 0] + out[present, 1]).max() > len(view):
            raise ChunkDecodeError(self.array, key, "shard index points past the end of the shard")
        return out

    def grid_of_array(self) -> tuple[int, ...]:
        """The shard's grid of inner chunks in the array's own axes."""
        if not self.order:
            return self.grid
        out = [0] * len(self.grid)
        for k, o in enumerate(self.order):
            out[o] = self.grid[k]
        return tuple(out)

    # -- the write side ------------------------------------------------------------
    def build(self, chunks: list[Any], key: str) -> bytes:
        """One shard's stored bytes: the encoded inner chunks (C order of their grid positions,
        ``None`` for absent ones) laid end to end, and the encoded index at the start or the end.

        Offsets in the index count from the start of the shard, so with the
        index first every offset is shifted by the index's length.
        """
        return b"".join(self.build_parts(chunks, key))

    def build_parts(self, chunks: list[Any], key: str) -> list[Any]:
        """The pieces of :meth:`build`'s shard in order, without joining them.

        The inner chunks are returned as given (no copy): a writer that takes
        several buffers (``os.writev``) stores a shard of hundreds of MB without
        first copying it into one ``bytes`` object while holding the GIL.
        """
        if len(chunks) != self.count:
            raise ValueError(f"{self.array}: shard {key!r} needs {self.count} inner chunks, got {len(chunks)}")
        present = [i for i, c in enumerate(chunks) if c is not None]
        parts = [chunks[i] for i in present]
        sizes = np.fromiter((memoryview(c).nbytes for c in parts), dtype=np.uint64, count=len(parts))
        index = np.full((self.count, 2), MISSING, dtype=np.uint64)
        if present:
            ends = np.cumsum(sizes, dtype=np.uint64) + np.uint64(0 if self.at_end else self.nbytes)
            index[present, 0] = ends - sizes
            index[present, 1] = sizes
        if self.order:  # stored in the transposed grid's order
            index = np.ascontiguousarray(index.reshape(*self.grid_of_array(), 2).transpose(*self.order, len(self.order)))
        encoded = self.pipeline.encode_chunk(index.reshape(self.pipeline.layouts[0].shape), f"{key} (index)")
        if len(encoded) != self.nbytes:  # pragma: no cover - bytes + crc32c only, so the size is fixed
            raise ValueError(f"{self.array}: shard index of {key!r} encoded to {len(encoded)} bytes, not {self.nbytes}")
        return [*parts, encoded] if self.at_end else [encoded, *parts]
