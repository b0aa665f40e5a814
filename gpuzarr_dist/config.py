"""gpuzarr-dist's settings, kept in dask's config under the ``gpuzarr`` key.

Every key, its default and its description are in ``gpuzarr_dist/gpuzarr.yaml``
(the package's data, the one place defaults are written). This module loads it
once at import, registers the defaults with dask, and reads every setting
through an accessor below, which parses and checks the value; an invalid value
raises ``ValueError`` naming the key. Set values like any dask option:
``dask.config.set({"gpuzarr.block-size.gpu": "1 GiB"})``, a dask YAML file, or
the environment (``DASK_GPUZARR__BLOCK_SIZE__GPU="1 GiB"``).
:func:`describe` returns the parsed file, for tools and the documentation.

This module imports nothing from the package: every other layer may use it.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from importlib import resources
from typing import Any

import dask.config
import yaml


def _load() -> dict[str, dict]:
    text = resources.files("gpuzarr_dist").joinpath("gpuzarr.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


#: the parsed ``gpuzarr.yaml``: flat key -> {"default", "description", optional "choices" and "details"}
_SETTINGS: dict[str, dict] = _load()


def _nested(flat: dict[str, dict]) -> dict:
    out: dict = {}
    for key, entry in flat.items():
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = entry["default"]
    return out


#: the defaults as dask holds them: ``{"gpuzarr": {...}}``
DEFAULTS: dict = _nested(_SETTINGS)

dask.config.update_defaults(DEFAULTS)


def describe() -> dict[str, dict]:
    """Every setting: flat key -> ``{"default", "description"}`` and, where given, ``"choices"`` and ``"details"``.

    A copy of the parsed ``gpuzarr.yaml``, in its order.
    """
    return copy.deepcopy(_SETTINGS)


def get(key: str) -> Any:
    """The raw value of setting ``key`` (a full key such as ``"gpuzarr.io-threads"``), its default where unset.

    Raises ``KeyError`` for a key that ``gpuzarr.yaml`` does not describe.
    """
    if key not in _SETTINGS:
        raise KeyError(f"{key} is not a gpuzarr setting (see gpuzarr_dist/gpuzarr.yaml)")
    return dask.config.get(key, _SETTINGS[key]["default"])


def _choices(key: str) -> tuple[str, ...]:
    return tuple(_SETTINGS[key]["choices"])


def _choice(key: str, choices: Any) -> str:
    """A setting that takes one of ``choices`` (case and surrounding spaces ignored). Raises naming the key."""
    v = str(get(key)).strip().lower()
    if v not in choices:
        raise ValueError(f"{key} must be one of {', '.join(choices)}, not {v!r}")
    return v


def _size_setting(key: str) -> int:
    """A size setting in bytes: an int or a string such as "32 MiB"; 0 (or None, "none") means none.

    A negative size raises ``ValueError`` naming the key.
    """
    from dask.utils import parse_bytes

    v = get(key)
    if v in (None, "", "none", "None"):
        return 0
    n = int(parse_bytes(v)) if isinstance(v, str) else int(v)
    if n < 0:
        raise ValueError(f"{key} must be a size of at least 0, not {v!r}")
    return n


def _flag_setting(key: str) -> bool:
    """A true/false setting: a bool, or one of its usual spellings as a string. Raises naming the key."""
    v = get(key)
    if isinstance(v, str):
        t = v.strip().lower()
        if t not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            raise ValueError(f"{key} must be true or false, not {v!r}")
        return t in ("true", "1", "yes", "on")
    return bool(v)


def _count_setting(key: str) -> int:
    """A count setting: an int (or its string) of at least 0; ``None``/``"none"`` mean 0. Raises naming the key."""
    v = get(key)
    n = 0 if v in (None, "", "none", "None") else int(v)
    if n < 0:
        raise ValueError(f"{key} must be a count of at least 0, not {v!r}")
    return n


# --- block size -------------------------------------------------------------------------------

#: ``gpuzarr.block-size.gpu: auto``: this fraction of the GPU's memory, within these bounds
GPU_BLOCK_SHARE = 160
GPU_BLOCK_MIN = 256 << 20
GPU_BLOCK_MAX = 1 << 30


def block_size_bytes(device: str, gpu_memory: Callable[[], int] | None = None) -> int:
    """``gpuzarr.block-size.{device}`` (``device`` "cpu" or "gpu") in bytes, ``auto`` resolved.

    ``auto`` is sized from ``gpu_memory()``, the GPU's total memory in bytes
    (callers pass :func:`gpuzarr_dist.cuda.device.gpu_memory_bytes`; it is
    called only for ``auto``); without it, as for a process that sees no GPU.
    """
    from dask.utils import parse_bytes

    value = get(f"gpuzarr.block-size.{device}")
    if str(value).strip().lower() == "auto":
        return auto_gpu_block_bytes(gpu_memory() if gpu_memory is not None else 0)
    return int(parse_bytes(value))


def auto_gpu_block_bytes(total_memory: int) -> int:
    """The ``auto`` GPU block size for a GPU of ``total_memory`` bytes: / :data:`GPU_BLOCK_SHARE`, rounded down
    to a MiB, within [:data:`GPU_BLOCK_MIN`, :data:`GPU_BLOCK_MAX`]; the minimum for 0 (no GPU seen)."""
    if not total_memory:
        return GPU_BLOCK_MIN
    return max(GPU_BLOCK_MIN, min(GPU_BLOCK_MAX, (total_memory // GPU_BLOCK_SHARE) >> 20 << 20))


def max_unsized_chunk_bytes() -> int:
    """``gpuzarr.max-unsized-chunk`` in bytes: the decoded (and stored) size bound of a chunk whose codec chain
    does not fix its decoded size."""
    n = _size_setting("gpuzarr.max-unsized-chunk")
    if n < 1:
        raise ValueError(f"gpuzarr.max-unsized-chunk must be a size of at least 1 byte, not {get('gpuzarr.max-unsized-chunk')!r}")
    return n


# --- local reads ------------------------------------------------------------------------------


def io_threads() -> int:
    """``gpuzarr.io-threads``: threads per process that read chunk files (at least 1)."""
    return max(1, int(get("gpuzarr.io-threads")))


LOCAL_READS = _choices("gpuzarr.local-reads")


def local_reads() -> str:
    """``gpuzarr.local-reads``: how a block's chunk files are read, one of :data:`LOCAL_READS`."""
    v = str(get("gpuzarr.local-reads")).lower()
    if v not in LOCAL_READS:
        raise ValueError(f"gpuzarr.local-reads must be one of {', '.join(LOCAL_READS)}, not {v!r}")
    return v


