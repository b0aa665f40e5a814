"""Warnings given once per process and key (a codec without a GPU implementation, say)."""

from __future__ import annotations

import threading
import warnings

_lock = threading.Lock()


def warn_once(seen: set[str], key: str, message: str, stacklevel: int = 2) -> None:
    """Warn ``message`` unless ``key`` is in ``seen`` (which it joins); ``stacklevel`` as for the caller's own warn."""
    with _lock:
        if key in seen:
            return
        seen.add(key)
    warnings.warn(message, RuntimeWarning, stacklevel=stacklevel + 1)
