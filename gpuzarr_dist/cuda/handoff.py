"""Batches handed from a loader's threads to the training loop's stream: reusable device buffers, events,
and DLPack export.

A loader's prefetch threads read and decode on their own streams
(:func:`.streams.thread_stream`); the training step runs on another stream
(torch's current stream, or CuPy's current stream of the consuming thread).
Two orderings must hold across them:

- the step must not read a batch before its writes are complete: the thread
  records an event after writing (:func:`BatchSlots.fill`), and the consumer's
  stream waits for it on the device (:func:`hand_over`), without blocking the
  host;
- a batch's memory must not be rewritten while the step may still read it:
  the memory is a slot of :class:`BatchSlots`, not CuPy's pool. When the last
  reference to the batch (the cupy array, any view, a torch tensor made through
  DLPack) is dropped, an event is recorded on the consumer's stream, and the
  next batch written into that slot first makes its writer's stream wait for
  that event (what ``Tensor.record_stream`` does for torch's allocator).

Only imported on the GPU path (imports cupy).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import cupy
import numpy as np

from gpuzarr_dist.cuda.streams import on_stream, thread_stream
from gpuzarr_dist.errors import GpuZarrError


class _Lease:
    """The owner of one handed-out slot: dropping it (with the last array viewing the slot) frees the slot.

    ``stream`` is the object of the consumer's stream (a ``cupy.cuda.Stream`` or ``torch.cuda.Stream``), kept
    so that the stream outlives the event recorded on it when the slot is freed: a caller may drop its own
    stream before the batches it handed to it.
    """

    __slots__ = ("slots", "index", "consumer", "stream", "ready", "__weakref__")

    def __init__(self, slots: BatchSlots, index: int):
        self.slots, self.index, self.consumer, self.stream, self.ready = slots, index, None, None, None

    def __del__(self) -> None:
        slots = self.slots
        if slots is not None:
            slots._release(self.index, self.consumer, self.ready)


class BatchSlots:
    """Device buffers of one batch shape and dtype, reused batch after batch.

    :meth:`take` (on a prefetch thread) returns a cupy array over a free slot,
    a new slot when none is free: the slots in use are the batches in flight
    plus those the caller still holds. :meth:`close` drops the free ones.
    """

    def __init__(self, shape: tuple[int, ...], dtype: Any, device: int):
        self.shape, self.dtype, self.device = tuple(shape), np.dtype(dtype), int(device)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self._buffers: list[Any] = []  # slot -> its cupy uint8 buffer, kept while the slots live
        self._free: deque[tuple[int, Any]] = deque()  # (slot, event the last reader's stream recorded, or None)
        self._lock = threading.RLock()  # a batch dropped by a collection inside take() releases re-entrantly
        self._error: BaseException | None = None
        self._closed = False

    @property
    def count(self) -> int:
        """Slots made so far (the device memory held is ``count * nbytes``)."""
        return len(self._buffers)

    def take(self) -> cupy.ndarray:
        """An array over a slot whose earlier readers are done, as seen from this thread's stream.

        Its stream waits (on the device) for the event recorded when the
        slot's previous batch was dropped; the writes queued after this call
        are ordered behind that batch's reads.
        """
        with self._lock:
            self._closed = False
            if self._error is not None:
                err, self._error = self._error, None
                raise GpuZarrError(f"recording the release of a loader batch failed: {err}") from err
            entry = self._free.popleft() if self._free else None
        stream = thread_stream()
        if entry is None:
            with on_stream(stream):
                buf = cupy.empty(max(self.nbytes, 1), dtype=cupy.uint8)
            with self._lock:
                index = len(self._buffers)
                self._buffers.append(buf)
        else:
            index, event = entry
            if event is not None:
                stream.wait_event(event)
        lease = _Lease(self, index)
        buf = self._buffers[index]
        mem = cupy.cuda.UnownedMemory(buf.data.ptr, self.nbytes, lease, device_id=self.device)
        return cupy.ndarray(self.shape, dtype=self.dtype, memptr=cupy.cuda.MemoryPointer(mem, 0))

    def fill(self, out: cupy.ndarray, parts: list[Any], axis: int | None = 1) -> cupy.Event:
        """Copy ``parts`` into ``out`` on this thread's stream: along ``axis`` (part ``c`` to ``out[:, c]`` for
        ``axis=1``), or the one part to the whole of ``out`` for ``axis=None``. Returns the event that marks the
        writes complete."""
        stream = thread_stream()
        with on_stream(stream):
            if axis is None:
                out[...] = cupy.asarray(parts[0], dtype=self.dtype)
            else:
                for c, part in enumerate(parts):
                    out[(slice(None),) * axis + (c,)] = cupy.asarray(part, dtype=self.dtype)
            ready = stream.record()
        lease = getattr(out.data.mem, "_owner", None)
        if isinstance(lease, _Lease):
            lease.ready = ready  # the slot's writes, waited for when it is freed without being handed over
        return ready

    def _release(self, index: int, consumer: int | None, ready: Any) -> None:
        """Called when the last array over slot ``index`` is dropped; ``consumer``: the stream it was handed to
        (None: never handed over, and then ``ready``, the event of its writes, is what a next writer waits for)."""
        event = ready
        try:
            if consumer is not None:
                with cupy.cuda.Device(self.device):
                    event = cupy.cuda.Event(block=False, disable_timing=True)
                    event.record(_external(consumer))
        except Exception as e:  # a finaliser cannot raise: the slot is not reused and the next take() raises
            with self._lock:
                self._error = e
            return
        with self._lock:
            if self._closed:
                self._buffers[index] = None  # no writer queues behind the event: the reads were waited for
                if event is not None:
                    event.synchronize()
            else:
                self._free.append((index, event))

    def close(self) -> None:
        """Free the slots not in use once the device work on them is done (slots still held stay valid, and
        are freed when dropped after this)."""
        with self._lock:
            free, self._free = list(self._free), deque()
            self._closed = True
        for index, event in free:
            if event is not None:
                event.synchronize()
            self._buffers[index] = None


def hand_over(out: cupy.ndarray, ready: cupy.Event, consumer: int, stream: Any) -> None:
    """Make stream ``consumer`` (a raw stream pointer, 0 for the legacy default stream) wait on the device for
    ``ready``, without blocking the host, and remember it as the stream that reads ``out``: once ``out`` and
    every array over it are dropped, its slot is freed behind the work queued on that stream by then.
    ``stream`` is that stream's object, kept alive until then."""
    _external(consumer).wait_event(ready)
    lease = getattr(out.data.mem, "_owner", None)
    if isinstance(lease, _Lease):
        lease.consumer, lease.stream = consumer, stream


