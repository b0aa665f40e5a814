"""The GPU device's block write: block on the device -> chunk grid (one copy kernel) -> nvCOMP encodes.

Called by :class:`gpuzarr_dist.array.write.BlockWriter` for cupy blocks. Work runs
on the calling thread's own CUDA stream (the one the fused compute ran on when
the block came from :func:`~gpuzarr_dist.from_zarr_gpu`); the stream is
synchronised before the host touches the results. A chain the GPU encoder
cannot run (see :func:`gpuzarr_dist.cuda.encode.gpu_encode_unsupported`)
is encoded on the CPU after one copy of the block to the host, with one
warning per codec; so is a block smaller than ``gpuzarr.gpu.min-batch``
(nvCOMP's per-call cost outweighs its speed there), without a warning.
:class:`GpuBlockEncoder` launches each sub-batch's encode without waiting, so
:meth:`~gpuzarr_dist.array.write.BlockWriter.run_batches` writes the previous
sub-batch from pinned memory while the GPU encodes.
"""

from __future__ import annotations

from typing import Any

import cupy

from gpuzarr_dist.codecs.encode import BlockEncoder, ChunkWriter, CpuBlockEncoder, chunk_grid
from gpuzarr_dist.config import gpu_min_batch_bytes
from gpuzarr_dist.cuda.encode import finish_encode_gpu, gpu_encode_unsupported, launch_encode_gpu
from gpuzarr_dist.cuda.streams import thread_stream
from gpuzarr_dist.errors import ChunkEncodeError
from gpuzarr_dist.runtime.once import warn_once

_warned: set[str] = set()


def _warn_cpu_fallback(codec: str, array: str) -> None:
    warn_once(_warned, codec, f"{array}: codec {codec} cannot be encoded on the GPU; blocks are copied to the host "
              "and encoded on the CPU (warned once per codec)", stacklevel=4)


class GpuBlockEncoder(BlockEncoder):
    """nvCOMP batch encodes of sub-batches of one block's chunks (a device array), on the thread's stream.

    ``launch`` enqueues the encode and returns; ``finish`` synchronises the
    stream and returns the stored bytes (views into pinned host memory). A
    sub-batch nvCOMP refuses is encoded on the CPU instead (same format), with
    one warning per codec.
    """

    def __init__(self, writer: ChunkWriter, chunks: Any, stream: Any):
        self.writer, self.chunks, self.stream = writer, chunks, stream

    def _rows(self, sel: Any) -> Any:
        return self.chunks[sel] if isinstance(sel, slice) else self.chunks[cupy.asarray(sel)]

    def launch(self, sel: Any, keys: list[str]) -> tuple[Any, list[str], Any, ChunkEncodeError | None]:
        try:
            return sel, keys, launch_encode_gpu(self.writer.pipeline, self._rows(sel), keys, self.stream), None
        except ChunkEncodeError as e:  # refused at launch: the CPU encoders give the same format
            return sel, keys, None, e

    def finish(self, pending: tuple[Any, list[str], Any, ChunkEncodeError | None]) -> list[Any]:
        sel, keys, launched, err = pending
        if err is None:
            try:
                return finish_encode_gpu(launched)
            except ChunkEncodeError as e:
                err = e
        return self._on_cpu(sel, keys, err)

    def _on_cpu(self, sel: Any, keys: list[str], err: ChunkEncodeError) -> list[Any]:
        from gpuzarr_dist.runtime.threads import decode_pool

        _warn_cpu_fallback(f"{err.codec} ({err.reason})", self.writer.spec.name)
        self.stream.synchronize()
        host = cupy.asnumpy(self._rows(sel), stream=self.stream)
        self.stream.synchronize()
        return self.writer.pipeline.encode_batch(list(host), keys, decode_pool())

    def abandon(self, pending: Any) -> None:
        self.stream.synchronize()  # the launched encode still reads and writes its buffers


def gpu_block_encoder(writer: ChunkWriter, block: Any) -> BlockEncoder:
    """The encoder for ``block`` (cupy, or numpy with device="gpu"): its chunks cut on the device (one copy
    kernel) for nvCOMP, or, for a chain the GPU encoder cannot run, copied to the host for the CPU encoders."""
    spec = writer.spec
    current = cupy.cuda.get_current_stream()
    stream = thread_stream()
    if current is not stream:  # the block was made on another stream (e.g. the legacy default one)
        current.synchronize()
    unsupported = gpu_encode_unsupported(writer.pipeline)
    if unsupported is not None:
        _warn_cpu_fallback(repr(unsupported), spec.name)
    if unsupported is not None or block.size * spec.dtype.itemsize < gpu_min_batch_bytes():
        # a small block: one nvCOMP encode call costs more than the CPU encode threads take for it
        host = cupy.asnumpy(block, stream=stream)  # a numpy block stays as it is
        stream.synchronize()
        return CpuBlockEncoder(writer, host)
    block = cupy.asarray(block)  # numpy blocks with device="gpu" go up once
    if block.dtype != spec.dtype:
        block = block.astype(spec.dtype)
    return GpuBlockEncoder(writer, chunk_grid(block, spec.chunk_shape, spec.fill_value, cupy), stream)


def encode_block_gpu(writer: ChunkWriter, block: Any, start: tuple[int, ...]) -> tuple[list[Any], tuple[int, ...], list[int]]:
    """Every chunk of ``block`` encoded on the GPU in one batch (no sub-batches; for benchmarks and checks);
    ``(encoded chunks, first chunk coords, chunk grid)``."""
    first, grid, coords = writer.chunk_layout(tuple(block.shape), start)
    encoder = gpu_block_encoder(writer, block)
    keys = [writer.spec.chunk_key(c) for c in coords]
    return encoder.finish(encoder.launch(slice(0, len(keys)), keys)), first, grid
