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

from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any

import numpy as np

from gpuzarr_dist.codecs.base import ArrayArrayCodec, ArrayBytesCodec, BytesBytesCodec, ChunkLayout
from gpuzarr_dist.codecs.compressors import (
    DecodeLimit,
    array_bytes_limit,
    chain_limits,
    decode_within,
    stored_size_limit,
)
from gpuzarr_dist.codecs.registry import get_codec
from gpuzarr_dist.core.metadata import ArraySpec
from gpuzarr_dist.errors import ChunkDecodeError, ChunkEncodeError, MetadataError
from gpuzarr_dist.runtime.threads import map_all


class CodecPipeline:
    """The decode side of one array's codec chain."""

    def __init__(self, spec: ArraySpec):
        codecs = [get_codec(c, spec.name) for c in spec.codecs]
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
        limits = chain_limits(array_bytes_limit(self.array_bytes, layouts[-1]), self.bytes_bytes)
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
