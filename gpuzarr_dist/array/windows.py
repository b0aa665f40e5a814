"""Random windows, the machine-learning access pattern: many small boxes of one array, read in one batch.

A training loop asks for, say, 64 windows of (4, 128, 128) at random places of
a (T, 721, 1440) array. Through dask each window would be a graph, a task and
a decode call of a few chunks, and the GPU would decode a handful of chunks at
a time. :class:`WindowSampler` instead takes all windows of a batch at once:
it collects the chunks (inner chunks of shards) that any window touches, reads
them in one batched read (each shard's index once, then only the byte ranges
needed, merged when close), decodes them in one batched call (one nvCOMP call
on the GPU; a call of many chunks in parts on several threads, see
``gpuzarr.windows.part-chunks``), and cuts every window out of the decoded
chunks (:func:`_cut_windows`: one kernel on the GPU), on the device where the
chunks are. Each chunk is read once per call however many windows share it,
so larger calls read more windows per second.

No dask is involved: call it from a data loader's thread. The returned array
is ``(n, *window)``: numpy on the CPU, cupy on the GPU (complete when returned).
:meth:`WindowSampler.batches` reads batch after batch with several calls in
flight (a loader's prefetch): one call's reads overlap another's decode.

For a sharded array the sampler keeps the shard indexes it has read across
calls (``index_cache``, 64 MiB by default, least recently used dropped first),
so a call reads only the indexes of shards it has not seen: the array is
taken to be unchanged while the sampler lives (a training set). Pass
``index_cache=0`` to read every index again in every call, or call
:meth:`WindowSampler.clear_cache` after the array was rewritten.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import numpy as np

from gpuzarr_dist import config
from gpuzarr_dist.array.reader import BlockReader
from gpuzarr_dist.cuda.device import resolve_device
from gpuzarr_dist.runtime.stages import stage_timer
from gpuzarr_dist.runtime.threads import decode_pool, map_all
from gpuzarr_dist.stores.sharded import IndexCache, ShardedChunkStore
from gpuzarr_dist.stores.source import open_source


class WindowSampler:
    """Reads batches of equally shaped windows of one Zarr array.

    ``WindowSampler(source, window, component=None, *, device="auto", storage_options=None, index_cache="64 MiB")``
    opens the array once (same ``source`` forms as :func:`~gpuzarr_dist.from_zarr_gpu`);
    :meth:`sample` then reads one batch of windows per call, and :meth:`batches` many, with calls
    overlapping. ``index_cache``
    (bytes, or a string such as ``"64 MiB"``; 0 or ``None`` turns it off) bounds
    the shard indexes kept across calls of a sharded array (see the module docstring).
    """

    def __init__(self, source: Any, window: Sequence[int], component: str | None = None, *, device: str = "auto",
                 storage_options: dict | None = None, index_cache: int | str | None = "64 MiB"):
        dev = resolve_device(device)
        store, spec = open_source(source, component, storage_options)
        if index_cache and isinstance(store, ShardedChunkStore):
            from dask.utils import parse_bytes

            limit = int(parse_bytes(index_cache)) if isinstance(index_cache, str) else int(index_cache)
            if limit > 0:
                store.index_cache = IndexCache(limit)
        self.reader = BlockReader(store, spec, dev)
        self.spec = spec
        self.device = dev
        self.window = tuple(int(w) for w in window)
        self._threads: dict[str, tuple[ThreadPoolExecutor, int]] = {}  # kind -> (pool, size), made on first use (_pool)
        self._pool_lock = threading.Lock()
        if len(self.window) != spec.ndim or any(w < 1 or w > s for w, s in zip(self.window, spec.shape)):
            raise ValueError(f"{spec.name}: window {self.window} does not fit in an array of shape {spec.shape}")

    def __repr__(self) -> str:
        return f"WindowSampler({self.spec.name!r}, window={self.window}, device={self.device!r})"

    def clear_cache(self) -> None:
        """Forget the shard indexes kept across calls (after the array was rewritten)."""
        cache = getattr(self.reader.store, "index_cache", None)
        if cache is not None:
            cache.clear()

    def random_starts(self, n: int, rng: Any = None) -> np.ndarray:
        """``n`` uniformly random window corners ``(n, ndim)`` with every window inside the array."""
        rng = np.random.default_rng(rng)
        high = np.array(self.spec.shape) - np.array(self.window) + 1
        return rng.integers(0, high, size=(n, len(high)))

    def sample(self, starts: Any) -> Any:
        """The windows whose first corners are ``starts`` (``(n, ndim)`` integers), as an ``(n, *window)`` array."""
        spec, window = self.spec, self.window
        timed = stage_timer()
        starts = np.asarray(starts, dtype=np.int64).reshape(-1, spec.ndim)
        if starts.size and ((starts < 0).any() or (starts + np.array(window) > np.array(spec.shape)).any()):
            raise IndexError(f"{spec.name}: a window of {window} at some of the starts runs outside the array {spec.shape}")
        n = len(starts)
        chunk = np.array(spec.chunk_shape)
        first = starts // chunk
        grid = tuple(int(g) for g in ((np.array(window) + chunk - 2) // chunk + 1))  # most chunks a window touches, per axis
        # every (window, grid position) -> chunk coordinates; positions past the array's grid are padding
        offs = np.stack(np.meshgrid(*[np.arange(g) for g in grid], indexing="ij"), axis=-1).reshape(-1, spec.ndim)
        coords = first[:, None, :] + offs[None, :, :]  # (n, G, ndim)
        last = (starts + np.array(window) - 1) // chunk  # the last chunk each window touches, per axis
        inside = (coords <= last[:, None, :]).all(axis=-1)  # grid positions a window does not reach read nothing
        unique, inverse = _unique_rows(coords[inside], spec.grid_shape)
        keys = _chunk_keys(spec, unique)
        timed("windows: plan")
        chunks, present = self._decode(keys)
        timed("windows: read + decode")
        # index into [decoded chunks..., one fill chunk]: missing or padding chunks read the fill chunk
        slot = np.full(len(unique), len(present), dtype=np.int64)
        slot[np.asarray(present, dtype=np.int64)] = np.arange(len(present))
        idx = np.full(coords.shape[:2], len(present), dtype=np.int64)
        idx[inside] = slot[inverse.reshape(-1)]
        out = _cut_windows(chunks, idx.reshape((n, *grid)), starts - first * chunk, window, spec.fill_value)
        if self.device == "gpu":
            from gpuzarr_dist.cuda.streams import sync_thread_stream

            sync_thread_stream()  # complete when returned (and the cut's time is its own)
        timed("windows: cut")
        return out

    def batches(self, starts: Iterable[Any], in_flight: int = 2) -> Iterator[Any]:
        """:meth:`sample` of each item of ``starts`` (each an ``(n, ndim)`` array of corners), in order,
        with up to ``in_flight`` calls running at once: a data loader's prefetch.

        A call spends most of its time waiting, for its file reads and then
        for one nvCOMP call, so one call's reads overlap another's decode; on
        the GPU each thread has its own stream. At most ``in_flight`` batches are being
        read, plus the one the caller holds. The threads belong to the
        sampler and serve its later ``batches`` too (so a loop that calls
        ``batches`` every epoch does not make new threads, streams and nvCOMP
        codecs each time); :meth:`close` ends them. ``starts`` is consumed
        lazily, so it may be an endless generator::

            for w in sampler.batches(sampler.random_starts(64) for _ in range(1000)):
                ...

        An error in a call (a window outside the array, a damaged chunk) is
        raised where its batch would have been yielded; the calls still
        running are waited for, and the rest are not started. Closing the
        iterator early (``break``) does the same.
        """
        in_flight = int(in_flight)
        if in_flight < 1:
            raise ValueError(f"{self.spec.name}: in_flight must be at least 1, got {in_flight}")
        items = iter(starts)
        pool = self._pool("calls", in_flight)
        pending: deque[Future] = deque()
        try:
            for item in itertools.islice(items, in_flight):
                pending.append(pool.submit(self.sample, item))
            while pending:
                out = pending.popleft().result()
                for item in itertools.islice(items, 1):  # keep in_flight calls running while the caller works
                    pending.append(pool.submit(self.sample, item))
                yield out
        finally:
            for f in pending:
                f.cancel()
            wait(pending)  # no call left running (on the GPU: no stream with work still queued)

    def _pool(self, kind: str, threads: int) -> ThreadPoolExecutor:
        """The sampler's threads of ``kind``, at least ``threads`` of them: ``"calls"`` for :meth:`batches`,
        ``"parts"`` for the parts of a large call (apart, so that calls waiting for their parts never hold
        the threads the parts need).

        A larger count than before gets a larger pool; the smaller one is
        not shut down (an iterator still running may submit to it), its threads
        end when the last iterator using it is gone.
        """
        with self._pool_lock:
            entry = self._threads.get(kind)
            if entry is None or entry[1] < threads:
                entry = self._threads[kind] = (ThreadPoolExecutor(threads, thread_name_prefix=f"gpuzarr-windows-{kind}"),
                                               threads)
            return entry[0]

    def __getstate__(self) -> dict:  # picklable (e.g. a data loader's worker processes): threads are not sent
        state = dict(self.__dict__)
        state["_threads"], state["_pool_lock"] = {}, None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._threads, self._pool_lock = {}, threading.Lock()

    def close(self) -> None:
        """End the sampler's threads (after their calls finish); the sampler stays usable."""
        with self._pool_lock:
            old, self._threads = self._threads, {}
        for pool, _ in old.values():
            pool.shutdown(wait=True)

    def _decode(self, keys: list[str]) -> tuple[Any, list[int]]:
        """Decoded chunks ``(n_present, *chunk_shape)`` for ``keys`` and the positions of those present."""
        reader = self.reader
        if self.device == "gpu":
            from gpuzarr_dist.cuda.windows import decode_keys_gpu, join_parts

            bounds = _part_bounds(len(keys), config.window_part_chunks())
            if len(bounds) == 1:
                return decode_keys_gpu(reader, keys)
            # a large call: parts read and decode on several threads (streams) at once, so one part's file
            # reads overlap another's copy up and nvCOMP call, and every chunk is still read once per call
            parts = map_all(self._pool("parts", config.window_part_threads()),
                            lambda ab: decode_keys_gpu(reader, keys[ab[0] : ab[1]]), bounds)
            return join_parts(parts, [a for a, _ in bounds])
        raw = reader.store.read_many(keys) if keys else []
        present = [i for i, b in enumerate(raw) if b is not None]
        out = np.empty((len(present), *self.spec.chunk_shape), dtype=self.spec.dtype)

        def place(j: int, arr: np.ndarray) -> None:
            out[j] = arr

        if present:
            reader.pipeline.decode_batch([raw[i] for i in present], [keys[i] for i in present], decode_pool(), sink=place)
        return out, present


