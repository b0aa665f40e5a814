"""Fuzz the batched GPU decoders with random and mutated chunks; count every outcome; survive crashes.

Usage (on a machine with a GPU, from the repository root)::

    timeout 260 python3 -m dev.gpu_fuzz --cases 12000 --time 240 --sanitize 3 --out "$OUT/fuzz"
    python3 -m dev.gpu_fuzz --device cpu --cases 300 --out /tmp/fuzz   # the same harness, CPU decoding
    compute-sanitizer --tool memcheck python3 -m dev.gpu_fuzz --replay "$OUT/fuzz/crash-123.json"

**Cases.** Case ``i`` is a function of ``(--seed, i)`` alone: its codec chain
comes from its position in a fixed round over the chains, and a generator
seeded with ``(seed, i)`` draws the chain's options (zstd level -7..19 and
content checksum; blosc inner codec settings, shuffle none/byte/bit, typesize
1/2/4/8, blocksize), a payload (random, smooth, constant, quantised, ramp or
incompressible bytes), and one damage: bit flips, truncation, extension,
header and block edits, overwritten runs, random bytes, an empty chunk, a
valid chunk of another decoded size, two frames in one chunk, a splice, zeros,
and for blosc edits of the header's nbytes, blocksize, cbytes, flags and
typesize, of a block start (bstarts) and of a stream's stored size. Chains with
an outer crc32c recompute the checksum after the damage half the time, so that
the damage reaches the decoder. Nothing is generated up front or written to
disk: a child process makes each case when it needs it.

**Batches.** A batch holds one to three damaged chunks of one chain (one for
chains whose damage reaches nvCOMP's zstd decoder, which does not validate its
input, so that a crash names its case) and three good chunks, at positions
drawn from the same seed, and goes through ``decode_batch_gpu`` (``--device
cpu``: the CPU pipeline). Every damaged chunk is also decoded on the CPU
(google-crc32c, numcodecs: libzstd, zlib, lz4, c-blosc;
not gpuzarr_dist's own pipeline) and judged against it:

- rejected: ``ChunkDecodeError`` naming a damaged key (counted by the check
  that caught it). The other damaged chunks the error lists (the GPU path asks
  the CPU about all its suspects and lists the ones it rejects) are rejected
  too; whether every chunk of the batch that the CPU rejects was named is
  counted; damaged chunks not named are decoded again, without the named ones,
  until each has its own verdict;
- decoded, equal to what the CPU decodes;
- decoded though the CPU rejects it: a *silent wrong value* (except a gzip or
  zlib chunk whose first deflate stream the GPU decoded and checked against
  the checksum and size at the end of the chunk, where zlib finds other bytes:
  counted on its own, after inflating that stream with zlib);
- decoded, but different from what the CPU decodes;
- good chunks decoded wrongly: *collateral*; an error naming a good chunk or no
  damaged one: *misattributed*; with several damaged chunks in the batch both
  are decoded again one damaged chunk at a time, so each case is judged alone;
- rejected though the CPU decodes it (a disagreement, reported, not a failure);
- other exceptions;
- *crashes*: the process died or hung (``--stall``), or the CUDA context was
  lost (checked with ``cudaDeviceSynchronize`` after every batch).

**Lanes.** ``--lanes N`` (default on the GPU: min(6, CPUs/2)) splits the
cases into N ranges of whole rounds, each run by its own supervisor thread,
children and journal, side by side on the one GPU: the work per batch is
mostly Python and the CPU reference decode, so one child at a time left the
GPU idle. ``--zstd-check`` sets ``gpuzarr.gpu.zstd-check`` for the decoders
(default ``literals``, the deepest). The run ends with a ``SUMMARY`` line (cases, chains,
rejected by the zstd walk (``rejected-by-walk``) and by the deflate walk
(``rejected-by-deflate-walk``), reported errors, wrong values, crashes, hangs).

**Crashes.** In each lane, one long-lived child judges batches until it is done, its time is
up, or it dies. Before each batch it appends the case ids to a journal (a line,
written through at once), so when it dies the supervisor knows the batch; a
batch of several damaged chunks is then run again one chunk per batch in the
next child to find the one that kills it. The culprit's bytes are saved as
``crash-<case>.bin`` with ``crash-<case>.json`` (chain, options, damage, seed,
the batch's layout), and the next child carries on after it. Children warm up
(imports, CUDA context, kernels, nvCOMP codecs) in advance (``--standby``), so
a crash costs little time. ``--replay crash-<case>.json`` decodes that batch
once, in this process, for ``compute-sanitizer``; ``--sanitize N`` does that for
up to N crashes after the run (``compute-sanitizer`` from the PATH or the CUDA
toolkit; ``--time`` keeps ``--sanitize-time`` for it once N crashes are saved),
writes its output next to the case and prints the first kernel it reports.

Prints a table of outcomes per chain, writes ``gpu_fuzz.json`` to ``--out`` and
exits 1 on any crash, silent wrong value, difference, misattribution,
collateral damage or other exception.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zlib

import numpy as np

#: the folder that holds ``dev/`` (the repository root)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: how children and replays start this harness
MODULE = "dev.gpu_fuzz"


def _command(*args: str) -> list[str]:
    """A command line that runs this harness in a new process (``python -m dev.gpu_fuzz ARGS``)."""
    return [sys.executable, "-m", MODULE, *args]


def _environ() -> dict[str, str]:
    """This process's environment with the repository root first on ``PYTHONPATH``: children import this checkout."""
    path = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=ROOT + (os.pathsep + path if path else ""))


# --------------------------------------------------------------------------- chains

#: chain name -> compressor, outer crc32c, dtype, chunk shape, damaged chunks per batch.
#: Chunks of 4 - 64 KiB, plus one multi-block zstd chain (zstd blocks hold at most 128 KiB).
CHAINS: dict[str, dict] = {
    "zstd": dict(comp="zstd", crc=False, dtype="<f4", shape=(64, 64), k=1),
    "zstd-checksum": dict(comp="zstd", crc=False, dtype="<u2", shape=(64, 64), k=1, checksum=True),
    "zstd-f8": dict(comp="zstd", crc=False, dtype="<f8", shape=(32, 128), k=1),
    "zstd-multiblock": dict(comp="zstd", crc=False, dtype="<f4", shape=(160, 256), k=1),
    "gzip": dict(comp="gzip", crc=False, dtype="<f4", shape=(32, 64), k=3),
    "zlib": dict(comp="zlib", crc=False, dtype="<i4", shape=(64, 64), k=3),
    "lz4": dict(comp="lz4", crc=False, dtype="<f4", shape=(128, 128), k=3),
    "lz4-u1": dict(comp="lz4", crc=False, dtype="|u1", shape=(64, 64), k=3),
    "blosc-lz4": dict(comp="blosc", cname="lz4", crc=False, dtype="<f4", shape=(64, 64), k=3),
    "blosc-lz4hc": dict(comp="blosc", cname="lz4hc", crc=False, dtype="<f8", shape=(32, 64), k=3),
    "blosc-zlib": dict(comp="blosc", cname="zlib", crc=False, dtype="<u2", shape=(64, 128), k=3),
    "blosc-zstd": dict(comp="blosc", cname="zstd", crc=False, dtype="<f4", shape=(64, 64), k=1),
    "zstd+crc32c": dict(comp="zstd", crc=True, dtype="<f8", shape=(16, 64), k=1),
    "gzip+crc32c": dict(comp="gzip", crc=True, dtype="<i2", shape=(64, 64), k=3),
    "zlib+crc32c": dict(comp="zlib", crc=True, dtype="<f4", shape=(32, 64), k=3),
    "lz4+crc32c": dict(comp="lz4", crc=True, dtype="<f4", shape=(64, 64), k=3),
    "blosc-lz4+crc32c": dict(comp="blosc", cname="lz4", crc=True, dtype="<i4", shape=(64, 64), k=3),
    "blosc-zstd+crc32c": dict(comp="blosc", cname="zstd", crc=True, dtype="|u1", shape=(128, 128), k=1),
}
NAMES = list(CHAINS)
MUTATIONS = ["bitflip", "bitflips", "truncate", "extend", "header-edit", "overwrite-run", "random", "empty",
             "wrong-size", "two-frames", "zeros", "block-edit", "splice"]
