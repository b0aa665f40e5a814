"""The GPU device's block read: stored bytes -> pinned staging -> one copy up -> one batched decode -> block.

Called by :class:`gpuzarr_dist.array.reader.BlockReader` for ``device="gpu"``. Work
runs on the calling thread's own CUDA stream, which is synchronised before the
block is returned (so the pinned staging buffer can be reused and the block
is complete for whichever thread uses it next). A chain the GPU cannot decode
(see :func:`gpuzarr_dist.cuda.decode.gpu_unsupported`) is decoded on the CPU
into pinned memory and copied up once per block, with one warning per codec.
At most ``gpuzarr.gpu.read-slots`` blocks of the process read local files at
once (one by default), so that blocks land one after another and each decodes
while the next ones are read (:attr:`~gpuzarr_dist.stores.base.ChunkStore.read_turns`).
A block takes its turn once its files are sized and opened and its staging
buffer is found, just before the reads; a block of fewer stored bytes than
``gpuzarr.gpu.read-slot-min`` takes none. Before that, blocks prepare their
reads (keys, opens and sizes, shard indexes, range plans) one at a time too
(``gpuzarr.gpu.plan-turns``), so that the first is ready after its own
preparation, not after everyone's.
"""

from __future__ import annotations

from contextlib import ExitStack

import cupy
import numpy as np

from gpuzarr_dist.config import gpu_plan_turns, gpu_read_slot_min_bytes, gpu_read_slots
from gpuzarr_dist.core.plan_reader import PlanReader
from gpuzarr_dist.core.selection import Plan, grid_slabs, unit_step_grid, whole_chunk_grid
from gpuzarr_dist.cuda.decode import decode_batch_gpu, framing_lead, gpu_unsupported
from gpuzarr_dist.cuda.sources import source
from gpuzarr_dist.cuda.streams import ALIGN, pinned_empty, pinned_staging, settle, thread_stream, upload
from gpuzarr_dist.runtime.once import warn_once
from gpuzarr_dist.runtime.stages import stage_timer
from gpuzarr_dist.runtime.threads import read_slot

_warned: set[str] = set()


def _warn_cpu_fallback(codec: str, array: str) -> None:
    warn_once(_warned, codec, f"{array}: codec {codec!r} has no GPU decoder; its chunks are decoded on the CPU and "
              "copied to the GPU once per block (warned once per codec)", stacklevel=4)


