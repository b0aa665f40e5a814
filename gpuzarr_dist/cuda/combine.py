"""Joining the nvCOMP calls that threads make at the same time into one call.

Used for decodes under ``gpuzarr.gpu.decode-combine`` (off by default) and,
always, for encodes through nvCOMP's C functions, which share one scratch
buffer per process (``codecs.gpu_encode._encode_joined``).

One nvCOMP zstd decode call takes about the same time whether it decodes 56
frames or 448, so small batches (a Cubed task's, a window batch's) leave
most of the GPU unused if their calls run one after another. Joining the
calls that wait at the same moment into one call decodes all their frames
for the price of one. Through nvCOMP's C functions (the default) the
threads' decode calls overlap on the GPU and do better than joined, so
decodes are not joined by default.

The joining is flat combining: a thread that finds no call running becomes
the leader and makes one call for every request queued (its own first);
requests that arrive meanwhile queue, and when the call ends the leader hands
the lead to the oldest of them, which takes the whole queue. No thread waits
for a timer, and a thread alone in the process makes its call at once.

This module holds only the queue and the hand-over (no CUDA): the caller's
``execute`` does the call and fills each request's ``result`` or ``error``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Request:
    """One thread's decode call: ``payload`` for ``execute``; after :meth:`Combiner.run`, ``result`` or ``error``.

    ``alone`` is set when the request was part of a joined call that failed:
    the caller then makes its own call, so that an error is reported for the
    block whose chunks caused it.
    """

    __slots__ = ("payload", "result", "error", "alone", "_event", "_lead")

    def __init__(self, payload: Any):
        self.payload = payload
        self.result: Any = None
        self.error: BaseException | None = None
        self.alone = False
        self._event = threading.Event()
        self._lead = False


class Combiner:
    """The queue of one kind of call (one GPU, one algorithm): see the module docstring.

    ``run(request, execute)`` returns once ``request`` has been executed, in
    this thread's call or another's. ``execute(requests)`` must not raise: it
    sets ``result`` (or ``error``, or ``alone``) on every request it is given.
    ``calls`` and ``requests`` count what was executed (for tests and benchmarks).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: list[Request] = []
        self._busy = False
        self.calls = 0
        self.requests = 0

    def run(self, request: Request, execute: Callable[[list[Request]], None]) -> Request:
        with self._lock:
            self._queue.append(request)
            lead = not self._busy
            self._busy = True
        if not lead:
            request._event.wait()
            if not request._lead:
                return request  # executed in another thread's call
        with self._lock:  # the leader takes everything queued: its own request is the oldest there
            batch, self._queue = self._queue, []
            self.calls += 1
            self.requests += len(batch)
        try:
            execute(batch)
        except BaseException as e:  # execute should not raise; if it does, no request may be left waiting
            for r in batch:
                if r.result is None and r.error is None:
                    r.error = e
        finally:
            with self._lock:
                nxt = self._queue[0] if self._queue else None
                if nxt is None:
                    self._busy = False
                else:
                    nxt._lead = True
            for r in batch:
                if r is not request:
                    r._event.set()
            if nxt is not None:
                nxt._event.set()
        return request


_combiners: dict[Any, Combiner] = {}
_combiners_lock = threading.Lock()


def combiner(key: Any) -> Combiner:
    """The process's :class:`Combiner` for ``key`` (e.g. ``(device id, algorithm)``), made on first use."""
    c = _combiners.get(key)
    if c is None:
        with _combiners_lock:
            c = _combiners.setdefault(key, Combiner())
    return c


def counts(kind: str) -> tuple[int, int]:
    """``(calls, requests)`` executed so far by this process's combiners whose key starts with ``kind``
    (``"encode"``: the joined nvCOMP encodes of every GPU and algorithm); requests per call is how much
    joining happened."""
    with _combiners_lock:
        picked = [c for k, c in _combiners.items() if isinstance(k, tuple) and k and k[0] == kind]
    return sum(c.calls for c in picked), sum(c.requests for c in picked)


__all__ = ["Combiner", "Request", "combiner", "counts"]
