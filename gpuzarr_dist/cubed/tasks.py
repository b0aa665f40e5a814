"""What runs in a worker thread for one cubed task: stream, measurement, the task, a stream sync.

Module-level functions only, importable in any worker without a GPU (cupy is
imported inside, on the GPU path).
"""

from __future__ import annotations

import time
from typing import Any

from gpuzarr_dist.cubed.memory import measurer
from gpuzarr_dist.cubed.storage import prepare_process


def _transient(e: BaseException) -> bool:
    """Errors worth a retry: I/O that may succeed again. Decode and metadata errors are not."""
    from gpuzarr_dist.errors import GpuZarrError

    return isinstance(e, (OSError, TimeoutError)) and not isinstance(e, GpuZarrError)


def run_task(item: Any, function: Any, config: Any, device: str, measure: str = "auto",
             retries: int = 0) -> tuple[Any, dict]:
    """Run one cubed task ``function(item, config=config)``; returns ``(result, stats)`` for cubed's TaskEndEvent.

    On the GPU the thread's CUDA stream (created once per thread) is CuPy's
    current stream for the task and is synchronised before returning, so
    everything the task wrote is complete; ``peak_measured_mem_end`` is the
    peak device memory the task's thread held from CuPy's pool.
    """
    prepare_process(device)
    stream = None
    if device == "gpu":
        from gpuzarr_dist.cuda.streams import thread_stream

        stream = thread_stream()
    attempt = 0
    while True:
        m = measurer(device, measure)()
        start = time.time()
        try:
            with m:
                result = function(item, config=config)
                if stream is not None:
                    stream.synchronize()
            break
        except Exception as e:
            if stream is not None:
                stream.synchronize()
            if attempt >= retries or not _transient(e):
                raise
            attempt += 1
    end = time.time()
    return result, {
        "function_start_tstamp": start,
        "function_end_tstamp": end,
        "peak_measured_mem_start": int(m.start),
        "peak_measured_mem_end": int(m.peak),
    }


_payloads: dict[int, tuple] = {}


def run_task_payload(item: Any, payload: bytes) -> tuple[Any, dict]:
    """:func:`run_task` with ``(function, config, device, measure, retries)`` cloudpickled in one scattered object.

    The bytes are unpickled once per worker process and operation (cached by object identity).
    """
    key = id(payload)
    entry = _payloads.get(key)
    if entry is None or entry[0] is not payload:
        import cloudpickle

        if len(_payloads) > 8:
            _payloads.clear()
        entry = _payloads[key] = (payload, cloudpickle.loads(payload))
    function, config, device, measure, retries = entry[1]
    return run_task(item, function, config, device, measure, retries)