def decode_threads() -> int:
    """``gpuzarr.decode-threads``: threads per process that decode on the CPU (unset: the CPU count)."""
    n = get("gpuzarr.decode-threads")
    return max(1, int(n) if n else (os.cpu_count() or 1))


def io_retries() -> int:
    """``gpuzarr.io-retries``: retries of a chunk read after a transient ``OSError`` (at least 0)."""
    return max(0, int(get("gpuzarr.io-retries")))


def io_retry_delay() -> float:
    """``gpuzarr.io-retry-delay``: seconds before the first retry of a chunk read (at least 0)."""
    return max(0.0, float(get("gpuzarr.io-retry-delay")))


# --- sharded arrays ---------------------------------------------------------------------------

SHARD_LOCAL_READS = _choices("gpuzarr.shards.local-reads")


def shard_merge_gap() -> int | None:
    """``gpuzarr.shards.merge-gap`` in bytes, or ``None`` where unset (``None``/``"auto"``: the store chooses)."""
    from dask.utils import parse_bytes

    value = get("gpuzarr.shards.merge-gap")
    return None if value in (None, "auto") else int(parse_bytes(value))


def shard_max_range() -> int:
    """``gpuzarr.shards.max-range`` in bytes (at least 1): the largest merged read of a shard."""
    from dask.utils import parse_bytes

    return max(1, int(parse_bytes(get("gpuzarr.shards.max-range"))))