def sample_windows(source: Any, starts: Any, window: Sequence[int], component: str | None = None, *,
                   device: str = "auto", storage_options: dict | None = None) -> Any:
    """Read windows of shape ``window`` at ``starts`` in one batch (opens the array each call; reuse a
    :class:`WindowSampler` for many batches)."""
    return WindowSampler(source, window, component, device=device, storage_options=storage_options,
                         index_cache=0).sample(starts)


def _cut_windows(chunks: Any, idx: np.ndarray, offsets: np.ndarray, window: tuple[int, ...], fill: Any) -> Any:
    """Windows ``(n, *window)`` out of decoded ``chunks`` (numpy or cupy, ``(m, *chunk_shape)``).

    ``idx`` ``(n, *grid)`` names, for each window, the grid of chunks around it
    (``m`` = the fill chunk); ``offsets`` ``(n, ndim)`` where the window starts in
    the first chunk. On the device one kernel writes every element of every
    window straight from the decoded chunks
    (:func:`.windows_gpu.cut_windows_gpu`); on the host each window copies its
    chunks' slices.
    """
    if not isinstance(chunks, np.ndarray):
        from gpuzarr_dist.cuda.windows import cut_windows_gpu

        return cut_windows_gpu(chunks, idx, offsets, window, fill)
    if idx.shape[0] == 0:
        return np.empty((0, *window), dtype=chunks.dtype)
    return _cut_windows_host(chunks, idx, offsets, window, fill)


