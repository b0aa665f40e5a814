"""GPU probe: inside each read turn of a dask time mean (local files): the I/O threads' ``preadv`` calls, how busy
each thread was, the gaps between turns, and the time after the last turn (session 23's README tables).

Per run: the total, when the first read turn began, when the last ended, the time after it, the turns' sum and
the gaps between them; per turn (sharded arrays): its calls, threads, first call and last end against the turn,
the busiest and the mean thread's time in calls, and the bytes.

    STEPS=960 RUNS=3 VARIANTS=unsharded,inner256k python tools/gpu_probe_turn_reads.py
    SET=gpuzarr.gpu.plan-turns=false python tools/gpu_probe_turn_reads.py

Environment: STEPS (960), RUNS (3), ROOT (/tmp/gap), VARIANTS (unsharded,inner256k), SET (``key=value,...``
dask settings for every run). Without a GPU it stops at the first block (``device="gpu"``).
"""
import os, sys, threading, time
import dask
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
steps = int(os.environ.get("STEPS", 960)); runs = int(os.environ.get("RUNS", 3)); root = os.environ.get("ROOT", "/tmp/gap")
names = os.environ.get("VARIANTS", "unsharded,inner256k").split(",")
setting = dict(kv.split("=", 1) for kv in os.environ.get("SET", "").split(",") if kv)
import gpuzarr_dist.cuda.blocks as rg
import gpuzarr_dist.stores.local as lo
from gpuzarr_dist.bench.shards import _mean, write_variants
paths = write_variants(root, steps, 721, 1440, shard_t=4)
turns, calls = [], []
lock = threading.Lock()
real_slot, real_pv = rg.read_slot, lo.preadv_table
class slot:
    def __init__(self, n, kind="read"): self.cm = real_slot(n, kind); self.kind = kind
    def __enter__(self):
        self.cm.__enter__(); self.t = time.perf_counter()
    def __exit__(self, *a):
        t = time.perf_counter()
        if self.kind == "read":
            with lock: turns.append((self.t, t))
        return self.cm.__exit__(*a)
def pv(fd, table, offset):
    t = time.perf_counter(); r = real_pv(fd, table, offset); e = time.perf_counter()
    with lock: calls.append((threading.get_ident(), t, e, r or 0))
    return r
rg.read_slot = slot; lo.preadv_table = pv
with dask.config.set(setting):
    for name in names:
        mean = _mean(paths[name], "gpu", 16)  # bench shards' time mean, 16 threads
        mean()
        for r in range(runs):
            turns.clear(); calls.clear()
            t0 = time.perf_counter(); mean(); t1 = time.perf_counter()
            ms = lambda t: (t - t0) * 1e3
            ts = sorted(turns)
            print(f"{name} run {r}: {ms(t1):.0f} ms; first turn in {ms(ts[0][0]):.1f}, last out {ms(ts[-1][1]):.1f}, tail {ms(t1) - ms(ts[-1][1]):.1f}; "
                  f"turns sum {sum(b - a for a, b in ts) * 1e3:.1f}, gaps between turns sum {sum(ts[i+1][0] - ts[i][1] for i in range(len(ts)-1)) * 1e3:.1f}", flush=True)
            for a, b in ts:
                c = [x for x in calls if a <= x[1] <= b]
                if not c:
                    print(f"   turn {ms(a):6.1f}-{ms(b):6.1f} dur {1e3*(b-a):5.1f}"); continue
                busy = {}
                for tid, s, e, n in c: busy[tid] = busy.get(tid, 0) + (e - s)
                nb = sum(x[3] for x in c)
                print(f"   turn {ms(a):6.1f}-{ms(b):6.1f} dur {1e3*(b-a):5.1f}  calls {len(c)} threads {len(busy)}  first call +{1e3*(min(x[1] for x in c)-a):4.1f}"
                      f"  last end -{1e3*(b-max(x[2] for x in c)):4.1f}  busy max {1e3*max(busy.values()):5.1f} mean {1e3*sum(busy.values())/len(busy):5.1f}"
                      f"  call ms min/med/max {1e3*min(x[2]-x[1] for x in c):.1f}/{1e3*sorted(x[2]-x[1] for x in c)[len(c)//2]:.1f}/{1e3*max(x[2]-x[1] for x in c):.1f}  {nb/1e6:.0f} MB", flush=True)
