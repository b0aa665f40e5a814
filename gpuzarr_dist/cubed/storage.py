"""Cubed's intermediate arrays, through one seam: :class:`IntermediateArray`.

Cubed stores every operation's output in Zarr (``work_dir``) and reads it back
in the next operation. Its tasks reach those arrays through the read and write
proxies of each operation (``BlockwiseSpec.reads_map`` / ``writes_map``);
:func:`wrap_pipeline` swaps each Zarr proxy for one whose array is an
:class:`IntermediateArray`:

- reads go through gpuzarr-dist's read path (:class:`gpuzarr_dist.reader.BlockReader`:
  one batched read, one batched decode, nvCOMP on the GPU);
- writes go through zarr-python today (with zarr's GPU buffers on the GPU,
  :func:`prepare_process`; zarr then compresses on the host). The batched GPU
  encode (``to_zarr_gpu``'s write path) plugs in at :meth:`IntermediateArray.__setitem__`.

Anything that is not a plain Zarr array (cubed's virtual arrays, structured
dtypes) is left as cubed made it. Nothing here imports cubed or cupy at import.
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from typing import Any

import numpy as np

_lock = threading.Lock()
_readers: dict[tuple, Any] = {}
_prepared: set[tuple[int, str]] = set()
_warned: set[str] = set()


def prepare_process(device: str) -> None:
    """Once per process: on the GPU, zarr-python uses device buffers, so cupy blocks are written without a host copy by us."""
    import os

    key = (os.getpid(), device)
    if key in _prepared:
        return
    with _lock:
        if key in _prepared:
            return
        if device == "gpu":
            import zarr

            zarr.config.set({"buffer": "zarr.buffer.gpu.Buffer", "ndbuffer": "zarr.buffer.gpu.NDBuffer"})
        _prepared.add(key)


def _warn_once(what: str, message: str) -> None:
    with _lock:
        if what in _warned:
            return
        _warned.add(what)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


class IntermediateArray:
    """A cubed intermediate Zarr array: reads through gpuzarr-dist's batched read path, writes through zarr."""

    def __init__(self, zarray: Any, device: str):
        self._zarray = zarray
        self.device = device
        self.shape = tuple(zarray.shape)
        self.dtype = np.dtype(zarray.dtype)
        self.chunks = tuple(zarray.chunks)
        self.ndim = len(self.shape)

    def _reader(self) -> Any:
        from ..reader import BlockReader
        from ..stores.source import open_source

        z = self._zarray
        key = (str(z.store), z.path, self.shape, str(self.dtype), self.chunks, self.device)
        r = _readers.get(key)
        if r is None:
            store, spec = open_source(z)
            r = BlockReader(store, spec, self.device)
            with _lock:
                if len(_readers) > 256:
                    _readers.clear()
                _readers[key] = r
        return r

    def __getitem__(self, selection: Any) -> Any:
        try:
            reader = self._reader()
        except Exception as e:  # a chain our registry cannot decode: zarr reads it, with one warning
            _warn_once(str(self._zarray.path), f"{self._zarray.path}: intermediate read through zarr-python ({e})")
            return self._zarray[selection]
        return reader[selection]

    def __setitem__(self, selection: Any, value: Any) -> None:
        # The seam for the GPU write path: encode the block in one nvCOMP batch and write its chunks.
        self._zarray[selection] = value

    def __getattr__(self, name: str) -> Any:  # store, path, metadata, ... as zarr has them
        return getattr(self._zarray, name)


class IntermediateProxy:
    """Stands in for cubed's ``CubedArrayProxy``: same ``array``/``chunks``, ``open()`` gives an IntermediateArray."""

    def __init__(self, proxy: Any, device: str):
        self.array = proxy.array
        self.chunks = proxy.chunks
        self._proxy = proxy
        self.device = device

    def open(self) -> IntermediateArray:
        return IntermediateArray(self._proxy.open(), self.device)


def _wrappable(proxy: Any) -> bool:
    import zarr

    try:
        from cubed.storage.zarr import LazyZarrArray
    except ImportError:  # pragma: no cover
        LazyZarrArray = ()  # type: ignore[assignment]
    arr = getattr(proxy, "array", None)
    if not isinstance(arr, (zarr.Array, LazyZarrArray)):
        return False
    dtype = np.dtype(arr.dtype)
    return dtype.fields is None and dtype.kind in "biufc"


def wrap_config(config: Any, device: str) -> Any:
    """A copy of a cubed ``BlockwiseSpec`` whose Zarr read/write proxies go through :class:`IntermediateArray`."""
    if config is None or not dataclasses.is_dataclass(config):
        return config
    if not hasattr(config, "reads_map") or not hasattr(config, "writes_map"):
        return config
    reads = {k: IntermediateProxy(p, device) if _wrappable(p) else p for k, p in config.reads_map.items()}
    writes = {k: IntermediateProxy(p, device) if _wrappable(p) else p for k, p in config.writes_map.items()}
    return dataclasses.replace(config, reads_map=reads, writes_map=writes)