BLOSC_MUTATIONS = ["blosc-nbytes", "blosc-blocksize", "blosc-cbytes", "blosc-flags", "blosc-typesize",
                   "blosc-bstarts", "blosc-stream-size"]
GOOD_PER_BATCH = 3
POOL = 6  # good chunks per chain
EXIT_CUDA_LOST = 3
#: the environment variable through which --zstd-check reaches ``gpuzarr.gpu.zstd-check``
ZSTD_CHECK_ENV = "DASK_GPUZARR__GPU__ZSTD_CHECK"

FAILURES = ("crash", "decoded, CPU rejects", "decoded, differs", "misattributed", "collateral", "other exception")

#: one round over the chains: chains decoded by nvCOMP's zstd twice (one damaged chunk per batch there)
_ROUND = [(name, CHAINS[name]["k"]) for name in NAMES] + [(name, 1) for name in NAMES if CHAINS[name]["k"] == 1]
_ROUND_SIZE = sum(k for _, k in _ROUND)
_ROUND_AT = np.cumsum([0] + [k for _, k in _ROUND])


def batch_of(i: int) -> tuple[str, int, int]:
    """Chain of case ``i`` and the case range ``[start, end)`` of its batch (cases go round the chains)."""
    r, off = divmod(i, _ROUND_SIZE)
    c = int(np.searchsorted(_ROUND_AT, off, side="right")) - 1
    return _ROUND[c][0], r * _ROUND_SIZE + int(_ROUND_AT[c]), r * _ROUND_SIZE + int(_ROUND_AT[c + 1])


def _crc(body: bytes) -> bytes:
    import google_crc32c

    return body + google_crc32c.value(body).to_bytes(4, "little")


