"""``ZarrLoader``: batches of windows of Zarr arrays for a training loop, read ahead on the GPU.

A batch is ``batch_size`` windows of the same shape, taken from a grid of
window positions (starts every ``stride`` elements along each axis, every
window inside the array). An epoch visits the grid in an order that depends
on ``(seed, epoch)`` only, and each rank of a distributed run takes its own
share, as ``torch.utils.data.DistributedSampler`` does. Reading goes through
:class:`~gpuzarr_dist.array.windows.WindowSampler`: a batch's windows of one
variable are one batched read and one batched decode, and a batch's variables
are read at the same time, each on its own thread (on the GPU: its own
stream). The next ``prefetch`` batches are read on the loader's threads while
the caller works on the current one; on the GPU, batches are read in groups
(``gpuzarr.loader.read-size``) so that each decode call is large.

See ``docs/training.md`` for the design and the ordering rules on the GPU.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
import threading
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Any

import numpy as np

from gpuzarr_dist import config
from gpuzarr_dist.array.windows import WindowSampler
from gpuzarr_dist.cuda.device import resolve_device

OUTPUTS = ("torch", "cupy", "numpy")

#: Groups read ahead at least, when batches are read in groups (on the GPU, ``prefetch`` > 0). With one, the
#: next group's file reads and decode run one after the other while the caller takes the current group's
#: batches; with two, one group's file reads overlap another's decode.
MIN_READS_AHEAD = 2


class ZarrLoader:
    """Batches of windows of a Zarr group's variables (stacked as channels) or of one Zarr array.

    Parameters
    ----------
    source
        A Zarr group (with ``variables``) or array (without), in any form
        :func:`~gpuzarr_dist.from_zarr_gpu` accepts: a local path, an object
        store URL, a ``zarr.Group`` or ``zarr.Array``.
    variables
        Names of arrays of the group, all of one shape and dimension names;
        each batch is ``(batch, len(variables), *window)`` with the variables
        in this order. ``None``: ``source`` (or ``component`` inside it) is
        one array and a batch is ``(batch, *window)``.
    window
        The window shape: a mapping from dimension name to length (dimensions
        not named take their whole length), or a tuple with one length per
        axis (the form for an array without dimension names).
    stride
        Step of the grid of window starts, in the same forms as ``window``
        (or one int for every axis); default: the window, so windows tile the
        array without overlap. Starts are ``0, stride, 2 * stride, ...``, as
        long as the window stays inside the array.
    batch_size, shuffle, seed, drop_last
        As for ``torch.utils.data.DataLoader`` with a ``DistributedSampler``:
        an epoch's order is a permutation of the grid that depends on
        ``(seed, epoch)`` only (:meth:`set_epoch`); with ``drop_last`` the
        grid positions beyond a multiple of ``world_size`` and a last
        incomplete batch are left out, without it the ranks' shares are padded
        by repeating the first positions of the order and the last batch may
        be smaller.
    rank, world_size
        This process's share. Default: ``torch.distributed``'s when it is
        initialised, else 0 of 1.
    prefetch
        Batches read ahead of the one the caller holds (0: read when asked).
        The variables of each batch are read at the same time, each on a
        thread of its own. On the GPU, consecutive batches are read together
        in groups of :attr:`read_batches` (as many as hold
        ``gpuzarr.loader.read-size`` of one variable's windows): one read and
        one decode call per variable and group, since an nvCOMP call costs
        about as much for a few chunks as for hundreds. ``prefetch`` is then
        rounded up to whole groups, and at least :data:`MIN_READS_AHEAD`
        groups are read ahead, so that one group's file reads overlap the
        decode of the next.
    device
        ``"auto"``, ``"gpu"`` or ``"cpu"``: where chunks are decoded and
        windows cut (on the GPU: the current CUDA device of the thread that
        iterates, e.g. the one ``torch.cuda.set_device`` chose).
    output
        ``"torch"`` (tensors through DLPack, no copy, on the device the data
        is on), ``"cupy"`` (on the GPU; copied up from the CPU device) or
        ``"numpy"`` (copied down from the GPU device).
    component, storage_options, index_cache
        As for :class:`~gpuzarr_dist.array.windows.WindowSampler`
        (``component``: the group or array inside ``source``).

    Notes
    -----
    On the GPU a batch is ready on the consuming stream (torch's current
    stream for ``"torch"``, CuPy's for ``"cupy"``) when it is yielded: that
    stream waits for the batch's writes on the device, and the host does not
    wait. A yielded batch's memory is not reused while that stream may still
    read it. Device memory is a batch per batch in flight (``prefetch``,
    rounded up to whole groups and at least :data:`MIN_READS_AHEAD` of them,
    plus the rest of the group being yielded) and
    the batches the caller still holds, and (several variables) the
    variables' windows of at most ``2`` more groups whose copy into their
    batches' buffers may not have run yet on the device.
    """

    def __init__(self, source: Any, variables: Sequence[str] | None = None, window: Mapping[str, int] | Sequence[int] | None = None,
                 stride: Mapping[str, int] | Sequence[int] | int | None = None, batch_size: int = 16, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = True, rank: int | None = None, world_size: int | None = None,
                 prefetch: int = 2, device: str = "auto", output: str = "torch", *, component: str | None = None,
                 storage_options: dict | None = None, index_cache: int | str | None = "64 MiB"):
        if output not in OUTPUTS:
            raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
        if window is None:
            raise ValueError("window= is required: a mapping from dimension name to length, or a tuple")
        self.device = resolve_device(device)
        self.output = output
        if isinstance(variables, str):
            variables = [variables]
        self.variables = None if variables is None else list(variables)
        if self.variables is not None and not self.variables:
            raise ValueError("variables= names no array; pass None for a bare array")
        comps = [component] if self.variables is None else [_join(component, v) for v in self.variables]
        names = [_label(source, c) for c in comps]
        shape, dims = _shape_and_dims(source, comps[0], storage_options, names[0])
        for comp, name in zip(comps[1:], names[1:]):
            s, d = _shape_and_dims(source, comp, storage_options, name)
            if s != shape or d != dims:
                raise ValueError(f"{name}: shape {s} and dimensions {d} differ from {names[0]}'s {shape} and {dims}; "
                                 "variables stacked as channels must match")
        self.shape, self.dims = shape, dims
        self.window = _per_axis(window, dims, shape, "window", names[0], default=shape)
        self.stride = self.window if stride is None else _per_axis(stride, dims, shape, "stride", names[0], default=self.window)
        if any(w < 1 or w > s for w, s in zip(self.window, shape)):
            raise ValueError(f"{names[0]}: window {self.window} does not fit in an array of shape {shape}")
        if any(s < 1 for s in self.stride):
            raise ValueError(f"{names[0]}: stride {self.stride} must be at least 1 along every axis")
        self.samplers = [WindowSampler(source, self.window, c, device=self.device, storage_options=storage_options,
                                       index_cache=index_cache) for c in comps]
        self.dtype = np.result_type(*[s.spec.dtype for s in self.samplers])
        #: windows per axis of the grid of starts
        self.grid = tuple((s - w) // st + 1 for s, w, st in zip(shape, self.window, self.stride))
        self.batch_size, self.shuffle, self.seed, self.drop_last = int(batch_size), bool(shuffle), int(seed), bool(drop_last)
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.prefetch = int(prefetch)
        if self.prefetch < 0:
            raise ValueError(f"prefetch must be at least 0, got {prefetch}")
        if (rank is None) != (world_size is None):
            dist_rank, dist_size = _distributed_defaults()
            rank = dist_rank if rank is None else rank
            world_size = dist_size if world_size is None else world_size
        elif rank is None:
            rank, world_size = _distributed_defaults()
        self.rank, self.world_size = int(rank), int(world_size)
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {rank} of world_size {world_size}: need 0 <= rank < world_size")
        self.name = names[0] if self.variables is None else _label(source, component)
        if self.samples_per_rank() < 1:
            raise ValueError(f"{self.name}: {self.num_windows} windows on the grid cannot give each of {self.world_size} "
                             "ranks one")
        self.epoch = 0
        #: batches read together, in one read and one decode call per variable (1 on the CPU and with prefetch=0)
        self.read_batches = self._read_batches()
        #: groups of read_batches read ahead of the one being yielded
        self.reads_ahead = -(-self.prefetch // self.read_batches)
        if self.read_batches > 1:
            self.reads_ahead = max(self.reads_ahead, MIN_READS_AHEAD)
        self._pool: ThreadPoolExecutor | None = None  # batches read ahead
        self._part_pool: ThreadPoolExecutor | None = None  # the variables of a batch, one call each
        self._held: list[tuple[Any, list[Any]]] = []  # (copy's event, parts) on the GPU: see _hold_until_copied
        self._slots: dict[tuple[int, int], Any] = {}  # (device, batch length) -> BatchSlots (GPU)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        what = f"variables={self.variables}, " if self.variables is not None else ""
        return (f"ZarrLoader({self.name!r}, {what}window={self.window}, stride={self.stride}, batch_size={self.batch_size}, "
                f"rank={self.rank}/{self.world_size}, device={self.device!r}, output={self.output!r})")

    # ------------------------------------------------------------------ the order
    @property
    def num_windows(self) -> int:
        """Window positions on the grid (all ranks together)."""
        return math.prod(self.grid)

    def samples_per_rank(self) -> int:
        """Windows this rank reads per epoch (``DistributedSampler``'s ``num_samples``)."""
        n, ws = self.num_windows, self.world_size
        return n // ws if self.drop_last else -(-n // ws)

    def __len__(self) -> int:
        """Batches this rank yields per epoch."""
        per = self.samples_per_rank()
        return per // self.batch_size if self.drop_last else -(-per // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration follows (as ``DistributedSampler.set_epoch``)."""
        self.epoch = int(epoch)

    def epoch_indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's grid positions (flat, C order over :attr:`grid`) for ``epoch`` (default: the current), in order."""
        epoch = self.epoch if epoch is None else int(epoch)
        n, ws = self.num_windows, self.world_size
        order = np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle else np.arange(n)
        per = self.samples_per_rank()
        if per * ws <= n:
            order = order[: per * ws]
        else:  # pad by repeating the order from its start, as DistributedSampler does
            order = np.concatenate([order, np.resize(order, per * ws - n)])
        return order[self.rank :: ws]

    def starts(self, indices: Any) -> np.ndarray:
        """The first corners ``(n, ndim)`` of the windows at flat grid positions ``indices``."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        return np.stack(np.unravel_index(idx, self.grid), axis=1).astype(np.int64) * np.array(self.stride, dtype=np.int64)

    def epoch_starts(self, epoch: int | None = None) -> np.ndarray:
        """The first corners of this rank's windows for ``epoch``, in the order they are yielded."""
        return self.starts(self.epoch_indices(epoch))

    def _read_batches(self) -> int:
        if self.device != "gpu" or self.prefetch == 0:
            return 1
        per_batch = self.batch_size * math.prod(self.window) * max(s.spec.dtype.itemsize for s in self.samplers)
        return max(1, -(-config.loader_read_size() // per_batch))

    def _batches(self) -> list[np.ndarray]:
        starts = self.epoch_starts()
        b, n = self.batch_size, len(starts)
        stop = n - n % b if self.drop_last else n
        return [starts[i : i + b] for i in range(0, stop, b)]

    # ------------------------------------------------------------------ reading
    def __iter__(self) -> Iterator[Any]:
        """This epoch's batches, with up to ``prefetch`` read ahead of the one yielded."""
        batches = self._batches()
        gpu_device = self._current_device() if self.device == "gpu" else None
        if self.prefetch == 0:
            for starts in batches:
                if gpu_device is None:
                    got = self._read([starts], None)[0]
                else:  # read on this thread: its current stream is the caller's again before the hand-over
                    from gpuzarr_dist.cuda.handoff import callers_stream_kept

                    with callers_stream_kept():
                        got = self._read([starts], gpu_device)[0]
                yield self._deliver(got)
                del got
            return
        g = self.read_batches
        pool = self._threads()
        items = iter([batches[i : i + g] for i in range(0, len(batches), g)])
        pending: deque[Future] = deque()
        try:
            for group in itertools.islice(items, self.reads_ahead):
                pending.append(pool.submit(self._read, group, gpu_device))
            while pending:
                got = pending.popleft().result()
                for group in itertools.islice(items, 1):
                    pending.append(pool.submit(self._read, group, gpu_device))
                got.reverse()
                while got:  # each batch handed over as it is yielded, and not held here after
                    yield self._deliver(got.pop())
                del got
        finally:
            for f in pending:
                f.cancel()
            wait(pending)  # no read left running behind an error or an early break

    def _threads(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.reads_ahead, thread_name_prefix="gpuzarr-loader")
            return self._pool

    def _part_threads(self) -> ThreadPoolExecutor:
        """The threads that read the variables of a group of batches: apart from the prefetch threads, so that
        a group waiting for its parts never holds a thread a part needs; one per variable of every group in
        flight (with ``prefetch=0``, the caller's one batch)."""
        with self._lock:
            if self._part_pool is None:
                self._part_pool = ThreadPoolExecutor(max(self.reads_ahead, 1) * len(self.samplers),
                                                     thread_name_prefix="gpuzarr-loader-parts")
            return self._part_pool

    def _current_device(self) -> int:
        from gpuzarr_dist.cuda.handoff import current_device

        return current_device()

    def _parts(self, starts: np.ndarray, gpu_device: int | None) -> list[Any]:
        """Each variable's windows at ``starts``, in ``variables`` order, read at the same time on the part
        threads (one variable: on this thread). An error in any part is raised once every part of the batch
        has ended (the first failed part in ``variables`` order); parts not started by then are not run."""
        if len(self.samplers) == 1:
            return [self.samplers[0].sample(starts)]
        pool = self._part_threads()
        futures = [pool.submit(self._part, s, starts, gpu_device) for s in self.samplers]
        try:
            wait(futures, return_when=FIRST_EXCEPTION)
        finally:  # after a failure (or an interruption of this thread): start no more parts, let the running end
            for f in futures:
                f.cancel()
            wait(futures)
        for f in futures:
            if not f.cancelled() and f.exception() is not None:
                raise f.exception()
        return [f.result() for f in futures]

    @staticmethod
    def _part(sampler: WindowSampler, starts: np.ndarray, gpu_device: int | None) -> Any:
        """One variable's windows, on a part thread (on the GPU: on the iterating thread's device, with this
        thread's own stream; complete when returned, as :meth:`WindowSampler.sample` synchronises it)."""
        if gpu_device is not None:
            from gpuzarr_dist.cuda.device import use_device

            use_device(gpu_device)
        return sampler.sample(starts)

    def _read(self, group: list[np.ndarray], gpu_device: int | None) -> list[tuple[Any, Any]]:
        """A group of batches, read together (on a prefetch thread): each ``(array, ready event or None)``,
        numpy or cupy, in order."""
        bounds = np.cumsum([0] + [len(s) for s in group])
        starts = np.concatenate(group) if len(group) > 1 else group[0]
        if gpu_device is not None:
            from gpuzarr_dist.cuda.device import use_device

            use_device(gpu_device)
        parts = self._parts(starts, gpu_device)
        if gpu_device is None:
            if self.variables is None:
                whole = parts[0].astype(self.dtype, copy=False)
            else:
                whole = np.stack([p.astype(self.dtype, copy=False) for p in parts], axis=1)
            return [(whole[a:b], None) for a, b in zip(bounds[:-1], bounds[1:])]
        axis = None if self.variables is None else 1
        if self.output == "numpy":
            from gpuzarr_dist.cuda.handoff import gather_host

            # each batch copied down on its own (and waited for: parts may be freed), so that a batch the caller
            # keeps does not keep the whole read's host array alive
            return [(gather_host([p[a:b] for p in parts], axis, self.dtype), None)
                    for a, b in zip(bounds[:-1], bounds[1:])]
        out = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            out.append(self._fill([p[a:b] for p in parts], axis, gpu_device))
        if len(parts) > 1:
            self._hold_until_copied(out[-1][1], parts)  # the copies are in order on this thread's stream
        return out

    def _fill(self, parts: list[Any], axis: int | None, gpu_device: int) -> tuple[Any, Any]:
        """One batch's buffer filled from ``parts`` (its windows of each variable) on this thread's stream."""
        from gpuzarr_dist.cuda.handoff import BatchSlots

        n = len(parts[0])
        key = (gpu_device, n)
        with self._lock:
            slots = self._slots.get(key)
            if slots is None:
                shape = (n, *((len(parts),) if axis else ()), *self.window)
                slots = self._slots[key] = BatchSlots(shape, self.dtype, gpu_device)
        out = slots.take()
        # The parts of several variables were made on the part threads' streams, and fill() copies them on
        # this thread's stream. Reading them there is correct: each sample() synchronised its own stream
        # before it returned, and this thread saw its result only after, so the parts are complete before
        # the copy is queued. Freeing them is what needs care: CuPy's pool gives a freed block back to the
        # stream that allocated it, where the part thread's next sample() may write it at once, while this
        # stream's copy (queued behind the slot's previous readers) may not have run yet. So they are held
        # until the copy's event is done (_hold_until_copied). One variable's part is this thread's own,
        # freed behind the copy on this very stream.
        try:
            ready = slots.fill(out, parts, axis)
        except BaseException:
            from gpuzarr_dist.cuda.streams import sync_thread_stream

            sync_thread_stream()  # copies queued before the failure end before the parts are freed
            raise
        return out, ready

    def _hold_until_copied(self, ready: Any, parts: list[Any]) -> None:
        """Keep ``parts`` (device arrays of other threads' streams) until the event ``ready`` of their copy
        is done, and free those held whose copy is done by now.

        A copy waits on the device for the readers of its slot's previous
        batch, so while the training step's stream lags behind, copies pend.
        At most ``reads_ahead + 2`` groups' parts are held: beyond that, this
        thread waits for the oldest copies (what reading on one stream did: a
        thread's next read queued behind its last copy).
        """
        with self._lock:
            done, keep = [], []
            for item in self._held:
                (done if item[0].done else keep).append(item)
            keep.append((ready, parts))
            over = max(len(keep) - (self.reads_ahead + 2), 0)  # never this read's own: it is the last of 2 or more
            oldest, self._held = keep[:over], keep[over:]
        for event, _ in oldest:
            event.synchronize()
        del done, oldest  # freed outside the lock, their copies done

    def _deliver(self, got: tuple[Any, Any]) -> Any:
        """The batch as the caller asked for it (in the caller's thread, on its streams)."""
        arr, ready = got
        if ready is None:  # a host array
            if self.output == "numpy":
                return arr
            if self.output == "torch":
                import torch

                return torch.from_numpy(arr)
            from gpuzarr_dist.cuda.handoff import to_device

            return to_device(arr)  # on CuPy's current stream of this thread
        from gpuzarr_dist.cuda.handoff import current_stream, dlpack_capsule, hand_over

        if self.output == "cupy":
            hand_over(arr, ready, *current_stream())
            return arr
        import torch

        stream = torch.cuda.current_stream(arr.device.id)
        hand_over(arr, ready, int(stream.cuda_stream), stream)
        return torch.from_dlpack(dlpack_capsule(arr))

    def close(self) -> None:
        """End the loader's threads and free its idle device buffers; the loader stays usable."""
        with self._lock:
            pool, self._pool = self._pool, None
            part_pool, self._part_pool = self._part_pool, None
            slots = list(self._slots.values())
        for p in (pool, part_pool):  # batches first: they wait for their parts
            if p is not None:
                p.shutdown(wait=True)
        with self._lock:
            held, self._held = self._held, []
        for ready, _ in held:
            ready.synchronize()  # the copies out of the parts are done before the parts are freed
        del held
        for s in slots:
            s.close()
        for s in self.samplers:
            s.close()

    def __enter__(self) -> ZarrLoader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ---------------------------------------------------------------------- helpers
def _join(component: str | None, name: str) -> str:
    return "/".join(p.strip("/") for p in (component, name) if p and p.strip("/"))


def _label(source: Any, component: str | None) -> str:
    base = getattr(source, "path", None) if not isinstance(source, str) else source
    base = str(base if base is not None else type(source).__name__)
    return f"{base.rstrip('/')}/{component}" if component else base


def _distributed_defaults() -> tuple[int, int]:
    """torch.distributed's rank and world size where it is imported and initialised, else ``(0, 1)``."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size())
    return 0, 1


def _shape_and_dims(source: Any, component: str | None, storage_options: dict | None, name: str) -> tuple[tuple[int, ...], tuple[str, ...] | None]:
    """An array's shape and dimension names (Zarr v3 ``dimension_names``, v2 ``_ARRAY_DIMENSIONS``), or None."""
    import zarr

    if isinstance(source, (zarr.Array, zarr.Group)):
        arr = source if isinstance(source, zarr.Array) else (source[component] if component else source)
        if not isinstance(arr, zarr.Array):
            raise ValueError(f"{name} is a Zarr group; pass variables= naming its arrays: {sorted(k for k, _ in arr.arrays())}")
        dims = getattr(arr.metadata, "dimension_names", None) or arr.attrs.get("_ARRAY_DIMENSIONS")
        return tuple(int(s) for s in arr.shape), _names(dims)
    from gpuzarr_dist.stores.source import open_source

    store, spec = open_source(source, component, storage_options)
    base = getattr(store, "base", store)  # a sharded array's store of whole objects
    dims = None
    try:
        docs = base.read_many([spec.metadata_key] + ([".zattrs"] if spec.zarr_format == 2 else []))
    except Exception:  # noqa: BLE001 - no names readable: windows are then given as tuples
        docs = []
    for doc in docs:
        if doc is None:
            continue
        try:
            meta = json.loads(bytes(doc))
        except ValueError:
            continue
        dims = dims or meta.get("dimension_names") or meta.get("_ARRAY_DIMENSIONS")
    return tuple(int(s) for s in spec.shape), _names(dims)


def _names(dims: Any) -> tuple[str, ...] | None:
    return tuple(str(d) for d in dims) if dims and all(d is not None for d in dims) else None


def _per_axis(value: Any, dims: tuple[str, ...] | None, shape: tuple[int, ...], what: str, name: str,
              default: tuple[int, ...]) -> tuple[int, ...]:
    """``value`` (a mapping by dimension name, a sequence, or one int) as one int per axis."""
    if isinstance(value, Mapping):
        if dims is None:
            raise ValueError(f"{name}: {what} is given by dimension name, but the array has no dimension names; "
                             f"pass a tuple of {len(shape)} lengths")
        unknown = sorted(set(value) - set(dims))
        if unknown:
            raise ValueError(f"{name}: {what} names {unknown}, not dimensions of the array {dims}")
        return tuple(int(value.get(d, default[a])) for a, d in enumerate(dims))
    if isinstance(value, (int, np.integer)):
        return (int(value),) * len(shape)
    out = tuple(int(v) for v in value)
    if len(out) != len(shape):
        raise ValueError(f"{name}: {what} {out} has {len(out)} lengths for an array of {len(shape)} dimensions {shape}")
    return out


__all__ = ["ZarrLoader"]
