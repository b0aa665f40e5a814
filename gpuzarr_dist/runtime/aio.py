"""One asyncio event loop per process, on a daemon thread, for object-store requests.

Tasks run on dask's worker threads, which have no event loop; each task hands
its requests to this loop (:func:`run`) and waits, so many requests of many
tasks are in flight together over one connection pool, bounded by
``gpuzarr.remote.concurrency`` (:func:`limit`). The loop is re-created in a
forked child, which inherits no running threads.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Coroutine, Iterable
from typing import Any, TypeVar

from gpuzarr_dist import config

T = TypeVar("T")

_lock = threading.Lock()
_state: dict[str, Any] = {}


def _loop() -> asyncio.AbstractEventLoop:
    if _state.get("pid") == os.getpid():
        return _state["loop"]
    with _lock:
        if _state.get("pid") != os.getpid():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="gpuzarr-aio", daemon=True)
            thread.start()
            _state.update(pid=os.getpid(), loop=loop, thread=thread, sem={})
        return _state["loop"]


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the process's loop and wait for its result (from any thread but the loop's)."""
    loop = _loop()
    if threading.current_thread() is _state.get("thread"):
        raise RuntimeError("gpuzarr_dist.runtime.aio.run called from its own event loop")
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


def limit() -> asyncio.Semaphore:
    """The semaphore bounding requests in flight in this process (call on the loop)."""
    n = config.remote_concurrency()
    sems = _state["sem"]
    if n not in sems:
        sems[n] = asyncio.Semaphore(n)
    return sems[n]


async def gather_all(aws: Iterable[Awaitable[T]]) -> list[T]:
    """``asyncio.gather``, except that no request is left running behind a failure.

    ``gather`` raises the first failure while the other awaitables go on (an
    object written after its batch was reported failed). Here the others are
    cancelled and awaited, then the first failure in argument order is raised
    (a cancelled one is not a failure).
    """
    tasks = [asyncio.ensure_future(a) for a in aws]
    if not tasks:
        return []
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:  # also when this coroutine is cancelled: none of its tasks outlives it
        pending = [t for t in tasks if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.wait(pending)
    # every failure is retrieved (asyncio logs the ones never looked at), the first in argument order raised
    failures = [t.exception() for t in tasks if not t.cancelled() and t.exception() is not None]
    if failures:
        raise failures[0]
    return [t.result() for t in tasks]
