"""The codec registry: metadata codec name -> codec class.

Zarr v3 names (``bytes``, ``zstd``, ``numcodecs.zlib`` ...) and Zarr v2 codec
ids (``zlib``, ``blosc`` ...) map to one class each, so both formats decode
through the same code. Names not registered here that numcodecs knows decode
through numcodecs (:mod:`.numcodecs_codecs`).
"""

from __future__ import annotations

from gpuzarr_dist.codecs.arrays import Bytes, Delta, Transpose
from gpuzarr_dist.codecs.base import Codec
from gpuzarr_dist.codecs.compressors import LZ4, Blosc, Crc32c, GZip, Zlib, Zstd
from gpuzarr_dist.codecs.numcodecs_codecs import known_numcodecs, numcodecs_codec
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
    """Every codec name that decodes: the registry's own and numcodecs' (as v2 ids and v3 ``numcodecs.*`` names)."""
    names = set(_REGISTRY)
    for ident in known_numcodecs():
        names.update((ident, f"numcodecs.{ident}"))
    return sorted(names)


def get_codec(spec: CodecSpec, array: str) -> Codec:
    """Instantiate the codec named in ``spec``; errors name the array and the codec.

    The registry's own class comes first; any other name numcodecs knows is
    decoded through numcodecs on the CPU (:mod:`.numcodecs_codecs`). A name
    neither knows raises :class:`UnsupportedCodecError` listing the known ones.
    """
    cls = _REGISTRY.get(spec.name)
    if cls is not None and spec.role == "filter" and cls.kind == "bytes_bytes":
        cls = None  # a compressor among a Zarr v2 array's filters: numcodecs decodes it where it stands
    try:
        if cls is None:
            codec = numcodecs_codec(spec.name, dict(spec.configuration), spec.role)
            if codec is None:
                raise UnsupportedCodecError(spec.name, array, known_codecs())
            return codec
        return cls.from_config(dict(spec.configuration))
    except (TypeError, ValueError, KeyError) as e:
        if isinstance(e, UnsupportedCodecError):
            raise
        raise MetadataError(f"{array}: invalid configuration for codec {spec.name!r}: {e}") from e
