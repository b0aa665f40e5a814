"""GPU probe of the loopback-S3 time mean: where its time goes, and what slows its requests (session 21).

    python tools/gpu_probe_s3.py STEPS [unsharded inner256k inner1m]

Writes ``bench shards``' arrays (float32 (STEPS, 721, 1440), zstd level 0)
once under /tmp/s3p<STEPS>, starts moto's S3 server in its own process,
uploads them, and for each variant prints: the raw GETs (obstore, the bench's
concurrency) with requests in flight over time; then our time mean, its
best of RUNS, the time to open the array, to the first request, after the
last response, and the requests in flight. Options, as environment variables:

- ``DEVICE`` (auto), ``RUNS`` (3), ``CONCS`` (comma list of request limits);
- ``SETTINGS``: ``;``-separated settings, each ``key=value,...`` with
  ``block`` (``gpuzarr.remote.block-size``), ``switch`` (the interpreter's
  switch interval), ``workers`` (dask threads), ``client=threads`` (obstore's
  blocking calls on a thread pool instead of the event loop), ``keep=1``
  (whole-shard responses kept alive until the next run, so their blocks'
  threads never free them);
- ``TIMELINE=1``: per-block times (start, shard GETs issued and done,
  staging filled, end) and each block's thread CPU time; ``STAGES=1``: one
  more run with :mod:`gpuzarr_dist.runtime.stages` on;
- ``RAWLOAD=N`` / ``RAWLOADPROC=N``: the raw GETs again beside N spinning
  Python threads (the GIL shared) / processes (the cores shared);
  ``RAWSYNC=1``: raw GETs by blocking calls on threads; ``NOOURS=1``: raw only;
- ``MALLOPT=1``: glibc's mmap and trim thresholds raised first (32 MiB, 1 GiB);
- ``SMALL=1``: a (STEPS, 181, 360) array, for a quick check on the CPU.

For where the GIL goes, run it under ``py-spy record --gil --threads
--nonblocking -r 500 -f raw -- python tools/gpu_probe_s3.py ...`` and count
the block tasks' samples by their innermost gpuzarr_dist frame.
"""
import asyncio, os, sys, time, socket, logging
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import numpy as np
import dask
from gpuzarr_dist.bench.remote import _start_moto, _objects
from gpuzarr_dist.bench.shards import write_variants, _stored
from gpuzarr_dist.stores import remote as rmod
from gpuzarr_dist.array.read import from_zarr_gpu

if os.environ.get("MALLOPT") == "1":  # large blocks from malloc's heap: freed without munmap, reused without faults
    import ctypes
    _libc = ctypes.CDLL(None)
    print("mallopt", _libc.mallopt(-3, 32 << 20), _libc.mallopt(-1, 1 << 30), flush=True)  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD
steps = int(sys.argv[1])
names = sys.argv[2:] or ["unsharded", "inner256k", "inner1m"]
device = os.environ.get("DEVICE", "auto")
runs = int(os.environ.get("RUNS", "3"))
conc = int(dask.config.get("gpuzarr.remote.concurrency"))
small = os.environ.get("SMALL") == "1"
nlat, nlon = (181, 360) if small else (721, 1440)
t = time.perf_counter()
paths = write_variants(f"/tmp/s3p{steps}{'s' if small else ''}", steps, nlat, nlon, shard_t=4)
print(f"write {time.perf_counter() - t:.1f} s", flush=True)
logging.getLogger("werkzeug").setLevel(logging.ERROR)
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
server = _start_moto(port, False)
endpoint = f"http://127.0.0.1:{port}"
opts = {"endpoint_url": endpoint, "key": "bench", "secret": "bench", "region": "us-east-1"}
import boto3
s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="bench", aws_secret_access_key="bench", region_name="us-east-1")
s3.create_bucket(Bucket="bench")
t = time.perf_counter()
for name in names:
    for key in _objects(paths[name]):
        s3.upload_file(os.path.join(paths[name], *key.split("/")), "bench", f"{name}.zarr/{key}")
