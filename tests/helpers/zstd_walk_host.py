"""The zstd frame walk of ``gpuzarr_dist.cuda.kernels`` (``ZSTD_FRAMES_SRC``), built for the host.

The CUDA source is plain C apart from the CUDA markers, so a host C++
compiler (with AddressSanitizer and UBSan where it has them, so that a read
outside a frame fails the run) builds the very source the GPU runs. One
process walks many frames read from stdin, each in its own exact-size heap
buffer. Used by ``tests/test_zstd_walk.py`` and ``dev/replay_zstd.py``;
no GPU needed::

    from tests.helpers.zstd_walk_host import build_walk, run_walk
    exe = build_walk("/tmp/zw")                 # None without g++ / clang++
    run_walk(exe, [frame], mode=1)              # -> [(stated size, frame length, deep code)]
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess

from gpuzarr_dist.cuda.kernels import ZSTD_FRAMES_SRC, ZSTD_SLOT_BYTES

#: what makes the CUDA source plain C++ (one thread: the launch indices are globals the caller sets)
PREAMBLE = r"""
#include <cstdio>
#include <cstdlib>
struct D { unsigned int x; };
static D blockIdx, threadIdx, blockDim;
#define __global__
#define __device__ static
#define __shared__ static
#define __syncthreads()
#define GZ_LIT_SLOTS 2
"""

HARNESS = PREAMBLE + "#define SLOT_BYTES %d\n" % ZSTD_SLOT_BYTES + ZSTD_FRAMES_SRC + r"""
int main(int argc, char** argv) {
    // argv[1]: the mode; argv[2]: 0 one thread per frame (zstd_frames), else the block walk
    // (zstd_plan, zstd_blocks, zstd_combine) with that many block slots per frame
    unsigned int n;
    int mode = argc > 1 ? atoi(argv[1]) : 0, cap = argc > 2 ? atoi(argv[2]) : 0;
    if (sizeof(gz_slot) != SLOT_BYTES) { fprintf(stderr, "sizeof(gz_slot) = %d\n", (int)sizeof(gz_slot)); return 3; }
    blockDim.x = 1; threadIdx.x = 0; blockIdx.x = 0;
    gz_slot* slots = (gz_slot*)malloc(sizeof(gz_slot) * (cap ? cap : 1));
    while (fread(&n, 4, 1, stdin) == 1) {
        unsigned char* buf = (unsigned char*)malloc(n ? n : 1);
        if (n && fread(buf, 1, n, stdin) != n) return 2;
        long long off = 0, size = n, fcs, len; int deep, ns;
        if (!cap) {
            zstd_frames(buf, &off, &size, 1, &fcs, &len, &deep, mode);
        } else {
            blockIdx.x = 0;
            zstd_plan(buf, &off, &size, 1, slots, cap, &ns, &fcs, &len, &deep);
            for (unsigned int t = 0; t < (unsigned int)cap; t++) {
                blockIdx.x = t;
                zstd_blocks(buf, &off, 1, slots, cap, &ns, mode);
            }
            if (mode >= 2) {  // a CUDA block's threads in order: each slot's table builder before its walkers
                blockDim.x = 4 * GZ_LIT_SLOTS;
                for (unsigned int b = 0; b * GZ_LIT_SLOTS < (unsigned int)cap; b++)
                    for (unsigned int t = 0; t < blockDim.x; t++) {
                        blockIdx.x = b; threadIdx.x = t;
                        zstd_literals(buf, &off, 1, slots, cap, &ns);
                    }
                blockDim.x = 1; threadIdx.x = 0;
            }
            blockIdx.x = 0;
            zstd_combine(buf, &off, &size, 1, slots, cap, &ns, &fcs, &len, &deep, mode);
        }
        printf("%lld %lld %d\n", fcs, len, deep);
        free(buf);
    }
    free(slots);
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


def run_walk(exe: str, frames: list[bytes], mode: int = 0, timeout: float = 300,
             blocks: int = 0) -> list[tuple[int, int, int]]:
    """``(stated size, frame length, deep code)`` of each frame, walked in ``mode`` (0 headers, 1 sequences, 2 literals).

    ``blocks`` > 0: through the block walk (plan, blocks, combine) with that
    many block slots per frame, as the decoder runs modes 1 and 2.
    """
    payload = b"".join(struct.pack("<I", len(f)) + f for f in frames)
    r = subprocess.run([exe, str(mode), str(blocks)], input=payload, capture_output=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"the host walk failed ({r.returncode}): {r.stderr.decode(errors='replace')[-4000:]}")
    return [tuple(map(int, line.split())) for line in r.stdout.decode().splitlines()]
