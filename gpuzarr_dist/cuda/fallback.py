"""The CPU fallback of the GPU decode path: a batch decoded on the CPU and copied up once, and the CPU's verdict
on the chunks the device checks or nvCOMP flagged.

Only imported on the GPU path: importing it imports cupy.
"""

from __future__ import annotations

from collections.abc import Sequence

import cupy
import numpy as np

from gpuzarr_dist.codecs.pipeline import CodecPipeline
from gpuzarr_dist.cuda.streams import pinned_empty
from gpuzarr_dist.errors import ChunkDecodeError


def cpu_diagnose(pipeline: CodecPipeline, host: np.ndarray, offsets: Sequence[int], sizes: Sequence[int],
                 keys: Sequence[str], reason: str, codec: str) -> ChunkDecodeError:
    """Find the chunk the GPU could not decode by decoding the batch on the CPU; name it."""
    for off, n, key in zip(offsets, sizes, keys):
        try:
            pipeline.decode_chunk(bytes(host[off : off + n]), key)
        except ChunkDecodeError as e:
            return e
    return ChunkDecodeError(pipeline.array, keys[0] if len(keys) == 1 else f"{keys[0]} .. {keys[-1]}", reason, codec)


def judge_on_cpu(pipeline: CodecPipeline, host: np.ndarray, offsets: Sequence[int], sizes: Sequence[int],
                 keys: Sequence[str], suspects: list[tuple[int, str]], codec: str = "zstd") -> None:
    """Decode the ``suspects`` (index, reason) on the CPU; raise for the first the CPU rejects, naming all of them.

    Returns when the CPU decodes every suspect: the device check was stricter
    than the format, and the caller decodes the batch on the CPU instead.
    """
    errors = []
    for i, reason in suspects:
        try:
            pipeline.decode_chunk(bytes(host[offsets[i] : offsets[i] + sizes[i]]), keys[i])
        except ChunkDecodeError as e:
            errors.append((keys[i], f"{reason} (the CPU decoder agrees: {e.reason})"))
    if errors:
        more = f"; {len(errors) - 1} more bad chunk(s) in this block: {', '.join(k for k, _ in errors[1:6])}" if len(errors) > 1 else ""
        raise ChunkDecodeError(pipeline.array, errors[0][0], errors[0][1] + more, codec)


def decode_on_cpu(pipeline: CodecPipeline, host: np.ndarray, offsets: Sequence[int], sizes: Sequence[int],
                  keys: Sequence[str], stream: cupy.cuda.Stream) -> cupy.ndarray:
    """Decode a batch on the CPU (thread pool) and copy it up once: for frames nvCOMP cannot size safely."""
    from gpuzarr_dist.runtime.threads import decode_pool

    layout0 = pipeline.layouts[0]
    chunks = pinned_empty((len(keys), *layout0.shape), layout0.dtype)  # the copy up runs at DMA speed

    def put(i: int, arr: np.ndarray) -> None:
        chunks[i] = arr

    pipeline.decode_batch([host[o : o + n] for o, n in zip(offsets, sizes)], keys, decode_pool(), sink=put)
    dev = cupy.empty(chunks.shape, dtype=chunks.dtype)
    dev.set(chunks, stream=stream)
    stream.synchronize()  # ``chunks`` goes back to the pinned pool on return: the copy must be done
    return dev