def read_plan_gpu(reader: PlanReader, plan: Plan) -> cupy.ndarray:
    """Read the chunks of ``plan`` into a new device array of ``plan.out_shape``."""
    spec, pipeline = reader.spec, reader.pipeline
    stream = thread_stream()
    if not plan.n_parts:
        return cupy.empty(plan.out_shape, dtype=spec.dtype)
    unsupported = gpu_unsupported(pipeline)
    if unsupported is not None:
        _warn_cpu_fallback(unsupported, spec.name)
        host = reader.read_plan_cpu(plan, out=pinned_empty(plan.out_shape, spec.dtype))
        out = cupy.empty(plan.out_shape, dtype=spec.dtype)
        out.set(host, stream=stream)
        stream.synchronize()
        return out
    timed = stage_timer()
    slots = gpu_read_slots() if getattr(reader.store, "read_turns", False) else 0  # local files; object stores cap requests already
    turn_min = gpu_read_slot_min_bytes()
    with ExitStack() as turn, ExitStack() as preparing:  # blocks land one after another: each decodes while the next ones read
        if slots and gpu_plan_turns():  # and prepare one after another: the first is ready after its own preparation
            preparing.enter_context(read_slot(1, "plan"))

        def staging(nbytes: int):
            preparing.close()  # prepared: the next block's preparation runs beside this one's reads
            # the buffer before the turn: pinning new memory (a staging pool miss) takes 100-250 ms for 512 MiB,
            # and inside the turn every other block's reads would wait for it
            buf = pinned_staging(nbytes)
            if not turn_taken and nbytes >= turn_min:  # a small read takes no turn (gpuzarr.gpu.read-slot-min)
                turn_taken.append(turn.enter_context(read_slot(slots)))
            return buf

        turn_taken: list = []
        keys = spec.chunk_keys(plan.coords())
        host, offsets, sizes = reader.store.read_into(keys, staging, ALIGN, framing_lead(pipeline))
    timed("read files")
    try:
        # the block's device array after its reads: an object store's first request leaves sooner (the
        # allocation would otherwise sit between the task's start and its first request)
        out = cupy.empty(plan.out_shape, dtype=spec.dtype)
        stored = np.asarray(sizes, dtype=np.int64) >= 0
        missing = np.flatnonzero(~stored).tolist()  # no loop per chunk: see below
        for i in missing:
            out[plan.parts[i].out_sel] = spec.fill_value
        slabs = grid_slabs(plan, spec, out.shape, getattr(reader, "decode_bytes", None)) if not missing else None
        present = range(len(sizes))
        if slabs is not None:  # rows of the chunk grid decoded and placed one slab after another
            for lo, hi in slabs:
                _read_slab(pipeline, plan, spec, out, host, offsets, sizes, keys, lo, hi, stream)
            timed("H2D + decode")
        elif len(missing) < len(sizes):
            if missing:  # the chunks that exist (a block of a sharded array holds thousands: lists only here)
                present = np.flatnonzero(stored).tolist()
                offsets, sizes, keys = ([v[i] for i in present] for v in (offsets, sizes, keys))
            chunks = decode_batch_gpu(pipeline, host, offsets, sizes, keys, stream)
            timed("H2D + decode")
            if len(present) != plan.n_parts or not _place_parts(out, chunks, plan, spec.chunk_shape):
                for j, i in enumerate(present):
                    part = plan.parts[i]
                    out[part.out_sel] = chunks[j][part.chunk_sel]
        stream.synchronize()
        timed("place")
    except BaseException:
        settle(stream)  # ``host`` goes back to the shared pinned pool: no copy may still read it
        raise
    return out


def _read_slab(pipeline, plan: Plan, spec, out: cupy.ndarray, host, offsets: list[int], sizes: list[int],
               keys: list[str], lo: int, hi: int, stream: cupy.cuda.Stream) -> None:
    """Decode parts ``lo:hi`` of ``plan`` (whole grid rows, see :func:`.assemble.grid_slabs`) and place them into ``out``.

    The slab's stored bytes are copied up from where they lie in ``host``
    (offsets rebased to an aligned start, so each frame keeps its alignment).
    Its decoded chunks and nvCOMP's scratch are freed on return, to the
    thread stream's pool, before the next slab allocates its own: the next
    slab's work is queued behind this one's placement on the same stream.
    """
    base = offsets[lo] // ALIGN * ALIGN
    chunks = decode_batch_gpu(pipeline, host[base:], [o - base for o in offsets[lo:hi]], sizes[lo:hi], keys[lo:hi],
                              stream)
    rows = plan.rows(lo, hi)
    _place_parts(out[rows.first.out_sel[0].start : rows.last.out_sel[0].stop], chunks, rows, spec.chunk_shape)


def _place_parts(out: cupy.ndarray, chunks: cupy.ndarray, plan: Plan, chunk_shape: tuple[int, ...]) -> bool:
    """Place the decoded ``chunks`` of ``plan``, a C-ordered grid, into ``out`` with one kernel: whole chunks
    tiling ``out``, or a grid trimmed at its edges; ``False`` (nothing placed) where the plan is neither."""
    if whole_chunk_grid(plan, chunk_shape, out.shape):
        _place_grid(out, chunks, chunk_shape)
    elif out.ndim == len(chunk_shape) and unit_step_grid(plan):
        _place_trimmed_grid(out, chunks, plan, chunk_shape)
    else:
        return False
    return True


#: one CUDA block per row of the block's last axis at a time: the row's chunk and its place in it are worked out
#: once per row (64-bit, the other axes), each element's along the last axis in ``U`` (32-bit unless that axis
#: is too long): about 2.7 times faster than one thread per element working out every axis with 64-bit
#: divisions. Its source is ``kernels/place_rows.cu``; :func:`place_tiles` puts the element types before it.
_PLACE_SRC = source("place_rows.cu")
_PLACE_TYPES = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}
#: the last axis' arithmetic is 32-bit while the block's last axis plus its start, and the chunk's, stay below this
_PLACE_NARROW = 1 << 32


