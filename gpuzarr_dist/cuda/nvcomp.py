"""nvCOMP's batched C API through ctypes: decode calls that let other threads run and do not wait for the GPU.

nvCOMP's Python ``Codec.decode`` holds the GIL until its GPU work is done,
so several threads calling it decode no faster in all than one. A ctypes call releases the GIL, and
``nvcompBatched<Algorithm>DecompressAsync`` only queues kernels on the
caller's stream, so the decodes of several threads run on the GPU side by
side, and the thread itself waits (stream synchronisation, GIL released) only
when it needs the decoded sizes.

Encoding goes the same way (:func:`encode`), into a scratch buffer the
caller provides (``gpu_encode`` keeps one per GPU and codec for the process:
zstd's is 1.13 GB whatever the call). The Python ``Codec.encode`` also
reported the slot capacities as the sizes when given output slots (nvCOMP
6.0); the C call writes the sizes itself.

The library is the one nvCOMP's Python package loads (``nvidia.libnvcomp``),
or a system ``libnvcomp.so.6``. Scratch space comes from CuPy's pool on the
caller's stream, so it is reused and counted with the task's other buffers.
"""
from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import cupy

#: nvCOMP's C names of the algorithms (``nvcomp.Codec``'s names, the ``algorithm`` of :class:`.steps.DeviceSteps`)
ALGORITHMS = ("Zstd", "LZ4", "Deflate", "Gzip")

#: ``nvcompStatus_t`` values and their names in nvCOMP's headers
STATUS = {0: "nvcompSuccess", 10: "nvcompErrorInvalidValue", 11: "nvcompErrorNotSupported",
          12: "nvcompErrorCannotDecompress", 13: "nvcompErrorBadChecksum",
          14: "nvcompErrorCannotVerifyChecksums", 15: "nvcompErrorOutputBufferTooSmall",
          16: "nvcompErrorWrongHeaderLength", 17: "nvcompErrorAlignment", 18: "nvcompErrorChunkSizeTooLarge",
          19: "nvcompErrorCannotCompress", 20: "nvcompErrorWrongInputLength", 21: "nvcompErrorBatchSizeTooLarge",
          22: "nvcompErrorSubChunkCountTooLarge", 23: "nvcompErrorSubChunkCountTooSmall",
          24: "nvcompErrorOutputBufferAlignmentTooSmall", 1000: "nvcompErrorCudaError", 10000: "nvcompErrorInternal"}


class _DecompressOpts(ctypes.Structure):
    """Any ``nvcompBatched<Algorithm>DecompressOpts_t``: 64 bytes, all zero in each algorithm's default options
    (backend ``NVCOMP_DECOMPRESS_BACKEND_DEFAULT``, gzip's naive algorithm, lz4's char data, no bitshuffle)."""

    _fields_ = [("raw", ctypes.c_char * 64)]


class _CompressOpts(ctypes.Structure):
    """Any ``nvcompBatched<Algorithm>CompressOpts_t``: 64 bytes; Deflate's first field is its ``algorithm``
    (1, nvCOMP's default: high throughput), Zstd's are all reserved (zero)."""

    _fields_ = [("first", ctypes.c_int), ("reserved", ctypes.c_char * 60)]


#: each encoder's default options (nvCOMP's ``nvcompBatched<Algorithm>CompressDefaultOpts``)
_COMPRESS_FIRST = {"Zstd": 0, "Deflate": 1}


class _Alignments(ctypes.Structure):
    """``nvcompAlignmentRequirements_t``."""

    _fields_ = [("input", ctypes.c_size_t), ("output", ctypes.c_size_t), ("temp", ctypes.c_size_t)]


class NvcompCallError(RuntimeError):
    """An nvCOMP C call that returned an error, or frames it reported it could not decode."""


