#!/usr/bin/env python3
"""Fuzz the batched GPU decoders with random and mutated chunks; count every outcome; survive crashes.

Usage (on a machine with a GPU, from the repository root)::

    python tools/gpu_fuzz.py                      # 12,000 cases, at most 270 s
    python tools/gpu_fuzz.py --cases 20000 --time 400 --out "$OUT"
    python tools/gpu_fuzz.py --device cpu --cases 300   # the same harness with CPU decoding (no GPU needed)

Each case is one damaged chunk (bit flips, truncation, extension, header field
edits, overwritten runs, random bytes, zero length, a valid chunk of another
size, two frames in one chunk ...) of one codec chain (zstd, zstd with 256 KiB
multi-block chunks, zstd with content checksums, gzip, zlib, lz4, and crc32c-wrapped zstd/zlib/lz4 whose
checksum is recomputed after the damage half the time so that the damage
reaches the decoder). It is decoded by ``decode_batch_gpu`` in one batch with
good chunks of the same chain, at a random position, and judged against the CPU
decoder (numcodecs, libzstd, zlib) on the same bytes:

- rejected: ``ChunkDecodeError`` naming the damaged chunk's key (by the check
  that caught it); naming a good chunk's key counts as *misattributed*;
- decoded, equal to what the CPU decodes;
- decoded though the CPU rejects it: a *silent wrong value*;
- decoded, but different from what the CPU decodes;
- good chunks of the batch decoded wrongly: *collateral*;
- rejected though the CPU decodes it (a disagreement, reported, not a failure);
- other exceptions;
- *crashes*: the process died, or the CUDA context was lost (a sticky CUDA
  error). Batches run in child processes, a group at a time, so a crash is
  counted, the chunk that caused it is saved under ``--out`` (``crash-<case>.bin``
  with a ``.json`` description), and the next child carries on.

Prints the counts and writes them to ``--out``/gpu_fuzz.json. Exits 1 when
there was a crash, a silent wrong value, a difference, a misattribution or
collateral damage.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

#: chain name -> (compressor, crc32c outside it, chunk shape)
CHAINS = {
    "zstd": ("zstd", False, (64, 64)),
    "zstd-256KiB": ("zstd", False, (256, 256)),
    "zstd-checksum": ("zstd-checksum", False, (64, 64)),
    "gzip": ("gzip", False, (64, 64)),
    "zlib": ("zlib", False, (64, 64)),
    "lz4": ("lz4", False, (64, 64)),
    "zstd+crc32c": ("zstd", True, (64, 64)),
    "zlib+crc32c": ("zlib", True, (64, 64)),
    "lz4+crc32c": ("lz4", True, (64, 64)),
}
MUTATIONS = ["bitflip", "bitflips", "truncate", "extend", "header-edit", "overwrite-run", "random", "empty",
             "wrong-size", "two-frames", "zeros", "block-edit"]
GOOD_PER_BATCH = 3
EXIT_CUDA_LOST = 3


# --------------------------------------------------------------------------- cases


def _numcodec(name: str, level: int | None = None):
    import numcodecs

    return {
        "zstd": lambda: numcodecs.Zstd(level=level if level is not None else 1),
        "zstd-checksum": lambda: numcodecs.Zstd(level=level if level is not None else 1, checksum=True),
        "gzip": lambda: numcodecs.GZip(level=level if level is not None else 1),
        "zlib": lambda: numcodecs.Zlib(level=level if level is not None else 1),
        "lz4": lambda: numcodecs.LZ4(),
    }[name]()


def _crc(body: bytes) -> bytes:
    import google_crc32c

    return body + google_crc32c.value(body).to_bytes(4, "little")


def _payload(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    kind = rng.integers(5)
    n = int(np.prod(shape))
    if kind == 0:
        a = rng.standard_normal(n).astype("f4")
    elif kind == 1:
        a = np.cumsum(rng.standard_normal(n)).astype("f4")
    elif kind == 2:
        a = np.zeros(n, "f4")
    elif kind == 3:
        a = (rng.integers(0, 4, n) * 0.5).astype("f4")
    else:
        a = np.linspace(0, 1, n, dtype="f4")
    return a.reshape(shape)


def _encode(chain: str, arr: np.ndarray, rng: np.random.Generator) -> bytes:
    comp, crc, _ = CHAINS[chain]
    level = int(rng.choice([1, 3, 9])) if comp != "lz4" else None
    body = _numcodec(comp, level).encode(np.ascontiguousarray(arr).tobytes())
    return _crc(bytes(body)) if crc else bytes(body)


def _mutate(kind: str, raw: bytes, chain: str, rng: np.random.Generator, other: bytes) -> bytes:
    comp, crc, _ = CHAINS[chain]
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
    elif kind == "zeros":
        b = bytearray(len(b))
    if crc and (kind in ("empty",) or rng.integers(2) == 0):
        return _crc(bytes(b))  # a valid checksum over damaged data: the damage reaches the decoder
    return bytes(b) + (raw[-4:] if crc and raw else b"")


def make_cases(n: int, seed: int) -> tuple[list[dict], dict[str, list[bytes]], dict[str, list[np.ndarray]]]:
    """``n`` damaged chunks, round robin over the chains, and a pool of good chunks (with their arrays) per chain."""
    rng = np.random.default_rng(seed)
    good: dict[str, list[bytes]] = {}
    arrays: dict[str, list[np.ndarray]] = {}
    for chain, (_, _, shape) in CHAINS.items():
        arrays[chain] = [_payload(rng, shape) for _ in range(8)]
        good[chain] = [_encode(chain, a, rng) for a in arrays[chain]]
    smaller = {chain: _encode(chain, _payload(rng, (shape[0] // 2, shape[1])), rng) for chain, (_, _, shape) in CHAINS.items()}
    cases = []
    names = list(CHAINS)
    for i in range(n):
        chain = names[i % len(names)]
        kind = MUTATIONS[rng.integers(len(MUTATIONS))]
        raw = good[chain][rng.integers(len(good[chain]))]
        data = _mutate(kind, raw, chain, rng, smaller[chain])
        cases.append({"case": i, "chain": chain, "kind": kind, "data": data, "slot": int(rng.integers(GOOD_PER_BATCH + 1)),
                      "goods": [int(g) for g in rng.integers(len(good[chain]), size=GOOD_PER_BATCH)]})
    return cases, good, arrays


def save_cases(path: str, cases: list[dict], good: dict, arrays: dict) -> None:
    meta = {"cases": [{k: v for k, v in c.items() if k != "data"} for c in cases], "chains": list(CHAINS)}
    blobs = [c["data"] for c in cases] + [g for chain in CHAINS for g in good[chain]]
    sizes = np.array([len(b) for b in blobs], dtype=np.int64)
    np.savez(path, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), sizes=sizes,
             blob=np.frombuffer(b"".join(blobs), dtype=np.uint8),
             **{f"arr_{chain}": np.stack(arrays[chain]) for chain in CHAINS})


def load_cases(path: str) -> tuple[list[dict], dict, dict]:
    z = np.load(path, allow_pickle=False)
    meta = json.loads(z["meta"].tobytes())
    sizes, blob = z["sizes"], z["blob"].tobytes()
    ends = np.cumsum(sizes)
    parts = [blob[e - s : e] for s, e in zip(sizes, ends)]
    cases = meta["cases"]
    for c, data in zip(cases, parts):
        c["data"] = data
    rest = parts[len(cases) :]
    good = {chain: rest[i * 8 : (i + 1) * 8] for i, chain in enumerate(meta["chains"])}
    arrays = {chain: list(z[f"arr_{chain}"]) for chain in meta["chains"]}
    return cases, good, arrays


# --------------------------------------------------------------------------- child: decode batches


def _spec(chain: str):
    from gpuzarr_dist.metadata import ArraySpec, CodecSpec

    comp, crc, shape = CHAINS[chain]
    codecs = [CodecSpec("bytes", {"endian": "little"}), CodecSpec(comp.split("-")[0], {})] + ([CodecSpec("crc32c", {})] if crc else [])
    return ArraySpec(name=f"fuzz-{chain}", shape=(shape[0] * 8, shape[1]), chunk_shape=shape, dtype=np.dtype("f4"),
                     fill_value=np.float32(0), zarr_format=3, codecs=tuple(codecs), key_prefix="c", key_separator="/",
                     metadata_key="zarr.json")


def _category(reason: str) -> str:
    reason = reason.split(";")[0]
    reason = re.sub(r"0x[0-9a-f]+|\b\d+\b", "N", reason)
    return reason[:90]


def run_child(args: argparse.Namespace) -> int:
    from gpuzarr_dist.codecs.pipeline import CodecPipeline

    cases, good, arrays = load_cases(args.cases_file)
    gpu = args.device == "gpu"
    if gpu:
        import cupy

        from gpuzarr_dist.runtime.cuda import thread_stream

        stream = thread_stream()
    pipelines = {chain: CodecPipeline(_spec(chain)) for chain in CHAINS}
    out = open(args.results, "a", buffering=1)

    def record(i: int, outcome: str | None, detail: str = "") -> None:
        out.write(json.dumps({"begin": i} if outcome is None else {"case": i, "outcome": outcome, "detail": detail}) + "\n")

    def judge(c: dict) -> None:
        if _judge_case(c, pipelines, good, arrays, gpu, stream if gpu else None, record) == EXIT_CUDA_LOST:
            out.close()
            sys.exit(EXIT_CUDA_LOST)

    for c in cases[args.start : args.end]:
        judge(c)
        if gpu:  # a fault inside nvCOMP can leave a sticky error that a caught exception hides: look now
            try:
                cupy.cuda.runtime.deviceSynchronize()  # a sticky error surfaces here, or in the next launch:
                int(cupy.arange(4).sum())
            except Exception as e:  # noqa: BLE001
                record(c["case"], "crash: CUDA context lost", f"{type(e).__name__}: {e}"[:300])
                out.close()
                return EXIT_CUDA_LOST
    out.close()
    return 0


def _judge_case(c, pipelines, good, arrays, gpu, stream, record) -> int | None:
    """Decode one case in its batch and record the outcome; ``EXIT_CUDA_LOST`` when the context is gone."""
    from gpuzarr_dist.errors import ChunkDecodeError
    from gpuzarr_dist.stores.base import staging_layout

    if gpu:
        from gpuzarr_dist.codecs.gpu import decode_batch_gpu, framing_lead
        from gpuzarr_dist.runtime.cuda import ALIGN, pinned_staging
    i, chain = c["case"], c["chain"]
    pipe = pipelines[chain]
    chunks = [good[chain][g] for g in c["goods"]]
    expected_good = [arrays[chain][g] for g in c["goods"]]
    chunks.insert(c["slot"], c["data"])
    keys = [f"c/{j}/0" for j in range(len(chunks))]
    bad_key = keys[c["slot"]]
    record(i, None)
    if str(i) == os.environ.get("GPU_FUZZ_SELFTEST_CRASH"):  # to check the crash accounting itself
        os._exit(139)
    try:
        cpu = pipe.decode_chunk(c["data"], bad_key)
    except ChunkDecodeError:
        cpu = None
    try:
        if gpu:
            sizes = [len(b) for b in chunks]
            offsets, total = staging_layout(sizes, ALIGN, framing_lead(pipe))
            host = pinned_staging(max(total, 1))
            for b, o in zip(chunks, offsets):
                host[o : o + len(b)] = np.frombuffer(b, dtype=np.uint8)
            dec = decode_batch_gpu(pipe, host, offsets, sizes, keys, stream)
            stream.synchronize()
            got = dec.get()
        else:
            got = np.stack([pipe.decode_chunk(b, k) for b, k in zip(chunks, keys)])
    except ChunkDecodeError as e:
        if e.key != bad_key:
            record(i, "misattributed", f"error names {e.key!r}, the damaged chunk is {bad_key!r}: {e.reason}")
        elif cpu is not None:
            record(i, "rejected, CPU decodes it", _category(e.reason))
        else:
            record(i, "rejected", _category(e.reason))
        return None
    except Exception as e:  # noqa: BLE001 - everything else is a finding
        text = f"{type(e).__name__}: {e}"
        if gpu and ("cudaError" in text or "CUDA_ERROR" in text or "illegal" in text.lower()):
            record(i, "crash: CUDA context lost", text[:300])
            return EXIT_CUDA_LOST
        record(i, "other exception", text[:300])
        return None
    bad = np.asarray(got[c["slot"]])
    others = [np.asarray(g) for j, g in enumerate(got) if j != c["slot"]]
    if any(not np.array_equal(g, e, equal_nan=True) for g, e in zip(others, expected_good)):
        record(i, "collateral: a good chunk decoded wrongly")
    elif cpu is None:
        record(i, "decoded, CPU rejects it (silent wrong value)")
    elif np.array_equal(bad, cpu, equal_nan=True):
        record(i, "decoded, equal to CPU")
    else:
        record(i, "decoded, differs from CPU")
    return None


# --------------------------------------------------------------------------- parent: children, counts, crashes


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", type=int, default=12000)
    p.add_argument("--time", type=float, default=270.0, help="seconds; no new group starts after this")
    p.add_argument("--group", type=int, default=300, help="cases per child process")
    p.add_argument("--seed", type=int, default=20261122)
    p.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    p.add_argument("--out", default=os.environ.get("OUT") or ".")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cases-file", help=argparse.SUPPRESS)
    p.add_argument("--results", help=argparse.SUPPRESS)
    p.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--end", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return run_child(args)

    t0 = time.time()
    os.makedirs(args.out, exist_ok=True)
    cases, good, arrays = make_cases(args.cases, args.seed)
    work = tempfile.mkdtemp(prefix="gpu_fuzz_")
    cases_file = os.path.join(work, "cases.npz")
    save_cases(cases_file, cases, good, arrays)
    results = os.path.join(work, "results.jsonl")
    print(f"{len(cases)} cases over {len(CHAINS)} chains generated in {time.time() - t0:.1f} s; device {args.device}", flush=True)
    start, children = 0, 0
    while start < len(cases):
        if time.time() - t0 > args.time:
            print(f"time limit reached after {start} cases", flush=True)
            break
        end = min(len(cases), start + args.group)
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--cases-file", cases_file, "--results", results,
               "--start", str(start), "--end", str(end), "--device", args.device]
        left = min(120.0, max(30.0, args.time + 60 - (time.time() - t0)))  # a hung child is a crash too
        try:
            rc = subprocess.run(cmd, timeout=left).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        children += 1
        done, begun = _progress(results)
        if rc == 0:
            start = end
            continue
        # the child died, hung or lost its CUDA context: the case it began last is the culprit
        culprit = max(begun) if begun else start
        if culprit not in done:
            _append(results, {"case": culprit, "outcome": f"crash: child process ended ({rc})", "detail": ""})
        _save_crash(args.out, cases[culprit], rc)
        start = culprit + 1
    counts, by_check, examples = _summarise(results)
    report = {"cases": sum(counts.values()), "children": children, "seconds": round(time.time() - t0, 1),
              "device": args.device, "outcomes": dict(counts), "rejected_by_check": dict(by_check), "examples": examples}
    with open(os.path.join(args.out, "gpu_fuzz.json"), "w") as f:
        json.dump(report, f, indent=1)
    _print(report)
    failures = sum(v for k, v in counts.items() if k.startswith(("crash", "decoded, CPU rejects", "decoded, differs",
                                                                 "misattributed", "collateral", "other exception")))
    return 1 if failures else 0


def _progress(results: str) -> tuple[set[int], set[int]]:
    done, begun = set(), set()
    if os.path.exists(results):
        with open(results) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue  # a line cut by a crash
                if "begin" in r:
                    begun.add(r["begin"])
                else:
                    done.add(r["case"])
    return done, begun


def _append(results: str, record: dict) -> None:
    with open(results, "a") as f:
        f.write(json.dumps(record) + "\n")


def _save_crash(out: str, case: dict, rc) -> None:
    stem = os.path.join(out, f"crash-{case['case']}")
    with open(stem + ".bin", "wb") as f:
        f.write(case["data"])
    meta = {k: v for k, v in case.items() if k != "data"}
    meta.update(returncode=str(rc), nbytes=len(case["data"]), chain_config=CHAINS[case["chain"]])
    with open(stem + ".json", "w") as f:
        json.dump(meta, f, indent=1, default=str)
    print(f"CRASH on case {case['case']} ({case['chain']}, {case['kind']}, {len(case['data'])} bytes): saved {stem}.bin", flush=True)


def _summarise(results: str):
    final: dict[int, dict] = {}
    with open(results) as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if "case" in r:
                final[r["case"]] = r
    counts = collections.Counter(r["outcome"] for r in final.values())
    by_check = collections.Counter(r["detail"] for r in final.values() if r["outcome"] == "rejected")
    examples: dict[str, list] = collections.defaultdict(list)
    for r in final.values():
        if r["outcome"] not in ("rejected", "decoded, equal to CPU") and len(examples[r["outcome"]]) < 5:
            examples[r["outcome"]].append(r)
    return counts, by_check, dict(examples)


def _print(report: dict) -> None:
    print(f"\ncases: {report['cases']}  children: {report['children']}  time: {report['seconds']} s  device: {report['device']}")
    for k, v in sorted(report["outcomes"].items(), key=lambda kv: -kv[1]):
        print(f"  {v:7d}  {k}")
    print("rejected, by check:")
    for k, v in sorted(report["rejected_by_check"].items(), key=lambda kv: -kv[1])[:40]:
        print(f"  {v:7d}  {k}")
    for k, rows in report["examples"].items():
        print(f"examples of {k!r}:")
        for r in rows:
            print(f"    case {r['case']}: {r['detail'][:200]}")


if __name__ == "__main__":
    sys.exit(main())
