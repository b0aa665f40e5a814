"""Configuration defaults, kept in dask's config under the ``gpuzarr`` key.

Set them like any dask option, e.g. ``dask.config.set({"gpuzarr.block-size.gpu": "1 GiB"})``
or the environment variable ``DASK_GPUZARR__BLOCK_SIZE__GPU="1 GiB"``.

``gpuzarr.block-size.cpu`` / ``gpuzarr.block-size.gpu``
    Target size in bytes (decompressed) of one dask block when ``chunks="auto"``.
    A block is always a whole multiple of the Zarr chunk shape, so each dask task
    decodes all of its chunks in one batch. Defaults: 128 MiB on the CPU;
    ``auto`` on the GPU: the GPU's memory / 160, at least 256 MiB and at most
    1 GiB (about 890 MiB on an H200 of 139 GiB, 256 MiB on GPUs of 40 GB or less), or 256 MiB
    where the process building the graph sees no GPU. A GPU task holds about
    6 blocks of device memory for zstd (see the README), so 16 threads stay
    within about 60% of the GPU's memory. Large blocks matter on the GPU: on
    one H200 (16 threads, time mean of 1600 x 4.15 MB chunks) blocks of 64
    chunks (256 MiB) read zstd at 13.1 GB/s and Blosc at 10.7, blocks of 200
    (830 MB) at 17.3 and 16.4.
``gpuzarr.io-threads``
    Threads that read chunk files per process (shared by all tasks). Default 16.
``gpuzarr.local-reads``
    How a block's chunk files are read from a local disk: ``kvikio`` (kvikio's
    C++ thread pool), ``threads`` (``preadv`` on the shared I/O threads),
    ``inline`` (``preadv`` one file after another on the task's own thread: with
    as many tasks in flight as cores, the reads are already parallel), or
    ``auto`` (default: kvikio where installed, else ``threads``). Measured on
    one H200 (time mean of 1600 x 4.15 MB zstd chunks, blocks of 64, warm):
    with 16 dask threads ``inline`` was 7-8% faster than kvikio in three runs
    (e.g. 14.54 against 13.55 GB/s), with 8 threads kvikio was faster (14.19
    against 13.06), and one block alone reads far faster through kvikio, so
    the default stays.
``gpuzarr.decode-threads``
    Threads that decode chunks on the CPU device per process. Default: CPU count.
``gpuzarr.shards.merge-gap`` / ``gpuzarr.shards.max-range``
    Byte ranges of one shard at most ``merge-gap`` apart are read as one range of
    at most ``max-range`` bytes. Default gap: ``None`` = per store (64 KiB for
    local files, 1 MiB for object stores); default max range 16 MiB. With the gap
    unset, a shard whose wanted chunks hold at least half the bytes of their span
    is read as that one span.
``gpuzarr.shards.local-reads``
    How merged ranges of local shard files are read: ``preadv`` (default; one
    system call per merged range, scattered into aligned slots) or ``kvikio``
    (one kvikio read per inner chunk, the earlier behaviour; for comparisons).
``gpuzarr.remote.concurrency`` / ``.retries`` / ``.backoff`` / ``.timeout``
    Object stores: requests in flight per process (64), attempts after the first
    for transient errors (5xx, resets, timeouts; 5), the first backoff in seconds
    (0.1, doubled per attempt, with full jitter), and the seconds one request may
    take (60).
``gpuzarr.remote.block-size``
    With ``chunks="auto"``, an array in an object store gets blocks of at most
    this many bytes (default ``128 MiB``; the smaller of this and
    ``gpuzarr.block-size.{cpu,gpu}``; ``0``: no cap). Its requests in flight are capped per
    process, so one large block fetches no faster than several small ones, but
    only several let a block decode while the next ones' requests are in
    flight. On one H200 (``bench remote --time-steps 192``, loopback S3, 797
    MB decoded, one run each) the GPU's ``auto`` block took the whole array
    in one block; the time mean's share of the raw GET rate with this cap /
    without: sharded with 1 MiB inner chunks 60% / 42%, 256 KiB 43% / 40%,
    unsharded 73% / 78% (the same 0.85 s both times; the GET rate moved).
``gpuzarr.remote.malloc-thresholds``
    ``auto`` (default): the first object-store client of a process raises
    glibc's ``malloc`` thresholds (``mmap`` 32 MiB, trim 128 MiB), so that
    freeing a large response does not unmap it with the GIL held (see
    :mod:`gpuzarr_dist.runtime.malloc`); left alone where the environment sets
    glibc's malloc already. ``False``: never.
``gpuzarr.io-retries`` / ``gpuzarr.io-retry-delay``
    How often a chunk read that failed with a transient ``OSError`` (``EIO``,
    ``EAGAIN``, ``ETIMEDOUT`` ...) is tried again (default 3), and the wait in
    seconds before the first retry (default 0.05, doubling each time). Then
    the read fails with ``ChunkReadError``.
``gpuzarr.write.batch-size``
    ``to_zarr_gpu``: a block's chunks are encoded and written in sub-batches of
    about this many bytes of uncompressed input (whole chunks or shards), so
    that the encode of one sub-batch (on the GPU, or the CPU encode threads)
    overlaps the file writes of the previous one. Default ``None``: each block
    is encoded in one batch (no overlap). Measured on an H200 (``bench write``,
    600 x 4.15 MB chunks, 16 threads): 64 MiB sub-batches wrote 1.65 GB/s,
    against 2.92-3.59 GB/s for whole-block batches, because nvCOMP's zstd
    encode is slower with fewer chunks per call; set a size to try it.
``gpuzarr.gpu.min-batch`` / ``gpuzarr.gpu.min-batch-chunks``
    With ``device="gpu"``, a batch whose chunks hold fewer decompressed bytes
    than ``min-batch`` (default ``32 MiB``) is encoded and decoded on the CPU
    decode threads instead of by nvCOMP, and moved over in one copy; so is a
    decode of fewer than ``min-batch-chunks`` chunks (default 8). ``0`` turns
    either off. An nvCOMP zstd call costs 10-50 ms whatever its size, calls
    from many threads ran largely one after another through nvCOMP's Python
    ``Codec`` (it holds the GIL; the figures below were measured with it, and
    not since the C functions became the default), and nvCOMP decodes a
    chunk's bytes largely in sequence, so a few large chunks decode slowly.
    Measured with 16 threads calling at once, GB/s of zstd float32 data,
    nvCOMP against the CPU threads (16 cores): on one H200, encoding 1 x 4 MB
    0.21 / 0.73, 8 x 4 MB 1.49 / 1.35, 1 x 16 MB 0.67 / 1.13, 2 x 16 MB
    1.26 / 1.20, 1 x 66 MB 1.63 / 1.15; decoding 1 x 66 MB 0.91 / 3.73,
    4 x 66 MB 3.71 / 5.12, 8 x 66 MB 5.49 / 4.37, 4 x 16 MB 2.11 / 4.50,
    16 x 16 MB 7.70 / 5.21, 16 x 4 MB 4.38 / 4.02. On one H100: decoding
    8 x 2 MB 2.1 / 4.9, 32 x 2 MB 6.0 / 4.0; one 0.5 MB chunk encoded in 33 ms
    against 1.3 ms. Lower them where a GPU has few CPU cores.
``gpuzarr.gpu.read-slots``
    With ``device="gpu"``, at most this many blocks of a process read their
    local files at the same time (``0``: no limit); the others wait their
    turn, in the order they asked. Object stores are not limited (their
    requests in flight are capped by ``gpuzarr.remote.concurrency``). A block's read already runs on many threads
    (kvikio's, or the I/O threads). When every task reads at once, the reads
    share the host's bandwidth and all blocks land together, late, so the GPU
    idles first and the reads idle later. One at a time, the first block
    lands after its own read and decodes while the next ones are read.
    Default 1. Measured on one H100 (2400 ERA5-like steps, blocks of 225
    chunks, 16 threads): 15.07 GB/s with every
    block reading at once (the first block's reads took 378 ms, against 20-35
    ms alone) and 19.70 with one slot; ``bench read --time-steps 1200
    --read-slots 0`` (same run) 13.08 GB/s with every block at once and 15.98
    with one slot. With only 3 to 5 blocks (600 steps) the runs did not tell
    them apart.
``gpuzarr.gpu.read-slot-min``
    A block whose stored bytes are fewer than this (default ``16 MiB``; ``0``:
    every block) reads without waiting for a read slot: its reads are too
    short to matter for the others' bandwidth, and a turn cost it the wait
    for every block ahead of it. Measured on one H200 (the Cubed variant's
    time mean, 8 threads): the combining operation's 64 reads of 1-2 MB
    spent 5.5 ms each waiting for a turn and 1.2 ms reading.
``gpuzarr.gpu.plan-turns``
    With read slots on (``gpuzarr.gpu.read-slots`` above 0), blocks also
    prepare their reads one at a time, in the order they asked (default
    ``True``): key lists, file opens and sizes, shard indexes, range plans.
    That work is Python, under the GIL; done by every block at once it
    shared the GIL evenly and every block became ready late, so the first
    read turn began late. One at a time, the first block is ready after its
    own preparation and reads while the next ones prepare.
``gpuzarr.gpu.decode-combine``
    With ``device="gpu"``, join the nvCOMP decode calls that threads of a
    process make at the same moment into one call (``True``), instead of one
    call per block (``False``, the default). An nvCOMP zstd call took about
    the same time for 56 frames as for 448 (H100: 11.0 against 13.5 ms), and
    the Python ``decode`` calls of several threads ran one after another
    (they hold the GIL), so joining them helped (H200, 16 threads x 56
    frames: 33.0 GB/s against 11.7). With the C functions (``nvcomp-api``
    ``c``, the default) threads' calls overlap, and joining them is slower
    (55.3 against 72.8 GB/s); ``bench read`` and ``bench shards`` were no
    faster with it either way. A joined call that fails is made again block
    by block, so errors still name the block's chunks.
``gpuzarr.gpu.nvcomp-api``
    With ``device="gpu"``, which of nvCOMP's interfaces decodes: ``c`` (the
    default) calls its batched C functions through ctypes
    (:mod:`gpuzarr_dist.cuda.nvcomp`), ``python`` its Python
    ``Codec.decode``. The Python call holds the GIL until its GPU work is
    done, so the decodes of a process's threads run one after another
    (measured on one H200: a counting thread ran at 26% of its idle rate
    beside a decode; 4 to 16 threads decoding reached 11.6-12.2 GB/s in all).
    The C call releases the GIL and only queues the decode on the thread's
    stream. Frames whose addresses miss the C functions' alignment, and
    processes whose libnvcomp lacks them, use the Python call.
``gpuzarr.gpu.encode-scratch``
    With ``device="gpu"`` and ``nvcomp-api c``: the device scratch a process
    keeps for nvCOMP's encoder, per GPU and codec (default ``2 GiB``; ``0``:
    as much as a call asks). The encodes that a process's threads ask for at
    the same time go in one call on it, in as many calls as keep it under
    this size. Measured on an H200: nvCOMP's zstd encoder asks 1.13 GB for
    any call plus 1.35 bytes per input byte (2 GiB: about 180 chunks of 4.17
    MB a call); its deflate encoder 9 bytes per input byte. The scratch is
    the process's, not a task's: it is not in the Cubed variant's measured
    peak per task (which is what ``allowed_mem`` bounds).
``gpuzarr.gpu.sync-wait``
    How a thread waits for the GPU (a stream synchronisation, a copy back):
    ``auto`` (default: CUDA's own choice, which is to spin on a core while the
    process has fewer CUDA contexts than the machine has cores, i.e. always
    on one GPU), ``spin``, ``yield`` or ``blocking`` (the thread sleeps until
    the GPU is done). It is a setting of the process's context on each GPU
    (CUDA's ``cuDevicePrimaryCtxSetFlags``), applied when a thread of this
    process next takes its stream after the setting changed. With many
    threads each waiting on its own stream, spinning threads hold cores that
    the file reads and CPU decodes of the other threads need; ``blocking``
    frees them at the cost of a wake-up (microseconds) per wait. Measured:
    with ``blocking`` the task threads spent 6-8% of the time on a CPU
    instead of 40-51% (H100, 16 threads, 500-900 MB blocks) at the same
    GB/s, and ``bench cubed`` on an H200 was slower (the variant's anomaly
    1.48 GB/s against 1.74); so the default stays CUDA's.
"""