def shard_local_reads() -> str:
    """``gpuzarr.shards.local-reads``: how merged ranges of local shard files are read, ``preadv`` or ``kvikio``."""
    return _choice("gpuzarr.shards.local-reads", SHARD_LOCAL_READS)


# --- object stores ----------------------------------------------------------------------------


def remote_concurrency() -> int:
    """``gpuzarr.remote.concurrency``: object-store requests in flight per process (at least 1)."""
    return max(1, int(get("gpuzarr.remote.concurrency")))


def remote_retries() -> int:
    """``gpuzarr.remote.retries``: attempts after the first for a transiently failed request (at least 0)."""
    return max(0, int(get("gpuzarr.remote.retries")))


def remote_backoff() -> float:
    """``gpuzarr.remote.backoff``: seconds of the first backoff before a request is retried."""
    return float(get("gpuzarr.remote.backoff"))


def remote_timeout() -> float:
    """``gpuzarr.remote.timeout``: seconds one object-store request may take."""
    return float(get("gpuzarr.remote.timeout"))


def remote_block_bytes() -> int:
    """``gpuzarr.remote.block-size`` in bytes: the largest ``auto`` block of an array in an object store (0: no cap)."""
    return _size_setting("gpuzarr.remote.block-size")


def remote_malloc_thresholds() -> bool:
    """``gpuzarr.remote.malloc-thresholds``: whether object-store clients may raise glibc's malloc thresholds
    (``False``, ``"false"``, ``"off"``, ``"no"`` and ``"0"`` say no; anything else, ``auto`` included, yes)."""
    setting = get("gpuzarr.remote.malloc-thresholds")
    return not (setting is False or str(setting).lower() in ("false", "off", "no", "0"))


# --- writes -----------------------------------------------------------------------------------


def write_batch_bytes() -> int | None:
    """``gpuzarr.write.batch-size`` in bytes, or None (one batch per block)."""
    return _size_setting("gpuzarr.write.batch-size") or None


# --- GPU --------------------------------------------------------------------------------------

#: values of ``gpuzarr.gpu.sync-wait`` and the scheduling flags of a CUDA context they stand for
SYNC_WAITS = {"auto": 0x0, "spin": 0x1, "yield": 0x2, "blocking": 0x4}


def gpu_sync_wait() -> str:
    """``gpuzarr.gpu.sync-wait``: how threads wait for the GPU, one of :data:`SYNC_WAITS`."""
    return _choice("gpuzarr.gpu.sync-wait", SYNC_WAITS)


def encode_scratch_bytes() -> int | None:
    """``gpuzarr.gpu.encode-scratch`` in bytes; None: no limit."""
    return _size_setting("gpuzarr.gpu.encode-scratch") or None


NVCOMP_APIS = _choices("gpuzarr.gpu.nvcomp-api")


def nvcomp_api() -> str:
    """``gpuzarr.gpu.nvcomp-api``: nvCOMP's interface for decoding, ``c`` or ``python``."""
    return _choice("gpuzarr.gpu.nvcomp-api", NVCOMP_APIS)


def gpu_decode_combine() -> bool:
    """``gpuzarr.gpu.decode-combine``: whether nvCOMP decode calls made at the same time are joined into one."""
    return _flag_setting("gpuzarr.gpu.decode-combine")


def gpu_plan_turns() -> bool:
    """``gpuzarr.gpu.plan-turns``: whether GPU blocks that take read turns also plan their reads one at a time."""
    return _flag_setting("gpuzarr.gpu.plan-turns")


def gpu_read_slots() -> int:
    """``gpuzarr.gpu.read-slots``: blocks of a process that read their local files at once on the GPU path (0: any)."""
    return _count_setting("gpuzarr.gpu.read-slots")


