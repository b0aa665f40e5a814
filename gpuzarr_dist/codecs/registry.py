"""The codec registry: metadata codec name -> codec class.

Zarr v3 names (``bytes``, ``zstd``, ``numcodecs.zlib`` ...) and Zarr v2 codec
ids (``zlib``, ``blosc`` ...) map to one class each, so both formats decode
through the same code.
"""

from __future__ import annotations

from gpuzarr_dist.codecs.arrays import Bytes, Delta, Transpose
from gpuzarr_dist.codecs.base import Codec
from gpuzarr_dist.codecs.compressors import LZ4, Blosc, Crc32c, GZip, Zlib, Zstd
from gpuzarr_dist.core.metadata import CodecSpec
from gpuzarr_dist.errors import MetadataError, UnsupportedCodecError

_REGISTRY: dict[str, type[Codec]] = {}


def register(cls: type[Codec], *aliases: str) -> type[Codec]:
    """Register a codec class under its name and any aliases."""
    for name in (cls.name, *aliases):
        _REGISTRY[name] = cls
    return cls


for _cls in (Bytes, Transpose, Delta, Zstd, GZip, Zlib, LZ4, Blosc, Crc32c):
    register(_cls, f"numcodecs.{_cls.name}")


def known_codecs() -> list[str]:
    return sorted(_REGISTRY)


def get_codec(spec: CodecSpec, array: str) -> Codec:
    """Instantiate the codec named in ``spec``; errors name the array and the codec."""
    cls = _REGISTRY.get(spec.name)
    if cls is None:
        raise UnsupportedCodecError(spec.name, array, known_codecs())
    try:
        return cls.from_config(dict(spec.configuration))
    except (TypeError, ValueError) as e:
        raise MetadataError(f"{array}: invalid configuration for codec {spec.name!r}: {e}") from e
