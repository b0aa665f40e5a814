"""Opt-in timing of the stages of a read (index reads, range reads, H2D + decode, placement, window cuts).

``gpuzarr-dist bench shards`` (its stage table) and ``bench scale`` (each
worker's file reads) turn it on to show where the time of a block or a window
call goes. Off by default:
then :func:`stage_timer` hands back a no-op, so the read paths pay one
function call per stage. Times are wall-clock seconds per thread, summed over
threads (with 16 threads reading at once, a stage can sum to more than the run
took); GPU stages include waiting for their stream where the code synchronises.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

_lock = threading.Lock()
_totals: dict[str, list[float]] = {}
_enabled = [False]


def enable(on: bool = True) -> None:
    """Start (or stop) recording stage times; :func:`reset` clears them."""
    _enabled[0] = bool(on)


def enabled() -> bool:
    """Whether stage times are being recorded (GPU code then synchronises where a stage's time needs it)."""
    return _enabled[0]


def reset() -> None:
    with _lock:
        _totals.clear()


def snapshot() -> dict[str, tuple[float, int]]:
    """``{stage: (seconds summed over calls, calls)}`` recorded so far."""
    with _lock:
        return {k: (v[0], int(v[1])) for k, v in _totals.items()}


def _noop(name: str) -> None:
    return None


def stage_timer() -> Callable[[str], None]:
    """A function ``mark(name)`` that books the time since the previous mark (or since this call) to ``name``."""
    if not _enabled[0]:
        return _noop
    last = [time.perf_counter()]

    def mark(name: str) -> None:
        now = time.perf_counter()
        with _lock:
            slot = _totals.setdefault(name, [0.0, 0])
            slot[0] += now - last[0]
            slot[1] += 1
        last[0] = now

    return mark


def format_stages(stages: dict[str, tuple[float, int]]) -> str:
    """A compact table of ``stages``: total seconds (summed over threads), calls, milliseconds per call."""
    lines = [f"    {'stage':<28} {'total s':>9} {'calls':>7} {'ms/call':>9}"]
    for name, (sec, calls) in stages.items():
        lines.append(f"    {name:<28} {sec:9.3f} {calls:7d} {1e3 * sec / max(calls, 1):9.3f}")
    return "\n".join(lines)
