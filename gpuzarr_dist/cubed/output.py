"""``to_zarr``: a cubed array written to a new Zarr array laid out for batched encodes.

``cubed.to_zarr(x, "out.zarr")`` makes every block of ``x`` one Zarr chunk,
so each write task encodes a single chunk: one thread of zstd on the CPU
(a block under ``gpuzarr.gpu.min-batch``) or a one-chunk nvCOMP call, the
slowest way either device has. :func:`to_zarr` creates the target with the
chunk rule of :func:`gpuzarr_dist.to_zarr_gpu` instead (a block up to
16 MiB is one chunk; a larger block is cut into chunks of about 4 MiB that
divide it), then runs ``cubed.to_zarr`` into it: each task's block is still
one write of whole chunks, which the write path encodes as one batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def output_chunks(block: tuple[int, ...], itemsize: int, chunks: Any, name: str) -> tuple[int, ...]:
    """The target's chunk shape for blocks of shape ``block``: ``chunks``, or the default rule; it must divide the block.

    A chunk that does not divide the block would be written in part by two
    tasks at once (zarr-python reads, merges and rewrites it): one of the
    writes could be lost, so it is refused.
    """
    from gpuzarr_dist.core.layout import as_shape, block_chunks

    block = tuple(max(int(b), 1) for b in block)
    chunk = block_chunks(block, itemsize) if chunks is None else as_shape(chunks, len(block), "chunks", block)
    bad = [ax for ax, (b, c) in enumerate(zip(block, chunk)) if b % c]
    if bad:
        raise ValueError(f"{name}: chunks {chunk} do not divide the array's blocks {block} along axis {bad[0]}; "
                         "each block must be whole chunks (rechunk the array or pick chunks that divide its blocks)")
    return chunk


def to_zarr(
    x: Any,
    store: Any,
    path: str | None = None,
    *,
    chunks: Any = None,
    codec: str = "zstd",
    level: int | None = None,
    crc32c: bool = False,
    fill_value: Any = None,
    overwrite: bool = False,
    storage_options: dict | None = None,
    executor: Any = None,
    **compute_kwargs: Any,
) -> Any:
    """Compute the cubed array ``x`` into a new Zarr v3 array at ``store`` (``path`` inside it); the ``zarr.Array``.

    Parameters
    ----------
    x
        A ``cubed.Array``.
    store, path, storage_options
        Where the array goes: a local path, a URL or a zarr store, as for
        :func:`gpuzarr_dist.to_zarr_gpu`.
    chunks
        The Zarr chunk shape; it must divide ``x.chunksize`` on every axis.
        Default: the block itself up to 16 MiB, else chunks of about 4 MiB
        dividing it (as :func:`gpuzarr_dist.to_zarr_gpu` does).
    codec, level, crc32c
        ``"zstd"`` (default; level 0, zstd's default), ``"gzip"`` or ``"none"``,
        and a crc32c checksum after it: the chains the write path encodes
        (nvCOMP on the GPU).
    fill_value
        The array's fill value (zarr-python's default when ``None``).
    overwrite
        Replace what is there. Without it an existing array or group raises
        :class:`~gpuzarr_dist.errors.ArrayExistsError`.
    executor, compute_kwargs
        Passed to ``cubed.to_zarr`` (e.g. ``callbacks=[gc.progress_bar()]``).
        The spec's executor by default, and ``optimize_function``
        :func:`gpuzarr_dist.cubed.optimize_dag` by default: cubed's fusion,
        except that an operation is never fused into a consumer with more
        tasks, so ``x - mean(x, axis=0)`` computes the mean once rather than in
        every subtract task. Pass ``optimize_function=`` to choose another, or
        ``None`` for cubed's own (``multiple_inputs_optimize_dag``; with the
        benchmark's blocks of 600 steps it fuses the whole mean into every
        subtract task and reads the source five times over).
    """
    import cubed

    from gpuzarr_dist.stores.target import codec_objects, create_metadata, open_target

    target = open_target(store, path, storage_options)
    dtype = np.dtype(x.dtype)
    chunk = output_chunks(tuple(x.chunksize), dtype.itemsize, chunks, target.name)
    z = create_metadata(target, shape=tuple(x.shape), dtype=dtype, chunk=chunk, shard=None,
                        compressors=codec_objects(codec, level, crc32c), fill_value=fill_value, attributes=None,
                        dimension_names=None, overwrite=overwrite, resume=False)
    if "optimize_function" not in compute_kwargs:
        from gpuzarr_dist.cubed.fusion import optimize_dag

        compute_kwargs["optimize_function"] = optimize_dag
    cubed.to_zarr(x, z, executor=executor, **compute_kwargs)
    return z