from __future__ import annotations

import os

import dask.config

DEFAULTS: dict = {
    "gpuzarr": {
        "block-size": {"cpu": "128 MiB", "gpu": "auto"},
        "io-threads": 16,
        "local-reads": "auto",
        "decode-threads": None,
        "shards": {"merge-gap": None, "max-range": "16 MiB", "local-reads": "preadv"},
        "remote": {"concurrency": 64, "retries": 5, "backoff": 0.1, "timeout": 60, "block-size": "128 MiB",
                   "malloc-thresholds": "auto"},
        "io-retries": 3,
        "io-retry-delay": 0.05,
    }
}

dask.config.update_defaults(DEFAULTS)


#: ``gpuzarr.block-size.gpu: auto``: this fraction of the GPU's memory, within these bounds (see the docstring)
GPU_BLOCK_SHARE = 160
GPU_BLOCK_MIN = 256 << 20
GPU_BLOCK_MAX = 1 << 30


def block_size_bytes(device: str) -> int:
    """The configured target block size for ``device`` ("cpu" or "gpu"), in bytes (``auto`` resolved)."""
    from dask.utils import parse_bytes

    value = dask.config.get(f"gpuzarr.block-size.{device}")
    if str(value).strip().lower() == "auto":
        return auto_gpu_block_bytes()
    return int(parse_bytes(value))


