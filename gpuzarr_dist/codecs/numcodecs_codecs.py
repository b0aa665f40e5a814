"""Every other codec numcodecs knows, decoded on the CPU through numcodecs.

The registry's own classes (:mod:`.arrays`, :mod:`.compressors`) come first;
a codec name they do not hold, a Zarr v2 id (``bz2``, ``shuffle``,
``fixedscaleoffset`` ...) or a Zarr v3 ``numcodecs.*`` name
(``numcodecs.bz2`` ...), is looked up in numcodecs' registry and wrapped in
one of the classes below. Their kind (array -> array, array -> bytes or
bytes -> bytes) is the one zarr-python gives them; in a Zarr v2 chain the
compressor is always bytes -> bytes. None of them has a GPU decoder: on the
GPU device an array using one decodes on the CPU and each block is copied up
once (see :func:`gpuzarr_dist.cuda.decode.gpu_unsupported`).

Output is bounded: a bytes -> bytes codec is told the decoded size the chain
expects of it where that is known (:meth:`NumcodecsBytesBytes.decode_within`),
and a filter decodes to its chunk layout's size; ``bz2`` and ``lzma``
decompress incrementally and stop one byte past that size, the others are
checked after decoding, before their output is used.
"""

from __future__ import annotations

import bz2
import lzma
import math
from typing import Any

import numcodecs
import numpy as np
from numcodecs.compat import ensure_ndarray

from gpuzarr_dist.codecs.base import ArrayArrayCodec, ArrayBytesCodec, BytesBytesCodec, ChunkLayout, Codec
from gpuzarr_dist.codecs.compressors import DecodeLimit, buffer_nbytes, compressed_bound

#: numcodecs ids that are array -> array codecs (zarr-python 3's ``numcodecs.*`` "filters")
ARRAY_ARRAY_IDS = frozenset({"delta", "bitround", "fixedscaleoffset", "quantize", "packbits", "astype", "categorize"})
#: numcodecs ids that turn an object array into bytes (variable-length strings, bytes, arrays, pickled objects)
OBJECT_IDS = frozenset({"vlen-utf8", "vlen-bytes", "vlen-array", "json2", "msgpack2", "pickle"})
#: numcodecs ids that are array -> bytes codecs
ARRAY_BYTES_IDS = OBJECT_IDS | {"pcodec", "zfpy"}
#: filters whose encoded layout follows from the decoded one (:meth:`NumcodecsArrayArray.resolve`)
_LAYOUT_IDS = ARRAY_ARRAY_IDS | {"shuffle"}
#: bytes -> bytes codecs whose encoded size follows from the decoded size: bytes they add
_SIZE_ADDED = {"shuffle": 0, "crc32": 4, "crc32c": 4, "adler32": 4, "fletcher32": 4, "jenkins_lookup3": 4}

PREFIX = "numcodecs."


def numcodecs_id(name: str) -> str:
    """The numcodecs id of a codec's metadata name (``numcodecs.bz2`` -> ``bz2``)."""
    return name[len(PREFIX) :] if name.startswith(PREFIX) else name


def known_numcodecs() -> list[str]:
    """The ids numcodecs can instantiate in this environment."""
    from numcodecs.registry import codec_registry

    return sorted(codec_registry)


def numcodecs_codec(name: str, configuration: dict, role: str | None = None) -> Codec | None:
    """A codec of this module for metadata ``name`` and its ``configuration``, or ``None`` where numcodecs does
    not know the name either. ``role`` is ``"filter"`` or ``"compressor"`` for a Zarr v2 chain.

    Raises ``TypeError`` or ``ValueError`` for a configuration numcodecs refuses.
    """
    ident = numcodecs_id(name)
    if ident not in known_numcodecs():
        return None
    config = {k: v for k, v in configuration.items() if k != "id"}
    impl = numcodecs.get_codec({"id": ident, **config})
    if role == "compressor":
        cls: type[Codec] = NumcodecsBytesBytes
    elif ident in ARRAY_BYTES_IDS:
        cls = NumcodecsArrayBytes
    elif ident in ARRAY_ARRAY_IDS or role == "filter":
        cls = NumcodecsArrayArray
    else:
        cls = NumcodecsBytesBytes
    return cls(name, impl, config)  # type: ignore[call-arg]


