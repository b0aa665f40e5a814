"""The codec interface: small classes keyed by the name in the Zarr metadata.

A codec decodes one stored representation into the one before it, as in the
Zarr v3 model: ``array -> array`` codecs (transpose, delta), exactly one
``array -> bytes`` codec (bytes, with its endianness) and ``bytes -> bytes``
codecs (compressors, checksums). Each class holds its configuration, round
trips it through :meth:`Codec.to_config`, and decodes one chunk on the CPU.
Batching over chunks is the pipeline's job (:mod:`.pipeline`); GPU batch
implementations are found by codec name in :mod:`.gpu`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

Kind = Literal["array_array", "array_bytes", "bytes_bytes"]


@dataclass(frozen=True)
class ChunkLayout:
    """Shape and dtype of a chunk at one point of the codec chain."""

    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for s in self.shape:
            n *= s
        return n


class Codec(ABC):
    """One codec of a chain. Subclasses set ``name`` and ``kind``."""

    name: ClassVar[str]
    kind: ClassVar[Kind]
    #: whether a GPU batch decoder exists for this codec (see :mod:`.gpu`)
    gpu_decode: ClassVar[bool] = False

    def __init__(self, **config: Any):
        self.config = config

    @classmethod
    def from_config(cls, config: dict) -> Codec:
        return cls(**config)

    def to_config(self) -> dict:
        return {"name": self.name, "configuration": dict(self.config)}

    def resolve(self, layout: ChunkLayout) -> ChunkLayout:
        """The layout this codec's *encoded* output has, given its input layout."""
        return layout

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config.items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.to_config() == self.to_config()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((self.name, repr(sorted(self.config.items()))))


class BytesBytesCodec(Codec):
    kind: ClassVar[Kind] = "bytes_bytes"

    @abstractmethod
    def decode(self, data: Any) -> Any:
        """Decode one chunk's buffer into a buffer (bytes-like or 1-d uint8 array)."""

    def encode(self, data: Any) -> Any:
        """Encode one chunk's buffer (the write side); codecs that gpuzarr does not write leave this out."""
        raise NotImplementedError(f"codec {self.name!r}: writing (encode) is not supported")


class ArrayBytesCodec(Codec):
    kind: ClassVar[Kind] = "array_bytes"

    @abstractmethod
    def decode(self, data: Any, layout: ChunkLayout) -> np.ndarray:
        """Decode one chunk's buffer into an array of ``layout``."""

    def encode(self, data: np.ndarray) -> Any:
        """Encode one chunk (an array of the chunk's layout) into a buffer (the write side)."""
        raise NotImplementedError(f"codec {self.name!r}: writing (encode) is not supported")


class ArrayArrayCodec(Codec):
    kind: ClassVar[Kind] = "array_array"

    @abstractmethod
    def decode(self, data: np.ndarray, layout: ChunkLayout) -> np.ndarray:
        """Undo this codec: ``data`` has the encoded layout, the result has ``layout``."""

    def encode(self, data: np.ndarray) -> np.ndarray:
        """Apply this codec to one chunk (the write side)."""
        raise NotImplementedError(f"codec {self.name!r}: writing (encode) is not supported")
