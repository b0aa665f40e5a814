"""A codec chain built from an array's metadata, decoding whole batches of chunks.

:meth:`CodecPipeline.decode_batch` is the one call a task makes for all chunks
of its block. On the CPU it runs each chunk's chain on a thread pool (the
numcodecs decoders release the GIL); the GPU path decodes stage by stage, one
batched nvCOMP call per stage (:mod:`.gpu`).

The write side is the same chain run forwards: :meth:`CodecPipeline.encode_batch`
encodes all chunks of a block in one call (CPU thread pool here; the GPU
batch encoder is :mod:`.gpu_encode`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import replace
from typing import Any

import numpy as np

from gpuzarr_dist.codecs.base import ArrayArrayCodec, ArrayBytesCodec, BytesBytesCodec, ChunkLayout
from gpuzarr_dist.codecs.compressors import (
    DecodeLimit,
    array_bytes_limit,
    chain_limits,
    decode_within,
    stored_size_limit,
    unsized_limit,
)
from gpuzarr_dist.codecs.registry import get_codec
from gpuzarr_dist.core.metadata import ArraySpec, CodecSpec, _v3_codecs
from gpuzarr_dist.errors import ChunkDecodeError, ChunkEncodeError, MetadataError
from gpuzarr_dist.runtime.threads import map_all


class CodecPipeline:
    """The decode side of one array's codec chain."""

    def __init__(self, spec: ArraySpec):
        codecs = [NestedShard(c, spec) if c.name == "sharding_indexed" else get_codec(c, spec.name) for c in spec.codecs]
        kinds = [c.kind for c in codecs]
        if kinds.count("array_bytes") != 1:
            raise MetadataError(
                f"{spec.name}: {spec.metadata_key} codecs must hold exactly one array->bytes codec "
                f"(such as 'bytes'), got {[c.name for c in codecs]}"
            )
        ab = kinds.index("array_bytes")
        if any(k != "array_array" for k in kinds[:ab]) or any(k != "bytes_bytes" for k in kinds[ab + 1 :]):
            raise MetadataError(
                f"{spec.name}: {spec.metadata_key} codecs are out of order (array->array, then "
                f"array->bytes, then bytes->bytes): {[c.name for c in codecs]}"
            )
        self.array = spec.name
        self.array_array: list[ArrayArrayCodec] = codecs[:ab]  # type: ignore[assignment]
        self.array_bytes: ArrayBytesCodec = codecs[ab]  # type: ignore[assignment]
        self.bytes_bytes: list[BytesBytesCodec] = codecs[ab + 1 :]  # type: ignore[assignment]
        # layouts[i] is the input layout of array_array[i]; layouts[-1] is what array_bytes yields
        layouts = [ChunkLayout(spec.chunk_shape, spec.dtype)]
        try:
            for c in self.array_array:
                layouts.append(c.resolve(layouts[-1]))
        except ValueError as e:
            raise MetadataError(f"{spec.name}: {spec.metadata_key} codecs: {e}") from e
        self.layouts = layouts
        #: the last filter decodes the stored bytes itself (numcodecs filters): ``bytes`` hands it the raw buffer
        self._raw_filter = bool(self.array_array) and getattr(self.array_array[-1], "raw_input", False) \
            and self.array_bytes.name == "bytes"
        endian = getattr(self.array_bytes, "endian", None)
        for i, c in enumerate(self.array_array):  # numcodecs filters handing back raw bytes: in the stored order
            if getattr(c, "raw_input", False):
                c.byteorder = ">" if endian == "big" else "<"  # type: ignore[attr-defined]
                c.pass_on = i > 0 and getattr(self.array_array[i - 1], "raw_input", False)  # type: ignore[attr-defined]
        #: the stored size of the raw buffer a numcodecs filter gets (``None``: its encoded size is not known)
        self.expected_raw = layouts[-1].nbytes if self._raw_filter and self.array_array[-1].sized else None  # type: ignore[attr-defined]
        taken = array_bytes_limit(self.array_bytes, layouts[-1])
        if self._raw_filter and self.expected_raw is None:  # a filter whose encoded size the chunk does not fix
            taken = unsized_limit()
        limits = chain_limits(taken, self.bytes_bytes)
        #: what each of ``bytes_bytes`` may decode to, and the most bytes a stored chunk may hold before it is
        #: refused unread (see :mod:`.compressors`)
        self.decode_limits: list[DecodeLimit] = limits[0]
        self.stored_limit: int = stored_size_limit(limits[1])

    @property
    def codecs(self) -> list:
        return [*self.array_array, self.array_bytes, *self.bytes_bytes]

    def decode_chunk(self, data: Any, key: str) -> np.ndarray:
        """Decode one stored chunk on the CPU into an array of the chunk's shape and dtype."""
        codec = None
        try:
            for codec, limit in zip(reversed(self.bytes_bytes), reversed(self.decode_limits)):
                data = decode_within(codec, data, limit)  # never more than the chunk should decode to
            codec = self.array_bytes
            if self._raw_filter:  # numcodecs filters view the stored bytes as the type they encoded to
                arr = _raw_bytes(data, self.expected_raw)
            else:
                arr = codec.decode(data, self.layouts[-1])
            for codec, layout in zip(reversed(self.array_array), reversed(self.layouts[:-1])):
                arr = codec.decode(arr, layout)
        except Exception as e:  # any decoder failure is reported against its chunk
            raise ChunkDecodeError(self.array, key, f"{type(e).__name__}: {e}", codec.name if codec else None) from e
        return arr

    def decode_batch(
        self,
        buffers: Sequence[Any],
        keys: Sequence[str],
        pool: Executor,
        sink: Callable[[int, np.ndarray], None] | None = None,
    ) -> list[np.ndarray] | None:
        """Decode all ``buffers`` on the CPU, spread over ``pool``.

        With ``sink``, each decoded chunk is handed to ``sink(i, array)`` on the
        pool thread (so it can be placed into the block at once) and nothing is
        returned; otherwise the decoded chunks are returned in order.
        """

        def one(i: int) -> np.ndarray | None:
            arr = self.decode_chunk(buffers[i], keys[i])
            if sink is None:
                return arr
            sink(i, arr)
            return None

        if len(buffers) == 1:
            out = [one(0)]
        else:
            out = map_all(pool, one, range(len(buffers)))  # none still writing through sink when an error leaves
        return None if sink is not None else out  # type: ignore[return-value]

    # -- the write side ------------------------------------------------------------
    def encode_chunk(self, chunk: np.ndarray, key: str) -> Any:
        """Encode one chunk (an array of the chunk's shape and dtype) into its stored bytes, on the CPU.

        ``bytes``, or a flat memoryview (which may share memory with ``chunk``) where the chain ends in one.
        """
        codec = None
        try:
            data: Any = chunk
            for codec in self.array_array:
                data = codec.encode(data)
            codec = self.array_bytes
            data = codec.encode(data)
            for codec in self.bytes_bytes:
                data = codec.encode(data)
        except NotImplementedError:
            raise
        except Exception as e:  # any encoder failure is reported against its chunk
            raise ChunkEncodeError(self.array, key, f"{type(e).__name__}: {e}", codec.name if codec else None) from e
        # a view, not a copy, where the chain ends in a buffer (e.g. no compressor): writers take any buffer
        return data if isinstance(data, bytes) else memoryview(data).cast("B")

    def encode_batch(self, chunks: Sequence[np.ndarray], keys: Sequence[str], pool: Executor) -> list[Any]:
        """Encode all ``chunks`` on the CPU, spread over ``pool``; the stored bytes in order."""
        if len(chunks) <= 1:
            return [self.encode_chunk(c, k) for c, k in zip(chunks, keys)]
        return map_all(pool, self.encode_chunk, chunks, keys)