def _payload(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    dt = np.dtype(dtype)
    n = int(np.prod(shape))
    kind = int(rng.integers(6))
    if kind == 5:  # incompressible: raw zstd blocks, literal-only lz4, stored deflate blocks
        return np.frombuffer(rng.bytes(n * dt.itemsize), dtype=dt).reshape(shape).copy()
    if kind == 0:
        a = rng.standard_normal(n) * 100
    elif kind == 1:
        a = np.cumsum(rng.standard_normal(n))
    elif kind == 2:
        a = np.zeros(n)
    elif kind == 3:
        a = rng.integers(0, 4, n) * 0.5
    else:
        a = np.linspace(0, 200, n)
    if dt.kind in "iu":
        a = np.clip(a, np.iinfo(dt).min, np.iinfo(dt).max)
    return a.astype(dt).reshape(shape)


def _options(chain: str, rng: np.random.Generator) -> dict:
    """The compressor's settings for one chunk (frames of all settings decode with the same codec)."""
    c = CHAINS[chain]
    if c["comp"] == "zstd":
        levels = [-3, 1, 3] if chain == "zstd-multiblock" else [-7, -1, 1, 3, 9, 19]
        return {"level": int(rng.choice(levels)), "checksum": bool(c.get("checksum", rng.integers(2)))}
    if c["comp"] in ("gzip", "zlib"):
        return {"level": int(rng.choice([1, 6, 9]))}
    if c["comp"] == "blosc":
        return {"cname": c["cname"], "clevel": int(rng.choice([1, 5, 9])), "shuffle": int(rng.integers(3)),
                "typesize": int(rng.choice([1, 2, 4, 8])), "blocksize": int(rng.choice([0, 1024, 4096, 16384]))}
    return {}


def _encode(chain: str, arr: np.ndarray, opts: dict) -> bytes:
    import numcodecs

    c = CHAINS[chain]
    raw = np.ascontiguousarray(arr).tobytes()
    if c["comp"] == "gzip":  # numcodecs stamps the time into the header: cases must be a function of (seed, i)
        import gzip

        body = gzip.compress(raw, compresslevel=opts["level"], mtime=0)
        return _crc(body) if c["crc"] else body
    codec = {"zstd": lambda: numcodecs.Zstd(**opts),
             "zlib": lambda: numcodecs.Zlib(**opts), "lz4": lambda: numcodecs.LZ4(),
             "blosc": lambda: numcodecs.Blosc(**opts)}[c["comp"]]()
    body = bytes(codec.encode(raw))
    return _crc(body) if c["crc"] else body


def _interesting(rng: np.random.Generator, orig: int) -> int:
    return int(rng.choice([0, 1, orig - 1, orig + 1, orig * 2, orig // 2, 16, 2**31 - 1, 2**32 - 1,
                           int(rng.integers(2**32))])) % (1 << 32)


def _mutate(kind: str, raw: bytes, chain: str, rng: np.random.Generator, other: bytes) -> bytes:
    crc = CHAINS[chain]["crc"]
    inner = raw[:-4] if crc and raw else raw
    b = bytearray(inner)
    if kind == "bitflip" and b:
        i = rng.integers(len(b))
        b[i] ^= 1 << rng.integers(8)
    elif kind == "bitflips" and b:
        for _ in range(rng.integers(2, 9)):
            i = rng.integers(len(b))
            b[i] ^= 1 << rng.integers(8)
    elif kind == "truncate":
        b = b[: rng.integers(0, max(1, len(b)))]
    elif kind == "extend":
        b += rng.bytes(int(rng.integers(1, 64)))
    elif kind == "header-edit" and b:
        i = rng.integers(0, min(len(b), 20))
        b[i] = rng.integers(256)
    elif kind == "block-edit" and len(b) > 8:
        i = rng.integers(4, min(len(b), 80))
        b[i : i + 2] = rng.bytes(2)
    elif kind == "overwrite-run" and b:
        i = rng.integers(len(b))
        b[i : i + int(rng.integers(2, 32))] = rng.bytes(int(rng.integers(2, 32)))
    elif kind == "random":
        b = bytearray(rng.bytes(int(rng.integers(1, 4096))))
    elif kind == "empty":
        b = bytearray()
    elif kind == "wrong-size":
        b = bytearray(other[:-4] if crc else other)
    elif kind == "two-frames":
        b = b + b
    elif kind == "splice":
        b = b[: rng.integers(0, len(b) + 1)] + bytearray(inner)
    elif kind == "zeros":
        b = bytearray(len(b))
    elif kind.startswith("blosc-") and len(b) >= 16:
        field = {"blosc-nbytes": 4, "blosc-blocksize": 8, "blosc-cbytes": 12}.get(kind)
        if field is not None:
            v = _interesting(rng, int.from_bytes(b[field : field + 4], "little"))
            b[field : field + 4] = v.to_bytes(4, "little")
        elif kind == "blosc-flags":
            b[2] ^= 1 << int(rng.integers(8))
        elif kind == "blosc-typesize":
            b[3] = int(rng.choice([0, 1, 3, 16, 255, int(rng.integers(256))]))
        elif not b[2] & 0x2:  # block starts and stream sizes (frames not stored whole)
            nbytes, bsize = (int.from_bytes(b[o : o + 4], "little") for o in (4, 8))
            nblocks = max(1, -(-nbytes // max(bsize, 1)))
            j = 16 + 4 * int(rng.integers(min(nblocks, max(0, (len(b) - 16) // 4)) or 1))
            start = int.from_bytes(b[j : j + 4], "little")
            if kind == "blosc-stream-size":
                j = start if 0 < start <= len(b) - 4 else j
            v = _interesting(rng, int.from_bytes(b[j : j + 4], "little"))
            b[j : j + 4] = v.to_bytes(4, "little")
    if crc and (kind == "empty" or rng.integers(2) == 0):
        return _crc(bytes(b))  # a valid checksum over damaged data: the damage reaches the decoder
    return bytes(b) + (raw[-4:] if crc and raw else b"")


class Pools:
    """Good chunks (bytes and arrays) and one valid chunk of another size per chain, from the seed alone."""

    def __init__(self, seed: int):
        self.good: dict[str, list[bytes]] = {}
        self.arrays: dict[str, list[np.ndarray]] = {}
        self.other: dict[str, bytes] = {}
        for ci, (chain, c) in enumerate(CHAINS.items()):
            rng = np.random.default_rng([seed, 1 << 40, ci])
            self.arrays[chain] = [_payload(rng, c["shape"], c["dtype"]) for _ in range(POOL)]
            self.good[chain] = [_encode(chain, a, _options(chain, rng)) for a in self.arrays[chain]]
            small = (max(1, c["shape"][0] // 2), *c["shape"][1:])
            self.other[chain] = _encode(chain, _payload(rng, small, c["dtype"]), _options(chain, rng))


def make_case(seed: int, i: int, pools: Pools) -> dict:
    """Case ``i``: one damaged chunk, drawn from ``(seed, i)`` alone."""
    chain = batch_of(i)[0]
    c = CHAINS[chain]
    rng = np.random.default_rng([seed, i])
    opts = _options(chain, rng)
    raw = _encode(chain, _payload(rng, c["shape"], c["dtype"]), opts)
    kinds = MUTATIONS + (BLOSC_MUTATIONS * 2 if c["comp"] == "blosc" else [])
    kind = kinds[int(rng.integers(len(kinds)))]
    data = _mutate(kind, raw, chain, rng, pools.other[chain])
    return {"case": i, "chain": chain, "kind": kind, "options": opts, "data": data}


def layout_for(seed: int, ids: list[int], attempt: int) -> list[list]:
    """Where the damaged chunks ``ids`` and the good ones go in one batch: ``[["case", i] | ["good", g], ...]``."""
    rng = np.random.default_rng([seed, 1 << 41, ids[0], attempt])
    entries = [["good", int(g)] for g in rng.integers(POOL, size=GOOD_PER_BATCH)] + [["case", i] for i in ids]
    return [entries[j] for j in rng.permutation(len(entries))]


def _spec(chain: str):
    from gpuzarr_dist.core.metadata import ArraySpec, CodecSpec

    c = CHAINS[chain]
    if c["comp"] == "blosc":
        comp = CodecSpec("blosc", {"cname": c["cname"], "clevel": 5, "shuffle": "shuffle",
                                   "typesize": np.dtype(c["dtype"]).itemsize, "blocksize": 0})
    else:
        comp = CodecSpec(c["comp"], {})
    codecs = [CodecSpec("bytes", {"endian": "little"}), comp] + ([CodecSpec("crc32c", {})] if c["crc"] else [])
    shape = c["shape"]
    return ArraySpec(name=f"fuzz-{chain}", shape=(shape[0] * 8, *shape[1:]), chunk_shape=shape,
                     dtype=np.dtype(c["dtype"]), fill_value=0, zarr_format=3, codecs=tuple(codecs),
                     key_prefix="c", key_separator="/", metadata_key="zarr.json")


def reference_decode(chain: str, data: bytes) -> np.ndarray:
    """The chunk as the reference libraries decode it (google-crc32c, numcodecs: libzstd, zlib, lz4, c-blosc).

    Independent of gpuzarr_dist's pipeline, which is under test on the CPU too.
    Raises ``ValueError`` (or the library's own error) where they reject it.
    """
    import google_crc32c
    import numcodecs

    c = CHAINS[chain]
    if c["crc"]:
        if len(data) < 4 or google_crc32c.value(data[:-4]) != int.from_bytes(data[-4:], "little"):
            raise ValueError("crc32c mismatch")
        data = data[:-4]
    if c["comp"] == "blosc":
        if len(data) < 16 or int.from_bytes(data[12:16], "little") > len(data):
            raise ValueError("blosc frame longer than the chunk")  # c-blosc 1 would read past the buffer
        codec = numcodecs.Blosc()
    else:
        codec = {"zstd": numcodecs.Zstd, "gzip": numcodecs.GZip, "zlib": numcodecs.Zlib, "lz4": numcodecs.LZ4}[c["comp"]]()
    raw = bytes(codec.decode(data))
    dt = np.dtype(c["dtype"])
    if len(raw) != int(np.prod(c["shape"])) * dt.itemsize:
        raise ValueError(f"decoded to {len(raw)} bytes")
    return np.frombuffer(raw, dtype=dt).reshape(c["shape"])


def _category(reason: str) -> str:
    reason = reason.split(";")[0].split(" (the CPU decoder agrees")[0]
    reason = re.sub(r"0x[0-9a-f]+|-?\b\d+\b", "N", reason)
    return reason[:90]


def _first_deflate_stream(chain: str, data: bytes) -> bytes | None:
    """The content of the first deflate stream of a gzip/zlib chunk, when zlib inflates it to its end."""
    c = CHAINS[chain]
    body = data[:-4] if c["crc"] else data
    inflate = zlib.decompressobj(-15)
    try:
        content = inflate.decompress(body[10 if c["comp"] == "gzip" else 2 :])
    except zlib.error:
        return None
    return content if inflate.eof else None


# --------------------------------------------------------------------------- the decoder under test


class Decoder:
    """Decodes one batch on the GPU (``decode_batch_gpu``) or the CPU (the pipeline), in this process."""

    def __init__(self, device: str, seed: int):
        from gpuzarr_dist.codecs.pipeline import CodecPipeline

        self.gpu = device == "gpu"
        self.seed = seed
        self.pools = Pools(seed)
        self.pipelines = {chain: CodecPipeline(_spec(chain)) for chain in CHAINS}
        if self.gpu:
            from gpuzarr_dist.cuda.streams import thread_stream

            self.stream = thread_stream()

    def warm_up(self) -> None:
        """One batch of good chunks per chain: kernels compiled or loaded, nvCOMP codecs made, before any case."""
        for chain in CHAINS:
            got = self.decode(chain, self.pools.good[chain], [f"c/{j}/0" for j in range(POOL)])
            if not all(_same(g, a) for g, a in zip(got, self.pools.arrays[chain])):
                raise SystemExit(f"good chunks of {chain} decode wrongly: the harness or the decoder is broken")
        self.check_context()

    def decode(self, chain: str, chunks: list[bytes], keys: list[str]) -> list[np.ndarray]:
        pipe = self.pipelines[chain]
        if not self.gpu:
            return [pipe.decode_chunk(b, k) for b, k in zip(chunks, keys)]
        from gpuzarr_dist.cuda.decode import decode_batch_gpu, framing_lead
        from gpuzarr_dist.cuda.streams import ALIGN, pinned_staging, settle
        from gpuzarr_dist.stores.base import staging_layout

        sizes = [len(b) for b in chunks]
        offsets, total = staging_layout(sizes, ALIGN, framing_lead(pipe))
        host = pinned_staging(max(total, 1))
        for b, o in zip(chunks, offsets):
            host[o : o + len(b)] = np.frombuffer(b, dtype=np.uint8)
        try:
            dec = decode_batch_gpu(pipe, host, offsets, sizes, keys, self.stream)
            self.stream.synchronize()
            return list(dec.get())
        except BaseException:  # the stream is idle before ``host`` can be refilled for the next batch
            settle(self.stream)
            raise

    def check_context(self) -> None:
        """Raise where the CUDA context is lost: a fault inside a kernel is sticky and shows at the next sync."""
        if self.gpu:
            import cupy

            cupy.cuda.runtime.deviceSynchronize()


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit (random payloads hold NaNs of every kind)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()



# --------------------------------------------------------------------------- child: judge batches


class Child:
    """Judges batches and writes every step to the journal (one JSON line each, written through)."""

    def __init__(self, dec: Decoder, journal):
        self.dec, self.journal = dec, journal
        self.crash_at = {int(x) for x in os.environ.get("GPU_FUZZ_SELFTEST_CRASH", "").split(",") if x.strip()}
        self.hang_at = {int(x) for x in os.environ.get("GPU_FUZZ_SELFTEST_HANG", "").split(",") if x.strip()}

    def write(self, rec: dict) -> None:
        self.journal.write(json.dumps(rec) + "\n")

    def lost(self, text: str) -> None:
        self.write({"lost": text[:400]})
        self.journal.flush()
        os._exit(EXIT_CUDA_LOST)  # no teardown: destructors on a lost context can hang

    def record(self, case: dict, outcome: str, detail: str = "") -> None:
        self.write({"case": case["case"], "chain": case["chain"], "kind": case["kind"], "outcome": outcome,
                    "detail": detail[:300]})

    def run_batch(self, ids: list[int], isolate: bool = False) -> None:
        """Judge the cases ``ids`` (one chain) in batches with good chunks until each has a verdict."""
        dec = self.dec
        cases = {i: make_case(dec.seed, i, dec.pools) for i in ids}
        chain = cases[ids[0]]["chain"]
        cpu: dict[int, np.ndarray | None] = {}
        for i, c in cases.items():
            try:
                cpu[i] = reference_decode(chain, c["data"])
            except Exception:  # noqa: BLE001 - whatever the reference libraries raise
                cpu[i] = None
        groups = [list(ids)]
        attempt = 0
        while groups:
            group = groups.pop(0)
            attempt += 1
            layout = layout_for(dec.seed, group, attempt)
            chunks = [cases[x]["data"] if e == "case" else dec.pools.good[chain][x] for e, x in layout]
            keys = [f"c/{j}/0" for j in range(len(layout))]
            key_case = {keys[j]: x for j, (e, x) in enumerate(layout) if e == "case"}
            self.write({"try": group, "layout": layout, "isolate": isolate})
            if self.crash_at & set(group):  # checks the crash accounting itself
                os._exit(139)
            if self.hang_at & set(group):
                time.sleep(3600)
            error = other = None
            try:
                got = dec.decode(chain, chunks, keys)
                dec.check_context()
            except Exception as e:  # noqa: BLE001 - sorted below
                from gpuzarr_dist.errors import ChunkDecodeError

                text = f"{type(e).__name__}: {e}"
                if dec.gpu:  # a lost context fails every later sync; other CUDA errors are findings of their own
                    try:
                        dec.check_context()
                    except Exception as e2:  # noqa: BLE001
                        self.lost(f"{text} / then {type(e2).__name__}: {e2}")
                if isinstance(e, ChunkDecodeError):
                    error = e
                else:
                    other = text
            problem = None  # a failure that a batch of several damaged chunks cannot attribute
            if error is not None:
                named = error.key
                if named not in key_case:
                    problem = ("misattributed", f"error names {named!r}, a good chunk (damaged: "
                               f"{sorted(key_case)}): {error.reason}")
                else:
                    listed = re.search(r"more bad chunk\(s\) in this block: ([^;]*)", error.reason)
                    listed = [k.strip() for k in listed.group(1).split(",")] if listed else []
                    more = re.search(r"; (\d+) more bad chunk", error.reason)
                    bad_good = [k for k in listed if k not in key_case]
                    if bad_good:
                        problem = ("misattributed", f"error lists good chunk(s) {bad_good}: {error.reason}")
                    else:
                        i = key_case[named]
                        self.record(cases[i], "rejected" if cpu[i] is None else "rejected, CPU decodes it",
                                    _category(error.reason))
                        done = {i}
                        for k in listed:
                            j = key_case[k]
                            self.record(cases[j], "rejected" if cpu[j] is None else "rejected, CPU decodes it",
                                        "listed in another chunk's error")
                            done.add(j)
                        failing = {j for j in group if cpu[j] is None}
                        if listed or more:  # a report of several chunks (the CPU judged the GPU's suspects)
                            complete = failing <= done or (more is not None and int(more.group(1)) + 1 >= len(failing))
                            self.write({"stat": "error listing several chunks named every chunk the CPU rejects"
                                        if complete else "error listing several chunks missed one the CPU rejects"})
                        elif len(failing) > 1:
                            self.write({"stat": "error named one of several chunks the CPU rejects (a check that "
                                                "stops at the first); the others judged again"})
                        rest = [j for j in group if j not in done]
                        if rest:
                            groups.insert(0, rest)
                        continue
            elif other is not None:
                problem = ("other exception", other)
            else:
                slots = {j: x for j, (e, x) in enumerate(layout)}
                wrong_good = [keys[j] for j, (e, x) in enumerate(layout)
                              if e == "good" and not _same(got[j], dec.pools.arrays[chain][x])]
                if wrong_good:
                    problem = ("collateral: a good chunk decoded wrongly", f"good chunk(s) {wrong_good} decoded wrongly")
                else:
                    for j, x in slots.items():
                        if layout[j][0] != "case":
                            continue
                        self.record(cases[x], *self._judge_decoded(cases[x], np.asarray(got[j]), cpu[x]))
                    continue
            if len(group) > 1:  # judge each damaged chunk alone; remember what the batch did
                self.write({"finding": problem[0], "cases": group, "detail": problem[1][:300]})
                groups[:0] = [[j] for j in group]
            else:
                self.record(cases[group[0]], problem[0], problem[1])

    @staticmethod
    def _judge_decoded(case: dict, got: np.ndarray, cpu: np.ndarray | None) -> tuple[str, str]:
        if cpu is None:
            if CHAINS[case["chain"]]["comp"] in ("gzip", "zlib"):
                content = _first_deflate_stream(case["chain"], case["data"])
                if content is not None and content == got.tobytes():
                    return "decoded the first deflate stream; CPU rejects what follows it", case["kind"]
            return "decoded, CPU rejects it (silent wrong value)", f"{len(case['data'])} bytes"
        if _same(got, cpu):
            return "decoded, equal to CPU", ""
        return "decoded, differs from CPU", f"shapes {got.shape}/{cpu.shape}"


def run_child(args: argparse.Namespace) -> int:
    dec = Decoder(args.device, args.seed)
    dec.warm_up()
    line = sys.stdin.readline()  # a standby waits here, warm, until the supervisor needs it
    if not line.strip():
        os._exit(0)
    job = json.loads(line)
    journal = open(args.journal, "a", buffering=1)
    child = Child(dec, journal)
    from gpuzarr_dist.config import zstd_check

    child.write({"ready": os.getpid(), "zstd_check": zstd_check()})  # the mode the decoders really run with
    for i in job["solo"]:
        child.run_batch([i], isolate=True)
    i = job["start"]
    while i < job["end"]:
        if time.time() > job["deadline"]:
            child.write({"stopped": i})
            break
        _, start, end = batch_of(i)
        ids = list(range(max(i, start), min(end, job["end"])))
        child.run_batch(ids)
        i = ids[-1] + 1
    else:
        child.write({"done": job["end"]})
    journal.flush()
    os._exit(0)


# --------------------------------------------------------------------------- supervisor


class Supervisor:
    """Runs the cases ``[lo, hi)`` (whole rounds) through one child at a time, children replaced as they die."""

    def __init__(self, args: argparse.Namespace, lo: int = 0, hi: int | None = None):
        self.args = args
        self.lo, self.hi = lo, args.cases if hi is None else hi
        self.t0 = time.time()
        self.work = tempfile.mkdtemp(prefix="gpu_fuzz_")
        self.journal = os.path.join(self.work, "journal.jsonl")
        open(self.journal, "w").close()
        self.standbys: list[subprocess.Popen] = []
        self.children = 0
        self.pools: Pools | None = None
        self.crashes: list[str] = []
        self.aborted = False
        self.crash_meta: list[dict] = []
        self.between = 0  # children that ended outside a batch (a harness failure)
        self.has_sanitizer = bool(args.sanitize) and sanitizer() is not None

    def spawn(self) -> subprocess.Popen:
        cmd = _command("--child", "--journal", self.journal, "--device", self.args.device,
                       "--seed", str(self.args.seed), "--zstd-check", self.args.zstd_check)
        return subprocess.Popen(cmd, stdin=subprocess.PIPE, text=True, env=_environ())

    def top_up(self) -> None:
        while len(self.standbys) < self.args.standby:
            self.standbys.append(self.spawn())

    def take(self) -> subprocess.Popen:
        for p in list(self.standbys):
            self.standbys.remove(p)
            if p.poll() is None:
                return p
        return self.spawn()

    def run(self) -> None:
        """Hand out work to one child at a time until every case is judged or the time is up."""
        args = self.args
        start, solo, idle_children = self.lo, [], 0
        while start < self.hi or solo:
            deadline = self.t0 + args.time - self.sanitize_reserve()  # time for memcheck replays of crashes so far
            if time.time() > deadline:
                print(f"time limit reached at case {start}", flush=True)
                break
            child = self.take()
            self.children += 1
            self.top_up()
            mark = os.path.getsize(self.journal)
            job = {"start": start, "end": self.hi, "solo": solo, "deadline": deadline}
            child.stdin.write(json.dumps(job) + "\n")
            child.stdin.flush()
            rc = self.watch(child, mark)
            recs = self.read(mark)
            if any("done" in r for r in recs):
                break
            if rc == 0 and any("stopped" in r for r in recs):
                print(f"time limit reached at case {next(r['stopped'] for r in recs if 'stopped' in r)}", flush=True)
                break
            tries = [r for r in recs if "try" in r]
            if not tries:
                idle_children += 1
                if idle_children >= 3:
                    print(f"three children in a row ended ({rc}) before their first batch: giving up", flush=True)
                    self.aborted = True
                    break
                continue
            idle_children = 0
            start, solo = self.after_crash(job, recs, tries[-1], rc)

    def after_crash(self, job: dict, recs: list[dict], last: dict, rc) -> tuple[int, list[int]]:
        """Record the crash of the batch ``last``; return where the next child starts and which cases it runs alone.

        A batch of one damaged chunk names its culprit; the cases of a batch
        with several that have no verdict yet are run again, one per batch.
        """
        judged = {r["case"] for r in recs if "case" in r}
        lost = next((r["lost"] for r in recs if "lost" in r), "")
        begun_alone = {t["try"][0] for t in recs if "try" in t and t.get("isolate")}
        solo = [i for i in job["solo"] if i not in begun_alone]
        start = job["start"]
        _, b0, b1 = batch_of(last["try"][0])
        unjudged = [i for i in range(max(b0, start), b1) if i not in judged]
        if not [i for i in last["try"] if i not in judged]:  # died after judging its batch: no case to blame
            self.between += 1
            self.write({"finding": "crash", "cases": [], "detail": f"child ended ({lost or rc}) between batches"})
            print(f"a child ended ({lost or rc}) between batches, after case {max(last['try'])}", flush=True)
            return (start, solo) if last.get("isolate") else (b1, sorted(set(solo) | set(unjudged)))
        if last.get("isolate"):  # the culprit is known; the batches after the solos were not begun
            self.crash(last["try"][0], last["layout"], rc, lost)
            return start, solo
        if len(last["try"]) == 1:
            self.crash(last["try"][0], last["layout"], rc, lost)
            unjudged = [i for i in unjudged if i != last["try"][0]]
        elif unjudged:
            self.write({"finding": "crash", "cases": last["try"],
                        "detail": f"a batch of several damaged chunks crashed ({lost or rc}); judged one by one"})
        return b1, sorted(set(solo) | set(unjudged))

    def watch(self, child: subprocess.Popen, mark: int):
        """Wait for ``child``; kill it when the journal stops growing for ``--stall`` seconds (after warm-up)."""
        size, seen = mark, time.time()
        grace = 120.0  # a cold child (no standby) warms up first: imports, context, kernels
        while True:
            rc = child.poll()
            if rc is not None:
                return rc
            time.sleep(0.02)
            now = time.time()
            cur = os.path.getsize(self.journal)
            if cur != size:
                size, seen, grace = cur, now, 0.0
            elif now - seen > self.args.stall + grace:
                child.kill()
                child.wait()
                return f"hung for {self.args.stall:.0f} s, killed"

    def read(self, mark: int) -> list[dict]:
        recs = []
        with open(self.journal, "rb") as f:
            f.seek(mark)
            for line in f:
                try:
                    recs.append(json.loads(line))
                except ValueError:
                    continue  # a line cut by a crash
        return recs

    def write(self, rec: dict) -> None:
        with open(self.journal, "a") as f:
            f.write(json.dumps(rec) + "\n")

    def crash(self, i: int, layout: list, rc, lost: str) -> None:
        if self.pools is None:
            self.pools = Pools(self.args.seed)
        case = make_case(self.args.seed, i, self.pools)
        why = "crash: CUDA context lost" if lost else f"crash: child process ended ({rc})"
        self.write({"case": i, "chain": case["chain"], "kind": case["kind"], "outcome": why, "detail": (lost or str(rc))[:300]})
        stem = os.path.join(self.args.out, f"crash-{i}")
        with open(stem + ".bin", "wb") as f:
            f.write(case["data"])
        meta = {k: v for k, v in case.items() if k != "data"}
        meta.update(seed=self.args.seed, layout=layout, returncode=str(rc), lost=lost, nbytes=len(case["data"]),
                    chain_config=CHAINS[case["chain"]], device=self.args.device,
                    replay=f"python3 -m {MODULE} --replay {stem}.json --device {self.args.device}",
                    data_hex=case["data"].hex())  # the .json alone replays it (the .bin may not travel)
        self.crash_meta.append(meta)
        with open(stem + ".json", "w") as f:
            json.dump(meta, f, indent=1, default=str)
        self.crashes.append(stem + ".json")
        print(f"CRASH on case {i} ({case['chain']}, {case['kind']}, {len(case['data'])} bytes): saved {stem}.bin "
              f"[{(lost or rc)!s:.120}]", flush=True)

    def sanitize_reserve(self) -> float:
        """Seconds kept for ``--sanitize``: ``--sanitize-time``/N per crash saved so far, up to N crashes."""
        n = self.args.sanitize
        if not n or not self.crashes or not self.has_sanitizer:
            return 0.0
        return self.args.sanitize_time * min(len(self.crashes), n) / n

    def close(self) -> None:
        for p in self.standbys:  # warm or warming, never given work: nothing to lose
            p.kill()
            p.wait()


class Lanes:
    """Several :class:`Supervisor` side by side (``--lanes``), each over its own range of whole rounds of cases.

    The decode of one batch is a few milliseconds of GPU work and many more of
    Python and CPU reference decoding, so one child at a time left the GPU
    and the host's cores mostly idle. Each lane keeps its own journal and its
    own children, so a crash or hang still names its case exactly and costs
    only that lane a restart; the journals are joined at the end.
    """

    def __init__(self, args: argparse.Namespace):
        rounds = -(-args.cases // _ROUND_SIZE)
        per = -(-rounds // max(1, args.lanes))
        self.sups = [Supervisor(args, lo, min(args.cases, lo + per * _ROUND_SIZE))
                     for lo in range(0, args.cases, per * _ROUND_SIZE)]
        self.t0 = min(s.t0 for s in self.sups)
        self.journal = self.sups[0].journal if len(self.sups) == 1 else os.path.join(
            tempfile.mkdtemp(prefix="gpu_fuzz_"), "journal.jsonl")

    def top_up(self) -> None:
        for s in self.sups:
            s.top_up()

    def run(self) -> None:
        import threading

        threads = [threading.Thread(target=s.run, name=f"lane-{k}") for k, s in enumerate(self.sups)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if len(self.sups) > 1:
            with open(self.journal, "wb") as out:
                for s in self.sups:
                    with open(s.journal, "rb") as f:
                        shutil.copyfileobj(f, out)

    def close(self) -> None:
        for s in self.sups:
            s.close()

    children = property(lambda self: sum(s.children for s in self.sups))
    between = property(lambda self: sum(s.between for s in self.sups))
    aborted = property(lambda self: any(s.aborted for s in self.sups))
    crashes = property(lambda self: [c for s in self.sups for c in s.crashes])
    crash_meta = property(lambda self: [m for s in self.sups for m in s.crash_meta])


def summary_line(counts: collections.Counter, by_check: collections.Counter, n: int, chains: int) -> str:
    """The run in one line: cases, chains, rejected by the zstd / deflate walks, reported errors, wrong values, crashes."""
    from gpuzarr_dist.cuda.deflate_walk import DEFLATE_WALK_REASONS, walk_reason
    from gpuzarr_dist.cuda.kernels import ZSTD_DEEP_REASONS

    walk = {_category(r) for r in ZSTD_DEEP_REASONS.values()}
    by_walk = sum(v for k, v in by_check.items() if k in walk)
    deflate = [*DEFLATE_WALK_REASONS.values(), walk_reason(1, 2)]
    deflate = {_category(r) for r in deflate} | {_category(f"blosc zlib stream: {r}") for r in deflate}
    by_deflate_walk = sum(v for k, v in by_check.items() if k in deflate)
    crashes = sum(v for k, v in counts.items() if k.startswith("crash") and "hung" not in k)
    hangs = sum(v for k, v in counts.items() if k.startswith("crash") and "hung" in k)
    wrong = sum(v for k, v in counts.items() if k.startswith(("decoded, CPU rejects", "decoded, differs")))
    reported = sum(v for k, v in counts.items() if k.startswith("rejected"))
    return (f"SUMMARY cases={n} chains={chains} rejected-by-walk={by_walk} rejected-by-deflate-walk={by_deflate_walk} "
            f"reported-errors={reported} "
            f"wrong-values={wrong} crashes={crashes} hangs={hangs}")


def summarise(journal: str) -> tuple[dict, dict, collections.Counter, collections.Counter, list, dict]:
    final: dict[int, dict] = {}
    stats: collections.Counter = collections.Counter()
    findings = []
    with open(journal) as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if "case" in r and "outcome" in r:
                final[r["case"]] = r
            elif "stat" in r:
                stats[r["stat"]] += 1
            elif "finding" in r:
                findings.append(r)
    per_chain: dict[str, collections.Counter] = {c: collections.Counter() for c in CHAINS}
    for r in final.values():
        per_chain[r["chain"]][r["outcome"]] += 1
    by_check = collections.Counter(r["detail"] for r in final.values() if r["outcome"] == "rejected")
    examples: dict[str, list] = collections.defaultdict(list)
    for r in final.values():
        if r["outcome"] not in ("rejected", "decoded, equal to CPU") and len(examples[r["outcome"]]) < 5:
            examples[r["outcome"]].append(r)
    return final, per_chain, by_check, stats, findings, dict(examples)


# --------------------------------------------------------------------------- replay and compute-sanitizer


def replay(path: str, device: str) -> int:
    """Decode the batch of one saved case once, in this process; 3 when the CUDA context is lost."""
    stem = path[: -len(".json")] if path.endswith(".json") else path[: -len(".bin")] if path.endswith(".bin") else path
    with open(stem + ".json") as f:
        meta = json.load(f)
    if "data_hex" in meta:
        data = bytes.fromhex(meta["data_hex"])
    else:
        with open(stem + ".bin", "rb") as f:
            data = f.read()
    dec = Decoder(device, int(meta["seed"]))
    chain = meta["chain"]
    layout = meta.get("layout") or [["case", meta["case"]]]
    chunks = [data if e == "case" else dec.pools.good[chain][x] for e, x in layout]
    keys = [f"c/{j}/0" for j in range(len(layout))]
    print(f"replaying case {meta['case']} ({chain}, {meta['kind']}, {len(data)} bytes) in a batch of {len(keys)} "
          f"on the {device}", flush=True)
    try:
        got = dec.decode(chain, chunks, keys)
        dec.check_context()
    except Exception as e:  # noqa: BLE001
        text = f"{type(e).__name__}: {e}"
        print(f"raised {text[:500]}", flush=True)
        try:
            dec.check_context()
        except Exception as e2:  # noqa: BLE001
            print(f"CUDA context lost: {type(e2).__name__}: {e2}", flush=True)
            os._exit(EXIT_CUDA_LOST)
        return 0
    j = next(j for j, (e, _) in enumerate(layout) if e == "case")
    try:
        cpu = reference_decode(chain, data)
        same = _same(got[j], cpu)
    except Exception as e:  # noqa: BLE001
        same = f"CPU rejects it: {e}"
    print(f"decoded; equal to the CPU decode: {same}", flush=True)
    return 0


def first_kernel(report: str) -> str | None:
    """The first kernel a compute-sanitizer report names (``at ... in kernel(args)`` / ``kernel+0x..``)."""
    for line in report.splitlines():
        m = re.match(r"=+\s+at (?:0x[0-9a-f]+ in )?(?:.*?:\d+:)?(.+?)(?:\+0x[0-9a-f]+)?\s*$", line)
        if m:
            return m.group(1).strip()
    m = re.search(r"[Kk]ernel (?:name )?[\"']?([A-Za-z_][\w:<>, ]*)", report)
    return m.group(1) if m else None


def sanitizer() -> str | None:
    """``compute-sanitizer`` from the PATH, else from the CUDA toolkit (``$CUDA_HOME``, /usr/local/cuda*)."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    import glob

    homes = [os.environ.get(v, "") for v in ("CUDA_HOME", "CUDA_PATH")] + sorted(glob.glob("/usr/local/cuda*"), reverse=True)
    for home in homes:
        for sub in ("bin", "compute-sanitizer"):
            path = os.path.join(home, sub, "compute-sanitizer")
            if home and os.access(path, os.X_OK):
                return path
    return None


def sanitize(crashes: list[str], n: int, device: str, budget: float) -> list[dict]:
    tool = sanitizer()
    if not tool or not crashes or n <= 0:
        if n > 0 and crashes:
            print("compute-sanitizer not found (PATH, $CUDA_HOME, /usr/local/cuda*): no memcheck replays", flush=True)
        return []
    results = []
    chosen = crashes[:n]
    for j, path in enumerate(chosen):
        each = budget / (len(chosen) - j)
        t = time.time()
        cmd = [tool, "--tool", "memcheck", "--print-limit", "5",
               *_command("--replay", path, "--device", device, "--zstd-check", os.environ.get(ZSTD_CHECK_ENV, "literals"))]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=max(5.0, each), env=_environ())
            text, rc = p.stdout + p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            text, rc = f"{(e.stdout or b'')!s}{(e.stderr or b'')!s}\n(timed out after {each:.0f} s)", "timeout"
        out = path[: -len(".json")] + ".memcheck.txt"
        with open(out, "w") as f:
            f.write(text)
        kernel = first_kernel(text)
        excerpt = "\n".join([ln for ln in text.splitlines() if ln.startswith("=====")][:40])
        results.append({"case": path, "returncode": str(rc), "first_kernel": kernel, "report": out,
                        "excerpt": excerpt})
        print(f"memcheck {os.path.basename(path)}: rc {rc}, first kernel: {kernel or '(none reported)'}; see {out}",
              flush=True)
        budget -= time.time() - t
    return results


# --------------------------------------------------------------------------- main


_SHORT = {"rejected": "rejected", "rejected, CPU decodes it": "rej/CPU ok", "decoded, equal to CPU": "equal",
          "decoded the first deflate stream; CPU rejects what follows it": "1st deflate",
          "decoded, CPU rejects it (silent wrong value)": "SILENT", "decoded, differs from CPU": "DIFFERS",
          "crash: CUDA context lost": "CRASH ctx", "other exception": "OTHER EXC"}


def _short(outcome: str) -> str:
    if outcome in _SHORT:
        return _SHORT[outcome]
    if outcome.startswith("crash"):
        return "CRASH " + ("hang" if "hung" in outcome else "exit")
    return outcome.split(":")[0].split(" (")[0].upper()[:14]


def _print(report: dict) -> None:
    print(f"\ncases: {report['cases']}  children: {report['children']}  time: {report['seconds']} s  "
          f"({report['cases_per_s']} cases/s)  device: {report['device']}")
    outcomes = sorted({o for c in report["per_chain"].values() for o in c}, key=lambda o: (o.startswith(FAILURES), o))
    short = {o: _short(o) for o in outcomes}
    print(f"{'chain':<20}{'cases':>7}" + "".join(f"{short[o]:>16}" for o in outcomes))
    for chain, counts in report["per_chain"].items():
        print(f"{chain:<20}{sum(counts.values()):>7}" + "".join(f"{counts.get(o, 0):>16}" for o in outcomes))
    print("outcomes:")
    for k, v in sorted(report["outcomes"].items(), key=lambda kv: -kv[1]):
        print(f"  {v:7d}  {k}{'   <-- FAILURE' if k.startswith(FAILURES) else ''}")
    if report["stats"]:
        print("batches with several damaged chunks, rejected:")
        for k, v in report["stats"].items():
            print(f"  {v:7d}  {k}")
    print("rejected, by the check that caught it:")
    for k, v in sorted(report["rejected_by_check"].items(), key=lambda kv: -kv[1])[:40]:
        print(f"  {v:7d}  {k}")
    for f in report["batch_findings"][:10]:
        print(f"  batch finding: {f['finding']} in cases {f['cases']}: {f['detail'][:160]}")
    for meta in report.get("crashes", [])[:20]:
        print(f"crash: case {meta['case']} ({meta['chain']}, {meta['kind']}, {meta['nbytes']} bytes, options "
              f"{meta['options']}): {(meta['lost'] or meta['returncode'])[:120]}"
              + (f"; memcheck: {meta['memcheck_first_kernel']}" if meta.get("memcheck_first_kernel") else ""))
    for k, rows in report["examples"].items():
        print(f"examples of {k!r}:")
        for r in rows:
            print(f"    case {r['case']} ({r['chain']}, {r['kind']}): {r['detail'][:200]}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dev.gpu_fuzz", description=__doc__.split("\n")[0])
    p.add_argument("--cases", type=int, default=12000)
    p.add_argument("--time", type=float, default=190.0, help="seconds for the whole run, --sanitize included")
    p.add_argument("--seed", type=int, default=20261122)
    p.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    p.add_argument("--out", default=os.environ.get("OUT") or ".")
    p.add_argument("--standby", type=int, default=None,
                   help="warm children kept ready per lane (default: 1; 3 on the gpu with one lane)")
    p.add_argument("--lanes", type=int, default=None,
                   help="supervisors side by side, each with its own children and journal (default: gpu "
                        "min(6, CPUs/2), cpu 1)")
    p.add_argument("--zstd-check", choices=["headers", "sequences", "literals"], default="literals",
                   help="gpuzarr.gpu.zstd-check for the decoders under test (default: literals, the library's default)")
    p.add_argument("--stall", type=float, default=15.0, help="seconds without progress before a child counts as hung")
    p.add_argument("--replay", metavar="FILE", help="decode the batch of one saved crash-<case>.json, in this process")
    p.add_argument("--sanitize", type=int, default=0, metavar="N",
                   help="after the run, replay up to N crashes under compute-sanitizer memcheck")
    p.add_argument("--sanitize-time", type=float, default=60.0,
                   help="seconds kept for --sanitize when N crashes are saved (a share of it per crash before)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--journal", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    # the decoders read it when gpuzarr_dist is imported; children and replays are handed --zstd-check
    # explicitly (their own argparse default would otherwise set this again, whatever the parent was asked)
    os.environ[ZSTD_CHECK_ENV] = args.zstd_check
    # the fuzz batches are small: every one goes to nvCOMP (and the walks), not to the CPU decoders
    os.environ["DASK_GPUZARR__GPU__MIN_BATCH"] = "0"
    os.environ["DASK_GPUZARR__GPU__MIN_BATCH_CHUNKS"] = "0"
    if args.replay:
        return replay(args.replay, args.device)
    if args.child:
        return run_child(args)
    if args.lanes is None:
        args.lanes = min(6, max(1, (os.cpu_count() or 2) // 2)) if args.device == "gpu" else 1
    if args.standby is None:
        args.standby = 3 if args.device == "gpu" and args.lanes == 1 else 1
    os.makedirs(args.out, exist_ok=True)
    sup = Lanes(args)
    sup.top_up()
    print(f"{args.cases} cases over {len(CHAINS)} chains, device {args.device}, seed {args.seed}, "
          f"{len(sup.sups)} lane(s), zstd check {args.zstd_check}; journal {sup.journal}", flush=True)
    try:
        sup.run()
    finally:
        sup.close()
    seconds = time.time() - sup.t0
    final, per_chain, by_check, stats, findings, examples = summarise(sup.journal)
    counts = collections.Counter(r["outcome"] for r in final.values())
    if sup.between:
        counts["crash: child ended between batches (harness)"] = sup.between
    for f in findings:
        if f["finding"] != "crash":  # a batch-only failure that no damaged chunk showed alone
            alone = [final.get(i, {}).get("outcome", "") for i in f["cases"]]
            if not any(o.startswith(f["finding"].split(":")[0]) for o in alone):
                counts[f"{f['finding']} (only with several damaged chunks in one batch)"] += 1
    modes = sorted(_child_modes(sup.journal))
    report = {"cases": len(final), "children": sup.children, "lanes": len(sup.sups), "zstd_check": args.zstd_check,
              "children_zstd_check": modes,
              "seconds": round(seconds, 1),
              "cases_per_s": round(len(final) / max(seconds, 1e-9), 1), "device": args.device, "seed": args.seed,
              "outcomes": dict(counts), "per_chain": {c: dict(v) for c, v in per_chain.items()},
              "rejected_by_check": dict(by_check), "stats": dict(stats), "batch_findings": findings,
              "examples": examples, "crash_files": sup.crashes, "crashes": sup.crash_meta}
    if args.sanitize:
        left = max(10.0, sup.t0 + args.time - time.time())
        report["sanitize"] = sanitize(sup.crashes, args.sanitize, args.device, left)
        for meta, san in zip(sup.crash_meta, report["sanitize"]):
            meta["memcheck_first_kernel"] = san["first_kernel"]
    with open(os.path.join(args.out, "gpu_fuzz.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    shutil.copy(sup.journal, os.path.join(args.out, "gpu_fuzz_journal.jsonl"))
    _print(report)
    failures = sum(v for k, v in counts.items() if k.startswith(FAILURES)) + sup.aborted
    if modes and modes != [args.zstd_check]:  # the run did not measure what it was asked to
        print(f"children decoded with gpuzarr.gpu.zstd-check {modes}, not {args.zstd_check!r}", flush=True)
        failures += 1
    print(summary_line(counts, by_check, len(final), len(CHAINS)), flush=True)
    print(f"\n{'FAIL' if failures else 'OK'}: {failures} failing case(s) of {len(final)}", flush=True)
    return 1 if failures else 0


def _child_modes(journal: str) -> set[str]:
    """The ``gpuzarr.gpu.zstd-check`` values the children reported when they started."""
    modes = set()
    with open(journal) as f:
        for line in f:
            if '"ready"' in line:
                try:
                    modes.add(json.loads(line).get("zstd_check"))
                except json.JSONDecodeError:  # a line cut by a crash
                    continue
    return modes - {None}


if __name__ == "__main__":
    sys.exit(main())
