"""``spec``: a ``cubed.Spec`` whose ``allowed_mem`` is the per-task device memory budget."""

from __future__ import annotations

import warnings
from typing import Any

from dask.utils import parse_bytes

from gpuzarr_dist.cubed.backend import CUPY, _same, loaded, use_backend
from gpuzarr_dist.cubed.memory import default_read_block, default_reserved_mem
from gpuzarr_dist.cuda.device import resolve_device


def choose_device(device: str) -> str:
    """``"auto"``: the GPU when usable and cubed can still (or already does) use cupy; else the CPU."""
    if device == "auto":
        dev = resolve_device("auto")
        have = loaded()
        if dev == "gpu" and have is not None and not _same(have, CUPY):
            warnings.warn(f"a GPU is usable, but cubed was already imported with the {have!r} backend: "
                          "running on the CPU. Import gpuzarr_dist.cubed and call spec() before cubed is "
                          "imported to run on the GPU.", RuntimeWarning, stacklevel=3)
            return "cpu"
        return dev
    return resolve_device(device)


def nbytes(value: int | str | None, what: str) -> int | None:
    if value is None:
        return None
    n = int(parse_bytes(value)) if isinstance(value, str) else int(value)
    if n < 0:
        raise ValueError(f"{what} must be at least 0, got {value!r}")
    return n


#: cubed >= 0.28 hands ``zarr_compressor`` to ``zarr.create_array(compressors=...)``: a Zarr v3 codec
ZSTD_V3 = {"name": "zstd", "configuration": {"level": 0, "checksum": False}}
#: cubed 0.27 takes a numcodecs config (its zarr-python 2 and tensorstore stores); its zarr-python 3
#: store ignores the value and zarr-python 3's default, zstd level 0, applies: the same chain
ZSTD_NUMCODECS = {"id": "zstd", "level": 0}


def intermediate_compressor(cubed_version: str) -> dict:
    """The ``zarr_compressor`` for cubed's intermediates: zstd (level 0: zstd's default), in the form ``cubed_version`` takes.

    zstd because gpuzarr-dist's write path encodes it on the GPU (nvCOMP) and on
    the CPU; cubed's own default (``"default"`` in 0.27, ``"auto"`` in 0.28:
    zarr-python's default) is not something we can rely on across zarr versions.
    """
    parts = []
    for p in cubed_version.split(".")[:2]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits or 0))
    major, minor = (parts + [0, 0])[:2]
    return dict(ZSTD_V3) if (major, minor) >= (0, 28) else dict(ZSTD_NUMCODECS)


def spec(
    allowed_mem: int | str,
    work_dir: str | None = None,
    *,
    device: str = "auto",
    reserved_mem: int | str | None = None,
    executor: Any = None,
    read_block: int | str | None = None,
    intermediate_store: Any = None,
    storage_options: dict | None = None,
    zarr_compressor: Any = None,
) -> Any:
    """A ``cubed.Spec`` for gpuzarr-dist: ``allowed_mem`` per task on the device, decoder workspace in ``reserved_mem``.

    Parameters
    ----------
    allowed_mem
        Memory one task may use, bytes or a string (``"2 GB"``): device memory
        on the GPU, host memory on the CPU. Includes ``reserved_mem``.
    work_dir
        Where cubed writes intermediate Zarr arrays (default: a temporary directory).
    device
        ``"auto"`` (GPU when usable), ``"gpu"`` or ``"cpu"``. Sets cubed's array
        backend (cupy on the GPU) if cubed is not imported yet; raises
        :class:`~gpuzarr_dist.cubed.CubedBackendError` when it is and has another backend.
    reserved_mem
        Memory per task that is not array data. Default: the decoders' and
        pools' workspace for read blocks of ``read_block`` bytes,
        ``1.525 * read_block + 2 MiB`` on the GPU (nvCOMP's zstd scratch, 3.05
        bytes per decoded byte of a call, for calls of half a read block: see
        :mod:`gpuzarr_dist.cubed.memory`; cubed counts the compressed bytes as
        the block's read buffer) and ``1.0 * read_block`` on the CPU.
    executor
        Default: :class:`~gpuzarr_dist.cubed.ThreadsExecutor` on the device.
    read_block
        Decompressed size of the blocks :func:`from_zarr_gpu` reads; default
        ``allowed_mem / 5.525`` on the GPU (the largest cubed's projection of a
        read, ``reserved_mem`` + 4 x the block, allows), ``allowed_mem // 8`` on the CPU.
    intermediate_store, storage_options
        As for ``cubed.Spec``.
    zarr_compressor
        The intermediates' compressor, as ``cubed.Spec`` takes it. Default
        (``None``): zstd (:func:`intermediate_compressor`), which gpuzarr-dist's
        write path encodes (nvCOMP on the GPU). Any other value is passed to
        cubed; a chain our write path does not encode (e.g. Blosc) is written by
        zarr-python, compressed on the host, with a warning.
    """
    dev = choose_device(device)
    use_backend(dev)
    import cubed

    allowed = nbytes(allowed_mem, "allowed_mem")
    if not allowed:
        raise ValueError(f"allowed_mem must be more than 0, got {allowed_mem!r}")
    rb = nbytes(read_block, "read_block") or default_read_block(allowed, dev)
    reserved = nbytes(reserved_mem, "reserved_mem")
    if reserved is None:
        reserved = default_reserved_mem(allowed, dev, rb)
    if reserved >= allowed:
        raise ValueError(f"reserved_mem ({reserved} bytes) leaves nothing of allowed_mem ({allowed} bytes) for "
                         "array data; raise allowed_mem or lower read_block/reserved_mem")
    if executor is None:
        from gpuzarr_dist.cubed.executor import ThreadsExecutor

        executor = ThreadsExecutor(device=dev)
    s = cubed.Spec(
        work_dir,
        intermediate_store=intermediate_store,
        allowed_mem=allowed,
        reserved_mem=reserved,
        executor=executor,
        storage_options=storage_options,
        zarr_compressor=intermediate_compressor(cubed.__version__) if zarr_compressor is None else zarr_compressor,
    )
    # cubed.Spec has no field for these; from_zarr_gpu reads them (plain attributes travel with pickles)
    s.gpuzarr_device = dev
    s.gpuzarr_read_block = rb
    return s
