"""GPU batch encoding: all chunks of a block compressed by one nvCOMP call, on the thread's stream.

The write side of :mod:`.gpu`. The chunks of a block arrive as one device
array ``(n, *chunk_shape)``; their bytes (C order, little-endian; byte-swapped
on the device for a big-endian ``bytes`` codec) go to nvCOMP in one batched
``encode`` call, the compressed chunks are packed into one device buffer at
256-byte aligned offsets, copied to pinned host memory once, and framed and
checksummed on the host where that is cheap:

- ``zstd``: nvCOMP ``Zstd`` with ``BitstreamKind.RAW`` writes standard zstd
  frames (the shared GPU notes: numcodecs decodes them). nvCOMP's zstd encoder
  takes no compression level: ``level`` applies to CPU writes and is recorded
  in the metadata, where decoders ignore it.
- ``gzip``: nvCOMP ``Deflate`` (raw deflate, RFC 1951) inside a gzip member
  (RFC 1952) built here: a 10-byte header, then the CRC-32 and size of the
  uncompressed chunk. The CRC-32 is computed on the host (``zlib.crc32`` on a
  pinned copy of the chunks, on the decode threads).
- ``crc32c``: computed on the host over the stored bytes, as the outermost codec.

Only imported on the GPU path: importing it imports cupy and nvCOMP.
"""

from __future__ import annotations

import sys
import threading
import zlib
from collections.abc import Sequence
from typing import Any

import cupy
import google_crc32c

from .pipeline import CodecPipeline
from ..errors import ChunkEncodeError

#: codec name -> nvCOMP algorithm that produces its payload
NVCOMP_ENCODERS: dict[str, str] = {"zstd": "Zstd", "gzip": "Deflate"}

GZIP_HEADER = bytes([0x1F, 0x8B, 8, 0, 0, 0, 0, 0, 0, 0xFF])  # deflate, no flags, no mtime, unknown OS

_local = threading.local()


def gpu_encode_unsupported(pipeline: CodecPipeline) -> str | None:
    """The first codec of the chain the GPU encoder cannot run, or ``None``.

    Supported: no array->array codecs, ``bytes``, at most one compressor with an
    nvCOMP encoder (zstd, gzip), then crc32c codecs as the outermost ones.
    """
    if pipeline.array_array:
        return pipeline.array_array[0].name
    if pipeline.array_bytes.name != "bytes":
        return pipeline.array_bytes.name
    bb = [c.name for c in pipeline.bytes_bytes]
    while bb and bb[-1] == "crc32c":
        bb.pop()
    if len(bb) > 1:
        return f"{bb[0]} (more than one compressor)"
    if bb and bb[0] not in NVCOMP_ENCODERS:
        return bb[0]
    return None


def _nvcomp_encoder(algorithm: str, stream: cupy.cuda.Stream) -> Any:
    """This thread's nvCOMP codec for ``algorithm`` on its stream (created in the using thread, as for decoding)."""
    from nvidia import nvcomp

    codecs = getattr(_local, "codecs", None)
    if codecs is None:
        codecs = _local.codecs = {}
    key = (algorithm, stream.ptr)
    codec = codecs.get(key)
    if codec is None:
        codec = codecs[key] = nvcomp.Codec(
            algorithm=algorithm,
            bitstream_kind=nvcomp.BitstreamKind.RAW,
            device_id=cupy.cuda.Device().id,
            cuda_stream=stream.ptr,
        )
    return codec


def _as_bytes_rows(pipeline: CodecPipeline, chunks: cupy.ndarray) -> cupy.ndarray:
    """``(n, nbytes)`` uint8 rows of each chunk's bytes as the ``bytes`` codec stores them."""
    n = chunks.shape[0]
    arr = cupy.ascontiguousarray(chunks)
    item = arr.dtype.itemsize
    unit = item // 2 if arr.dtype.kind == "c" else item
    endian = getattr(pipeline.array_bytes, "endian", sys.byteorder)
    raw = arr.reshape(n, -1).view(cupy.uint8).reshape(n, -1)
    if unit > 1 and endian != sys.byteorder:
        raw = cupy.ascontiguousarray(raw.reshape(n, -1, unit)[:, :, ::-1]).reshape(n, -1)
    return raw


