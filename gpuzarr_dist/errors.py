"""Exceptions raised by gpuzarr-dist.

Every error that concerns stored data names the array and the chunk key (or the
metadata document and field), so a failure in one task of a large graph can be
traced to the object in the store that caused it.
"""

from __future__ import annotations

import difflib
import errno


class GpuZarrError(Exception):
    """Base class of every error raised by gpuzarr-dist.

    Every one pickles (dask sends a task's error from the worker to the
    client) with its message and attributes, whatever its constructor takes.
    """

    def __reduce__(self):
        state = dict(self.__dict__)
        if isinstance(self, OSError):  # not in args when a filename is given
            state.update({k: getattr(self, k) for k in ("errno", "strerror", "filename") if getattr(self, k) is not None})
        return _rebuild, (type(self), self.args, state)


def _rebuild(cls: type, args: tuple, state: dict) -> BaseException:
    """An error of class ``cls`` with ``args`` and attributes ``state``, made without calling its constructor."""
    try:
        error = cls.__new__(cls, *args)
    except TypeError:  # MemoryError's own __new__ refuses subclasses with other bases
        error = BaseException.__new__(cls, *args)
    (OSError if issubclass(cls, OSError) else Exception).__init__(error, *args)
    for k, v in state.items():
        setattr(error, k, v)
    return error


class MetadataError(GpuZarrError, ValueError):
    """Zarr metadata that cannot be read or is inconsistent.

    The message names the metadata document (``zarr.json`` or ``.zarray``) and,
    where known, the field.
    """


class UnsupportedCodecError(MetadataError, NotImplementedError):
    """A codec named in the metadata that no decoder in the registry handles."""

    def __init__(self, codec: str, array: str, known: list[str] | None = None, reason: str | None = None):
        self.codec = codec
        self.array = array
        hint = f" Known codecs: {', '.join(sorted(known))}." if known else ""
        super().__init__(f"{array}: {reason or 'unknown codec'} {codec!r}.{hint}")


class _ChunkCodecError(GpuZarrError, ValueError):
    """A chunk that a codec chain failed on; names the array, the chunk key and the codec."""

    verb = "process"

    def __init__(self, array: str, key: str, reason: str, codec: str | None = None):
        self.array = array
        self.key = key
        self.codec = codec
        self.reason = reason
        where = f" with codec {codec!r}" if codec else ""
        super().__init__(f"{array}: chunk {key!r} failed to {self.verb}{where}: {reason}")


class ChunkDecodeError(_ChunkCodecError):
    """A stored chunk that failed to decode (corrupt, truncated, wrong size, bad checksum)."""

    verb = "decode"


class DeviceUnavailableError(GpuZarrError, RuntimeError):
    """``device="gpu"`` was asked for where no usable GPU stack is installed."""


class ChunkReadError(GpuZarrError, OSError):
    """Reading a chunk's bytes from the store failed (after any retries)."""

    def __init__(self, array: str, key: str, reason: str):
        self.array = array
        self.key = key
        self.reason = reason
        super().__init__(f"{array}: reading chunk {key!r} failed: {reason}")


class ChunkEncodeError(_ChunkCodecError):
    """A chunk that failed to encode while writing (names the array, the chunk key and the codec)."""

    verb = "encode"


class ArrayExistsError(GpuZarrError, FileExistsError):
    """``to_zarr_gpu`` found an array or group at the target and was not told to overwrite or resume."""


class ChunkWriteError(GpuZarrError, OSError):
    """Writing a stored object (chunk or shard) to the store failed."""

    def __init__(self, array: str, key: str, reason: str):
        self.array = array
        self.key = key
        super().__init__(f"{array}: writing {key!r} failed: {reason}")


class ArrayNotFoundError(GpuZarrError, FileNotFoundError):
    """No Zarr array (or no store at all) where one was asked for.

    A ``FileNotFoundError`` (``errno`` ``ENOENT``, ``filename`` the store or
    array) as well as a :class:`GpuZarrError`; ``array`` names what was looked for.
    """

    def __init__(self, array: str, message: str | None = None):
        self.array = array
        super().__init__(errno.ENOENT, message or f"No Zarr array at {array}", array)

    def __str__(self) -> str:
        return self.strerror


class GroupNotFoundError(GpuZarrError, FileNotFoundError):
    """No Zarr group (or no store at all) where one was asked for; ``group`` names what was looked for."""

    def __init__(self, group: str, message: str | None = None):
        self.group = group
        super().__init__(errno.ENOENT, message or f"No Zarr group at {group}", group)

    def __str__(self) -> str:
        return self.strerror