class _Api:
    """The three decode functions of one algorithm, with their argument types, and its alignments."""

    def __init__(self, lib: ctypes.CDLL, algorithm: str) -> None:
        p, sz, vp = ctypes.POINTER, ctypes.c_size_t, ctypes.c_void_p
        self.temp_size = getattr(lib, f"nvcompBatched{algorithm}DecompressGetTempSize")
        self.temp_size.argtypes = [sz, sz, _DecompressOpts, p(sz), sz, vp]
        self.decompress = getattr(lib, f"nvcompBatched{algorithm}DecompressAsync")
        self.decompress.argtypes = [vp, vp, vp, vp, sz, vp, sz, vp, _DecompressOpts, vp, vp]
        aligns = getattr(lib, f"nvcompBatched{algorithm}DecompressGetRequiredAlignments")
        aligns.argtypes = [_DecompressOpts, p(_Alignments)]
        for f in (self.temp_size, self.decompress, aligns):
            f.restype = ctypes.c_int
        a = _Alignments()
        _check(aligns(_DecompressOpts(), ctypes.byref(a)), f"nvcompBatched{algorithm}DecompressGetRequiredAlignments")
        self.alignments = (int(a.input), int(a.output), int(a.temp))


class _EncodeApi:
    """The encode functions of one algorithm, with their argument types, its alignments and default options."""

    def __init__(self, lib: ctypes.CDLL, algorithm: str) -> None:
        p, sz, vp = ctypes.POINTER, ctypes.c_size_t, ctypes.c_void_p
        name = f"nvcompBatched{algorithm}Compress"
        self.opts = _CompressOpts(_COMPRESS_FIRST[algorithm])
        self.temp_size = getattr(lib, f"{name}GetTempSize")
        self.temp_size.argtypes = [sz, sz, _CompressOpts, p(sz), sz, vp]
        self.max_output = getattr(lib, f"{name}GetMaxOutputChunkSize")
        self.max_output.argtypes = [sz, _CompressOpts, p(sz)]
        self.compress = getattr(lib, f"{name}Async")
        self.compress.argtypes = [vp, vp, sz, sz, vp, sz, vp, vp, _CompressOpts, vp, vp]
        aligns = getattr(lib, f"{name}GetRequiredAlignments")
        aligns.argtypes = [_CompressOpts, p(_Alignments)]
        for f in (self.temp_size, self.max_output, self.compress, aligns):
            f.restype = ctypes.c_int
        a = _Alignments()
        _check(aligns(self.opts, ctypes.byref(a)), f"{name}GetRequiredAlignments")
        self.alignments = (int(a.input), int(a.output), int(a.temp))


_lock = threading.Lock()
_apis: dict[str, _Api] = {}
_encode_apis: dict[str, _EncodeApi] = {}
_lib: list[ctypes.CDLL] = []


#: the nvCOMP major version whose C headers these bindings follow (argument lists change between majors)
ABI_MAJOR = "6"


def _library() -> ctypes.CDLL:
    """The libnvcomp nvCOMP's Python package uses (loaded once); OSError for another major version than
    :data:`ABI_MAJOR`, whose functions may take other arguments (the Python ``Codec`` is used then)."""
    if not _lib:
        import importlib

        version = str(getattr(importlib.import_module("nvidia.nvcomp"), "__version__", "unknown"))
        if version.split(".")[0] != ABI_MAJOR:
            raise OSError(f"nvCOMP {version}: the C bindings follow nvCOMP {ABI_MAJOR}'s headers")
        lib = None
        try:
            import nvidia.libnvcomp as wheel

            lib = wheel.load_library()
        except ImportError:
            pass
        _lib.append(lib if lib is not None else ctypes.CDLL("libnvcomp.so.6", mode=ctypes.RTLD_LOCAL))
    return _lib[0]


