"""The zstd frame walk that runs on the GPU before nvCOMP, compiled as C++ and run on the CPU.

``gpuzarr_dist.codecs.kernels.ZSTD_FRAMES_SRC`` is plain C apart from the CUDA
markers, so a host compiler (with AddressSanitizer where it has one) runs the
very source the GPU runs: one process, each frame in its own exact-size heap
buffer, so a read past a frame's end is caught. The walk must accept every
frame libzstd writes, never read outside a frame, and flag structurally
impossible frames; libzstd (through numcodecs) is the independent judge.
"""

from __future__ import annotations

import collections
import shutil
import struct
import subprocess

import numcodecs
import numpy as np
import pytest

from gpuzarr_dist.codecs.kernels import ZSTD_DEEP_REASONS, ZSTD_FRAMES_SRC

HARNESS = r"""
#include <cstdio>
#include <cstdlib>
struct D { unsigned int x; };
static D blockIdx, threadIdx, blockDim;
#define __global__
#define __device__ static
""" + ZSTD_FRAMES_SRC + r"""
int main() {
    unsigned int n;
    blockDim.x = 1; threadIdx.x = 0; blockIdx.x = 0;
    while (fread(&n, 4, 1, stdin) == 1) {
        unsigned char* buf = (unsigned char*)malloc(n ? n : 1);
        if (n && fread(buf, 1, n, stdin) != n) return 2;
        long long off = 0, size = n, fcs, len; int deep;
        zstd_frames(buf, &off, &size, 1, &fcs, &len, &deep);
        printf("%lld %lld %d\n", fcs, len, deep);
        free(buf);
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def walk(tmp_path_factory):
    """``walk(frames) -> [(stated size, frame length, deep code)]`` through the compiled kernel source."""
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler to build the kernel source for the host")
    folder = tmp_path_factory.mktemp("zstd_walk")
    src, exe = folder / "walk.cpp", folder / "walk"
    src.write_text(HARNESS)
    for flags in (["-fsanitize=address,undefined", "-fno-sanitize-recover=all"], []):
        if subprocess.run([cxx, "-O1", "-g", *flags, "-o", str(exe), str(src)], capture_output=True).returncode == 0:
            break
    else:
        pytest.fail("the kernel source does not compile as C++")

    def run(frames: list[bytes]) -> list[tuple[int, int, int]]:
        payload = b"".join(struct.pack("<I", len(f)) + f for f in frames)
        r = subprocess.run([str(exe)], input=payload, capture_output=True, timeout=300)
        assert r.returncode == 0, r.stderr.decode(errors="replace")[-4000:]
        return [tuple(map(int, line.split())) for line in r.stdout.decode().splitlines()]

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


def _device_walk(frames: list[bytes]) -> list[tuple[int, int, int]]:
    """The same walk on the GPU, through the kernel the decoder launches (frames at 256-byte aligned offsets)."""
    import cupy

    from gpuzarr_dist.codecs.gpu import _kernel
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
    _kernel("zstd_frames", ZSTD_FRAMES_SRC)(((n + 63) // 64,), (64,), (
        dev, cupy.asarray(np.asarray(offsets, dtype=np.int64)), cupy.asarray(np.asarray(sizes, dtype=np.int64)),
        np.int32(n), fcs, length, deep))
    return list(zip(fcs.get().tolist(), length.get().tolist(), deep.get().tolist()))


@pytest.mark.gpu
def test_device_walk_agrees_with_libzstd_and_with_the_host_build():
    rng = np.random.default_rng(1)
    valid, sizes = [], []
    for size in [0, 100, 65536, 300_000]:
        for make in _payloads(rng).values():
            valid.append(numcodecs.Zstd(level=3).encode(make(size)))
            sizes.append(size)
    assert _device_walk(valid) == [(s, len(f), 0) for s, f in zip(sizes, valid)]
    base = [(numcodecs.Zstd(level=lv).encode(make(n)), n) for n in (1000, 65536) for make in _payloads(rng).values() for lv in (1, 19)]
    cases = [(_mutate(rng, f), n) for f, n in (base[i] for i in rng.integers(len(base), size=2000))]
    results = _device_walk([f for f, _ in cases])
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
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is not None:  # the very same source built for the host gives the very same answers
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            src, exe = f"{tmp}/walk.cpp", f"{tmp}/walk"
            with open(src, "w") as fh:
                fh.write(HARNESS)
            subprocess.run([cxx, "-O1", "-o", exe, src], check=True)
            payload = b"".join(struct.pack("<I", len(f)) + f for f, _ in cases)
            out = subprocess.run([exe], input=payload, capture_output=True, check=True).stdout.decode().splitlines()
        assert [tuple(map(int, line.split())) for line in out] == results
