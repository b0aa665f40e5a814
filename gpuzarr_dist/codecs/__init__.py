"""Codecs: one registry from Zarr codec metadata to batch decoders (CPU and GPU)."""

from gpuzarr_dist.codecs.base import ArrayArrayCodec, ArrayBytesCodec, BytesBytesCodec, ChunkLayout, Codec
from gpuzarr_dist.codecs.pipeline import CodecPipeline
from gpuzarr_dist.codecs.registry import get_codec, known_codecs, register

__all__ = [
    "ArrayArrayCodec",
    "ArrayBytesCodec",
    "BytesBytesCodec",
    "ChunkLayout",
    "Codec",
    "CodecPipeline",
    "get_codec",
    "known_codecs",
    "register",
]