def _external(ptr: int) -> cupy.cuda.Stream:
    return cupy.cuda.Stream.null if ptr == 0 else cupy.cuda.ExternalStream(ptr)


@contextmanager
def callers_stream_kept() -> Iterator[None]:
    """Make CuPy's current stream of this thread, as it was before the block, current again after it: a read
    on the caller's thread makes the thread's own stream current (:func:`~gpuzarr_dist.cuda.streams.thread_stream`),
    and the caller's work after it must stay on the stream the caller chose."""
    prev = cupy.cuda.get_current_stream()
    try:
        yield
    finally:
        if cupy.cuda.get_current_stream() is not prev:
            prev.use()


def current_stream() -> tuple[int, Any]:
    """CuPy's current stream in this thread: its raw pointer (0: the legacy default stream) and its object."""
    stream = cupy.cuda.get_current_stream()
    return int(stream.ptr), stream


def current_device() -> int:
    """This thread's current CUDA device."""
    return int(cupy.cuda.Device().id)


def gather_host(parts: list[cupy.ndarray], axis: int | None, dtype: Any) -> np.ndarray:
    """One host array of ``parts`` (device arrays of one shape): stacked along ``axis``, or the one part for
    ``axis=None``. Copied down on this thread's stream, which is then waited for."""
    stream = thread_stream()
    dtype = np.dtype(dtype)
    with on_stream(stream):
        if axis is None:
            out = cupy.asnumpy(parts[0], stream=stream).astype(dtype, copy=False)
        else:
            first = parts[0]
            out = np.empty((first.shape[0], len(parts), *first.shape[1:]), dtype=dtype)
            for c, part in enumerate(parts):
                out[:, c] = cupy.asnumpy(part, stream=stream)
        stream.synchronize()
    return out


def to_device(x: np.ndarray) -> cupy.ndarray:
    """A copy of the host array ``x`` on the current device, queued on CuPy's current stream of this thread."""
    return cupy.asarray(x)


def dlpack_capsule(x: cupy.ndarray) -> Any:
    """A DLPack capsule of ``x`` (no copy) for another library, without CuPy ordering any stream: the caller
    has ordered the consumer's stream (:func:`hand_over`)."""
    try:
        return x.__dlpack__(stream=-1)  # the array API's "no synchronisation"
    except (TypeError, ValueError, BufferError):  # a CuPy without it: it orders the default stream, also correct
        return x.__dlpack__()
