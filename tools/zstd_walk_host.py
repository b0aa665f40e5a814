"""The zstd frame walk of ``gpuzarr_dist.codecs.kernels`` (``ZSTD_FRAMES_SRC``), built for the host.

The CUDA source is plain C apart from the CUDA markers, so a host C++
compiler (with AddressSanitizer and UBSan where it has them, so that a read
outside a frame fails the run) builds the very source the GPU runs. One
process walks many frames read from stdin, each in its own exact-size heap
buffer. Used by ``tests/test_zstd_walk.py`` and ``tools/gpu_replay_zstd.py``;
no GPU needed::

    from zstd_walk_host import build_walk, run_walk
    exe = build_walk("/tmp/zw")                 # None without g++ / clang++
    run_walk(exe, [frame], mode=1)              # -> [(stated size, frame length, deep code)]
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpuzarr_dist.codecs.kernels import ZSTD_FRAMES_SRC  # noqa: E402

HARNESS = r"""
#include <cstdio>
#include <cstdlib>
struct D { unsigned int x; };
static D blockIdx, threadIdx, blockDim;
#define __global__
#define __device__ static
""" + ZSTD_FRAMES_SRC + r"""
int main(int argc, char** argv) {
    unsigned int n;
    int mode = argc > 1 ? atoi(argv[1]) : 0;
    blockDim.x = 1; threadIdx.x = 0; blockIdx.x = 0;
    while (fread(&n, 4, 1, stdin) == 1) {
        unsigned char* buf = (unsigned char*)malloc(n ? n : 1);
        if (n && fread(buf, 1, n, stdin) != n) return 2;
        long long off = 0, size = n, fcs, len; int deep;
        zstd_frames(buf, &off, &size, 1, &fcs, &len, &deep, mode);
        printf("%lld %lld %d\n", fcs, len, deep);
        free(buf);
    }
    return 0;
}
"""

SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]


def build_walk(folder: str, sanitize: bool = True, opt: str = "-O1") -> str | None:
    """Compile the walk into ``folder``; its path, or ``None`` where no C++ compiler is installed.

    With ``sanitize``, AddressSanitizer and UBSan are tried first and the
    plain build is the fallback. Raises ``RuntimeError`` if the source does
    not compile at all.
    """
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        return None
    os.makedirs(folder, exist_ok=True)
    src, exe = os.path.join(folder, "walk.cpp"), os.path.join(folder, "walk")
    with open(src, "w") as f:
        f.write(HARNESS)
    errors = ""
    for flags in ([SANITIZE, []] if sanitize else [[]]):
        r = subprocess.run([cxx, opt, "-g", *flags, "-o", exe, src], capture_output=True, text=True)
        if r.returncode == 0:
            return exe
        errors = r.stderr
    raise RuntimeError(f"the zstd walk's kernel source does not compile as C++:\n{errors[-4000:]}")


def run_walk(exe: str, frames: list[bytes], mode: int = 0, timeout: float = 300) -> list[tuple[int, int, int]]:
    """``(stated size, frame length, deep code)`` of each frame, walked in ``mode`` (0 headers, 1 sequences, 2 literals)."""
    payload = b"".join(struct.pack("<I", len(f)) + f for f in frames)
    r = subprocess.run([exe, str(mode)], input=payload, capture_output=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"the host walk failed ({r.returncode}): {r.stderr.decode(errors='replace')[-4000:]}")
    return [tuple(map(int, line.split())) for line in r.stdout.decode().splitlines()]