print(f"upload {time.perf_counter() - t:.1f} s", flush=True)

log = []
orig = rmod.ObjectChunkStore._get


async def _get(self, key, rng):
    t0 = time.perf_counter()
    r = await orig(self, key, rng)
    log.append((t0, time.perf_counter(), 0 if r is None else len(memoryview(r).cast("B"))))
    return r

rmod.ObjectChunkStore._get = _get

# prototype: sync obstore calls on a pool of threads (the GIL released while each waits), instead of the asyncio loop
from concurrent.futures import ThreadPoolExecutor
_gpool = {}
def _sync_get(self, key, rng):
    import obstore
    options = {}
    if rng is not None:
        off, n = rng
        options["range"] = {"suffix": -off} if off < 0 else (off, off + n)
    t0 = time.perf_counter()
    try:
        r = obstore.get(self.store, key, options=options or None).bytes()
    except FileNotFoundError:
        r = None
    log.append((t0, time.perf_counter(), 0 if r is None else len(memoryview(r).cast("B"))))
    return r
def _spool():
    n = int(dask.config.get("gpuzarr.remote.concurrency"))
    if n not in _gpool:
        _gpool[n] = ThreadPoolExecutor(n, thread_name_prefix="gz-get")
    return _gpool[n]
def read_many_sync(self, keys):
    return list(_spool().map(lambda k: _sync_get(self, k, None), keys))
def read_ranges_sync(self, reqs):
    return list(_spool().map(lambda r: _sync_get(self, r.key, (r.offset, r.length)), reqs))
async_impl = (rmod.ObjectChunkStore.read_many, rmod.ObjectChunkStore.read_ranges)
def use_client(kind):
    rmod.ObjectChunkStore.read_many, rmod.ObjectChunkStore.read_ranges = (
        (read_many_sync, read_ranges_sync) if kind == "threads" else async_impl)

# per-block timeline: entry, shard GETs issued/done, staging filled, exit
from gpuzarr_dist.runtime import stages
try:
    from gpuzarr_dist.cuda import blocks as reader_gpu
except ImportError:
    reader_gpu = None
from gpuzarr_dist.stores import sharded as shmod
blocks_log = {}
import threading
real_plan = reader_gpu.read_plan_gpu if reader_gpu is not None else None
def plan_wrapped(reader, plan):
    rec = blocks_log.setdefault(threading.get_ident(), [])
    row = {"start": time.perf_counter(), "cpu0": time.thread_time()}
    rec.append(row)
    try:
        return real_plan(reader, plan)
    finally:
        row["end"] = time.perf_counter()
        row["cpu"] = time.thread_time() - row["cpu0"]

if reader_gpu is not None:
    reader_gpu.read_plan_gpu = plan_wrapped
real_whole = shmod.ShardedChunkStore._read_whole_shards
def whole_wrapped(self, *a, **k):
    row = blocks_log.get(threading.get_ident(), [{}])[-1]
    row["get0"] = time.perf_counter()
    r = real_whole(self, *a, **k)
    row["get1"] = time.perf_counter()
    if KEEP[0]:
        kept.extend(v[1] for v in r.values())  # freed by the main thread between runs, not by the block's thread
    return r
shmod.ShardedChunkStore._read_whole_shards = whole_wrapped
KEEP = [False]
kept = []
real_ri = shmod.ShardedChunkStore.read_into
def ri_wrapped(self, *a, **k):
    r = real_ri(self, *a, **k)
    blocks_log.get(threading.get_ident(), [{}])[-1]["staged"] = time.perf_counter()
    return r
shmod.ShardedChunkStore.read_into = ri_wrapped


def timeline(t0):
    rows = sorted((r for v in blocks_log.values() for r in v), key=lambda r: r["start"])
    f = lambda r, k: f"{(r[k] - t0) * 1e3:5.0f}" if k in r else "    -"
    print("   block: start get0 get1 staged end (ms from run start), thread CPU ms", flush=True)
    for r in rows:
        print("   " + " ".join(f(r, k) for k in ("start", "get0", "get1", "staged", "end")) + f"  cpu {r.get('cpu', 0) * 1e3:5.1f}", flush=True)
    print(f"   blocks' thread CPU in all: {sum(r.get('cpu', 0) for r in rows) * 1e3:.0f} ms", flush=True)