def auto_gpu_block_bytes() -> int:
    """The ``auto`` GPU block size: the current GPU's memory / :data:`GPU_BLOCK_SHARE`, rounded down to a MiB,
    within [:data:`GPU_BLOCK_MIN`, :data:`GPU_BLOCK_MAX`]; the minimum where this process sees no GPU."""
    from gpuzarr_dist.cuda.device import gpu_memory_bytes

    total = gpu_memory_bytes()
    if not total:
        return GPU_BLOCK_MIN
    return max(GPU_BLOCK_MIN, min(GPU_BLOCK_MAX, (total // GPU_BLOCK_SHARE) >> 20 << 20))


def remote_block_bytes() -> int:
    """``gpuzarr.remote.block-size`` in bytes: the largest ``auto`` block of an array in an object store."""
    return _size_setting("gpuzarr.remote.block-size", "128 MiB")


def io_threads() -> int:
    return max(1, int(dask.config.get("gpuzarr.io-threads")))


LOCAL_READS = ("auto", "kvikio", "threads", "inline")


def local_reads() -> str:
    """``gpuzarr.local-reads``: how a block's chunk files are read (see the module docstring)."""
    v = str(dask.config.get("gpuzarr.local-reads", "auto")).lower()
    if v not in LOCAL_READS:
        raise ValueError(f"gpuzarr.local-reads must be one of {', '.join(LOCAL_READS)}, not {v!r}")
    return v


def decode_threads() -> int:
    n = dask.config.get("gpuzarr.decode-threads")
    return max(1, int(n) if n else (os.cpu_count() or 1))


def io_retries() -> int:
    return max(0, int(dask.config.get("gpuzarr.io-retries")))


def io_retry_delay() -> float:
    return max(0.0, float(dask.config.get("gpuzarr.io-retry-delay")))


dask.config.update_defaults({"gpuzarr": {"write": {"batch-size": None}}})


def _size_setting(key: str, default: object) -> int:
    """A size setting in bytes: an int or a string such as "32 MiB"; 0 (or None, "none") means none.

    A negative size raises ``ValueError`` naming the key.
    """
    from dask.utils import parse_bytes

    v = dask.config.get(key, default)
    if v in (None, "", "none", "None"):
        return 0
    n = int(parse_bytes(v)) if isinstance(v, str) else int(v)
    if n < 0:
        raise ValueError(f"{key} must be a size of at least 0, not {v!r}")
    return n


def write_batch_bytes() -> int | None:
    """``gpuzarr.write.batch-size`` in bytes, or None (one batch per block)."""
    return _size_setting("gpuzarr.write.batch-size", None) or None


dask.config.update_defaults({"gpuzarr": {"gpu": {"min-batch": "32 MiB", "min-batch-chunks": 8, "sync-wait": "auto"}}})

#: values of ``gpuzarr.gpu.sync-wait`` and the scheduling flags of a CUDA context they stand for
SYNC_WAITS = {"auto": 0x0, "spin": 0x1, "yield": 0x2, "blocking": 0x4}


def gpu_sync_wait() -> str:
    """``gpuzarr.gpu.sync-wait``: how threads wait for the GPU (see the module docstring)."""
    v = str(dask.config.get("gpuzarr.gpu.sync-wait", "auto")).strip().lower()
    if v not in SYNC_WAITS:
        raise ValueError(f"gpuzarr.gpu.sync-wait must be one of {', '.join(SYNC_WAITS)}, not {v!r}")
    return v


dask.config.update_defaults({"gpuzarr": {"gpu": {"read-slots": 1, "decode-combine": False}}})


dask.config.update_defaults({"gpuzarr": {"gpu": {"encode-scratch": "2 GiB"}}})


def encode_scratch_bytes() -> int | None:
    """``gpuzarr.gpu.encode-scratch`` in bytes (see the module docstring); None: no limit."""
    return _size_setting("gpuzarr.gpu.encode-scratch", "2 GiB") or None


NVCOMP_APIS = ("c", "python")

dask.config.update_defaults({"gpuzarr": {"gpu": {"nvcomp-api": "c"}}})


def nvcomp_api() -> str:
    """``gpuzarr.gpu.nvcomp-api``: nvCOMP's interface for decoding, ``c`` or ``python`` (see the module docstring)."""
    v = str(dask.config.get("gpuzarr.gpu.nvcomp-api", "c")).strip().lower()
    if v not in NVCOMP_APIS:
        raise ValueError(f"gpuzarr.gpu.nvcomp-api must be one of {', '.join(NVCOMP_APIS)}, not {v!r}")
    return v


def _flag_setting(key: str, default: bool) -> bool:
    """A true/false setting: a bool, or one of its usual spellings as a string. Raises naming the key."""
    v = dask.config.get(key, default)
    if isinstance(v, str):
        t = v.strip().lower()
        if t not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            raise ValueError(f"{key} must be true or false, not {v!r}")
        return t in ("true", "1", "yes", "on")
    return bool(v)


def gpu_decode_combine() -> bool:
    """``gpuzarr.gpu.decode-combine``: whether nvCOMP decode calls made at the same time are joined into one."""
    return _flag_setting("gpuzarr.gpu.decode-combine", False)


dask.config.update_defaults({"gpuzarr": {"gpu": {"plan-turns": True}}})


def gpu_plan_turns() -> bool:
    """``gpuzarr.gpu.plan-turns``: whether GPU blocks that take read turns also plan their reads one at a time."""
    return _flag_setting("gpuzarr.gpu.plan-turns", True)


def _count_setting(key: str, default: int) -> int:
    """A count setting: an int (or its string) of at least 0; ``None``/``"none"`` mean 0. Raises naming the key."""
    v = dask.config.get(key, default)
    n = 0 if v in (None, "", "none", "None") else int(v)
    if n < 0:
        raise ValueError(f"{key} must be a count of at least 0, not {v!r}")
    return n


def gpu_read_slots() -> int:
    """``gpuzarr.gpu.read-slots``: blocks of a process that read their local files at once on the GPU path (0: any)."""
    return _count_setting("gpuzarr.gpu.read-slots", 1)


dask.config.update_defaults({"gpuzarr": {"gpu": {"read-slot-min": "16 MiB"}}})


def gpu_read_slot_min_bytes() -> int:
    """``gpuzarr.gpu.read-slot-min`` in bytes: a GPU block read of fewer stored bytes takes no read slot."""
    return _size_setting("gpuzarr.gpu.read-slot-min", "16 MiB")


dask.config.update_defaults({"gpuzarr": {"windows": {"part-chunks": 2048, "part-threads": 4}}})


def window_part_chunks() -> int:
    """``gpuzarr.windows.part-chunks``: on the GPU, a window call of at least twice this many chunks reads and
    decodes them in parts of at least this many, on :func:`window_part_threads` threads at once (0: one part)."""
    return _count_setting("gpuzarr.windows.part-chunks", 2048)


def window_part_threads() -> int:
    """``gpuzarr.windows.part-threads``: the threads a :class:`~gpuzarr_dist.WindowSampler` reads parts on (at least 1)."""
    return max(1, _count_setting("gpuzarr.windows.part-threads", 4))


def gpu_min_batch_bytes() -> int:
    """``gpuzarr.gpu.min-batch`` in bytes: GPU batches of fewer decompressed bytes are coded on the CPU."""
    return _size_setting("gpuzarr.gpu.min-batch", "32 MiB")


def gpu_min_batch_chunks() -> int:
    """``gpuzarr.gpu.min-batch-chunks``: GPU decodes of fewer chunks run on the CPU."""
    return _count_setting("gpuzarr.gpu.min-batch-chunks", 8)


dask.config.update_defaults({"gpuzarr": {"gpu": {"zstd-check": "literals"}}})

#: values of ``gpuzarr.gpu.zstd-check`` (see README, "Reliability")
ZSTD_CHECKS = ("headers", "sequences", "literals")


def zstd_check() -> str:
    """``gpuzarr.gpu.zstd-check``: how deeply zstd frames are checked on the GPU before nvCOMP sees them.

    ``"headers"``: frame and block headers, literals and sequences section
    headers, Huffman tree descriptions (weights decoded in full), FSE table
    descriptions and the end markers of every bit stream. ``"sequences"``:
    also decodes every sequence's codes (no output), so that offsets,
    lengths and the bit stream's exact length are checked too.
    ``"literals"`` (default): also decodes every Huffman-coded literal (no
    output) and sends frames whose literal streams are not used up exactly
    to the CPU decoder (libzstd accepts some, and decoders disagree on what
    they hold).

    Modes 1 and 2 walk every block of a frame in a thread of its own (and
    each Huffman stream of a block in ``literals``, four threads a block
    sharing its table in shared memory) between a plan and a combine per
    frame, with the one-thread walk's verdicts. Measured on one H100
    (batches of 225 ERA5-like chunks of 4.15 MB):
    walk 2.3-2.8 ms (headers), 11.0-11.6 ms (sequences), 19.1-21.2 ms
    (literals), against 53-62 ms for the batch's ``decode_batch_gpu``. In
    the GPU fuzz (``dev/gpu_fuzz.py``, damaged chunks over 18 codec
    chains) ``literals`` had no wrong value, crash or hang in 132,000 cases;
    ``sequences`` let 72 of 60,000 zstd frames decode to other bytes than
    libzstd's (61 that libzstd also decodes, to other bytes, 11 that it
    rejects); ``headers`` let damaged frames reach nvCOMP's zstd decoder,
    which hung 29 times in 12,000. A hung kernel cannot be stopped, so
    ``headers`` is only for data you trust.
    """
    v = str(dask.config.get("gpuzarr.gpu.zstd-check", "literals")).strip().lower()
    if v not in ZSTD_CHECKS:
        raise ValueError(f"gpuzarr.gpu.zstd-check must be one of {', '.join(ZSTD_CHECKS)}, not {v!r}")
    return v


dask.config.update_defaults({"gpuzarr": {"gpu": {"deflate-walk-threads": "auto", "deflate-check": "walk"}}})

DEFLATE_CHECKS = ("walk", "off")


def deflate_check() -> str:
    """``gpuzarr.gpu.deflate-check``: ``"walk"`` (default) or ``"off"``.

    ``walk``: every gzip, zlib and Blosc-zlib stream is inflated without
    output on the device before nvCOMP sees it (nvCOMP 6's Deflate decoder
    hung on damaged streams in our fuzzing). The walk is a full inflate, one
    thread per stream: on one H200 a batch of 64 zlib chunks of 4.15 MB took
    609 ms to walk (one batch alone; batches of concurrent tasks overlap),
    where a zstd batch of that size decodes in about 26 ms. ``off``: for trusted data, skip it;
    the checksums and sizes after the decode still catch damaged data that
    decodes, but damaged data can then hang the process inside nvCOMP.
    """
    v = str(dask.config.get("gpuzarr.gpu.deflate-check", "walk")).strip().lower()
    if v not in DEFLATE_CHECKS:
        raise ValueError(f"gpuzarr.gpu.deflate-check must be one of {', '.join(DEFLATE_CHECKS)}, not {v!r}")
    return v


def deflate_walk_threads() -> int:
    """``gpuzarr.gpu.deflate-walk-threads``: threads per block of the deflate walk (0 for ``"auto"``).

    The walk that keeps damaged gzip/zlib/Blosc-zlib streams from nvCOMP is
    on unless ``gpuzarr.gpu.deflate-check`` is ``off`` (nvCOMP hangs on some
    damaged deflate); this only sets its launch geometry, one stream per thread. ``"auto"`` (default) spreads the streams
    over the GPU's SMs (one per block for small batches, up to 32 per block).
    """
    v = dask.config.get("gpuzarr.gpu.deflate-walk-threads", "auto")
    if v is None or str(v).strip().lower() in ("auto", "", "0"):
        return 0
    n = int(v)
    if not 1 <= n <= 1024:
        raise ValueError(f"gpuzarr.gpu.deflate-walk-threads must be 'auto' or 1..1024, not {v!r}")
    return n
