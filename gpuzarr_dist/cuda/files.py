"""Local chunk files read by kvikio (cuFile), straight into a staging buffer; for :mod:`gpuzarr_dist.stores.local`.

kvikio reads on its own C++ thread pool (no Python thread per read, so no
GIL hand-offs between reads), into host or device memory. The local store
reads whole chunk files through :func:`read_files_into` where
``gpuzarr.local-reads`` asks for it (:func:`for_files`) and kvikio is
installed (:func:`cufile`), and shard byte ranges through
:func:`read_ranges_into` where ``gpuzarr.shards.local-reads: kvikio`` asks
for it (:func:`for_ranges`; to compare on a GPU machine). Importing this
module imports neither kvikio nor cupy: :func:`cufile` imports kvikio on its
first call.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from gpuzarr_dist.config import io_threads, shard_local_reads
from gpuzarr_dist.errors import ChunkReadError
from gpuzarr_dist.runtime.stages import stage_timer
from gpuzarr_dist.stores.base import staging_layout, stored_refusal
from gpuzarr_dist.stores.ranges import MergedRead
from gpuzarr_dist.stores.retry import describe, with_retries

_kvikio_state: list = []
_kvikio_lock = threading.Lock()


def cufile() -> Any:
    """kvikio, set to read with ``gpuzarr.io-threads`` threads, or ``None`` where it is not installed.

    kvikio's default of one thread reads at a fraction of the disk's rate; its
    ``KVIKIO_NTHREADS`` environment variable, when set, is left as it is. The
    setting happens once, under a lock, before any read: resetting kvikio's
    thread pool while another thread waits on a read deadlocks.
    """
    if not _kvikio_state:
        with _kvikio_lock:
            if not _kvikio_state:
                try:
                    import kvikio
                    import kvikio.defaults
                except ImportError:
                    _kvikio_state.append(None)
                else:
                    if "KVIKIO_NTHREADS" not in os.environ and kvikio.defaults.get("num_threads") < io_threads():
                        kvikio.defaults.set("num_threads", io_threads())
                    _kvikio_state.append(kvikio)
    return _kvikio_state[0]


def for_files(mode: str) -> bool:
    """Whether ``gpuzarr.local-reads`` mode ``mode`` reads whole chunk files through kvikio where it is installed."""
    return mode in ("auto", "kvikio")


def for_ranges() -> bool:
    """Whether ``gpuzarr.shards.local-reads`` asks for one kvikio read per piece (to compare on a GPU machine)."""
    return shard_local_reads() == "kvikio"


class LocalFiles(Protocol):
    """The local chunk store as these reads see it (:class:`gpuzarr_dist.stores.local.LocalChunkStore`)."""

    #: the array's name, for errors
    array: str

    def path(self, key: str) -> str:
        """The file of chunk ``key``."""

    def size_or_missing(self, key: str) -> int:
        """The size of chunk ``key``'s file, -1 where there is none; ``ChunkReadError`` for a file that is not a
        regular file or is larger than the store's ``object_limit``."""

    def read_slot(self, key: str, view: memoryview, n: int) -> None:
        """Read chunk ``key`` (``n`` bytes) into ``view`` with its own file handle, retrying transient errors."""


def read_files_into(kvikio: Any, store: LocalFiles, keys: Sequence[str], staging: Callable[[int], Any], align: int,
                    lead: int) -> tuple[Any, list[int], list[int]]:
    """:meth:`~gpuzarr_dist.stores.local.LocalChunkStore.read_into` through ``kvikio`` (:func:`cufile`)."""
    timed = stage_timer()
    sizes = [with_retries(lambda: store.size_or_missing(key), store.array, key) for key in keys]
    offsets, total = staging_layout(sizes, align, lead)
    futures, again, opened = [], [], []  # opened: (key, size, offset, CuFile), each closed below
    key, waited = (keys[0] if keys else ""), 0
    try:
        # the files are opened before ``staging`` is called: on the GPU path that call takes the block's
        # read turn, and 56 opens inside it (two open() each, with the GIL) made every other block wait
        for key, n, off in zip(keys, sizes, offsets):
            if n > 0:
                try:
                    opened.append((key, n, off, kvikio.CuFile(store.path(key), "r")))
                except (OSError, RuntimeError):  # read below with the retry policy
                    again.append((key, n, off))
        timed("files: open + sizes")
        buf = staging(total)
        timed("staging alloc")
        for key, n, off, f in opened:
            futures.append((key, n, off, f.pread(buf[off : off + n], n, 0)))
        for key, n, off, fut in futures:
            try:
                got = fut.get()
            except (OSError, RuntimeError) as e:
                got = describe(e)
            waited += 1
            if got != n:  # failed or short: read again below, once every kvikio read has finished
                again.append((key, n, off))
    finally:
        for _, _, _, fut in futures[waited:]:  # never hand back the buffer while a read still writes to it
            try:
                fut.get()
            except Exception:  # the first failure is already being raised
                pass
        for *_, f in opened:
            f.close()
    view = memoryview(buf).cast("B") if again else None
    for key, n, off in again:
        store.read_slot(key, view[off : off + n], n)
    timed("files: reads (kvikio)", sum(n for n in sizes if n > 0))
    return buf, offsets, sizes


def read_ranges_into(kvikio: Any, store: LocalFiles, reads: Sequence[MergedRead], buf: Any) -> list[int]:
    """:meth:`~gpuzarr_dist.stores.local.LocalChunkStore.read_ranges_into` through ``kvikio``: one read per piece."""
    sizes: dict[str, int] = {}
    for r in reads:
        if r.key not in sizes:
            try:
                st = os.stat(store.path(r.key))
            except FileNotFoundError:
                sizes[r.key] = -1
                continue
            except OSError as e:
                raise ChunkReadError(store.array, r.key, f"{type(e).__name__}: {e.strerror or e}") from e
            why = stored_refusal(st.st_mode, 0, None, "shard")  # a device or pipe never ends; sizes: the index's
            if why:
                raise ChunkReadError(store.array, r.key, why)
            sizes[r.key] = st.st_size
    files: dict[str, Any] = {}
    futures: list = []
    waited = 0
    key = reads[0].key if reads else ""
    try:
        for r in reads:
            key, size = r.key, sizes[r.key]
            if size < 0:
                continue
            if key not in files:
                files[key] = kvikio.CuFile(store.path(key), "r")
            for off, n, dest in r.pieces:
                m = max(0, min(n, size - off))
                if m:
                    futures.append((key, m, files[key].pread(buf[dest : dest + m], m, off)))
        for key, m, fut in futures:
            got = fut.get()
            waited += 1
            if got != m:
                raise ChunkReadError(store.array, key, f"read {got} of {m} bytes (file changed while reading?)")
    except (OSError, RuntimeError) as e:
        if isinstance(e, ChunkReadError):
            raise
        raise ChunkReadError(store.array, key, f"{type(e).__name__}: {e}") from e
    finally:
        for _, _, fut in futures[waited:]:
            try:
                fut.get()
            except Exception:
                pass
        for f in files.values():
            f.close()
    return [-1 if sizes[r.key] < 0 else max(0, min(r.length, sizes[r.key] - r.offset)) for r in reads]
