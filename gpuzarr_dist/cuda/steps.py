"""What a compressor does on the device, declared by the compressor's own module: the GPU decode path's plug-ins.

A module per codec (:mod:`.zstd`, :mod:`.deflate` for gzip and zlib,
:mod:`.lz4`, :mod:`.blosc`) builds a :class:`DeviceSteps` and
:func:`register`\\ s it under the codec's metadata name; importing
:mod:`.codecs` imports them all. The driver (:mod:`.decode`) runs the
registered steps of a chain's compressor in a fixed order:

1. ``check_host`` on the stored bytes before anything is copied up (raises);
2. the copy up, then ``check_frames`` on the device: ``None`` hands the batch
   to nvCOMP; a list of suspects ``(index, reason)`` (possibly empty) keeps it
   from nvCOMP: the CPU decoder judges the suspects (raising for the first it
   rejects), ``warn_fallback`` is called if set, and the batch decodes on the CPU;
3. one nvCOMP call for ``algorithm`` on the payloads (``head`` bytes of
   framing before each, ``tail`` after it stripped);
4. ``verify`` after the sizes match: the chunks whose checksums do not match,
   as ``(index, reason)``, judged by the CPU decoder like the suspects.

A codec with a ``decode`` of its own (Blosc: frames taken apart on the host,
several inner codecs) runs that instead of steps 1-4.

Imports no cupy and no other codec module: it is the bottom of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np


class Batch(NamedTuple):
    """One batch of one compressor's chunks, as the device steps see it."""

    array: str  # the array's name, for errors
    host: np.ndarray  # the stored bytes (pinned)
    offsets: Sequence[int]  # each chunk's frame in ``host``, and in ``dev``
    sizes: Sequence[int]  # each frame's bytes (outer crc32c stripped)
    keys: Sequence[str]  # each chunk's key
    expected: int  # decoded bytes of every chunk
    dev: Any  # cupy uint8: the frames on the device, at ``offsets``
    in_offs: np.ndarray  # int64: each payload (framing stripped) in ``dev``
    in_sizes: np.ndarray  # int64: each payload's bytes
    frames: Any  # cupy (2, n) int64: ``in_offs`` and ``in_sizes`` already on the device
    out: Any  # cupy uint8: the decoded slots, chunk ``i`` at ``i * stride``
    stride: int
    stream: Any  # the batch's stream (current while the steps run)


#: ``(index, reason)`` of chunks kept from nvCOMP or failing a check after it
Suspects = list[tuple[int, str]]


@dataclass(frozen=True)
class DeviceSteps:
    """The device side of one compressor (see the module's docstring for the order the driver runs them in)."""

    name: str  #: the codec's metadata name
    algorithm: str | None = None  #: nvCOMP's algorithm (``nvcomp.Codec``'s name); None with ``decode``
    head: int = 0  #: bytes of framing before the payload nvCOMP decodes
    tail: int = 0  #: bytes of framing after it
    kernels: tuple[str, ...] = ()  #: the ``kernels/*.cu`` sources the steps compile
    #: why the GPU cannot decode this codec's configuration (``codec`` the chain's codec object), or None
    unsupported: Callable[[Any], str | None] | None = None
    #: ``(array, host, offsets, sizes, keys, expected)``: raise :class:`ChunkDecodeError` for a bad chunk
    check_host: Callable[..., None] | None = None
    check_frames: Callable[[Batch], Suspects | None] | None = None
    #: ``(array, suspects)``: called when the CPU accepted every suspect and decodes the batch
    warn_fallback: Callable[[str, Suspects], None] | None = None
    verify: Callable[[Batch], Suspects] | None = None
    #: ``(pipeline, host, offsets, sizes, stored_sizes, keys, expected, stride, stream)`` -> the decoded bytes on
    #: the device, chunk ``i`` at ``i * stride``, or None where the batch decodes on the CPU
    decode: Callable[..., Any] | None = None


_registry: dict[str, DeviceSteps] = {}


def register(steps: DeviceSteps) -> DeviceSteps:
    """Register ``steps`` under ``steps.name`` (a later registration of the name replaces it)."""
    _registry[steps.name] = steps
    return steps


def device_steps(name: str) -> DeviceSteps | None:
    """The registered steps of the codec ``name``, or None."""
    return _registry.get(name)


def registered() -> dict[str, DeviceSteps]:
    """Every registered codec's steps, by name (a copy)."""
    return dict(_registry)
