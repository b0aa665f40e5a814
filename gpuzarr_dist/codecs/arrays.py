"""Array codecs: ``bytes`` (array <-> bytes with an endianness), ``transpose`` and ``delta``."""

from __future__ import annotations

import sys
from typing import Any

import numcodecs
import numpy as np

from gpuzarr_dist.codecs.base import ArrayArrayCodec, ArrayBytesCodec, ChunkLayout


class Bytes(ArrayBytesCodec):
    """Zarr v3 ``bytes``: the chunk's elements in C order with the given endianness."""

    name = "bytes"
    gpu_decode = True

    def __init__(self, endian: str | None = None, **config: Any):
        if endian not in (None, "little", "big"):
            raise ValueError(f"bytes codec: endian must be 'little' or 'big', got {endian!r}")
        super().__init__(**({"endian": endian} if endian else {}), **config)
        self.endian = endian or sys.byteorder

    def decode(self, data: Any, layout: ChunkLayout) -> np.ndarray:
        buf = data if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)
        buf = buf.reshape(-1).view(np.uint8) if buf.dtype != np.uint8 else buf.reshape(-1)
        if buf.nbytes != layout.nbytes:
            raise ValueError(
                f"decoded to {buf.nbytes} bytes, expected {layout.nbytes} "
                f"for a chunk of shape {layout.shape} and dtype {layout.dtype}"
            )
        stored = layout.dtype.newbyteorder("<" if self.endian == "little" else ">")
        arr = buf.view(stored).reshape(layout.shape)
        if layout.dtype.itemsize > 1 and self.endian != sys.byteorder:
            arr = arr.astype(layout.dtype)
        return arr

    def encode(self, data: np.ndarray) -> np.ndarray:
        """The chunk's elements in C order with this codec's endianness, as a flat uint8 array."""
        arr = np.asarray(data)
        stored = arr.dtype.newbyteorder("<" if self.endian == "little" else ">")
        return np.ascontiguousarray(arr, dtype=stored).reshape(-1).view(np.uint8)


class Transpose(ArrayArrayCodec):
    """Zarr v3 ``transpose``: encoded = array.transpose(order)."""

    name = "transpose"
    gpu_decode = True

    def __init__(self, order: Any, **config: Any):
        super().__init__(order=[int(o) for o in order], **config)
        self.order = tuple(int(o) for o in order)
        if sorted(self.order) != list(range(len(self.order))):
            raise ValueError(f"transpose codec: order {self.order} is not a permutation")

    def resolve(self, layout: ChunkLayout) -> ChunkLayout:
        if len(self.order) != len(layout.shape):
            raise ValueError(f"transpose codec: order {self.order} does not match {len(layout.shape)} dimensions")
        return ChunkLayout(tuple(layout.shape[i] for i in self.order), layout.dtype)

    def decode(self, data: np.ndarray, layout: ChunkLayout) -> np.ndarray:
        return data.transpose(np.argsort(self.order))

    def encode(self, data: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(data.transpose(self.order))


class Delta(ArrayArrayCodec):
    """numcodecs ``delta``: differences of consecutive elements in memory order."""

    name = "delta"
    gpu_decode = True

    def __init__(self, dtype: str, astype: str | None = None, **config: Any):
        super().__init__(dtype=dtype, **({"astype": astype} if astype else {}), **config)
        self._codec = numcodecs.Delta(dtype=dtype, astype=astype)

    def resolve(self, layout: ChunkLayout) -> ChunkLayout:
        return ChunkLayout(layout.shape, np.dtype(self._codec.astype).newbyteorder("="))

    def decode(self, data: np.ndarray, layout: ChunkLayout) -> np.ndarray:
        enc = np.ascontiguousarray(data).astype(self._codec.astype, copy=False)
        return np.asarray(self._codec.decode(enc)).astype(layout.dtype, copy=False).reshape(layout.shape)
