"""The GPU device's block write: block on the device -> chunk grid (one copy kernel) -> one nvCOMP encode.

Called by :class:`gpuzarr_dist.write.BlockWriter` for cupy blocks. Work runs
on the calling thread's own CUDA stream (the one the fused compute ran on when
the block came from :func:`~gpuzarr_dist.from_zarr_gpu`); the stream is
synchronised before the host touches the results. A chain the GPU encoder
cannot run (see :func:`gpuzarr_dist.codecs.gpu_encode.gpu_encode_unsupported`)
is encoded on the CPU after one copy of the block to the host, with one
warning per codec.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import cupy

from .codecs.gpu_encode import encode_batch_gpu, gpu_encode_unsupported
from .errors import ChunkEncodeError
from .runtime.cuda import thread_stream
from .runtime.once import warn_once

if TYPE_CHECKING:
    from .write import BlockWriter

_warned: set[str] = set()


def _warn_cpu_fallback(codec: str, array: str) -> None:
    warn_once(_warned, codec, f"{array}: codec {codec} cannot be encoded on the GPU; blocks are copied to the host "
              "and encoded on the CPU (warned once per codec)", stacklevel=4)


def encode_block_gpu(writer: "BlockWriter", block: Any, start: tuple[int, ...]) -> tuple[list[Any], tuple[int, ...], list[int]]:
    """Encode every chunk of ``block`` on the GPU; ``(encoded chunks, first chunk coords, chunk grid)``."""
    from .write import chunk_grid

    spec = writer.spec
    current = cupy.cuda.get_current_stream()
    stream = thread_stream()
    if current is not stream:  # the block was made on another stream (e.g. the legacy default one)
        current.synchronize()
    unsupported = gpu_encode_unsupported(writer.pipeline)
    if unsupported is not None:
        _warn_cpu_fallback(repr(unsupported), spec.name)
        host = cupy.asnumpy(cupy.asarray(block), stream=stream)
        stream.synchronize()
        return writer._encode_cpu(host, start)
    block = cupy.asarray(block)  # numpy blocks with device="gpu" go up once
    if block.dtype != spec.dtype:
        block = block.astype(spec.dtype)
    first, grid, coords = writer._chunk_layout(tuple(block.shape), start)
    chunks = chunk_grid(block, spec.chunk_shape, spec.fill_value, cupy)
    keys = [spec.chunk_key(c) for c in coords]
    try:
        return encode_batch_gpu(writer.pipeline, chunks, keys, stream), first, grid
    except ChunkEncodeError as e:  # nvCOMP refused the batch: the CPU encoders give the same format
        _warn_cpu_fallback(f"{e.codec} ({e.reason})", spec.name)
        host = cupy.asnumpy(block, stream=stream)
        stream.synchronize()
        return writer._encode_cpu(host, start)
