"""The zstd frame walk that runs on the GPU before nvCOMP, compiled as C++ and run on the CPU.

``gpuzarr_dist.cuda.kernels.ZSTD_FRAMES_SRC`` is plain C apart from the CUDA
markers, so a host compiler (with AddressSanitizer where it has one) runs the
very source the GPU runs: one process, each frame in its own exact-size heap
buffer, so a read past a frame's end is caught. The walk must accept every
frame libzstd writes, never read outside a frame, and flag structurally
impossible frames; libzstd (through numcodecs) is the independent judge.
"""

from __future__ import annotations

import collections
from concurrent.futures import ThreadPoolExecutor

import numcodecs
import numpy as np
import pytest

from gpuzarr_dist.cuda.kernels import ZSTD_DEEP_REASONS, ZSTD_FRAMES_SRC
from tests.helpers.zstd_walk_host import build_walk, run_walk


@pytest.fixture(scope="module")
def walk_exe(tmp_path_factory):
    """The kernel source built for the host (with AddressSanitizer where the compiler has it)."""
    exe = build_walk(str(tmp_path_factory.mktemp("zstd_walk")))
    if exe is None:
        pytest.skip("no C++ compiler to build the kernel source for the host")
    return exe


@pytest.fixture(scope="module")
def walk(walk_exe):
    """``walk(frames) -> [(stated size, frame length, deep code)]`` through the compiled kernel source."""
    exe = walk_exe

    def run(frames: list[bytes], mode: int = 0) -> list[tuple[int, int, int]]:
        return run_walk(exe, frames, mode)

    return run


