"""A progress bar through cubed's callbacks: tqdm's when tqdm is installed, else one text line per operation."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from cubed.runtime.types import Callback


class TextProgress(Callback):
    """Prints, for each operation, its tasks done out of its total (every ``every`` seconds and at its end)."""

    def __init__(self, file: TextIO | None = None, every: float = 1.0):
        self.file = file
        self.every = every
        self.total: dict[str, int] = {}
        self.done: dict[str, int] = {}
        self.events = 0
        self._last = 0.0

    def _out(self) -> TextIO:
        return self.file or sys.stderr

    def on_compute_start(self, event: Any) -> None:
        self.total, self.done = {}, {}
        for name, data in event.dag.nodes(data=True):
            op = data.get("primitive_op")
            if op is not None and data.get("pipeline") is not None:
                self.total[name] = int(op.num_tasks)
                self.done[name] = 0

    def on_task_end(self, event: Any) -> None:
        self.events += 1
        self.done[event.name] = self.done.get(event.name, 0) + int(getattr(event, "num_tasks", 1) or 1)
        now = time.monotonic()
        finished = self.done[event.name] >= self.total.get(event.name, 0)
        if finished or now - self._last >= self.every:
            self._last = now
            total = self.total.get(event.name, "?")
            print(f"  {event.name}: {self.done[event.name]}/{total} tasks", file=self._out(), flush=True)


def progress_bar(**kwargs: Any) -> Callback:
    """cubed's ``TqdmProgressBar`` when tqdm is installed, else :class:`TextProgress`."""
    try:
        import tqdm  # noqa: F401
        from cubed.diagnostics.tqdm import TqdmProgressBar

        return TqdmProgressBar(**kwargs)
    except ImportError:
        return TextProgress(**kwargs)