class _Wrapped:
    """What the numcodecs wrappers share: the metadata name, the configuration and the numcodecs codec."""

    def __init__(self, name: str, impl: Any, config: dict):
        self.name = name  # type: ignore[misc] - per instance: one class wraps many numcodecs codecs
        self.id = numcodecs_id(name)
        self.impl = impl
        self.config = dict(config)

    def __reduce__(self) -> tuple:
        return (_rebuild, (type(self), self.name, self.config))


def _rebuild(cls: type, name: str, config: dict) -> Any:
    return cls(name, numcodecs.get_codec({"id": numcodecs_id(name), **config}), config)


class NumcodecsBytesBytes(_Wrapped, BytesBytesCodec):
    """A numcodecs compressor, checksum or byte filter (``bz2``, ``lzma``, ``shuffle``, ``fletcher32`` ...)."""

    def encoded_limit(self, limit: DecodeLimit) -> DecodeLimit:
        """Checksums and byte shuffles add a fixed number of bytes (exact where the data's size is); anything
        else is bounded as a compressor."""
        added = _SIZE_ADDED.get(self.id)
        if added is None:
            return DecodeLimit(compressed_bound(limit.size), False)
        return DecodeLimit(limit.size + added, limit.exact)

    def decode(self, data: Any) -> Any:
        return self.impl.decode(data)

    def decode_within(self, data: Any, limit: DecodeLimit) -> Any:
        """Decode one chunk's buffer within ``limit`` (``ValueError`` beyond it): ``bz2`` and ``lzma`` stop
        decompressing one byte past it (no allocation beyond the chunk's size), others are checked after."""
        out = _bounded(self.id, self.impl, data, limit.size)
        if out is None:
            out = self.impl.decode(data)
        limit.check(buffer_nbytes(out))
        return out

    def encode(self, data: Any) -> Any:
        out = self.impl.encode(data)
        return out.tobytes() if isinstance(out, np.ndarray) else out


def _bounded(ident: str, impl: Any, data: Any, limit: int) -> bytes | None:
    """``impl.decode(data)`` for ``bz2`` and ``lzma``, stopped one byte past ``limit`` (an error); ``None`` for
    other codecs (decoded whole, then checked)."""
    if ident == "bz2":
        return _bounded_streams(bz2.BZ2Decompressor, data, limit, OSError)
    if ident == "lzma":
        return _bounded_streams(lambda: lzma.LZMADecompressor(format=impl.format, filters=impl.filters), data,
                                limit, lzma.LZMAError)
    return None


def _bounded_streams(make: Any, data: Any, limit: int, error: type[Exception]) -> bytes:
    """Concatenated ``bz2``/``xz`` streams decompressed as ``bz2.decompress``/``lzma.decompress`` do (data after
    the last valid stream ignored), but never more than ``limit + 1`` bytes: more is an error."""
    rest = bytes(data)
    parts: list[bytes] = []
    total = 0
    while rest:
        dec = make()
        try:
            part = dec.decompress(rest, max_length=limit - total + 1)
        except error:
            if parts:
                break  # what follows the last stream is not a stream: ignored, as numcodecs' decoders do
            raise
        parts.append(part)
        total += len(part)
        if total > limit:
            raise ValueError(f"decompresses to more than the {limit} bytes expected")
        if not dec.eof:
            raise ValueError("compressed data ended before the end-of-stream marker was reached")
        rest = dec.unused_data
    return b"".join(parts)


