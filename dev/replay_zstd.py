"""Replay GPU fuzz cases through the zstd decoders: damaged frames nvCOMP and libzstd disagree on, and batches
whose error named a good chunk. Cases are re-made from ``(seed, case)`` by ``dev/gpu_fuzz.py``.

Usage (from the repository root)::

    python3 -m dev.replay_zstd                 # on a GPU machine
    python3 -m dev.replay_zstd --device cpu    # dry run: the CPU pipeline stands in for decode_batch_gpu

**Disagreements** (``--cases``; the default lists cases of the default seed whose damaged frames nvCOMP and
libzstd decode differently): every damaged zstd frame of a case
(for Blosc chains, each damaged zstd stream inside the frame) is decoded alone through ``decode_batch_gpu``
with ``gpuzarr.gpu.zstd-check`` = ``sequences`` (so it reaches nvCOMP, as in the fuzz run), through libzstd
(numcodecs) and through ``tests/helpers/zstd_rfc_decode.py`` (the RFC's reading, with its notes, e.g. a Huffman
stream not used up exactly). Per frame it prints the first differing offset and the count of differing bytes for
each pair, and the walk's verdict on the host build (if a C++ compiler is found) in each mode. Then the whole
chunk goes through the harness's batch (``--zstd-check literals``) and is judged as the fuzz harness judges it.

**Misattributions** (``--batches``; the default lists two cases of the default seed): the cases of the fuzz
lane from its first case up to the misattributed one are decoded in order in this process, as the lane's child
did, ``--repeat`` times; each error is printed with the chunk it names and the chunk the host walk blames. ``--race-demo`` also launches the
zstd walk on a second non-blocking stream right after queuing the upload on the first (no ordering between
them): the errors that gives show what an unordered walk reports.

Exits 0; prints a summary line per case. Nothing is written unless ``--out`` is given (a JSON report there).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

from dev import gpu_fuzz as gf
from tests.helpers import zstd_rfc_decode as rfc

#: cases of seed 20261122 whose damaged zstd frames nvCOMP and libzstd decode differently
DISAGREE = [2017, 2258, 2799, 2958, 4699, 6059]
#: cases of seed 20261122 (12000 cases, 6 lanes) whose batch once raised an error naming a good chunk
MISATTRIBUTED = [4045, 6065]


# --------------------------------------------------------------------------- frames of a case


def frames_of(chain: str, data: bytes) -> list[tuple[str, bytes, int]]:
    """The zstd frames a chunk hands to nvCOMP: ``(label, frame, decoded size)``."""
    from gpuzarr_dist.codecs import blosc_frames as bf

    c = gf.CHAINS[chain]
    data = data[:-4] if c["crc"] else data
    nbytes = int(np.prod(c["shape"])) * np.dtype(c["dtype"]).itemsize
    if c["comp"] == "zstd":
        return [("frame", data, nbytes)]
    plan = bf.plan_frames("replay", np.frombuffer(data, np.uint8), [0], [len(data)], ["c/0/0"], nbytes, nbytes)
    return [(f"stream {k}", data[s : s + n], int(d)) for k, (s, n, d, code) in enumerate(zip(
        plan.piece_src.tolist(), plan.piece_csize.tolist(), plan.piece_dsize.tolist(), plan.piece_codec.tolist()))
        if code == 4]


def undamaged(seed: int, i: int) -> bytes:
    chain = gf.batch_of(i)[0]
    c = gf.CHAINS[chain]
    rng = np.random.default_rng([seed, i])
    opts = gf._options(chain, rng)
    return gf._encode(chain, gf._payload(rng, c["shape"], c["dtype"]), opts)


def diff(a: bytes | None, b: bytes | None) -> str:
    if a is None or b is None:
        return "n/a (one side rejects)"
    if len(a) != len(b):
        return f"sizes differ ({len(a)} / {len(b)})"
    d = np.flatnonzero(np.frombuffer(a, np.uint8) != np.frombuffer(b, np.uint8))
    return "identical" if d.size == 0 else f"{d.size} bytes differ, first at {int(d[0])}, last at {int(d[-1])}"


# --------------------------------------------------------------------------- host build of the walk


class HostWalk:
    """``ZSTD_FRAMES_SRC`` built with the host C++ compiler (``tests.helpers.zstd_walk_host``, as the tests build it)."""

    def __init__(self):
        from tests.helpers.zstd_walk_host import build_walk

        self.tmp = tempfile.mkdtemp(prefix="zstd_walk_")
        self.exe = build_walk(self.tmp, sanitize=False, opt="-O2")

    def __call__(self, frames: list[bytes], mode: int) -> list[tuple[int, int, int]] | None:
        from tests.helpers.zstd_walk_host import run_walk

        return None if self.exe is None else run_walk(self.exe, frames, mode)


# --------------------------------------------------------------------------- decoding one frame


def raw_zstd_pipeline(nbytes: int):
    from gpuzarr_dist.codecs.pipeline import CodecPipeline
    from gpuzarr_dist.core.metadata import ArraySpec, CodecSpec

    spec = ArraySpec(name="replay-zstd", shape=(nbytes,), chunk_shape=(nbytes,), dtype=np.dtype("|u1"), fill_value=0,
                     zarr_format=3, codecs=(CodecSpec("bytes", {}), CodecSpec("zstd", {})), key_prefix="c",
                     key_separator="/", metadata_key="zarr.json")
    return CodecPipeline(spec)


def device_decode(device: str, frame: bytes, nbytes: int, check: str) -> tuple[bytes | None, str]:
    """The frame decoded alone through decode_batch_gpu (``--device cpu``: the CPU pipeline), or its error."""
    import dask

    from gpuzarr_dist.errors import ChunkDecodeError

    pipe = raw_zstd_pipeline(nbytes)
    with dask.config.set({"gpuzarr.gpu.zstd-check": check}):
        try:
            if device == "cpu":
                return bytes(np.asarray(pipe.decode_chunk(frame, "c/0")).tobytes()), "decoded (CPU pipeline)"
            from gpuzarr_dist.cuda.decode import decode_batch_gpu
            from gpuzarr_dist.cuda.streams import pinned_staging, thread_stream

            stream = thread_stream()
            host = pinned_staging(len(frame))
            host[: len(frame)] = np.frombuffer(frame, np.uint8)
            out = decode_batch_gpu(pipe, host, [0], [len(frame)], ["c/0"], stream)
            stream.synchronize()
            return bytes(out.get().tobytes()), "decoded (decode_batch_gpu)"
        except ChunkDecodeError as e:
            return None, f"rejected: {e.reason[:160]}"


def libzstd(frame: bytes) -> tuple[bytes | None, str]:
    import numcodecs

    try:
        return bytes(numcodecs.Zstd().decode(frame)), "decoded"
    except Exception as e:  # noqa: BLE001
        return None, f"rejects: {e}"


def rfc_reading(frame: bytes) -> tuple[bytes | None, list[str]]:
    try:
        out, notes, _ = rfc.decode(frame)
        return out, notes
    except rfc.Corrupt as e:
        return None, [f"corrupt: {e}"]


# --------------------------------------------------------------------------- the two parts


def replay_disagreement(args, dec, walk: HostWalk, i: int) -> dict:
    case = gf.make_case(args.seed, i, dec.pools)
    chain = case["chain"]
    print(f"\n== case {i}: {chain}, {case['kind']}, options {case['options']}, {len(case['data'])} bytes", flush=True)
    before = dict((label, f) for label, f, _ in frames_of(chain, undamaged(args.seed, i)))
    rec = {"case": i, "chain": chain, "kind": case["kind"], "frames": []}
    for label, frame, nbytes in frames_of(chain, case["data"]):
        if before.get(label) == frame:
            continue
        dev, dev_how = device_decode(args.device, frame, nbytes, "sequences")
        lib, lib_how = libzstd(frame)
        ref, notes = rfc_reading(frame)
        orig = libzstd(before[label])[0] if label in before else None
        walks = {m: (walk([frame], k) or [None])[0] for m, k in (("headers", 0), ("sequences", 1), ("literals", 2))}
        print(f"  {label}: {len(frame)} bytes -> {nbytes}; {args.device}: {dev_how}; libzstd: {lib_how}")
        print(f"    {args.device} vs libzstd:     {diff(dev, lib)}")
        print(f"    {args.device} vs RFC reading: {diff(dev, ref)}")
        print(f"    libzstd vs RFC reading: {diff(lib, ref)}")
        print(f"    libzstd vs undamaged:   {diff(lib, orig)}")
        print(f"    host walk (fcs, length, code): {walks}")
        for n in notes[:8]:
            print(f"    RFC reading: {n}")
        rec["frames"].append({"label": label, "device": dev_how, "libzstd": lib_how, "device_vs_libzstd": diff(dev, lib),
                              "device_vs_rfc": diff(dev, ref), "libzstd_vs_rfc": diff(lib, ref), "walks": walks,
                              "notes": notes[:8]})
    # the whole chunk in the harness's batch, judged as the harness judges it (default: the literals walk)
    import dask

    from gpuzarr_dist.errors import ChunkDecodeError

    layout = gf.layout_for(args.seed, [i], 1)
    chunks = [case["data"] if e == "case" else dec.pools.good[chain][x] for e, x in layout]
    keys = [f"c/{j}/0" for j in range(len(layout))]
    try:
        cpu = gf.reference_decode(chain, case["data"])
    except Exception:  # noqa: BLE001
        cpu = None
    with dask.config.set({"gpuzarr.gpu.zstd-check": args.zstd_check}):
        try:
            got = dec.decode(chain, chunks, keys)
            j = next(j for j, (e, _) in enumerate(layout) if e == "case")
            verdict = gf.Child._judge_decoded(case, np.asarray(got[j]), cpu)[0]
        except ChunkDecodeError as e:
            named = keys.index(e.key) if e.key in keys else -1
            verdict = f"rejected ({e.key}{'' if named >= 0 and layout[named][0] == 'case' else ', NOT the damaged chunk'}): {e.reason[:120]}"
    print(f"  batch with zstd-check {args.zstd_check}: {verdict}")
    rec["batch_verdict"] = verdict
    return rec


def lane_start(i: int, cases: int = 12000, lanes: int = 6) -> int:
    """The first case of the fuzz lane that ran case ``i`` (``--cases 12000``, six lanes on the GPU machine)."""
    rounds = -(-cases // gf._ROUND_SIZE)
    per = -(-rounds // lanes) * gf._ROUND_SIZE
    return i // per * per


def replay_misattributed(args, dec, walk: HostWalk, i: int) -> dict:
    from gpuzarr_dist.errors import ChunkDecodeError

    start = lane_start(i, args.fuzz_cases, args.lanes)
    ids = list(range(start, i + 1))
    print(f"\n== batch of case {i} ({gf.batch_of(i)[0]}), after the cases {ids[:-1]} of its lane, {args.repeat} times")
    expected = {}
    for x in ids:
        case = gf.make_case(args.seed, x, dec.pools)
        layout = gf.layout_for(args.seed, [x], 1)
        chunks = [case["data"] if e == "case" else dec.pools.good[case["chain"]][g] for e, g in layout]
        w = walk([fr for c in chunks for _, fr, _ in frames_of(case["chain"], c)][: len(chunks)], 1) \
            if gf.CHAINS[case["chain"]]["comp"] == "zstd" else None
        expected[x] = (case, layout, chunks, w)
        print(f"  case {x}: layout {layout}; host walk per chunk: {w}")
    seen: dict[str, int] = {}
    for _ in range(args.repeat):
        for x in ids:
            case, layout, chunks, _ = expected[x]
            keys = [f"c/{j}/0" for j in range(len(layout))]
            try:
                dec.decode(case["chain"], chunks, keys)
                what = "decoded"
            except ChunkDecodeError as e:
                j = keys.index(e.key) if e.key in keys else -1
                ok = j >= 0 and layout[j][0] == "case"
                what = f"{e.key} {'(damaged)' if ok else '(GOOD CHUNK: misattributed)'}: {e.reason[:90]}"
            except Exception as e:  # noqa: BLE001
                what = f"{type(e).__name__}: {str(e)[:90]}"
            dec.check_context()
            seen[f"case {x}: {what}"] = seen.get(f"case {x}: {what}", 0) + 1
    for k, v in seen.items():
        print(f"  {v:4d} x {k}")
    rec = {"case": i, "lane_cases": ids, "outcomes": seen}
    if args.race_demo and args.device == "gpu":
        c = gf.CHAINS[gf.batch_of(i)[0]]
        rec["race_demo"] = race_demo(expected[i][2], args.repeat, int(np.prod(c["shape"])) * np.dtype(c["dtype"]).itemsize)
    return rec


def race_demo(chunks: list[bytes], repeat: int, nbytes: int) -> dict:
    """The zstd walk launched on another non-blocking stream than the upload, unordered: what it then reports."""
    import cupy

    from gpuzarr_dist.codecs import host_checks
    from gpuzarr_dist.cuda.kernels import ZSTD_FRAMES_SRC
    from gpuzarr_dist.cuda.launch import kernel, walk_launch
    from gpuzarr_dist.cuda.streams import ALIGN, pinned_staging
    from gpuzarr_dist.stores.base import staging_layout

    sizes = [len(c) for c in chunks]
    offsets, total = staging_layout(sizes, ALIGN, 0)
    host = pinned_staging(total)
    for c, o in zip(chunks, offsets):
        host[o : o + len(c)] = np.frombuffer(c, np.uint8)
    up, other = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    counts: dict[str, int] = {}
    n = len(chunks)
    for _ in range(repeat):
        with other:
            offs = cupy.asarray(np.asarray(offsets, np.int64))
            lens = cupy.asarray(np.asarray(sizes, np.int64))
            found = cupy.empty(3 * n, dtype=cupy.int64)
            other.synchronize()
        with up:
            dev = cupy.zeros(total, dtype=cupy.uint8)
            up.synchronize()
            dev.set(host[:total], stream=up)
        with other:  # no wait on ``up``
            kernel("zstd_frames", ZSTD_FRAMES_SRC)(*walk_launch(n), (dev, offs, lens, np.int32(n), found[:n],
                                                                      found[n : 2 * n], found[2 * n :].view(cupy.int32),
                                                                      np.int32(1)))
            res = found.get(stream=other)
        up.synchronize()
        v = host_checks.zstd_verdicts(res[:n], res[n : 2 * n], res[2 * n :].view(np.int32)[:n], sizes, nbytes)
        key = " ".join(str(int(x)) for x in v)
        counts[key] = counts.get(key, 0) + 1
    print(f"  race demo (verdict per chunk, 0 ok, 1 'not a zstd frame', 5 wrong size, 7 flagged): {counts}")
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dev.replay_zstd", description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    p.add_argument("--seed", type=int, default=20261122)
    p.add_argument("--cases", type=int, nargs="*", default=DISAGREE)
    p.add_argument("--batches", type=int, nargs="*", default=MISATTRIBUTED)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--fuzz-cases", type=int, default=12000, help="--cases of the fuzz run (for its lanes)")
    p.add_argument("--lanes", type=int, default=6, help="lanes of the fuzz run")
    p.add_argument("--zstd-check", choices=["headers", "sequences", "literals"], default="literals",
                   help="gpuzarr.gpu.zstd-check for the whole-chunk batches (default: literals)")
    p.add_argument("--race-demo", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    dec = gf.Decoder(args.device, args.seed)
    walk = HostWalk()
    if walk.exe is None:
        print("no C++ compiler: host walk verdicts left out", flush=True)
    report = {"device": args.device, "seed": args.seed, "disagreements": [], "misattributions": []}
    for i in args.cases:
        report["disagreements"].append(replay_disagreement(args, dec, walk, i))
    import dask

    with dask.config.set({"gpuzarr.gpu.zstd-check": "sequences"}):  # as the fuzz run had it
        for i in args.batches:
            report["misattributions"].append(replay_misattributed(args, dec, walk, i))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "replay_zstd.json"), "w") as f:
            json.dump(report, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
