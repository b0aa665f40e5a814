"""The checksum kernels of the GPU path (gzip CRC-32, zstd XXH64), built for the host and compared with zlib and libzstd."""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib

import numpy as np
import pytest

from gpuzarr_dist.cuda.kernels import CRC32_SEGMENT, CRC32_SRC, XXH64_SRC

HARNESS = r"""
#include <cstdio>
#include <vector>
struct D { unsigned int x; };
static D blockIdx, threadIdx, blockDim;
#define __global__
#define __device__ static
#define __shared__ static
#define __syncthreads() do {} while (0)
""" + CRC32_SRC + r"""
int main() {
    long long n, nbytes, seg;
    while (fread(&n, 8, 1, stdin) == 1) {
        if (fread(&nbytes, 8, 1, stdin) != 1 || fread(&seg, 8, 1, stdin) != 1) return 2;
        std::vector<unsigned char> data(n * nbytes + 1);
        if ((long long)fread(data.data(), 1, n * nbytes, stdin) != n * nbytes) return 2;
        long long nseg = nbytes ? (nbytes + seg - 1) / seg : 1, total = n * nseg;
        std::vector<unsigned int> segs(total), out(n);
        blockDim.x = 1; threadIdx.x = 0;
        for (long long t = 0; t < total; t++) { blockIdx.x = t; crc32_segments(data.data(), nbytes, nbytes, seg, nseg, total, segs.data()); }
        for (long long i = 0; i < n; i++) { blockIdx.x = i; crc32_combine(segs.data(), nseg, seg, nbytes, (int)n, out.data()); }
        for (long long i = 0; i < n; i++) printf("%u\n", out[i]);
    }
    return 0;
}
"""


def test_segmented_crc32_equals_zlib(tmp_path):
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler to build the kernel source for the host")
    src, exe = tmp_path / "crc.cpp", tmp_path / "crc"
    src.write_text(HARNESS)
    for flags in (["-fsanitize=address,undefined", "-fno-sanitize-recover=all"], []):
        if subprocess.run([cxx, "-O1", *flags, "-o", str(exe), str(src)], capture_output=True).returncode == 0:
            break
    else:
        pytest.fail("the kernel source does not compile as C++")
    rng = np.random.default_rng(0)
    payload, expected = b"", []
    for nbytes in [0, 1, 100, 4095, 4096, 4097, 10_000, 65_536, 100_003]:
        for seg in [1, 7, CRC32_SEGMENT]:
            if nbytes > 20_000 and seg < 100:
                continue
            data = rng.bytes(3 * nbytes)
            payload += struct.pack("<qqq", 3, nbytes, seg) + data
            expected += [zlib.crc32(data[i * nbytes : (i + 1) * nbytes]) for i in range(3)]
    out = subprocess.run([str(exe)], input=payload, capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode(errors="replace")[-3000:]
    assert list(map(int, out.stdout.split())) == expected


XXH_HARNESS = r"""
#include <cstdio>
#include <cstdlib>
struct D { unsigned int x; };
static D blockIdx, threadIdx, blockDim;
#define __global__
#define __device__ static
""" + XXH64_SRC + r"""
int main() {
    long long nbytes;
    while (fread(&nbytes, 8, 1, stdin) == 1) {
        unsigned char* buf = (unsigned char*)aligned_alloc(256, (nbytes + 255) / 256 * 256 + 256);
        if ((long long)fread(buf, 1, nbytes, stdin) != nbytes) return 2;
        unsigned char wanted = 1; unsigned int out = 0;
        blockDim.x = 1; threadIdx.x = 0; blockIdx.x = 0;
        xxh64_low32(buf, 0, nbytes, 1, &wanted, &out);
        printf("%u\n", out);
        free(buf);
    }
    return 0;
}
"""


def test_xxh64_equals_the_checksums_libzstd_writes(tmp_path):
    import numcodecs

    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler to build the kernel source for the host")
    src, exe = tmp_path / "xxh.cpp", tmp_path / "xxh"
    src.write_text(XXH_HARNESS)
    for flags in (["-fsanitize=address,undefined", "-fno-sanitize-recover=all"], []):
        if subprocess.run([cxx, "-O1", *flags, "-o", str(exe), str(src)], capture_output=True).returncode == 0:
            break
    else:
        pytest.fail("the kernel source does not compile as C++")
    rng = np.random.default_rng(1)
    payload, expected = b"", []
    for n in [0, 1, 3, 4, 7, 8, 31, 32, 33, 63, 64, 100, 1000, 4096, 65_537, 300_001]:
        data = rng.bytes(n)
        frame = bytes(numcodecs.Zstd(level=1, checksum=True).encode(data))
        payload += struct.pack("<q", n) + data
        expected.append(int.from_bytes(frame[-4:], "little"))  # libzstd's low 32 bits of XXH64
    out = subprocess.run([str(exe)], input=payload, capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode(errors="replace")[-3000:]
    assert list(map(int, out.stdout.split())) == expected
