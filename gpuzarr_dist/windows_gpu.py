"""The GPU half of :mod:`gpuzarr_dist.windows`: chunk keys -> pinned staging -> one copy -> one nvCOMP call.

Only imported on the GPU path (imports cupy). The same steps as
:func:`gpuzarr_dist.reader_gpu.read_plan_gpu`, for an arbitrary set of chunk
keys instead of a block's plan; the stream is synchronised before returning so
the pinned staging buffer can be reused and the chunks are complete.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import cupy
import numpy as np

from .codecs.gpu import decode_batch_gpu, framing_lead, gpu_unsupported
from .runtime.cuda import ALIGN, pinned_staging, thread_stream
from .runtime.threads import decode_pool

if TYPE_CHECKING:
    from .reader import BlockReader


def decode_keys_gpu(reader: "BlockReader", keys: list[str]) -> tuple[Any, list[int]]:
    """Decoded chunks ``(n_present, *chunk_shape)`` on the device, and the positions of the keys present."""
    spec, pipeline = reader.spec, reader.pipeline
    stream = thread_stream()
    if not keys:
        return cupy.empty((0, *spec.chunk_shape), dtype=spec.dtype), []
    if gpu_unsupported(pipeline) is not None:  # decode on the CPU, one copy up
        raw = reader.store.read_many(keys)
        present = [i for i, b in enumerate(raw) if b is not None]
        host = np.empty((len(present), *spec.chunk_shape), dtype=spec.dtype)
        if present:
            decoded = pipeline.decode_batch([raw[i] for i in present], [keys[i] for i in present], decode_pool())
            for j, arr in enumerate(decoded or []):
                host[j] = arr
        out = cupy.asarray(host)
        stream.synchronize()
        return out, present
    host, offsets, sizes = reader.store.read_into(keys, pinned_staging, ALIGN, framing_lead(pipeline))
    present = [i for i, n in enumerate(sizes) if n >= 0]
    if not present:
        return cupy.empty((0, *spec.chunk_shape), dtype=spec.dtype), []
    chunks = decode_batch_gpu(pipeline, host, [offsets[i] for i in present], [sizes[i] for i in present],
                              [keys[i] for i in present], stream)
    chunks = chunks.reshape((len(present), *spec.chunk_shape))
    stream.synchronize()
    return chunks, present
