"""Codecs: one registry from Zarr codec metadata to batch decoders (CPU and GPU)."""

from .base import ArrayArrayCodec, ArrayBytesCodec, BytesBytesCodec, ChunkLayout, Codec
from .pipeline import CodecPipeline
from .registry import get_codec, known_codecs, register

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
