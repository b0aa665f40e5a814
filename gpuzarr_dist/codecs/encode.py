"""Encoding one block's chunks in sub-batches: the encoder interface and its CPU implementation.

A block writer cuts a block into its Zarr chunks (:func:`chunk_grid`) and the
chunks into sub-batches of whole stored objects (:class:`SubBatch`); an
encoder (:class:`BlockEncoder`) encodes one sub-batch at a time, so that the
writer stores the previous sub-batch's objects while the next one is encoded.
:class:`CpuBlockEncoder` encodes with numcodecs on the shared CPU encode
threads; the GPU's encoder (:mod:`gpuzarr_dist.cuda.write`) implements the
same interface.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from gpuzarr_dist.codecs.pipeline import CodecPipeline
from gpuzarr_dist.core.metadata import ArraySpec


def chunk_grid(block: Any, chunk: tuple[int, ...], fill: Any, xp: Any) -> Any:
    """The chunks of ``block`` as one contiguous ``(n, *chunk)`` array, in C order of their grid positions.

    Edge chunks are padded with ``fill`` to the full chunk shape (Zarr stores
    edge chunks whole). Works for numpy and cupy (one copy kernel on the GPU).
    """
    grid = [-(-b // c) for b, c in zip(block.shape, chunk)]
    full = tuple(g * c for g, c in zip(grid, chunk))
    if full != tuple(block.shape):
        padded = xp.full(full, fill, dtype=block.dtype)
        padded[tuple(slice(0, b) for b in block.shape)] = block
        block = padded
    nd = len(chunk)
    tiles = block.reshape([v for g, c in zip(grid, chunk) for v in (g, c)])
    tiles = tiles.transpose(list(range(0, 2 * nd, 2)) + list(range(1, 2 * nd, 2)))
    return xp.ascontiguousarray(tiles).reshape((math.prod(grid), *chunk))


class ChunkWriter(Protocol):
    """The block writer as the encoders see it (:class:`gpuzarr_dist.array.write.BlockWriter`)."""

    spec: ArraySpec

    @property
    def pipeline(self) -> CodecPipeline:
        """The array's codec pipeline."""

    @property
    def index(self) -> Any:
        """The array's shard index builder (:class:`gpuzarr_dist.codecs.sharding.ShardIndex`)."""

    def host_chunks(self, block: np.ndarray) -> np.ndarray:
        """The block's chunks as one host array ``(n, *chunk_shape)`` in the array's dtype."""

    def chunk_layout(self, shape: tuple[int, ...], start: tuple[int, ...]) -> tuple[tuple[int, ...], list[int], list[tuple[int, ...]]]:
        """Grid coordinates of the first chunk of a block of ``shape`` at ``start``, its chunk grid, and every
        chunk's coordinates."""


@dataclass
class SubBatch:
    """Some chunks of one block, encoded together, and the whole objects they make.

    ``sel`` picks the chunks from the block's chunk list (a slice, or positions
    when the shards' chunks are not contiguous there); ``keys`` are their chunk
    keys (for errors). Unsharded, ``objects`` are the chunks themselves;
    sharded, ``shards`` holds each shard's inner-chunk positions (-1: absent).
    """

    sel: Any
    keys: list[str]
    object_keys: list[str]
    shards: list[np.ndarray] | None

    def objects(self, writer: ChunkWriter, encoded: list[Any]) -> list[tuple[str, Any]]:
        """``(store key, data)`` of each object from this sub-batch's encoded chunks (in ``sel`` order)."""
        if self.shards is None:
            return list(zip(self.object_keys, encoded))
        out, it = [], iter(encoded)
        for key, pos in zip(self.object_keys, self.shards):
            parts = [next(it) if p >= 0 else None for p in pos.tolist()]
            out.append((key, writer.index.build_parts(parts, key)))
        return out


class BlockEncoder:
    """Encodes sub-batches of one block's chunks: ``launch`` starts the work, ``finish`` waits for the bytes.

    ``launch`` returns quickly where the work runs elsewhere (the GPU, the CPU
    encode threads), so the caller can write the previous sub-batch meanwhile;
    ``abandon`` waits for launched work whose result is no longer wanted (its
    buffers must outlive it).
    """

    def launch(self, sel: Any, keys: list[str]) -> Any:
        raise NotImplementedError

    def finish(self, pending: Any) -> list[Any]:
        raise NotImplementedError

    def abandon(self, pending: Any) -> None:
        raise NotImplementedError


class CpuBlockEncoder(BlockEncoder):
    """numcodecs encoders on the shared CPU encode threads (``decode_pool``), one future per chunk."""

    def __init__(self, writer: ChunkWriter, block: np.ndarray):
        self.pipeline = writer.pipeline
        self.chunks = writer.host_chunks(block)

    def launch(self, sel: Any, keys: list[str]) -> list[Any]:
        from gpuzarr_dist.runtime.threads import decode_pool

        rows = list(self.chunks[sel]) if isinstance(sel, slice) else [self.chunks[i] for i in sel.tolist()]
        if len(rows) == 1:  # one chunk: no thread hand-off
            return [_Done(self.pipeline.encode_chunk, rows[0], keys[0])]
        pool = decode_pool()
        return [pool.submit(self.pipeline.encode_chunk, r, k) for r, k in zip(rows, keys)]

    def finish(self, pending: list[Any]) -> list[Any]:
        from concurrent.futures import wait

        wait([f for f in pending if not isinstance(f, _Done)])  # none left running when one failed
        return [f.result() for f in pending]

    def abandon(self, pending: list[Any]) -> None:
        from concurrent.futures import wait

        for f in pending:
            f.cancel()
        wait([f for f in pending if not isinstance(f, _Done)])


class _Done:
    """A call run when its result is asked for (a future without a thread)."""

    def __init__(self, fn: Any, *args: Any):
        self.fn, self.args = fn, args

    def result(self) -> Any:
        return self.fn(*self.args)

    def cancel(self) -> bool:
        return True