def _place_trimmed_grid(out: cupy.ndarray, chunks: cupy.ndarray, plan: Plan, chunk_shape: tuple[int, ...]) -> None:
    """Place a C-ordered grid of chunks, trimmed at the block's edges, into ``out`` with one kernel.

    A shard at the edge of the array (e.g. 768 x 1536 over 721 x 1440) makes
    every block a trimmed grid of dozens of inner chunks: one ``out[...] =``
    per chunk cost a kernel launch and its Python each. The kernel reads each
    element from its chunk directly (a padded block cut afterwards would cost
    a second copy and an allocation as large as the block).
    """
    first, last = plan.first, plan.last
    grid = tuple(b - a + 1 for a, b in zip(first.coords, last.coords))
    item = out.dtype.itemsize
    tile_elems = 1
    for c in chunk_shape:
        tile_elems *= c
    tiles_ok = (chunks.dtype == out.dtype and chunks.shape[1:] == tuple(chunk_shape) and len(chunks) == plan.n_parts
                and chunks[:1].flags.c_contiguous and chunks.strides[0] % item == 0
                and chunks.strides[0] // item >= tile_elems)
    if item not in _PLACE_TYPES or not out.flags.c_contiguous or not tiles_ok:
        padded = cupy.empty(tuple(g * c for g, c in zip(grid, chunk_shape)), dtype=out.dtype)
        _place_grid(padded, chunks, chunk_shape)
        out[...] = padded[tuple(slice(s.start, s.start + n) for s, n in zip(first.chunk_sel, out.shape))]
        return
    place_tiles(out, chunks, chunk_shape, grid, tuple(s.start for s in first.chunk_sel))


def place_tiles(out: cupy.ndarray, chunks: cupy.ndarray, chunk_shape: tuple[int, ...], grid: tuple[int, ...],
                start: tuple[int, ...]) -> None:
    """Queue :data:`_PLACE_SRC`'s kernel: ``out`` (C-contiguous) from ``chunks``, a C-ordered ``grid`` of tiles of
    ``chunk_shape`` (each at a multiple of ``chunks.strides[0]``), the block starting ``start`` into its first tile."""
    from gpuzarr_dist.cuda.launch import kernel as compiled

    if not out.size:
        return
    item = out.dtype.itemsize
    wide = out.shape[-1] + start[-1] >= _PLACE_NARROW or chunk_shape[-1] >= _PLACE_NARROW
    u = "unsigned long long" if wide else "unsigned int"
    kernel = compiled("place_rows", f"typedef {_PLACE_TYPES[item]} T;\ntypedef {u} U;\n" + _PLACE_SRC,
                      (f"-DGZ_PLACE_ITEM={item}", f"-DGZ_PLACE_WIDE={int(wide)}"))  # one build per item size and width
    nd = out.ndim
    dims = upload(np.asarray([*out.shape, *chunk_shape, *grid, *start], dtype=np.int64))
    rows = out.size // out.shape[-1]
    threads = min(256, 32 * -(-out.shape[-1] // 32))
    kernel((min(rows, 1 << 20),), (threads,), (chunks, out, np.int64(rows), np.int32(nd), dims,
                                                 np.int64(chunks.strides[0] // item)))


def _place_grid(out: cupy.ndarray, chunks: cupy.ndarray, chunk_shape: tuple[int, ...]) -> None:
    """Copy a C-ordered grid of decoded chunks into ``out`` with one kernel instead of one per chunk."""
    grid = tuple(o // c for o, c in zip(out.shape, chunk_shape))
    nd = len(grid)
    tiles = out.reshape([v for g, c in zip(grid, chunk_shape) for v in (g, c)])
    tiles = tiles.transpose(list(range(0, 2 * nd, 2)) + list(range(1, 2 * nd, 2)))
    tiles[...] = chunks.reshape(grid + tuple(chunk_shape))