def _bound(table: dict, make: type, algorithm: str, known: Any, what: str) -> Any:
    """``make(lib, algorithm)`` once per algorithm, kept in ``table``; ValueError for one not in ``known``."""
    if algorithm not in known:
        raise ValueError(f"nvCOMP C {what}: unknown algorithm {algorithm!r} (one of {', '.join(known)})")
    with _lock:
        a = table.get(algorithm)
        if a is None:
            a = table[algorithm] = make(_library(), algorithm)
    return a


def api(algorithm: str) -> _Api:
    """The decode functions of ``algorithm`` (one of :data:`ALGORITHMS`); raises OSError without libnvcomp."""
    return _bound(_apis, _Api, algorithm, ALGORITHMS, "decode")


def encode_api(algorithm: str) -> _EncodeApi:
    """The encode functions of ``algorithm`` (``Zstd`` or ``Deflate``); raises OSError without libnvcomp."""
    return _bound(_encode_apis, _EncodeApi, algorithm, _COMPRESS_FIRST, "encode")


def max_compressed_size(algorithm: str, nbytes: int) -> int:
    """nvCOMP's bound on the compressed size of a chunk of ``nbytes`` bytes."""
    a = encode_api(algorithm)
    out = ctypes.c_size_t(0)
    _check(a.max_output(nbytes, a.opts, ctypes.byref(out)), f"nvcompBatched{algorithm}CompressGetMaxOutputChunkSize")
    return int(out.value)


def encode_aligned(algorithm: str, in_ptrs: Sequence[int]) -> bool:
    """Whether every input address meets ``algorithm``'s encode alignment (output slots are ours to align)."""
    return _multiples(in_ptrs, encode_api(algorithm).alignments[0])


def encode_scratch_size(algorithm: str, n: int, nbytes: int) -> int:
    """The device scratch nvCOMP asks for to encode ``n`` chunks of at most ``nbytes`` bytes in one call.

    With nvCOMP 6.0: Zstd about
    1.13 GB whatever the call, plus 1.35 bytes per input byte; Deflate 9
    bytes per input byte, nothing fixed.
    """
    a = encode_api(algorithm)
    out = ctypes.c_size_t(0)
    _check(a.temp_size(n, nbytes, a.opts, ctypes.byref(out), n * nbytes, None),
           f"nvcompBatched{algorithm}CompressGetTempSize")
    return int(out.value)


