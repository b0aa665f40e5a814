"""glibc's thresholds for large allocations, raised once per process that reads object stores.

An object store's response (a whole shard: 13 MB in ``bench remote``) is
allocated by obstore's Rust code with the C library's ``malloc``. glibc maps
an allocation that large with ``mmap`` and unmaps it with ``munmap`` when it
is freed, and its own adaptive threshold does not catch responses of slightly
growing sizes. The last reference to a response is dropped by a Python
thread, so the ``munmap`` (freeing 3,000 pages) runs with the GIL held: about
a third of the GIL time of a sharded S3 read's block tasks. With the
thresholds raised, the freed memory stays in
malloc's heap and the next response reuses it (no unmapping, no page faults).

What is raised: ``M_MMAP_THRESHOLD`` to 32 MiB (the ceiling of glibc's own
adaptive threshold) and ``M_TRIM_THRESHOLD`` to 128 MiB (the free memory at
the top of a heap kept for reuse). Left alone where the environment already
sets glibc's malloc (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``,
or ``GLIBC_TUNABLES`` with a ``glibc.malloc`` entry; distributed's nanny sets
``MALLOC_TRIM_THRESHOLD_`` for its workers), where the C library is not
glibc, and where ``gpuzarr.remote.malloc-thresholds`` is ``False``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading

from gpuzarr_dist import config

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 128 << 20
#: environment variables through which a user (or distributed's nanny) chose glibc's malloc settings
_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")

_done: dict[int, bool] = {}
_lock = threading.Lock()


def chosen_by_environment(environ: dict | None = None) -> str | None:
    """The environment variable that already sets glibc's malloc thresholds, or ``None``."""
    env = os.environ if environ is None else environ
    for name in _ENV:
        if name in env:
            return name
    if "glibc.malloc." in env.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES"
    return None


def raise_thresholds() -> bool:
    """Raise glibc's ``mmap`` and trim thresholds once in this process (see the module's text); whether they
    are raised now. Never raises: a C library without ``mallopt`` leaves things as they are."""
    pid = os.getpid()
    if pid in _done:
        return _done[pid]
    with _lock:
        if pid not in _done:
            _done[pid] = _apply()
    return _done[pid]


def _apply() -> bool:
    if not config.remote_malloc_thresholds():
        return False
    chosen = chosen_by_environment()
    if chosen is not None:
        logger.debug("glibc malloc thresholds left as %s sets them", chosen)
        return False
    try:
        libc = ctypes.CDLL(None)
        if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
            return False
        mallopt = libc.mallopt
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    except (OSError, AttributeError):
        return False
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    logger.debug("glibc malloc thresholds raised (mmap %d, trim %d): %s", MMAP_THRESHOLD, TRIM_THRESHOLD, ok)
    return ok