class ComponentNotFoundError(ArrayNotFoundError, KeyError):
    """``component=`` names no array of the group; the message lists the arrays there, close matches first.

    Also a ``KeyError`` (as ``group[component]`` raises) and a
    ``FileNotFoundError``; ``component`` is the name asked for, ``available``
    the arrays the group holds (``None`` where the store cannot list them).
    """

    def __init__(self, array: str, component: str, available: list[str] | None, where: str | None = None):
        self.component = component
        self.available = None if available is None else list(available)
        where = where or array
        if self.available is None:
            listing = f"{where} cannot list its arrays"
        elif not self.available:
            listing = f"{where} holds no arrays"
        else:
            shown = ordered_matches(component, self.available)
            more = f" and {len(shown) - 20} more" if len(shown) > 20 else ""
            listing = f"arrays in {where}: {', '.join(shown[:20])}{more}"
            close = difflib.get_close_matches(component, self.available, n=1)
            if close:
                listing = f"did you mean {close[0]!r}? {listing}"
        super().__init__(array, f"No Zarr array at {array} (component {component!r}); {listing}")


def ordered_matches(name: str, candidates: list[str]) -> list[str]:
    """``candidates`` with the close matches of ``name`` first (closest first), then the others sorted."""
    close = difflib.get_close_matches(name, candidates, n=len(candidates), cutoff=0.6)
    base = {c.rsplit("/", 1)[-1]: c for c in candidates}
    close += [base[c] for c in difflib.get_close_matches(name, list(base), n=len(base), cutoff=0.6)]
    first = list(dict.fromkeys(close))
    return first + sorted(c for c in candidates if c not in first)


class NotAnArrayError(GpuZarrError, ValueError):
    """A Zarr group where an array was asked for; the message lists the group's arrays (pass ``component=``)."""

    def __init__(self, array: str, message: str):
        self.array = array
        super().__init__(message)


class NotAGroupError(GpuZarrError, ValueError):
    """A Zarr array where a group (a Dataset) was asked for."""


class MissingDependencyError(GpuZarrError, ModuleNotFoundError):
    """An optional dependency of the feature used is not installed; the message says what to install.

    A ``ModuleNotFoundError``, so ``except ImportError`` still catches it;
    ``extra`` names the project's extra that installs it (``"gpu"``, ``"cubed"``).
    """

    def __init__(self, message: str, *, name: str | None = None, extra: str | None = None):
        self.extra = extra
        self.module = name
        super().__init__(message, name=name)


#: how to install the GPU stack: gpuzarr-dist is installed from its source, not from a package index
GPU_INSTALL_HINT = (
    "install the GPU extra from a gpuzarr-dist checkout (pip install '.[gpu]'), or the GPU packages for your CUDA "
    "version: cupy-cuda13x, nvidia-nvcomp-cu13 and kvikio-cu13 (CUDA 13) or cupy-cuda12x, nvidia-nvcomp-cu12 and "
    "kvikio-cu12 (CUDA 12), and dask-cuda"
)


def extra_hint(extra: str) -> str:
    """How to install the project's optional dependency group ``extra`` (from a checkout of gpuzarr-dist)."""
    if extra == "gpu":
        return GPU_INSTALL_HINT
    return f"install the {extra} extra from a gpuzarr-dist checkout: pip install '.[{extra}]'"


class GpuOutOfMemoryError(GpuZarrError, MemoryError):
    """The GPU ran out of memory while reading a block; the message says the block size and how to lower it."""

    def __init__(self, array: str, message: str):
        self.array = array
        super().__init__(message)


class UnsupportedDtypeError(GpuZarrError, TypeError):
    """A data type the chosen device cannot hold (strings, bytes, structured or object arrays on the GPU).

    Raised when the graph is built; the message names the array and the data
    type and says to read it with ``device="cpu"``.
    """

    def __init__(self, array: str, dtype: object, device: str = "gpu"):
        self.array = array
        self.dtype = dtype
        super().__init__(
            f"{array}: data type {dtype} cannot be read on the {device.upper()} device (CuPy holds only numbers "
            f"and bools); open it with device=\"cpu\""
        )


class BlockTooLargeError(GpuZarrError, MemoryError):
    """A block larger than the memory of the device that reads it, refused before it is planned or allocated;
    the message names the array, the block's shape and bytes, and how to read smaller blocks."""

    def __init__(self, array: str, message: str):
        self.array = array
        super().__init__(message)
