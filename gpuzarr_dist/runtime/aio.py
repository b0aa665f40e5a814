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
from collections.abc import Coroutine
from typing import Any, TypeVar

import dask.config

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
    n = max(1, int(dask.config.get("gpuzarr.remote.concurrency", 64)))
    sems = _state["sem"]
    if n not in sems:
        sems[n] = asyncio.Semaphore(n)
    return sems[n]
