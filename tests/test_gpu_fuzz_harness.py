"""The GPU fuzz harness (``dev/gpu_fuzz.py``) run on the CPU: its judging, its speed and its crash accounting.

The GPU fuzz results rely on the harness, and GPU time is scarce, so
everything but the kernels is checked here: a ``--device cpu`` run
decodes batches with the CPU pipeline and judges every damaged chunk against
the reference libraries (numcodecs, google-crc32c) directly; the self-test
hooks make a child die or hang on chosen cases, and the run must name exactly
those cases, save their bytes, replay them, and judge every other case.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from dev import gpu_fuzz as gf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = ["-m", "dev.gpu_fuzz"]

FAILURE_PREFIXES = gf.FAILURES


def _run(tmp_path, *args, env=None, timeout=120):
    out = tmp_path / "out"
    e = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    e.update(env or {})
    p = subprocess.run([sys.executable, *TOOL, "--device", "cpu", "--out", str(out), *args], env=e,
                       capture_output=True, text=True, timeout=timeout)
    report = json.loads((out / "gpu_fuzz.json").read_text())
    return p, report, out


def test_cpu_run_judges_every_case_with_no_failure(tmp_path):
    p, report, _ = _run(tmp_path, "--cases", "300", "--standby", "0")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert report["cases"] == 300
    failing = {k: v for k, v in report["outcomes"].items() if k.startswith(FAILURE_PREFIXES)}
    assert not failing, failing
    assert set(report["per_chain"]) == set(gf.CHAINS) and all(sum(c.values()) > 0 for c in report["per_chain"].values())
    # both verdicts occur (a harness that rejects, or decodes, everything would judge nothing)
    assert report["outcomes"].get("rejected", 0) > 100 and report["outcomes"].get("decoded, equal to CPU", 0) > 10
    assert report["seconds"] < 20, report["seconds"]
    assert "cases/s" in p.stdout and "blosc-zstd+crc32c" in p.stdout


@pytest.mark.parametrize("mode", ["headers", "sequences"])
def test_children_decode_with_the_zstd_check_asked_for(tmp_path, mode):
    """``--zstd-check`` reaches the children (each used to set it again from its own argparse default)."""
    p, report, _ = _run(tmp_path, "--cases", "40", "--standby", "0", "--zstd-check", mode)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert report["zstd_check"] == mode and report["children_zstd_check"] == [mode]


def test_crash_and_hang_are_named_saved_and_replayable(tmp_path):
    # ``alone`` dies in a batch of one damaged chunk (zstd); ``hang`` hangs in a batch of several, which the
    # next child runs again one damaged chunk per batch to find the culprit
    size = [end - start for _, start, end in map(gf.batch_of, range(150))]
    alone = next(i for i in range(20, 150) if size[i] == 1)
    hang = next(i for i in range(60, 150) if size[i] > 1 and gf.batch_of(i)[1] < i)
    fake = tmp_path / "bin"  # a stand-in compute-sanitizer: prints a memcheck finding, then runs the replay
    fake.mkdir()
    (fake / "compute-sanitizer").write_text('#!/bin/sh\necho "========= Invalid __global__ read of size 1 bytes"\n'
                                            'echo "=========     at fake_kernel(int)+0x10"\nshift 4\nexec "$@"\n')
    (fake / "compute-sanitizer").chmod(0o755)
    p, report, out = _run(tmp_path, "--cases", "150", "--stall", "1.5", "--sanitize", "1",
                          env={"GPU_FUZZ_SELFTEST_CRASH": str(alone), "GPU_FUZZ_SELFTEST_HANG": str(hang),
                               "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"})
    assert p.returncode == 1, p.stdout[-3000:]
    assert report["cases"] == 150  # every case judged, the others after each crash too
    assert report["outcomes"]["crash: child process ended (139)"] == 1
    assert report["outcomes"]["crash: child process ended (hung for 2 s, killed)"] == 1
    saved = [f"crash-{i}.{ext}" for i in (alone, hang) for ext in ("bin", "json")]
    assert sorted(os.listdir(out)) == sorted(saved + ["gpu_fuzz.json", "gpu_fuzz_journal.jsonl",
                                                      f"crash-{alone}.memcheck.txt"])
    assert f"crash-{alone}.json: rc 0, first kernel: fake_kernel(int)" in p.stdout, p.stdout[-2000:]
    assert [c["case"] for c in report["crashes"]] == [alone, hang]
    assert report["crashes"][0]["memcheck_first_kernel"] == "fake_kernel(int)"
    assert "replaying case" in (out / f"crash-{alone}.memcheck.txt").read_text()
    other = {k: v for k, v in report["outcomes"].items() if k.startswith(FAILURE_PREFIXES) and not k.startswith("crash")}
    assert not other, other
    assert [f["cases"] for f in report["batch_findings"]] == [list(range(gf.batch_of(hang)[1], gf.batch_of(hang)[2]))]
    meta = json.loads((out / f"crash-{hang}.json").read_text())
    case = gf.make_case(meta["seed"], hang, gf.Pools(meta["seed"]))
    assert (out / f"crash-{hang}.bin").read_bytes() == case["data"] == bytes.fromhex(meta["data_hex"])
    assert meta["chain"] == case["chain"]
    assert meta["layout"].count(["case", hang]) == 1 and len(meta["layout"]) == gf.GOOD_PER_BATCH + 1
    r = subprocess.run([sys.executable, *TOOL, "--replay", str(out / f"crash-{hang}.json"), "--device", "cpu"],
                       env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and f"replaying case {hang} " in r.stdout, r.stdout + r.stderr


def test_cases_depend_on_seed_and_index_only():
    pools = gf.Pools(7)
    a = [gf.make_case(7, i, pools) for i in (0, 1, 999)]
    b = [gf.make_case(7, i, gf.Pools(7)) for i in (999, 1, 0)][::-1]
    assert [c["data"] for c in a] == [c["data"] for c in b]
    assert gf.make_case(8, 1, gf.Pools(8))["data"] != a[1]["data"]
    gz = gf.Pools(7).good["gzip"][0]
    assert gz[4:8] == b"\0\0\0\0"  # no time stamp in gzip headers: the supervisor re-makes a crashed case
    # batches tile the cases: consecutive, one chain each, every chain in a round
    seen, i = set(), 0
    while i < 2 * gf._ROUND_SIZE:
        chain, start, end = gf.batch_of(i)
        assert start == i and end > i and all(gf.batch_of(j)[0] == chain for j in range(start, end))
        seen.add(chain)
        i = end
    assert seen == set(gf.CHAINS)


@pytest.mark.parametrize("chain", list(gf.CHAINS))
def test_reference_decodes_good_chunks_and_rejects_damaged_crc(chain):
    pools = gf.Pools(3)
    for data, arr in zip(pools.good[chain], pools.arrays[chain]):
        assert gf._same(gf.reference_decode(chain, data), arr)
    with pytest.raises(Exception):
        gf.reference_decode(chain, pools.other[chain])  # a valid chunk of another decoded size


def test_blosc_header_mutations_edit_the_named_field():
    pools = gf.Pools(1)
    raw = pools.good["blosc-lz4"][0]
    rng = np.random.default_rng(0)
    for kind, field in (("blosc-nbytes", 4), ("blosc-blocksize", 8), ("blosc-cbytes", 12)):
        for _ in range(20):
            m = gf._mutate(kind, raw, "blosc-lz4", rng, b"")
            assert len(m) == len(raw) and m[:field] == raw[:field] and m[field + 4 :] == raw[field + 4 :]


def test_first_kernel_is_read_from_memcheck_reports():
    report = """========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 1 bytes