def encode_batch_gpu(
    pipeline: CodecPipeline, chunks: cupy.ndarray, keys: Sequence[str], stream: cupy.cuda.Stream
) -> list[Any]:
    """Encode ``chunks`` (a device array ``(n, *chunk_shape)``) into the stored bytes of each chunk.

    Returns one bytes-like object per chunk (views into one pinned host buffer,
    or ``bytes`` where the host added framing). The caller's fused compute ran
    on ``stream``; everything here is ordered after it on the same stream, and
    the stream is synchronised before the host reads the results.
    """
    from ..runtime.cuda import align, pinned_staging
    from ..runtime.threads import decode_pool

    n = chunks.shape[0]
    raw = _as_bytes_rows(pipeline, chunks)
    nbytes = raw.shape[1]
    bb = [c.name for c in pipeline.bytes_bytes]
    n_crc = 0
    while bb and bb[-1] == "crc32c":
        bb.pop()
        n_crc += 1
    compressor = bb[0] if bb else None
    crc32 = None
    if compressor is None:
        host = pinned_staging(n * nbytes)
        raw.reshape(-1).get(out=host, stream=stream)
        stream.synchronize()
        out: list[Any] = [host[i * nbytes : (i + 1) * nbytes] for i in range(n)]
    else:
        from nvidia import nvcomp

        codec = _nvcomp_encoder(NVCOMP_ENCODERS[compressor], stream)
        stride = align(max(nbytes, 1))
        if stride != nbytes and n > 1:  # nvCOMP wants aligned sub-buffers: pad the rows
            padded = cupy.empty((n, stride), dtype=cupy.uint8)
            padded[:, :nbytes] = raw
            flat = padded.reshape(-1)
        else:
            flat = raw.reshape(-1)
        if compressor == "gzip":  # the gzip trailer needs the CRC-32 of the uncompressed bytes
            plain = pinned_staging(n * nbytes)
            raw.reshape(-1).get(out=plain, stream=stream)
        try:
            res = codec.encode(nvcomp.as_arrays(flat, [i * stride for i in range(n)], [nbytes] * n))
            stream.synchronize()  # wait where CuPy releases the GIL, before reading sizes
            parts = [cupy.asarray(res[i]).view(cupy.uint8).reshape(-1) for i in range(n)]
            sizes = [int(v) for v in res.buffer_sizes] if hasattr(res, "buffer_sizes") else \
                [int(res[i].buffer_size) for i in range(n)]
        except (RuntimeError, ValueError, MemoryError) as e:
            raise ChunkEncodeError(pipeline.array, keys[0] if n == 1 else f"{keys[0]} .. {keys[-1]}",
                                   f"nvCOMP: {e}", compressor) from e
        offsets, total = [], 0
        for s in sizes:
            offsets.append(total)
            total += align(max(s, 1))
        packed = cupy.empty(max(total, 1), dtype=cupy.uint8)
        for part, off, s in zip(parts, offsets, sizes):
            packed[off : off + s] = part[:s]
        host = pinned_staging(max(total, 1))
        packed.get(out=host, stream=stream)
        stream.synchronize()
        del res, parts
        out = [host[o : o + s] for o, s in zip(offsets, sizes)]
        if compressor == "gzip":
            crc32 = list(decode_pool().map(lambda i: zlib.crc32(plain[i * nbytes : (i + 1) * nbytes]), range(n)))
            isize = (nbytes % (1 << 32)).to_bytes(4, "little")
            out = [b"".join((GZIP_HEADER, o, c.to_bytes(4, "little"), isize)) for o, c in zip(out, crc32)]
    for _ in range(n_crc):
        out = [b"".join((bytes(o), google_crc32c.value(bytes(o)).to_bytes(4, "little"))) for o in out]
    return out
