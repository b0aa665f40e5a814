"""Opt-in timing of the stages of a read or a write (index reads, range reads, H2D + decode, placement,
window cuts, file reads, encodes, object writes).

``gpuzarr-dist bench shards`` (its stage table), ``bench scale`` (each
worker's file reads) and ``bench climate`` (each worker's reads and writes)
turn it on to show where the time of a block or a window call goes. Off by default:
then :func:`stage_timer` hands back a no-op, so the read paths pay one
function call per stage. Times are wall-clock seconds per thread, summed over
threads (with 16 threads reading at once, a stage can sum to more than the run
took); GPU stages include waiting for their stream where the code synchronises.
A stage may also book the bytes it moved (file reads, object writes).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

#: the stages in which a block reads its chunk files: local files on the GPU device (through kvikio or the I/O
#: threads), any store on the CPU device
READ_STAGES = ("files: reads (kvikio)", "files: reads", "chunk reads")

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


def take(on: bool) -> dict[str, tuple[float, int, int]]:
    """``{stage: (seconds, calls, bytes)}`` recorded since the last call, then recording turned on (or off) and
    cleared: what a benchmark runs in each worker (``client.run(take, True)`` before, ``take(False)`` after)."""
    with _lock:
        got = {k: (v[0], int(v[1]), int(v[2])) for k, v in _totals.items()}
        _totals.clear()
    enable(on)
    return got


def summed(got: dict[str, tuple[float, int, int]], names: tuple[str, ...]) -> tuple[float, int, int]:
    """The seconds, calls and bytes of the stages ``names`` in a :func:`take` result, added up."""
    picked = [v for k, v in got.items() if k in names]
    return sum(v[0] for v in picked), sum(v[1] for v in picked), sum(v[2] for v in picked)


def _noop(name: str, nbytes: int = 0) -> None:
    return None


def stage_timer() -> Callable[..., None]:
    """A function ``mark(name, nbytes=0)`` that books the time since the previous mark (or since this call),
    and ``nbytes`` moved in it, to ``name``."""
    if not _enabled[0]:
        return _noop
    last = [time.perf_counter()]

    def mark(name: str, nbytes: int = 0) -> None:
        now = time.perf_counter()
        with _lock:
            slot = _totals.setdefault(name, [0.0, 0, 0])
            slot[0] += now - last[0]
            slot[1] += 1
            slot[2] += nbytes
        last[0] = now

    return mark


def format_stages(stages: dict[str, tuple[float, int]]) -> str:
    """A compact table of ``stages``: total seconds (summed over threads), calls, milliseconds per call."""
    lines = [f"    {'stage':<28} {'total s':>9} {'calls':>7} {'ms/call':>9}"]
    for name, (sec, calls) in stages.items():
        lines.append(f"    {name:<28} {sec:9.3f} {calls:7d} {1e3 * sec / max(calls, 1):9.3f}")
    return "\n".join(lines)
