"""The deflate walk and the adler32 kernels of ``gpuzarr_dist.cuda.deflate_walk``, built for the host.

The CUDA sources are plain C apart from the CUDA markers, so a host C++
compiler (with AddressSanitizer where it has one, so that a read outside a
stream fails the run) builds the very source the GPU runs. One process
handles many streams over stdin, each in its own exact-size heap buffer.
Used by ``tests/test_deflate_walk.py``, ``tests/test_gpu_deflate.py`` and
``dev/replay_deflate.py``; no GPU needed::

    from tests.helpers.deflate_walk_host import HostKernels
    k = HostKernels.build("/tmp/dw")          # None without g++ / clang++
    k.walk([zlib.compress(b"abc")], wrap=1, limits=[3])   # -> [(3, 11)]
    k.adler32([b"abc"], seg=4096)             # -> [zlib.adler32(b"abc")]
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import threading
from collections.abc import Sequence

from gpuzarr_dist.cuda.deflate_walk import ADLER32_SRC, DEFLATE_WALK_SRC

HARNESS = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
struct D { unsigned int x; };
static D blockIdx, threadIdx, blockDim;
#define __global__
#define __device__ static
""" + DEFLATE_WALK_SRC + ADLER32_SRC + r"""
int main(int argc, char** argv) {
    // records on stdin: u32 mode (0 walk, 1 adler32), u32 n, i64 arg (walk: wrap << 56 | limit; adler32:
    // segment size), n bytes. Prints one line per record.
    unsigned int mode, n;
    long long arg;
    blockDim.x = 1; threadIdx.x = 0; blockIdx.x = 0;
    while (fread(&mode, 4, 1, stdin) == 1) {
        if (fread(&n, 4, 1, stdin) != 1 || fread(&arg, 8, 1, stdin) != 1) return 2;
        unsigned char* buf = (unsigned char*)malloc(n ? n : 1);
        if (n && fread(buf, 1, n, stdin) != n) return 2;
        long long off = 0, size = n;
        if (mode == 0) {
            int wrap = (int)(arg >> 56);
            long long limit = arg & ((1LL << 56) - 1), len, end;
            blockIdx.x = 0;
            deflate_walk(buf, &off, &size, &limit, 1, wrap, &len, &end);
            printf("%lld %lld\n", len, end);
            fflush(stdout);
        } else {
            long long seg = arg, nseg = (size + seg - 1) / seg, seg0[2] = {0, nseg};
            unsigned int* segs = (unsigned int*)malloc(8 * (nseg ? nseg : 1));
            for (long long t = 0; t < nseg; t++) {
                blockIdx.x = (unsigned int)t;
                adler32_segments(buf, &off, &size, seg0, 1, seg, nseg, segs);
            }
            unsigned int result;
            blockIdx.x = 0;
            adler32_combine(segs, &size, seg0, 1, seg, &result);
            printf("%u\n", result);
            fflush(stdout);
            free(segs);
        }
        free(buf);
    }
    return 0;
}
"""


class HostKernels:
    """The compiled harness: ``walk`` and ``adler32`` over many streams in one process."""

    def __init__(self, exe: str, sanitized: bool):
        self.exe = exe
        self.sanitized = sanitized
        self._proc: subprocess.Popen | None = None

    @classmethod
    def build(cls, folder: str, sanitize: bool = True) -> HostKernels | None:
        """Compile the harness into ``folder``; ``None`` where there is no C++ compiler."""
        cxx = shutil.which("g++") or shutil.which("clang++")
        if cxx is None:
            return None
        os.makedirs(folder, exist_ok=True)
        src, exe = os.path.join(folder, "deflate_walk.cpp"), os.path.join(folder, "deflate_walk")
        with open(src, "w") as f:
            f.write(HARNESS)
        tries = ([["-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]] if sanitize else []) + [["-O2"]]
        for flags in tries:
            r = subprocess.run([cxx, *flags, "-o", exe, src], capture_output=True, text=True)
            if r.returncode == 0:
                return cls(exe, "-fsanitize=address,undefined" in flags)
        raise RuntimeError(f"the deflate walk source does not compile as C++:\n{r.stderr[-4000:]}")

    def _run(self, payload: bytes, records: int) -> list[str]:
        """Send ``records`` records to the long-lived harness process (a writer thread feeds it) and read the answers."""
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen([self.exe], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE)
        proc = self._proc
        writer = threading.Thread(target=lambda: (proc.stdin.write(payload), proc.stdin.flush()), daemon=True)
        writer.start()
        lines = []
        for _ in range(records):
            line = proc.stdout.readline()
            if not line:
                proc.wait(timeout=60)
                self._proc = None
                raise RuntimeError(f"host kernels failed ({proc.returncode}): "
                                   f"{proc.stderr.read().decode(errors='replace')[-4000:]}")
            lines.append(line.decode())
        writer.join()
        return lines

    def close(self) -> None:
        """End the harness process."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.stdin.close()
            self._proc.wait(timeout=60)
        self._proc = None

    def walk(self, streams: Sequence[bytes], wrap: int, limits: Sequence[int] | int) -> list[tuple[int, int]]:
        """``deflate_walk`` over each stream: ``(decoded length or negative code, end of the deflate data)``."""
        if isinstance(limits, int):
            limits = [limits] * len(streams)
        payload = b"".join(struct.pack("<IIq", 0, len(s), (wrap << 56) | lim) + bytes(s) for s, lim in zip(streams, limits))
        return [tuple(map(int, line.split())) for line in self._run(payload, len(streams))]

    def adler32(self, buffers: Sequence[bytes], seg: int) -> list[int]:
        """adler32 of each buffer through ``adler32_segments`` and ``adler32_combine`` with segments of ``seg`` bytes."""
        payload = b"".join(struct.pack("<IIq", 1, len(b), seg) + bytes(b) for b in buffers)
        return [int(line) for line in self._run(payload, len(buffers))]