def _cut_windows_host(chunks: np.ndarray, idx: np.ndarray, offsets: np.ndarray, window: tuple[int, ...], fill: Any) -> np.ndarray:
    """:func:`_cut_windows` on the host: one slice copy per (window, chunk it overlaps).

    The overlap of every window with every grid position is worked out with
    numpy for all windows at once, per axis; the Python loop only walks the
    chunks a window really overlaps and copies.
    """
    n, nd = idx.shape[0], idx.ndim - 1
    cshape = chunks.shape[1:]
    grid = idx.shape[1:]
    out = np.empty((n, *window), dtype=chunks.dtype)
    m = len(chunks)
    per_axis = []  # per axis: for each window, [(grid position, source slice, destination slice)] it overlaps
    for a in range(nd):
        lo = np.arange(grid[a], dtype=np.int64) * cshape[a]  # (G,): where each grid position's chunk starts
        o = np.asarray(offsets[:, a : a + 1], dtype=np.int64)  # (n, 1): where each window starts
        s0, s1 = np.maximum(o, lo), np.minimum(o + window[a], lo + cshape[a])  # (n, G): the overlap
        rows = zip((s0 < s1).tolist(), (s0 - lo).tolist(), (s1 - lo).tolist(), (s0 - o).tolist(), (s1 - o).tolist())
        per_axis.append([[(g, slice(a0[g], a1[g]), slice(b0[g], b1[g])) for g in range(grid[a]) if ok[g]]
                         for ok, a0, a1, b0, b1 in rows])
    idx_rows = idx.tolist()
    for w in range(n):
        for combo in itertools.product(*(axis[w] for axis in per_axis)):
            k = idx_rows[w]
            for g, _, _ in combo:
                k = k[g]
            dst = (w, *(d for _, _, d in combo))
            out[dst] = chunks[(k, *(s for _, s, _ in combo))] if k < m else fill
    return out