def _raw_bytes(data: Any, expected: int | None) -> np.ndarray:
    """``data`` as a flat uint8 array of ``expected`` bytes (else an error; ``None``: any size)."""
    buf = data if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)
    buf = np.ascontiguousarray(buf).reshape(-1).view(np.uint8)
    if expected is not None and buf.nbytes != expected:
        raise ValueError(f"decoded to {buf.nbytes} bytes, expected {expected}")
    return buf


class NestedShard(ArrayBytesCodec):
    """``sharding_indexed`` inside another shard's codecs: one inner chunk is itself a shard, decoded on the CPU.

    Its index is decoded with the index codecs and each of its chunks with
    its own chain; chunks its index marks absent take the array's fill value.
    The outer shard is read as any sharded array is (:mod:`gpuzarr_dist.stores.sharded`).
    """

    name = "sharding_indexed"
    _MISSING = 2**64 - 1

    def __init__(self, spec: CodecSpec, array: ArraySpec):
        cfg = dict(spec.configuration)
        super().__init__(**cfg)
        try:
            self.inner = tuple(int(c) for c in cfg["chunk_shape"])
            codecs = _v3_codecs({"codecs": cfg["codecs"]}, array.name)
            index_codecs = _v3_codecs({"codecs": cfg.get("index_codecs") or [
                {"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]}, array.name)
        except (KeyError, TypeError, ValueError) as e:
            raise MetadataError(f"{array.name}: zarr.json nested sharding_indexed configuration is invalid: {e}") from e
        self.at_end = cfg.get("index_location", "end") == "end"
        if cfg.get("index_location", "end") not in ("start", "end"):
            raise MetadataError(f"{array.name}: zarr.json nested sharding index_location must be 'start' or 'end'")
        self.array = array
        self.codecs = codecs
        self.index_codecs = index_codecs
        self._pipes: dict = {}

    def _pipe(self, shape: tuple[int, ...], dtype: np.dtype, codecs: tuple, what: str) -> CodecPipeline:
        key = (shape, str(dtype), what)
        pipe = self._pipes.get(key)
        if pipe is None:
            pipe = self._pipes[key] = CodecPipeline(replace(
                self.array, name=f"{self.array.name} ({what})", shape=shape, chunk_shape=shape, dtype=dtype,
                codecs=codecs, shard_shape=None, shard_transpose=None))
        return pipe

    def resolve(self, layout: ChunkLayout) -> ChunkLayout:
        if len(self.inner) != len(layout.shape) or any(i <= 0 or s % i for s, i in zip(layout.shape, self.inner)):
            raise ValueError(f"nested sharding: inner chunk shape {self.inner} does not divide {layout.shape}")
        return layout

    def decode(self, data: Any, layout: ChunkLayout) -> np.ndarray:
        if len(self.inner) != len(layout.shape) or any(i <= 0 or s % i for s, i in zip(layout.shape, self.inner)):
            raise ValueError(f"nested sharding: inner chunk shape {self.inner} does not divide {layout.shape}")
        per = tuple(s // i for s, i in zip(layout.shape, self.inner))
        count = math.prod(per)
        index_pipe = self._pipe((*per, 2), np.dtype("uint64"), self.index_codecs, "nested shard index")
        n_index = count * 16 + 4 * sum(c.name == "crc32c" for c in index_pipe.bytes_bytes)
        if len(index_pipe.bytes_bytes) != sum(c.name == "crc32c" for c in index_pipe.bytes_bytes):
            raise ValueError("nested sharding: index codecs other than bytes and crc32c are not supported by gpuzarr-dist")
        view = memoryview(data).cast("B")
        if len(view) < n_index:
            raise ValueError(f"nested shard of {len(view)} bytes is shorter than its {n_index}-byte index")
        raw = view[len(view) - n_index :] if self.at_end else view[:n_index]
        index = index_pipe.decode_chunk(raw, "index").reshape(count, 2)
        present = ~((index[:, 0] == self._MISSING) & (index[:, 1] == self._MISSING))
        ends = index[present, 0].astype(object) + index[present, 1].astype(object)
        if present.any() and max(ends) > len(view):
            raise ValueError(f"nested shard index points past the end of its {len(view)} bytes")
        out = np.empty(layout.shape, dtype=layout.dtype)
        chunk_pipe = self._pipe(self.inner, layout.dtype, self.codecs, "nested shard chunk")
        for i, pos in enumerate(np.ndindex(*per)):
            sel = tuple(slice(p * c, (p + 1) * c) for p, c in zip(pos, self.inner))
            if not present[i]:
                out[sel] = self.array.fill_value
                continue
            off, n = int(index[i, 0]), int(index[i, 1])
            out[sel] = chunk_pipe.decode_chunk(view[off : off + n], f"[{','.join(map(str, pos))}]")
        return out