def raw(client, keys, conc):
    import obstore
    ev = []

    async def go():
        sem = asyncio.Semaphore(conc)

        async def one(k):
            async with sem:
                t0 = time.perf_counter()
                r = await obstore.get_async(client, k)
                n = len(await r.bytes_async())
                ev.append((t0, time.perf_counter(), n))

        await asyncio.gather(*(one(k) for k in keys))
    t0 = time.perf_counter()
    asyncio.run(go())
    return time.perf_counter() - t0, ev, t0


def describe(label, total, ev, t0):
    if not ev:
        print(f"  {label}: no requests", flush=True)
        return
    a = np.array(ev)
    s, e = a[:, 0] - t0, a[:, 1] - t0
    first, last = s.min(), e.max()
    # mean requests in flight between first start and last end
    grid = np.linspace(first, last, 400)
    infl = ((s[None, :] <= grid[:, None]) & (e[None, :] > grid[:, None])).sum(1)
    dur = e - s
    big = a[:, 2] > 65536
    print(f"  {label}: total {total * 1e3:.0f} ms; requests {len(a)} ({big.sum()} > 64 KiB), first start {first * 1e3:.0f} ms, "
          f"last end {last * 1e3:.0f} ms, tail {(total - last) * 1e3:.0f} ms; in flight mean {infl.mean():.1f} "
          f"(deciles {' '.join(str(int(v)) for v in np.percentile(infl, [10, 30, 50, 70, 90]))}); "
          f"request ms median {np.median(dur) * 1e3:.0f} p90 {np.percentile(dur, 90) * 1e3:.0f}; "
          f"MB {a[:, 2].sum() / 1e6:.0f}", flush=True)


def _spin_proc(ev):
    while not ev.is_set():
        sum(range(2000))


