"""GPU batch decoding of a codec chain: all chunks of a block in one nvCOMP call per stage.

The compressed chunks arrive in one pinned host buffer at aligned offsets
(see :meth:`gpuzarr_dist.stores.base.ChunkStore.read_into`). They are checked
on the host where that is cheap (crc32c of the stored bytes, framing headers),
copied to the device in one transfer on the thread's stream, decoded by one
batched nvCOMP call per compressor, and the array codecs (byte order,
transpose, delta) run as CuPy kernels on the same stream.

Codecs with a GPU decoder set ``gpu_decode = True`` on their class (below, at
import of this module). :func:`gpu_unsupported` names the first codec of a
chain that has none; the reader then decodes that array on the CPU and copies
each block up once.

Only imported on the GPU path: importing it imports cupy and nvCOMP.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import cupy
import numpy as np

from .arrays import Bytes, Delta, Transpose
from .compressors import LZ4, Crc32c, GZip, Zlib, Zstd
from .pipeline import CodecPipeline
from ..errors import ChunkDecodeError

#: codec name -> (nvCOMP algorithm, bytes to strip before the payload, bytes to strip after it)
NVCOMP_FRAMING: dict[str, tuple[str, int, int]] = {
    "zstd": ("Zstd", 0, 0),
    "gzip": ("Gzip", 0, 0),
    "zlib": ("Deflate", 2, 4),  # RFC 1950: 2-byte header, raw deflate, 4-byte adler32
    "lz4": ("LZ4", 4, 0),  # numcodecs: 4-byte little-endian decoded size, then an LZ4 block
}

for _cls in (Zstd, GZip, Zlib, LZ4, Crc32c, Bytes, Transpose, Delta):
    _cls.gpu_decode = True

_local = threading.local()


def gpu_unsupported(pipeline: CodecPipeline) -> str | None:
    """The name of the first codec in the chain without a GPU decoder, or ``None``.

    crc32c decodes on the GPU path only as the outermost codec (checked on the
    host, on the stored bytes, before upload).
    """
    for c in pipeline.codecs:
        if not c.gpu_decode:
            return c.name
    bb = pipeline.bytes_bytes
    for i, c in enumerate(bb):
        if c.name == "crc32c" and any(d.name != "crc32c" for d in bb[i + 1 :]):
            return "crc32c (inside another bytes codec)"
    return None


def _nvcomp_codec(algorithm: str) -> Any:
    """This thread's nvCOMP codec for ``algorithm``, created once per thread."""
    from nvidia import nvcomp

    codecs = getattr(_local, "codecs", None)
    if codecs is None:
        codecs = _local.codecs = {}
    codec = codecs.get(algorithm)
    if codec is None:
        codec = codecs[algorithm] = nvcomp.Codec(algorithm=algorithm, bitstream_kind=nvcomp.BitstreamKind.RAW)
    return codec


def nvcomp_decode(
    algorithm: str, src: cupy.ndarray, offsets: Sequence[int], sizes: Sequence[int], stream: cupy.cuda.Stream
) -> list[cupy.ndarray]:
    """Decode the compressed chunks ``src[offsets[i]:offsets[i]+sizes[i]]`` in one nvCOMP call.

    Returns one uint8 device array per chunk, ready to use on ``stream``.
    """
    from nvidia import nvcomp

    codec = _nvcomp_codec(algorithm)
    inputs = nvcomp.as_arrays([src[o : o + n] for o, n in zip(offsets, sizes)])
    # nvCOMP runs on its own stream: the inputs must be on the device before it starts
    stream.synchronize()
    decoded = codec.decode(inputs, data_type="|u1")
    return [cupy.asarray(decoded[i]).view(cupy.uint8).reshape(-1) for i in range(len(sizes))]