def gpu_read_slot_min_bytes() -> int:
    """``gpuzarr.gpu.read-slot-min`` in bytes: a GPU block read of fewer stored bytes takes no read slot."""
    return _size_setting("gpuzarr.gpu.read-slot-min")


def gpu_min_batch_bytes() -> int:
    """``gpuzarr.gpu.min-batch`` in bytes: GPU batches of fewer decompressed bytes are coded on the CPU."""
    return _size_setting("gpuzarr.gpu.min-batch")


def gpu_min_batch_chunks() -> int:
    """``gpuzarr.gpu.min-batch-chunks``: GPU decodes of fewer chunks run on the CPU."""
    return _count_setting("gpuzarr.gpu.min-batch-chunks")


#: values of ``gpuzarr.gpu.zstd-check``, from the shallowest check to the deepest
ZSTD_CHECKS = _choices("gpuzarr.gpu.zstd-check")


def zstd_check() -> str:
    """``gpuzarr.gpu.zstd-check``: how deeply zstd frames are checked on the GPU before nvCOMP sees them,
    one of :data:`ZSTD_CHECKS` (``headers``, ``sequences``, ``literals``)."""
    return _choice("gpuzarr.gpu.zstd-check", ZSTD_CHECKS)


DEFLATE_CHECKS = _choices("gpuzarr.gpu.deflate-check")


def deflate_check() -> str:
    """``gpuzarr.gpu.deflate-check``: ``"walk"`` (inflate every deflate stream on the device without output
    before nvCOMP sees it) or ``"off"`` (trusted data)."""
    return _choice("gpuzarr.gpu.deflate-check", DEFLATE_CHECKS)


def deflate_walk_threads() -> int:
    """``gpuzarr.gpu.deflate-walk-threads``: threads per CUDA block of the deflate walk, 1 to 1024 (0 for ``"auto"``)."""
    v = get("gpuzarr.gpu.deflate-walk-threads")
    if v is None or str(v).strip().lower() in ("auto", "", "0"):
        return 0
    n = int(v)
    if not 1 <= n <= 1024:
        raise ValueError(f"gpuzarr.gpu.deflate-walk-threads must be 'auto' or 1..1024, not {v!r}")
    return n


# --- window sampler ---------------------------------------------------------------------------


def window_part_chunks() -> int:
    """``gpuzarr.windows.part-chunks``: on the GPU, a window call of at least twice this many chunks reads and
    decodes them in parts of at least this many, on :func:`window_part_threads` threads at once (0: one part)."""
    return _count_setting("gpuzarr.windows.part-chunks")


def window_part_threads() -> int:
    """``gpuzarr.windows.part-threads``: the threads a :class:`~gpuzarr_dist.WindowSampler` reads parts on (at least 1)."""
    return max(1, _count_setting("gpuzarr.windows.part-threads"))


def loader_read_size() -> int:
    """``gpuzarr.loader.read-size`` in bytes: on the GPU, a :class:`~gpuzarr_dist.ml.ZarrLoader` reads as many
    consecutive batches together as hold this much of one variable's windows (at least one batch)."""
    return _size_setting("gpuzarr.loader.read-size")


# --- clusters ---------------------------------------------------------------------------------


def cluster_placement() -> bool:
    """``gpuzarr.cluster.placement``: place consecutive blocks of a ``from_zarr_gpu`` array on one worker each."""
    return _flag_setting("gpuzarr.cluster.placement")


def cluster_whole_waves() -> bool:
    """``gpuzarr.cluster.whole-waves``: on a distributed client, ``auto`` blocks come in multiples of a worker's threads."""
    return _flag_setting("gpuzarr.cluster.whole-waves")


def cluster_warm() -> bool:
    """``gpuzarr.cluster.warm``: ``start_cluster`` warms every GPU worker before it returns."""
    return _flag_setting("gpuzarr.cluster.warm")
