"""Where one nvCOMP zstd decode call through the C API spends its time: host time of each step, GPU time.

For frames of 256 KiB (the inner chunks of ``bench shards``) and of 2 MB,
8 to 4096 of them a call, it times ``GetTempSize``, the scratch allocation,
the ``DecompressAsync`` call's return, and the stream synchronisation on the
host, and the GPU time between two events around the call. It also prints
the scratch nvCOMP asks for per decoded byte.

Measured on an H200 (session 18, nvCOMP 6.0): the call returns in 30-75 us
and the GPU time is 7.7 ms for 8 frames of 256 KiB, 8.4 for 64, 9.3 for 256,
10.6 for 1024 and 21.2 for 4096 (0.3 / 2.0 / 7.2 / 25.4 / 50.6 GB/s);
11.6 ms for 8 frames of 2 MB, 12.0 for 64, 15.7 for 256. So every call costs
at least 7.7 ms of GPU time, whatever its size. Calls on several streams
overlap it (session 15: 16 threads of 56-frame calls reached 72.8 GB/s).
The scratch was 3.05 bytes per decoded byte in every case: the figure
``gpuzarr_dist.cubed`` puts in ``reserved_mem``.

    python3 tools/gpu_probe_nvcomp_latency.py
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import ctypes  # noqa: E402
import time

import cupy
import numcodecs
import numpy as np

from gpuzarr_dist.cuda import nvcomp as nvcomp_c
from gpuzarr_dist.demo import _Field
from gpuzarr_dist.cuda.streams import thread_stream
a = nvcomp_c.api("Zstd")
f = _Field(7, 721, 1440)
zs = numcodecs.Zstd(level=0)


def make(shape, count):
    out = []
    t = 0
    while len(out) < count:
        step = f.step(t); t += 1
        for i in range(0, 721 - shape[1] + 1, shape[1]):
            for j in range(0, 1440 - shape[2] + 1, shape[2]):
                out.append(zs.encode(np.ascontiguousarray(step[None, i:i + shape[1], j:j + shape[2]])))
                if len(out) >= count: return out
    return out


KINDS = {"256K": ((1, 256, 256), 4096), "2MB": ((1, 721, 720), 256)}
stream = thread_stream()
for kind, (shape, most) in KINDS.items():
    fr = make(shape, most)
    raw = int(np.prod(shape)) * 4
    print(f"{kind}: {len(fr)} frames, {np.mean([len(x) for x in fr]) / 1e3:.0f} KB stored each", flush=True)
    for n in (8, 64, 256, 1024, 4096):
        if n > most: continue
        sel = fr[:n]
        sizes = [len(x) for x in sel]
        offs = np.concatenate([[0], np.cumsum([(s + 255) // 256 * 256 for s in sizes])[:-1]]).astype(np.int64)
        buf = np.zeros(int(offs[-1] + sizes[-1]), np.uint8)
        for o, x in zip(offs, sel): buf[o:o + len(x)] = np.frombuffer(x, np.uint8)
        with stream:
            dev = cupy.asarray(buf); out = cupy.empty(n * raw, cupy.uint8)
            tables = cupy.asarray(nvcomp_c.decode_tables([dev.data.ptr + int(o) for o in offs], sizes,
                                  [out.data.ptr + i * raw for i in range(n)], [raw] * n))
            results = cupy.empty(2 * n, cupy.uint64)
        stream.synchronize()
        rows = []
        for rep in range(6):
            e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
            t0 = time.perf_counter()
            tb = ctypes.c_size_t(0)
            nvcomp_c._check(a.temp_size(n, raw, nvcomp_c._DecompressOpts(), ctypes.byref(tb), n * raw, stream.ptr), "ts")
            t1 = time.perf_counter()
            with stream:
                temp = cupy.empty(int(tb.value), cupy.uint8)
            t2 = time.perf_counter()
            e0.record(stream)
            row = tables.data.ptr
            nvcomp_c._check(a.decompress(row, row + 8 * n, row + 16 * n, results.data.ptr, n, temp.data.ptr, int(tb.value),
                                         row + 24 * n, nvcomp_c._DecompressOpts(), results.data.ptr + 8 * n, stream.ptr), "dec")
            t3 = time.perf_counter()
            e1.record(stream)
            stream.synchronize()
            t4 = time.perf_counter()
            rows.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3, cupy.cuda.get_elapsed_time(e0, e1) / 1e3, tb.value))
        r = np.median(np.array(rows[1:]), axis=0)
        st = results.get()
        assert (st[n:].view(np.int32)[:n] == 0).all() and (st[:n] == raw).all()
        print(f"  n {n:5d}: temp_size {r[0]*1e3:6.3f} ms, empty {r[1]*1e3:6.3f}, decompress call {r[2]*1e3:7.3f}, "
              f"sync {r[3]*1e3:7.3f}; GPU {r[4]*1e3:7.3f} ms; {n * raw / r[4] / 1e9:6.1f} GB/s GPU; temp {r[5]/1e6:.0f} MB "
              f"({r[5] / (n * raw):.2f} per decoded byte)", flush=True)