def _payloads(rng: np.random.Generator) -> dict[str, callable]:
    return {
        "zeros": lambda n: bytes(n),
        "random": lambda n: rng.bytes(n),
        "smooth-f4": lambda n: np.cumsum(rng.standard_normal(n // 4 + 1)).astype("f4").tobytes()[:n],
        "text": lambda n: (b"the quick brown fox %d jumps " * (n // 20 + 1))[:n],
        "ramp-i8": lambda n: np.arange(n // 8 + 1, dtype="i8").tobytes()[:n],
    }


def test_every_frame_libzstd_writes_passes(walk):
    rng = np.random.default_rng(0)
    frames, sizes = [], []
    for size in [0, 1, 7, 100, 1000, 4096, 65536, 131072, 131073, 300_000, 1 << 20]:
        for make in _payloads(rng).values():
            data = make(size)
            for level in [-5, 1, 3, 9, 19]:
                if size > 200_000 and level == 19:
                    continue
                for checksum in (False, True):
                    frames.append(numcodecs.Zstd(level=level, checksum=checksum).encode(data))
                    sizes.append(size)
    results = walk(frames)
    bad = [(s, len(f), r) for s, f, r in zip(sizes, frames, results) if r != (s, len(f), 0)]
    assert len(frames) > 400 and bad == []


def _mutate(rng: np.random.Generator, frame: bytes) -> bytes:
    b = bytearray(frame)
    kind = rng.integers(6)
    if kind == 0:
        for _ in range(rng.integers(1, 5)):
            i = rng.integers(len(b))
            b[i] ^= 1 << rng.integers(8)
    elif kind == 1:  # frame header fields
        b[rng.integers(4, min(len(b), 18))] = rng.integers(256)
    elif kind == 2:
        b = b[: rng.integers(len(b))]
    elif kind == 3:
        i = rng.integers(len(b))
        b[i : i + 8] = rng.bytes(8)
    elif kind == 4:
        b += rng.bytes(rng.integers(1, 20))
    else:  # block, literals and sequences headers near the start
        b[rng.integers(6, min(len(b), 64))] = rng.integers(256)
    return bytes(b)


def test_mutated_frames_never_read_out_of_bounds_and_flags_agree_with_libzstd(walk):
    """3,000 mutated frames: no out-of-bounds read (ASan), and what the walk rejects libzstd rejects too."""
    rng = np.random.default_rng(1)
    base = []
    for size in [100, 1000, 6000, 65536, 300_000]:
        for make in _payloads(rng).values():
            for level in (1, 19):
                data = make(size)
                base.append((numcodecs.Zstd(level=level).encode(data), size))
    cases = [(_mutate(rng, f), n) for f, n in (base[i] for i in rng.integers(len(base), size=3000))]
    results = walk([f for f, _ in cases])
    assert len(results) == len(cases)
    counts: collections.Counter = collections.Counter()
    for (frame, n), (fcs, length, deep) in zip(cases, results):
        try:
            cpu_ok = len(numcodecs.Zstd().decode(frame)) == n
        except Exception:
            cpu_ok = False
        if fcs == -1 or (fcs == n and 0 <= length < len(frame)):
            counts["to the CPU decoder (no stated size, or data after the frame)"] += 1
        elif fcs != n or length != len(frame):
            counts["rejected by the header checks"] += 1
            assert not cpu_ok, f"header checks reject a frame libzstd decodes: {frame[:24].hex()}"
        elif deep:
            assert deep in ZSTD_DEEP_REASONS
            counts["flagged, libzstd decodes it (decoded on the CPU)" if cpu_ok else "flagged, libzstd rejects it"] += 1
        else:
            counts["to nvCOMP, libzstd decodes it" if cpu_ok else "to nvCOMP, libzstd rejects it"] += 1
    print(dict(counts))
    assert counts["flagged, libzstd rejects it"] > 50  # the walk does catch damaged blocks
    # a flag on a frame libzstd decodes costs a CPU decode, never a wrong error: keep it rare
    assert counts["flagged, libzstd decodes it (decoded on the CPU)"] <= len(cases) // 200


def _device_walk(frames: list[bytes], mode: int = 0) -> list[tuple[int, int, int]]:
    """The same walk on the GPU, through the kernel the decoder launches (frames at 256-byte aligned offsets)."""
    import cupy

    from gpuzarr_dist.cuda.launch import kernel
    from gpuzarr_dist.stores.base import staging_layout

    sizes = [len(f) for f in frames]
    offsets, total = staging_layout(sizes, 256)
    host = np.zeros(max(total, 1), dtype=np.uint8)
    for f, o in zip(frames, offsets):
        host[o : o + len(f)] = np.frombuffer(f, dtype=np.uint8)
    n = len(frames)
    dev = cupy.asarray(host)
    fcs, length = cupy.empty(n, dtype=cupy.int64), cupy.empty(n, dtype=cupy.int64)
    deep = cupy.empty(n, dtype=cupy.int32)
    kernel("zstd_frames", ZSTD_FRAMES_SRC)(((n + 63) // 64,), (64,), (
        dev, cupy.asarray(np.asarray(offsets, dtype=np.int64)), cupy.asarray(np.asarray(sizes, dtype=np.int64)),
        np.int32(n), fcs, length, deep, np.int32(mode)))
    return list(zip(fcs.get().tolist(), length.get().tolist(), deep.get().tolist()))


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [0, 1, 2], ids=["headers", "sequences", "literals"])
def test_device_walk_agrees_with_libzstd_and_with_the_host_build(mode):
    rng = np.random.default_rng(1)
    valid, sizes = [], []
    for size in [0, 100, 65536, 300_000]:
        for make in _payloads(rng).values():
            valid.append(numcodecs.Zstd(level=3).encode(make(size)))
            sizes.append(size)
    assert _device_walk(valid, mode) == [(s, len(f), 0) for s, f in zip(sizes, valid)]
    base = [(numcodecs.Zstd(level=lv).encode(make(n)), n) for n in (1000, 65536) for make in _payloads(rng).values() for lv in (1, 19)]
    cases = [(_mutate(rng, f), n) for f, n in (base[i] for i in rng.integers(len(base), size=2000))]
    results = _device_walk([f for f, _ in cases], mode)
    for (frame, n), (fcs, length, deep) in zip(cases, results):
        if fcs == n and length == len(frame) and deep == 0:
            continue
        if fcs == -1 or (fcs == n and 0 <= length < len(frame)):
            continue  # the CPU decodes these
        try:
            cpu_ok = len(numcodecs.Zstd().decode(frame)) == n
        except Exception:
            cpu_ok = False
        if not cpu_ok:
            continue
        # header rejections must never hit a frame libzstd decodes; deep flags may (the CPU decodes those)
        assert deep and fcs == n and length == len(frame), (frame[:24].hex(), fcs, length, deep)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:  # the very same source built for the host gives the very same answers
        exe = build_walk(tmp, sanitize=False)
        if exe is not None:
            assert run_walk(exe, [f for f, _ in cases], mode) == results


# ---------------------------------------------------------------- the entropy checks (issue 9): both modes

MODES = {"headers": 0, "sequences": 1, "literals": 2}


def _libzstd_verdict(frame: bytes, n: int) -> str:
    """"ok", "checksum" (the data decodes but its content checksum differs) or "rejected"."""
    try:
        return "ok" if len(numcodecs.Zstd().decode(frame)) == n else "rejected"
    except Exception as e:  # noqa: BLE001 - whatever libzstd raises is a rejection
        return "checksum" if "checksum" in str(e) else "rejected"


def _libzstd_ok(frame: bytes, n: int) -> bool:
    return _libzstd_verdict(frame, n) == "ok"


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
def test_no_false_positives_at_every_level_checksum_and_block_count(walk, mode):
    """Every level libzstd has (-5..22), with and without checksum, empty to multi-block, RLE to incompressible."""
    rng = np.random.default_rng(7)
    frames, sizes = [], []
    makers = {**_payloads(rng), "rle-run": lambda n: b"\x07" * n,
              "runs": lambda n: bytes(np.repeat(rng.integers(0, 256, n // 50 + 1, dtype=np.uint8), 50)[:n])}
    for level in range(-5, 23):
        for size in (0, 1, 300, 5000, 70_000) + ((140_000, 400_000) if level < 15 else ()):
            for j, make in enumerate(makers.values()):
                if (level + size + j) % 3:  # a third of the grid, every level and every payload kept
                    continue
                frames.append(numcodecs.Zstd(level=level, checksum=bool((level + j) % 2)).encode(make(size)))
                sizes.append(size)
    results = walk(frames, mode)
    bad = [(s, len(f), r) for s, f, r in zip(sizes, frames, results) if r != (s, len(f), 0)]
    assert len(frames) > 250 and bad == []


hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies


@hypothesis.settings(max_examples=15, deadline=None, suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(pieces=st.lists(st.tuples(st.sampled_from(["bytes", "repeat", "text", "zeros"]),
                                            st.binary(min_size=1, max_size=64), st.integers(1, 6000)),
                                  min_size=0, max_size=12),
                  level=st.integers(-5, 22), checksum=st.booleans())
def test_no_false_positives_on_generated_data(walk, pieces, level, checksum):
    """Data built from hypothesis' pieces (literal runs, repeats at many distances, zeros): never flagged."""
    parts = []
    for kind, b, n in pieces:
        parts.append(b if kind == "bytes" else bytes(n) if kind == "zeros" else (b * (n // len(b) + 1))[:n]
                     if kind == "repeat" else b" ".join([b.hex().encode()] * (n // 64 + 1)))
    data = b"".join(parts)
    frames = [numcodecs.Zstd(level=lv, checksum=checksum).encode(data) for lv in (level, 1, 19)]
    for mode in MODES.values():
        assert walk(frames, mode) == [(len(data), len(f), 0) for f in frames]


def _mutated_cases(seed: int, n: int) -> list[tuple[bytes, int]]:
    rng = np.random.default_rng(seed)
    base = []
    for size in [100, 1000, 6000, 65536, 200_000]:
        for make in _payloads(rng).values():
            for level in (-3, 1, 9, 19):
                base.append((numcodecs.Zstd(level=level, checksum=level == 9).encode(make(size)), size))
    return [(_mutate(rng, f), k) for f, k in (base[i] for i in rng.integers(len(base), size=n))]


def test_what_either_mode_rejects_libzstd_rejects_and_sequences_catch_more(walk):
    """Mutated frames (bit flips, byte edits, truncation, header and block edits): the walk's rejections are
    libzstd's, and the share of libzstd's rejections (among frames that would reach nvCOMP) caught is reported."""
    cases = _mutated_cases(11, 2500)
    frames = [f for f, _ in cases]
    cpu = [_libzstd_verdict(f, n) for f, n in cases]
    caught = {}
    for name, mode in MODES.items():
        counts: collections.Counter = collections.Counter()
        for (frame, n), verdict, (fcs, length, deep) in zip(cases, cpu, walk(frames, mode)):
            if fcs == -1 or (fcs == n and 0 <= length < len(frame)):
                continue  # decoded on the CPU whatever the walk says
            rejected = fcs != n or length != len(frame) or deep != 0
            if name == "literals" and verdict == "ok" and deep == 22 and fcs == n and length == len(frame):
                # a Huffman stream read past its start or not used up: libzstd's fast path accepts some, and
                # what they hold depends on the decoder; flagged, so the CPU decodes them (never a wrong error)
                counts["literal stream not consumed exactly, libzstd decodes it: to the CPU"] += 1
                continue
            assert not (rejected and verdict == "ok"), f"{name}: rejects a frame libzstd decodes: {frame[:32].hex()}"
            if verdict == "checksum":  # sound structure, wrong content: the device's XXH64 check after nvCOMP
                counts["checksum only, caught" if rejected else "checksum only, to the XXH64 check"] += 1
            elif verdict == "rejected":
                counts["caught" if rejected else "reaches nvCOMP"] += 1
        caught[name] = counts["caught"] / max(1, counts["caught"] + counts["reaches nvCOMP"])
        print(f"{name}: of {counts['caught'] + counts['reaches nvCOMP']} mutated frames libzstd rejects as corrupt "
              f"(that nvCOMP would get), the walk catches {counts['caught']} ({caught[name]:.1%}); "
              f"content checksum mismatches only: {dict((k, v) for k, v in counts.items() if 'checksum' in k)}")
        if name == "literals":
            print(f"literals: sent to the CPU though libzstd decodes them: "
                  f"{counts['literal stream not consumed exactly, libzstd decodes it: to the CPU']}")
            assert counts["literal stream not consumed exactly, libzstd decodes it: to the CPU"] <= len(cases) // 50
    assert caught["headers"] > 0.8 and caught["sequences"] > 0.97 and caught["sequences"] > caught["headers"]
    assert caught["literals"] >= caught["sequences"]


def _block_walk_cases(seed: int, n: int) -> list[bytes]:
    """Valid multi-block frames (repeat offsets and tables across blocks) and ``n`` damaged ones, some deep inside."""
    rng = np.random.default_rng(seed)
    base = []
    for size in [1000, 65536, 300_000, 700_000]:
        for make in _payloads(rng).values():
            for level in (-1, 3, 19):
                if size > 300_000 and level == 19:
                    continue
                base.append(numcodecs.Zstd(level=level).encode(make(size)))
    cases = list(base)
    for i in rng.integers(len(base), size=n):
        b = bytearray(base[i])
        if rng.integers(2):
            cases.append(_mutate(rng, bytes(b)))
            continue
        for _ in range(rng.integers(1, 4)):  # bit flips anywhere: most land in the bit streams
            j = rng.integers(len(b))
            b[j] ^= 1 << rng.integers(8)
        cases.append(bytes(b))
    return cases


@pytest.mark.parametrize("mode", [1, 2], ids=["sequences", "literals"])
def test_block_walk_gives_the_one_thread_walks_verdicts(walk_exe, mode):
    """The decoder's walk in modes 1 and 2 (a plan, a thread per block and stream, a combine per frame) against the
    one-thread walk of the same source: the same stated sizes and lengths, the same frames rejected, the same reason
    except where a block's offset reaches too far back (checked after the block, so a later fault in the same block
    is named instead). With 2 block slots most frames overflow the plan and are walked whole by the combine."""
    from gpuzarr_dist.cuda.kernels import zstd_block_slots

    cases = _block_walk_cases(21, 1200)
    one = run_walk(walk_exe, cases, mode)
    for cap in (zstd_block_slots(700_000), 2):
        par = run_walk(walk_exe, cases, mode, blocks=cap)
        counts: collections.Counter = collections.Counter()
        for frame, a, b in zip(cases, one, par):
            assert a[:2] == b[:2] and (a[2] == 0) == (b[2] == 0), (cap, frame[:24].hex(), a, b)
            assert a[2] == b[2] or a[2] == 19, (cap, frame[:24].hex(), a, b)
            counts["ok" if a[2] == 0 else "offset, later fault named" if a[2] != b[2] else f"code {a[2]}"] += 1
        print(cap, dict(counts))
        assert counts["ok"] >= 40 and sum(counts.values()) - counts["ok"] > 250
        assert counts["code 19"] >= 1 and counts["code 21"] > 10 and counts["code 18"] > 10  # offsets, streams


@pytest.mark.gpu
@pytest.mark.parametrize("fork", [True, False], ids=["literals-beside", "literals-after"])
@pytest.mark.parametrize("mode", [1, 2], ids=["sequences", "literals"])
def test_device_block_walk_is_the_host_builds(walk_exe, mode, fork, monkeypatch):
    """The decoder's zstd walk on the GPU (``zstd_walk``: plan, blocks, literals, combine) answers as the host
    build does, with the literals walk on the thread's second stream or after the sequences walk, from eight
    threads at once on their own streams (each thread's verdicts read back after its stream alone is synchronised)."""
    import cupy

    from gpuzarr_dist.cuda import kernels
    from gpuzarr_dist.cuda.kernels import zstd_block_slots
    from gpuzarr_dist.cuda.streams import thread_stream
    from gpuzarr_dist.cuda.zstd import zstd_walk
    from gpuzarr_dist.stores.base import staging_layout

    monkeypatch.setattr(kernels, "ZSTD_WALK_FORK", fork)

    cases = _block_walk_cases(22, 1500)
    sizes = [len(f) for f in cases]
    offsets, total = staging_layout(sizes, 256)
    host = np.zeros(total, dtype=np.uint8)
    for f, o in zip(cases, offsets):
        host[o : o + len(f)] = np.frombuffer(f, dtype=np.uint8)
    n = len(cases)

    def walk(_: int) -> list:
        stream = thread_stream()
        with stream:
            found = cupy.empty(3 * n, dtype=cupy.int64)
            zstd_walk(cupy.asarray(host), cupy.asarray(np.asarray(offsets, np.int64)),
                      cupy.asarray(np.asarray(sizes, np.int64)), n, found[:n], found[n : 2 * n],
                      found[2 * n :].view(cupy.int32), mode, 700_000)
            stream.synchronize()
            got = found.get(stream=stream)
        return list(zip(got[:n].tolist(), got[n : 2 * n].tolist(), got[2 * n :].view(np.int32)[:n].tolist()))

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(walk, range(16)))
    expected = run_walk(walk_exe, cases, mode, blocks=zstd_block_slots(700_000))
    assert all(r == expected for r in results)


def _frame_with_compressed_block(rng: np.random.Generator) -> tuple[bytes, int, int]:
    """A frame of one compressed block with Huffman literals and FSE sequences, and that block's offset."""
    data = (b"gpuzarr %d " * 900 % tuple(rng.integers(0, 10**6, 900)))[:8000]
    frame = numcodecs.Zstd(level=19).encode(data)
    desc = frame[4]
    pos = 5 + (0 if desc & 0x20 else 1) + [0, 1, 2, 4][desc & 3] + ([1 if desc & 0x20 else 0, 2, 4, 8][desc >> 6])
    h = int.from_bytes(frame[pos : pos + 3], "little")
    assert (h >> 1) & 3 == 2, "expected one compressed block"
    return frame, len(data), pos + 3


def test_targeted_damage_is_named_by_the_check_that_catches_it(walk):
    """Hand-made damage to each entropy structure gives its own reason code (and libzstd rejects it too)."""
    from gpuzarr_dist.cuda.kernels import ZSTD_DEEP_REASONS

    rng = np.random.default_rng(3)
    frame, n, blk = _frame_with_compressed_block(rng)
    assert walk([frame], 1) == [(n, len(frame), 0)]
    b = bytearray(frame)
    assert b[blk] & 3 == 2, "expected Huffman-compressed literals"
    b[-1] = 0  # the sequences bit stream's last byte holds its end marker
    damaged = {"zero last byte": (bytes(b), {17})}
    b = bytearray(frame)
    b[blk + (3 if (b[blk] >> 2) & 3 < 2 else (b[blk] >> 2 & 3) + 2)] = 0xFF  # the Huffman tree header byte
    damaged["tree header"] = (bytes(b), {4, 7})
    got = walk([f for f, _ in damaged.values()], 1)
    for (name, (f, codes)), (fcs, length, deep) in zip(damaged.items(), got):
        assert deep in codes, (name, deep, ZSTD_DEEP_REASONS.get(deep))
        assert not _libzstd_ok(f, n), name


def _fuzz_frames(cases: list[int], seed: int = 20261122) -> list[tuple[int, bytes, bytes]]:
    """``(case, damaged zstd frame, undamaged frame)`` of ``dev/gpu_fuzz.py`` cases (Blosc: the damaged stream)."""
    from dev import gpu_fuzz as gf
    from gpuzarr_dist.codecs import blosc_frames as bf

    pools = gf.Pools(seed)

    def frames(chain: str, data: bytes) -> list[bytes]:
        c = gf.CHAINS[chain]
        data = data[:-4] if c["crc"] else data
        if c["comp"] == "zstd":
            return [data]
        n = int(np.prod(c["shape"])) * np.dtype(c["dtype"]).itemsize
        plan = bf.plan_frames("fuzz", np.frombuffer(data, np.uint8), [0], [len(data)], ["c/0/0"], n, n)
        return [data[s : s + k] for s, k, code in zip(plan.piece_src.tolist(), plan.piece_csize.tolist(),
                                                       plan.piece_codec.tolist()) if code == 4]

    out = []
    for i in cases:
        case = gf.make_case(seed, i, pools)
        chain = case["chain"]
        c = gf.CHAINS[chain]
        rng = np.random.default_rng([seed, i])
        opts = gf._options(chain, rng)
        raw = gf._encode(chain, gf._payload(rng, c["shape"], c["dtype"]), opts)
        for damaged, orig in zip(frames(chain, case["data"]), frames(chain, raw)):
            if damaged != orig:
                out.append((i, damaged, orig))
    return out


def test_fuzz_cases_where_nvcomp_and_libzstd_disagreed_are_flagged_in_literals_mode(walk):
    """Issue 9's GPU fuzz run: nvCOMP decoded these damaged frames to other bytes than libzstd (or libzstd rejects
    them, 2258). Each has a Huffman literal stream read past its start or with bits left over; the sequences walk
    passes them, the literals walk flags them (code 22, so the CPU decodes or rejects them); their undamaged
    frames pass."""
    found = _fuzz_frames([2017, 2258, 2799, 2958, 4699, 6059])
    assert sorted({i for i, _, _ in found}) == [2017, 2258, 2799, 2958, 4699, 6059]
    damaged, orig = [f for _, f, _ in found], [f for _, _, f in found]
    assert [r[2] for r in walk(damaged, 1)] == [0] * len(found)
    assert [r[2] for r in walk(damaged, 2)] == [22] * len(found)
    assert [r[2] for r in walk(orig, 2)] == [0] * len(found)
    assert "Huffman" in ZSTD_DEEP_REASONS[22]


def test_default_zstd_check_is_literals_and_values_are_checked():
    """The default keeps damaged frames from nvCOMP's zstd decoder, which hung on frames the header walk passed
    and decoded frames with damaged literal streams to other bytes than libzstd under the sequences walk."""
    import dask

    from gpuzarr_dist.config import ZSTD_CHECKS, zstd_check
    from gpuzarr_dist.cuda.kernels import ZSTD_CHECK_MODES

    assert zstd_check() == "literals"
    assert set(ZSTD_CHECKS) == set(ZSTD_CHECK_MODES)
    for mode in ZSTD_CHECKS:
        with dask.config.set({"gpuzarr.gpu.zstd-check": mode.upper()}):
            assert zstd_check() == mode
    with dask.config.set({"gpuzarr.gpu.zstd-check": "full"}):
        with pytest.raises(ValueError, match="gpuzarr.gpu.zstd-check must be one of"):
            zstd_check()
