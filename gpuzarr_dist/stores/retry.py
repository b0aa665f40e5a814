"""Retrying transient I/O errors of chunk reads, then reporting them against the chunk.

A read that fails with an error that may go away on its own (``EIO``,
``EAGAIN``, ``ETIMEDOUT``, a stale NFS handle, a reset connection ...) is
tried again ``gpuzarr.io-retries`` times, waiting ``gpuzarr.io-retry-delay``
seconds before the first retry and twice as long before each next one.
Errors that cannot go away by waiting (the file is missing, a folder, not
readable) are reported at once. Either way the error that reaches the user is
a :class:`~gpuzarr_dist.errors.ChunkReadError` naming the array, the chunk key
and how many attempts were made.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from typing import TypeVar

from gpuzarr_dist import config
from gpuzarr_dist.errors import ChunkReadError

T = TypeVar("T")

#: errno values that retrying cannot fix
PERMANENT_ERRNOS = frozenset(
    getattr(errno, name)
    for name in ("ENOENT", "ENOTDIR", "EISDIR", "EACCES", "EPERM", "ENAMETOOLONG", "ELOOP", "EINVAL", "EBADF", "EFBIG", "EROFS")
    if hasattr(errno, name)
)


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` is an ``OSError`` that a later attempt may not meet."""
    if not isinstance(error, OSError) or isinstance(error, ChunkReadError):
        return False
    if isinstance(error, (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)):
        return False
    return error.errno not in PERMANENT_ERRNOS


def describe(error: BaseException) -> str:
    """``Type: message`` of an I/O error, without the file name (the caller names the chunk)."""
    return f"{type(error).__name__}: {getattr(error, 'strerror', None) or error}"


def with_retries(read: Callable[[], T], array: str, key: str, sleep: Callable[[float], None] = time.sleep) -> T:
    """``read()``, retried on transient ``OSError``s with exponential backoff; a :class:`ChunkReadError` otherwise."""
    retries, delay = config.io_retries(), config.io_retry_delay()
    attempt = 0
    while True:
        try:
            return read()
        except ChunkReadError:
            raise
        except OSError as e:
            if not is_transient(e) or attempt >= retries:
                tries = f" (after {attempt + 1} attempts)" if attempt else ""
                raise ChunkReadError(array, key, describe(e) + tries) from e
        sleep(delay * 2**attempt)
        attempt += 1