=========     at void nvcomp::zstd::decompress_kernel<int>(const unsigned char *, long)+0x1a30
=========     by thread (3,0,0) in block (0,0,0)
========= Program hit cudaErrorLaunchFailure on CUDA API call to cudaStreamSynchronize.
=========     Saved host backtrace up to driver entry point at error
"""
    assert gf.first_kernel(report) == "void nvcomp::zstd::decompress_kernel<int>(const unsigned char *, long)"
    assert gf.first_kernel("=========     at 0x70 in /src/k.cu:12:lz4_block_length(const unsigned char *)") == \
        "lz4_block_length(const unsigned char *)"
    assert gf.first_kernel("========= ERROR SUMMARY: 0 errors") is None


class _FakeGpu(gf.Decoder):
    """Decodes like the GPU path reports: one error for the batch, naming the first bad chunk and listing the others."""

    def __init__(self, seed, mode):
        super().__init__("cpu", seed)
        self.mode = mode

    def decode(self, chain, chunks, keys):
        from gpuzarr_dist.errors import ChunkDecodeError

        got, bad = [], []
        for b, k in zip(chunks, keys):
            try:
                got.append(gf.reference_decode(chain, b))
            except Exception:  # noqa: BLE001
                bad.append(k)
                got.append(np.zeros(gf.CHAINS[chain]["shape"], gf.CHAINS[chain]["dtype"]))
        if self.mode == "collateral" and bad:
            got = [(g.view(np.uint8) ^ 1).view(g.dtype).reshape(g.shape) if k not in bad else g  # every good chunk wrong
                   for g, k in zip(got, keys)]
            return got
        if bad:
            first = keys[0] if self.mode == "misattribute" else bad[0]
            more = f"; {len(bad) - 1} more bad chunk(s) in this block: {', '.join(bad[1:6])}" if len(bad) > 1 else ""
            raise ChunkDecodeError("fake", first, "structure check (the CPU decoder agrees: x)" + more, "zstd")
        return got


def _multi(n):
    """The cases of the batches of several damaged chunks that start before case ``n``."""
    return [i for i in range(n + 8) if gf.batch_of(i)[2] - gf.batch_of(i)[1] > 1 and gf.batch_of(i)[1] < n]


def _judge(mode, ids):
    import io

    journal = io.StringIO()
    child = gf.Child(_FakeGpu(11, mode), journal)
    for i in ids:
        _, start, end = gf.batch_of(i)
        if start == i:
            child.run_batch(list(range(start, end)))
    recs = [json.loads(line) for line in journal.getvalue().splitlines()]
    return {r["case"]: r for r in recs if "case" in r}, recs


def test_errors_listing_every_bad_chunk_judge_the_whole_batch():
    ids = _multi(200)
    final, recs = _judge("list", ids)
    assert sorted(final) == ids
    assert all(not r["outcome"].startswith(gf.FAILURES) for r in final.values())
    assert any(r["detail"] == "listed in another chunk's error" for r in final.values())
    stats = [r["stat"] for r in recs if "stat" in r]
    assert stats and all(s == "error listing several chunks named every chunk the CPU rejects" for s in stats)


@pytest.mark.parametrize("mode, outcome", [("misattribute", "misattributed"), ("collateral", "collateral")])
def test_batch_failures_are_judged_again_one_damaged_chunk_at_a_time(mode, outcome):
    ids = _multi(120)
    final, recs = _judge(mode, ids)
    assert sorted(final) == ids
    failing = [i for i, r in final.items() if r["outcome"].startswith(outcome)]
    assert failing and all(r["outcome"].startswith(("rejected", "decoded", outcome)) for r in final.values())
    findings = [r for r in recs if "finding" in r]
    assert findings and all(set(f["cases"]) <= set(ids) for f in findings)
    # every case blamed was judged in a batch of its own, after the batch of several showed the failure
    solo_tries = {r["try"][0] for r in recs if "try" in r and len(r["try"]) == 1}
    assert set(failing) <= solo_tries


def test_lanes_split_the_cases_and_still_name_crashes_and_hangs_exactly(tmp_path):
    """Two lanes side by side: every case judged once, a crash in one lane and a hang in the other each named."""
    n = 2 * gf._ROUND_SIZE + 10  # the second lane starts at a round boundary and gets the rest
    size = [end - start for _, start, end in map(gf.batch_of, range(n))]
    alone = next(i for i in range(5, gf._ROUND_SIZE) if size[i] == 1)  # lane 0
    hang = next(i for i in range(2 * gf._ROUND_SIZE - 20, n) if size[i] == 1)  # lane 1
    p, report, out = _run(tmp_path, "--cases", str(n), "--lanes", "2", "--stall", "1.5",
                          env={"GPU_FUZZ_SELFTEST_CRASH": str(alone), "GPU_FUZZ_SELFTEST_HANG": str(hang)})
    assert p.returncode == 1, p.stdout[-3000:]
    assert report["lanes"] == 2 and report["cases"] == n
    assert sorted(c["case"] for c in report["crashes"]) == sorted([alone, hang])
    assert report["outcomes"]["crash: child process ended (139)"] == 1
    assert report["outcomes"]["crash: child process ended (hung for 2 s, killed)"] == 1
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("SUMMARY "))
    fields = dict(kv.split("=") for kv in line.split()[1:])
    assert fields["cases"] == str(n) and fields["chains"] == str(len(gf.CHAINS))
    assert fields["crashes"] == "1" and fields["hangs"] == "1" and fields["wrong-values"] == "0"
    assert int(fields["reported-errors"]) == sum(v for k, v in report["outcomes"].items() if k.startswith("rejected"))
    journal = [json.loads(ln) for ln in (out / "gpu_fuzz_journal.jsonl").read_text().splitlines()]
    assert len({r["case"] for r in journal if "outcome" in r}) == n