def one_variant(name, conc):
    stored = _stored(paths[name])
    keys = [f"{name}.zarr/{k}" for k in _objects(paths[name]) if not k.endswith("zarr.json")]
    client = ObjectChunkStore("s3://bench", storage_options=opts).store
    print(f"=== {name}, concurrency {conc}", flush=True)
    raws = [raw(client, keys, conc) for _ in range(runs)]
    tr, ev, t0 = min(raws, key=lambda r: r[0])
    print(f"{name}: stored {stored / 1e6:.0f} MB, {len(keys)} objects; raw best {tr * 1e3:.0f} ms = {stored / tr / 1e9:.2f} GB/s", flush=True)
    describe("raw", tr, ev, t0)
    load = int(os.environ.get("RAWLOAD", "0"))
    if load:
        stop = [False]
        def spin():
            while not stop[0]:
                sum(range(200))
        ths = [threading.Thread(target=spin, daemon=True) for _ in range(load)]
        [t.start() for t in ths]
        try:
            rl = [raw(client, keys, conc) for _ in range(runs)]
            st = ObjectChunkStore("s3://bench", storage_options=opts)
            rs = []
            for _ in range(runs):
                t1 = time.perf_counter(); read_many_sync(st, keys); rs.append(time.perf_counter() - t1)
        finally:
            stop[0] = True
            [t.join() for t in ths]
        tl, evl, t0l = min(rl, key=lambda r: r[0])
        print(f"  raw with {load} Python threads spinning: best {tl * 1e3:.0f} ms ({tr / tl:.0%} of raw)", flush=True)
        print(f"  raw by sync calls on {conc} threads, {load} Python threads spinning: best {min(rs) * 1e3:.0f} ms ({tr / min(rs):.0%} of raw)", flush=True)
        describe("raw+load", tl, evl, t0l)
    if os.environ.get("RAWSYNC") == "1":
        st = ObjectChunkStore("s3://bench", storage_options=opts)
        rs = []
        for _ in range(runs):
            t1 = time.perf_counter(); read_many_sync(st, keys); rs.append(time.perf_counter() - t1)
        print(f"  raw by sync calls on {conc} threads, no load: best {min(rs) * 1e3:.0f} ms ({tr / min(rs):.0%} of raw)", flush=True)
    nproc = int(os.environ.get("RAWLOADPROC", "0"))
    if nproc:
        import multiprocessing as mp
        ctx = mp.get_context("fork")
        ev_stop = ctx.Event()
        procs = [ctx.Process(target=_spin_proc, args=(ev_stop,), daemon=True) for _ in range(nproc)]
        [p.start() for p in procs]
        time.sleep(2)
        try:
            rp = [raw(client, keys, conc) for _ in range(runs)]
        finally:
            ev_stop.set()
            [p.join() for p in procs]
        tp, evp, t0p = min(rp, key=lambda r: r[0])
        print(f"  raw with {nproc} processes spinning (CPU load, no shared GIL): best {tp * 1e3:.0f} ms ({tr / tp:.0%} of raw)", flush=True)
    if os.environ.get("NOOURS") == "1":
        return
    url = f"s3://bench/{name}.zarr"
    for setting in os.environ.get("SETTINGS", "block=128 MiB").split(";"):
        kv = dict(x.split("=", 1) for x in setting.split(","))
        b = kv.get("block", "128 MiB")
        sw = float(kv.get("switch", "0.005"))
        workers = int(kv.get("workers", "16"))
        KEEP[0] = kv.get("keep", "0") == "1"
        use_client(kv.get("client", "asyncio"))
        sys.setswitchinterval(sw)
        print(f" setting {setting}", flush=True)
        with dask.config.set({"gpuzarr.remote.block-size": b}):
            x = from_zarr_gpu(url, device=device, storage_options=opts)
            print(f" block-size {b}: blocks {x.numblocks} of {x.chunksize}", flush=True)
            with dask.config.set(scheduler="threads", num_workers=workers):
                float(x.mean(axis=0).compute()[0, 0])  # warm
                res = []
                for _ in range(runs):
                    log.clear()
                    blocks_log.clear()
                    kept.clear()
                    t0 = time.perf_counter()
                    x = from_zarr_gpu(url, device=device, storage_options=opts)
                    t_open = time.perf_counter() - t0
                    float(x.mean(axis=0).compute()[0, 0])
                    tot = time.perf_counter() - t0
                    res.append((tot, t_open, list(log), t0, {k: list(v) for k, v in blocks_log.items()}))
            tot, t_open, ev, t0, bl = min(res, key=lambda r: r[0])
            print(f"  ours: best {tot * 1e3:.0f} ms = {tr / tot:.0%} of raw (all: {' '.join(f'{r[0] * 1e3:.0f}' for r in res)}); open {t_open * 1e3:.0f} ms", flush=True)
            describe("ours", tot, ev, t0)
            if os.environ.get("TIMELINE") == "1" and name != "unsharded":
                blocks_log.clear(); blocks_log.update(bl)
                timeline(t0)
            if os.environ.get("STAGES") == "1":
                stages.reset(); stages.enable()
                with dask.config.set(scheduler="threads", num_workers=16):
                    t1 = time.perf_counter()
                    float(from_zarr_gpu(url, device=device, storage_options=opts).mean(axis=0).compute()[0, 0])
                    t1 = time.perf_counter() - t1
                stages.enable(False)
                print(f"  stages (one run with stage timing, {t1 * 1e3:.0f} ms):", flush=True)
                print(stages.format_stages(stages.snapshot()), flush=True)
    sys.setswitchinterval(0.005)


from gpuzarr_dist.stores.remote import ObjectChunkStore
try:
    for name in names:
        for c in [int(c) for c in os.environ.get("CONCS", str(conc)).split(",")]:
            with dask.config.set({"gpuzarr.remote.concurrency": c}):
                one_variant(name, c)
finally:
    server.stop()
