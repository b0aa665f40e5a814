"""GPU probe: what a block's shard reads would cost as dense spans, inside the read turns of a time mean.

In each read turn of the 256 KiB time mean (``bench shards``' array, local files): first the same merged reads as
dense spans into a scratch pinned buffer, by kvikio (``EXTRA=kvikio``: one ``CuFile.pread`` per read, opened in
the turn) or by one ``preadv`` per read on the I/O jobs (``EXTRA=preadv1``), then the real scattered read; both
timed apart, per block (session 23: both ~13 ms per 398 MB block, as the scattered read: the turn is the host's
copy bandwidth under the mean's load, not the read's layout or its threads).

    EXTRA=kvikio STEPS=960 RUNS=3 python tools/gpu_probe_dense_reads.py

Environment: EXTRA (none, kvikio, preadv1), STEPS (960), RUNS (3), ROOT (/tmp/gap).
"""
import os, sys, threading, time, itertools
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
steps = int(os.environ.get("STEPS", 960)); runs = int(os.environ.get("RUNS", 3)); root = os.environ.get("ROOT", "/tmp/gap")
extra = os.environ.get("EXTRA", "")
import cupy
import gpuzarr_dist.stores.local as lo
from gpuzarr_dist.bench.shards import _mean, write_variants
from gpuzarr_dist.runtime.threads import io_pool, map_all
from gpuzarr_dist.config import io_threads
paths = write_variants(root, steps, 721, 1440, shard_t=4)
real = lo.LocalChunkStore.read_ranges_into
rec = []
lock = threading.Lock()
scratch = threading.local()
def buf_for(n):
    b = getattr(scratch, "b", None)
    if b is None or b.nbytes < n:
        mem = cupy.cuda.alloc_pinned_memory(n)
        scratch.mem = mem
        scratch.b = b = np.frombuffer(mem, dtype=np.uint8, count=n)
    return b
def patched(self, reads, buf, prepared=None):
    total = sum(r.length for r in reads)
    t0 = time.perf_counter()
    if extra == "kvikio":
        kvikio = lo._kvikio()
        b = buf_for(total + 4096 * len(reads))
        futs, files, pos = [], [], 0
        for r in reads:
            f = kvikio.CuFile(self.path(r.key), "r"); files.append(f)
            futs.append(f.pread(b[pos:pos + r.length], r.length, r.offset)); pos += (r.length + 4095) // 4096 * 4096
        for fu in futs: fu.get()
        for f in files: f.close()
    elif extra == "preadv1":
        b = buf_for(total + 4096 * len(reads))
        fds = self._open_all([r.key for r in reads])
        starts = np.cumsum([0] + [(r.length + 4095) // 4096 * 4096 for r in reads]).tolist()
        mv = memoryview(b)
        nxt = itertools.count()
        def job(_):
            while (i := next(nxt)) < len(reads):
                r = reads[i]; os.preadv(fds[r.key], [mv[starts[i]:starts[i] + r.length]], r.offset)
        map_all(io_pool(), job, range(min(io_threads(), len(reads))))
        self._close_own(fds)
    t1 = time.perf_counter()
    out = real(self, reads, buf, prepared)
    t2 = time.perf_counter()
    with lock: rec.append((t1 - t0, t2 - t1, total))
    return out
lo.LocalChunkStore.read_ranges_into = patched
mean = _mean(paths["inner256k"], "gpu", 16)
mean()
for r in range(runs):
    rec.clear()
    t = time.perf_counter(); mean(); el = time.perf_counter() - t
    ex = [x[0] * 1e3 for x in rec]; re = [x[1] * 1e3 for x in rec]
    print(f"EXTRA={extra or 'none'} run {r}: {el * 1e3:.0f} ms; extra read ms {' '.join(f'{v:.1f}' for v in ex)} (sum {sum(ex):.1f}); "
          f"real read ms {' '.join(f'{v:.1f}' for v in re)} (sum {sum(re):.1f})", flush=True)