def chunks_per_call(algorithm: str, nbytes: int, max_scratch: int) -> int:
    """The most chunks of ``nbytes`` one encode call may take with at most ``max_scratch`` of scratch (at least 1)."""
    one = encode_scratch_size(algorithm, 1, nbytes)
    each = max(1, encode_scratch_size(algorithm, 2, nbytes) - one)
    return max(1, (max_scratch - (one - each)) // each)


def encode(algorithm: str, stream: cupy.cuda.Stream, in_ptrs: Sequence[int], in_sizes: Sequence[int],
           out_ptrs: Sequence[int], scratch_ptr: int, scratch_bytes: int, per_call: int) -> list[int]:
    """Encode chunks into slots of at least :func:`max_compressed_size` of the largest on ``stream``, waited for;
    their compressed sizes. Raises :class:`NvcompCallError` if nvCOMP refuses a call or fails a chunk.

    The chunks go in calls of at most ``per_call``, queued one after another
    on ``stream`` and sharing the scratch at ``scratch_ptr``, which must hold
    :func:`encode_scratch_size` of ``per_call`` chunks of the largest size.
    The thread waits for ``stream`` with the GIL released.
    """
    import cupy

    from gpuzarr_dist.cuda.streams import on_stream, pinned_staging

    a = encode_api(algorithm)
    n = len(in_ptrs)
    if n == 0:
        return []
    largest = int(max(in_sizes))
    a_in, a_out, a_temp = a.alignments
    if any(p % a_in for p in in_ptrs) or any(p % a_out for p in out_ptrs) or scratch_ptr % a_temp:
        raise NvcompCallError(f"nvCOMP {algorithm} encode: buffers not aligned to {a.alignments} (in, out, scratch)")
    per_call = max(1, min(per_call, n))
    if encode_scratch_size(algorithm, per_call, largest) > scratch_bytes:
        raise ValueError(f"nvCOMP {algorithm} encode: {scratch_bytes} bytes of scratch are too few for "
                         f"{per_call} chunks of {largest} bytes a call")
    tables = pinned_staging(3 * n * 8).view(np.uint64).reshape(3, n)  # in ptrs, in bytes, out ptrs
    tables[0], tables[1], tables[2] = in_ptrs, in_sizes, out_ptrs
    try:
        with on_stream(stream):
            dev_tables = cupy.empty((3, n), dtype=cupy.uint64)
            dev_tables.set(tables, stream=stream)
            results = cupy.empty(2 * n, dtype=cupy.uint64)  # compressed sizes, then the int32 statuses
            row, res = dev_tables.data.ptr, results.data.ptr
            for lo in range(0, n, per_call):  # stream-ordered: each call's scratch is free when the next starts
                k = min(per_call, n - lo)
                _check(a.compress(row + 8 * lo, row + 8 * (n + lo), largest, k, scratch_ptr, scratch_bytes,
                                  row + 8 * (2 * n + lo), res + 8 * lo, a.opts, res + 8 * n + 4 * lo, stream.ptr),
                       f"nvcompBatched{algorithm}CompressAsync")
            stream.synchronize()  # the GIL released while waiting
            host = results.get(stream=stream)
    except BaseException:
        stream.synchronize()  # the pinned tables go back to their pool only when no copy reads them
        raise
    return _sizes(host, n, f"nvCOMP {algorithm} encode", "chunk")


_unavailable: list[str] = []


def available() -> bool:
    """Whether libnvcomp's C decode functions load in this process (tried once; :func:`why_unavailable` says why not)."""
    if not _apis and not _unavailable:
        try:
            api("Zstd")
        except (OSError, ImportError, AttributeError, NvcompCallError) as e:
            _unavailable.append(f"{type(e).__name__}: {e}")
    return not _unavailable


def why_unavailable() -> str | None:
    """Why the C functions did not load, or ``None`` when they did (or were not tried)."""
    return _unavailable[0] if _unavailable else None


def _sizes(host: np.ndarray, n: int, what: str, unit: str) -> list[int]:
    """The sizes of a call's results (``n`` uint64 sizes, then ``n`` int32 statuses); raises on any failure."""
    statuses = host[n:].view(np.int32)[:n]
    bad = np.flatnonzero(statuses)
    if bad.size:
        i = int(bad[0])
        raise NvcompCallError(f"{what}: {bad.size} of {n} {unit}s failed, the first ({unit} {i}) "
                              f"with {STATUS.get(int(statuses[i]), int(statuses[i]))}")
    return host[:n].astype(np.int64).tolist()


def _check(status: int, what: str) -> None:
    if status != 0:
        raise NvcompCallError(f"{what} returned {STATUS.get(status, status)}")


def aligned(algorithm: str, in_ptrs: Sequence[int], out_ptrs: Sequence[int]) -> bool:
    """Whether every input and output address meets ``algorithm``'s alignment (checked before a call)."""
    a_in, a_out, _ = api(algorithm).alignments
    return _multiples(in_ptrs, a_in) and _multiples(out_ptrs, a_out)


def _multiples(ptrs: Sequence[int], align: int) -> bool:
    """Whether every address of ``ptrs`` (a sequence or a uint64 array) is a multiple of ``align``: numpy, no loop."""
    p = np.asarray(ptrs, dtype=np.uint64)
    return not np.any(p % np.uint64(align))


def decode_tables(in_ptrs: Sequence[int], in_sizes: Sequence[int], out_ptrs: Sequence[int],
                  out_sizes: Sequence[int], into: np.ndarray | None = None) -> np.ndarray:
    """The pointer and size tables of a decode call, ``(4, n)`` uint64 (in ``into`` when given): for
    :func:`decode`'s ``dev_tables``, copied up by the caller with other small tables in one copy."""
    t = np.empty((4, len(in_ptrs)), dtype=np.uint64) if into is None else into
    t[0], t[1], t[2], t[3] = in_ptrs, in_sizes, out_sizes, out_ptrs
    return t


def decode(algorithm: str, stream: cupy.cuda.Stream, in_ptrs: Sequence[int], in_sizes: Sequence[int],
           out_ptrs: Sequence[int], out_sizes: Sequence[int], dev_tables: cupy.ndarray | None = None) -> list[int]:
    """Decode ``len(in_ptrs)`` frames into the slots at ``out_ptrs`` on ``stream``; their decoded sizes.

    The addresses are device pointers into buffers the caller keeps alive
    until this returns; ``out_sizes`` are the slots' sizes. They bound
    nothing: nvCOMP 6.0 reported success and the full decoded size for a zstd
    frame given half the slot it needed, so callers check what frames
    state before the call and guard the output (``gpu._decode_batch``). The
    pointer tables, the scratch space
    and the results are queued on ``stream`` behind the work already there
    (the uploads of the frames), the decode is queued after them, and the
    thread then waits for ``stream`` with the GIL released. Raises
    :class:`NvcompCallError` if nvCOMP refuses the call or reports any frame
    it could not decode (the caller then judges the frames on the CPU).

    ``dev_tables``: :func:`decode_tables` of these arguments already queued
    for the device on ``stream``. A batch's reader copies them up before the
    batch's chunks: copied here, after the walk, a few hundred bytes wait on
    the copy engine behind every other thread's chunks queued meanwhile.
    """
    import cupy

    from gpuzarr_dist.cuda.streams import on_stream, pinned_staging

    a = api(algorithm)
    n = len(in_ptrs)
    if n == 0:
        return []
    if not aligned(algorithm, in_ptrs, out_ptrs):
        raise NvcompCallError(f"nvCOMP {algorithm} decode: buffers not aligned to {a.alignments[:2]} (input, output)")
    sizes = np.asarray(out_sizes, dtype=np.int64)
    largest, total = int(sizes.max()), int(sizes.sum())
    try:
        with on_stream(stream):
            if dev_tables is None:
                tables = decode_tables(in_ptrs, in_sizes, out_ptrs, out_sizes,
                                       pinned_staging(4 * n * 8).view(np.uint64).reshape(4, n))
                dev_tables = cupy.empty((4, n), dtype=cupy.uint64)
                dev_tables.set(tables, stream=stream)
            results = cupy.empty(2 * n, dtype=cupy.uint64)  # decoded sizes, then the int32 statuses
            temp_bytes = ctypes.c_size_t(0)
            _check(a.temp_size(n, largest, _DecompressOpts(), ctypes.byref(temp_bytes), total, stream.ptr),
                   f"nvcompBatched{algorithm}DecompressGetTempSize")
            temp = cupy.empty(max(int(temp_bytes.value), 1), dtype=cupy.uint8)
            if temp.data.ptr % a.alignments[2]:
                raise NvcompCallError(f"nvCOMP {algorithm} decode: scratch not aligned to {a.alignments[2]}")
            row = dev_tables.data.ptr
            _check(a.decompress(row, row + 8 * n, row + 16 * n, results.data.ptr, n, temp.data.ptr,
                                int(temp_bytes.value), row + 24 * n, _DecompressOpts(), results.data.ptr + 8 * n,
                                stream.ptr), f"nvcompBatched{algorithm}DecompressAsync")
            stream.synchronize()  # the GIL released while waiting
            host = results.get(stream=stream)
    except BaseException:
        stream.synchronize()  # the pinned tables go back to their pool only when no copy reads them
        raise
    return _sizes(host, n, f"nvCOMP {algorithm} decode", "frame")