def _part_bounds(n: int, part: int) -> list[tuple[int, int]]:
    """``[(start, stop)]`` splitting ``n`` chunks into even parts of at least ``part`` each (one part when
    ``n < 2 * part`` or ``part`` is 0)."""
    k = n // part if part > 0 else 1
    if k <= 1:
        return [(0, n)]
    edges = [n * i // k for i in range(k + 1)]
    return list(zip(edges[:-1], edges[1:]))


def _unique_rows(rows: np.ndarray, grid: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(rows, axis=0, return_inverse=True)`` for chunk coordinates inside ``grid``, through a 1-d unique.

    (The row-wise unique sorts a structured view and cost a millisecond per window call.)
    """
    if not len(rows) or not len(grid):
        return np.unique(rows, axis=0, return_inverse=True)
    flat = np.ravel_multi_index(tuple(np.asarray(rows, dtype=np.int64).T), grid)
    ids, inverse = np.unique(flat, return_inverse=True)
    return np.stack(np.unravel_index(ids, grid), axis=1).astype(np.int64), inverse.reshape(-1)


def _chunk_keys(spec: Any, coords: np.ndarray) -> list[str]:
    """:meth:`ArraySpec.chunk_key` of each row of ``coords`` (vectorised: :meth:`ArraySpec.chunk_keys`)."""
    return spec.chunk_keys(coords)


__all__ = ["WindowSampler", "sample_windows"]