def _as_layout(arr: Any, layout: ChunkLayout, order: str = "<") -> np.ndarray:
    """``arr`` (what a numcodecs decoder returned) as an array of ``layout``; any other size is an error.

    Raw bytes (a filter that keeps bytes as they are, such as ``shuffle``) are
    read in the stored byte ``order`` (``"<"`` or ``">"``).
    """
    arr = ensure_ndarray(arr) if not isinstance(arr, np.ndarray) else arr
    want = layout.dtype
    if arr.dtype != want:
        if arr.dtype.kind == want.kind and arr.dtype.itemsize == want.itemsize:
            arr = arr.astype(want)  # the same type in another byte order
        elif want.hasobject or arr.dtype.hasobject:
            arr = arr.astype(want)
        else:
            arr = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
            if arr.nbytes != layout.nbytes:
                raise ValueError(f"decoded to {arr.nbytes} bytes, expected {layout.nbytes} for a chunk of shape "
                                 f"{layout.shape} and dtype {want}")
            stored = want.newbyteorder(order) if want.byteorder in "<>=" else want
            arr = arr.view(stored)
            if stored != want:
                arr = arr.astype(want)
    if arr.size != math.prod(layout.shape):
        raise ValueError(f"decoded to {arr.size} elements, expected {math.prod(layout.shape)} for a chunk of "
                         f"shape {layout.shape}")
    return arr.reshape(layout.shape)


class NumcodecsArrayArray(_Wrapped, ArrayArrayCodec):
    """A numcodecs filter (``fixedscaleoffset``, ``bitround``, ``quantize``, ``packbits``, ``astype`` ...).

    It decodes the stored bytes itself (numcodecs' filters view their input as
    the type they encoded to), so the ``bytes`` codec before it hands it the
    raw buffer (:attr:`raw_input`).
    """

    raw_input = True
    #: the byte order of the stored elements (the ``bytes`` codec's), for filters that hand back raw bytes
    byteorder = "<"
    #: the codec decoded after this one is a numcodecs filter too: it gets this one's output as it is (as
    #: zarr-python's Zarr v2 reader hands it on), only its size checked
    pass_on = False

    @property
    def sized(self) -> bool:
        """Whether :meth:`resolve` knows the encoded layout (else the stored size is left to this codec's check)."""
        return self.id in _LAYOUT_IDS

    def resolve(self, layout: ChunkLayout) -> ChunkLayout:
        impl = self.impl
        if self.id in ("delta", "fixedscaleoffset", "quantize", "categorize"):
            return ChunkLayout(layout.shape, np.dtype(impl.astype))
        if self.id == "astype":
            return ChunkLayout(layout.shape, np.dtype(impl.encode_dtype))
        if self.id == "packbits":
            return ChunkLayout((1 + math.ceil(math.prod(layout.shape) / 8),), np.dtype("u1"))
        return layout  # bitround, and filters that keep the layout

    def decode(self, data: Any, layout: ChunkLayout) -> np.ndarray:
        if isinstance(data, np.ndarray) and not data.flags.c_contiguous:
            data = np.ascontiguousarray(data)
        out = _bounded(self.id, self.impl, data, layout.nbytes) if not layout.dtype.hasobject else None
        out = self.impl.decode(data) if out is None else out
        if self.pass_on and not layout.dtype.hasobject:
            arr = ensure_ndarray(out)
            if arr.nbytes != layout.nbytes:
                raise ValueError(f"decoded to {arr.nbytes} bytes, expected {layout.nbytes}")
            return arr
        return _as_layout(out, layout, self.byteorder)

    def encode(self, data: np.ndarray) -> np.ndarray:
        return ensure_ndarray(self.impl.encode(np.ascontiguousarray(data)))


class NumcodecsArrayBytes(_Wrapped, ArrayBytesCodec):
    """A numcodecs codec from an array to bytes: the object codecs (``vlen-utf8``, ``vlen-bytes``, ``json2`` ...)
    and ``pcodec``/``zfpy``."""

    def decode(self, data: Any, layout: ChunkLayout) -> np.ndarray:
        out = self.impl.decode(bytes(data) if self.id in ("pcodec", "zfpy") else data)
        return _as_layout(out, layout)

    def encode(self, data: np.ndarray) -> Any:
        return self.impl.encode(data)
