"""``gpuzarr-dist bench shards``: sharded against unsharded, and random windows.

(a) The time mean of the same ERA5-like data stored unsharded (one chunk per
    time step) and sharded (inner chunks of 256 KiB and 1 MiB), through
    gpuzarr-dist: target, sharded at least as fast as unsharded.
(b) Random windows of (4, 128, 128) from the sharded (T, 721, 1440) array, the
    ML access pattern: windows per second through :class:`~gpuzarr_dist.WindowSampler`
    (calls of an eighth, a half and all of ``--batch`` windows), zarr-python
    (one ``a[box]`` per window) and tensorstore (as many reads issued together,
    then awaited, as our row has windows in flight; as it opens by default, and
    with a fresh chunk cache per group), in the same run on the same files:
    targets 5x zarr-python and 2x tensorstore.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable

import numpy as np

from gpuzarr_dist.bench.files import data_folder
from gpuzarr_dist.bench.report import Row, best_of, format_table, save

OURS = "gpuzarr-dist, sharded 256 KiB inner chunks"
#: the chunk cache of tensorstore's cached rows: more than a group of windows here decodes (the whole array is 0.8 GB)
TS_CACHE = 4 << 30


def write_variants(root: str, steps: int, nlat: int, nlon: int, shard_t: int) -> dict[str, str]:
    """The same float32 (steps, nlat, nlon) data, zstd level 0: unsharded and sharded (256 KiB / 1 MiB inner chunks)."""
    import zarr
    import zarr.codecs as zc

    from gpuzarr_dist.synthetic import Field

    paths = {k: os.path.join(root, f"{k}.zarr") for k in ("unsharded", "inner256k", "inner1m")}
    if all(os.path.exists(os.path.join(p, "zarr.json")) and os.path.exists(os.path.join(p, ".complete")) for p in paths.values()):
        return paths
    field = Field(7, nlat, nlon)
    zstd = zc.ZstdCodec(level=0)
    arrays = {
        "unsharded": zarr.create_array(paths["unsharded"], shape=(steps, nlat, nlon), dtype="float32",
                                       chunks=(1, nlat, nlon), compressors=zstd, overwrite=True),
    }
    for name, side in (("inner256k", 256), ("inner1m", 512)):
        side = min(side, nlat, nlon)
        shard = (shard_t, -(-nlat // side) * side, -(-nlon // side) * side)
        arrays[name] = zarr.create_array(paths[name], shape=(steps, nlat, nlon), dtype="float32", chunks=shard,
                                         compressors=None, overwrite=True,
                                         serializer=zc.ShardingCodec(chunk_shape=(1, side, side), codecs=[zc.BytesCodec(), zstd]))
    for t0 in range(0, steps, shard_t):
        slab = np.stack([field.step(t) for t in range(t0, min(steps, t0 + shard_t))])
        for a in arrays.values():
            a[t0 : t0 + len(slab)] = slab
    for p in paths.values():
        open(os.path.join(p, ".complete"), "w").close()
    return paths


def _stored(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(path) for n in ns if n not in ("zarr.json", ".complete"))


def _mean(path: str, device: str, threads: int) -> Callable[[], None]:
    import dask

    from gpuzarr_dist.array.read import from_zarr_gpu

    def run() -> None:
        x = from_zarr_gpu(path, device=device)
        with dask.config.set(scheduler="threads", num_workers=threads):
            float(x.mean(axis=0).compute()[0, 0])

    return run


def call_sizes(batch: int) -> list[int]:
    """The windows per call of the one-call-at-a-time rows: an eighth, a half and all of ``batch``."""
    return sorted({max(1, batch // 8), max(1, batch // 2), batch})


def window_rates(path: str, device: str, window: tuple[int, ...], n: int, batch: int, seed: int = 0,
                 in_flight: int = 2) -> tuple[list[tuple[str, float, str]], dict]:
    """Windows per second for each tool on the same random windows, ``[(name, windows/s, note)]``, and
    the stage times (:mod:`..stages`) of our timed calls of ``batch`` windows made one at a time.

    Ours one call at a time with each of :func:`call_sizes` windows per call,
    then ``batch`` windows in flight as :meth:`WindowSampler.batches` of
    ``in_flight`` calls of ``batch // in_flight``; tensorstore with as many
    reads in flight as each of our rows has windows in flight, as it opens by
    default (no chunk cache: each read decodes its own chunks) and with a
    chunk cache shared by the reads of one group only (a fresh cache pool per
    group, so a chunk that windows of a group share is decoded once, as our
    call decodes it once, and nothing carries over from group to group).
    """
    import zarr

    from gpuzarr_dist.array.windows import WindowSampler
    from gpuzarr_dist.runtime import stages

    sampler = WindowSampler(path, window, device=device)
    sizes = call_sizes(batch)
    n = max(n, batch)
    starts = sampler.random_starts(n, rng=seed)
    out = []

    def ours(size: int, at: np.ndarray) -> None:
        for i in range(0, len(at), size):
            w = sampler.sample(at[i : i + size])
        float(w[0, 0, 0, 0])

    stage_times: dict = {}
    for k, size in enumerate(sizes):
        ours(size, sampler.random_starts(n, rng=seed + 100 + k))  # warm: the cut kernel, staging of this size
        if size == batch:
            stages.reset()  # the stage table is of the timed calls of the largest size
            stages.enable()
        t0 = time.perf_counter()
        ours(size, starts)  # read for the first time by this row (each row reads the same windows)
        t = time.perf_counter() - t0
        if size == batch:
            stage_times = stages.snapshot()
            stages.enable(False)  # the other rows run without the stage timer's synchronisations
        out.append((f"gpuzarr-dist WindowSampler, {size} windows per call", n / t, f"{device}; {size} windows in flight"))
    part = batch // in_flight
    if in_flight > 1 and part >= 1:
        def prefetched(at: np.ndarray) -> None:
            for w in sampler.batches((at[i : i + part] for i in range(0, len(at), part)), in_flight=in_flight):  # noqa: B007  (the last batch is read below)
                pass
            float(w[0, 0, 0, 0])

        # warm, as the calls one at a time were: the sampler's threads for this many calls in flight, their
        # streams, and a pinned staging buffer for each call at once (a new one took 100-250 ms to pin)
        prefetched(sampler.random_starts(n, rng=seed + 3))
        t0 = time.perf_counter()
        prefetched(starts)
        t = time.perf_counter() - t0
        out.append((f"gpuzarr-dist WindowSampler.batches, {in_flight} calls of {part} in flight", n / t,
                    f"{part * in_flight} windows in flight"))
    a = zarr.open_array(path, mode="r")
    m = min(n, 64 if device == "cpu" else 256)

    def zp() -> None:
        for s in starts[:m]:
            a[tuple(slice(int(v), int(v) + w) for v, w in zip(s, window))]

    t = best_of(zp, 1)
    out.append(("zarr-python a[window], one per call", m / t, f"{m} windows"))
    try:
        import tensorstore as ts
    except ImportError:
        return out, stage_times
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": path}}
    plain = ts.open(spec, read=True).result()

    def tsr(group: int, cached: bool) -> None:
        for i in range(0, n, group):
            arr = plain
            if cached:  # a fresh cache for this group only
                arr = ts.open(spec, read=True, context=ts.Context({"cache_pool": {"total_bytes_limit": TS_CACHE}})).result()
            futs = [arr[tuple(slice(int(v), int(v) + w) for v, w in zip(s, window))].read() for s in starts[i : i + group]]
            for f in futs:
                f.result()

    for size in sizes:
        for cached in (False, True):
            t = best_of(lambda: tsr(size, cached), 1)
            out.append((f"tensorstore{' with a chunk cache per group' if cached else ''}, {size} reads in flight",
                        n / t, "" if not cached else "shared decodes within a group"))
    return out, stage_times


def window_ratios(rates: list[tuple[str, float, str]], batch: int, in_flight: int) -> list[str]:
    """Lines comparing our rows with tensorstore's at equal windows in flight, and with zarr-python."""
    by_name = {name: rate for name, rate, _ in rates}
    lines = []
    for size in call_sizes(batch):
        ours = by_name.get(f"gpuzarr-dist WindowSampler, {size} windows per call")
        plain = by_name.get(f"tensorstore, {size} reads in flight")
        cached = by_name.get(f"tensorstore with a chunk cache per group, {size} reads in flight")
        if ours and plain and cached:
            target = " (target >= 2)" if size == batch else ""
            lines.append(f"{size} windows in flight: WindowSampler ({size} per call) / tensorstore {ours / plain:.2f}x{target}; "
                         f"/ tensorstore with a chunk cache per group {ours / cached:.2f}x")
    ahead = by_name.get(f"gpuzarr-dist WindowSampler.batches, {in_flight} calls of {batch // in_flight} in flight")
    plain = by_name.get(f"tensorstore, {batch} reads in flight")
    if ahead and plain:
        lines.append(f"{batch} windows in flight as {in_flight} calls: WindowSampler.batches / tensorstore {ahead / plain:.2f}x")
    ours = by_name.get(f"gpuzarr-dist WindowSampler, {batch} windows per call")
    zp = by_name.get("zarr-python a[window], one per call")
    if ours and zp:
        lines.append(f"WindowSampler ({batch} per call) / zarr-python {ours / zp:.2f}x (target >= 5)")
    return lines


def run(args) -> int:
    """Entry point of ``gpuzarr-dist bench shards``."""
    from gpuzarr_dist.cuda.device import gpu_status, resolve_device

    device = resolve_device(getattr(args, "device", "auto") or "auto")
    quick = bool(getattr(args, "quick", False))
    threads = int(getattr(args, "threads", None) or min(16, os.cpu_count() or 1))
    steps = getattr(args, "time_steps", None) or (8 if quick else (192 if device == "gpu" else 32))
    nlat, nlon = (181, 360) if quick else (721, 1440)
    window = (4, 64, 64) if quick else (4, 128, 128)
    n_windows = getattr(args, "windows", None) or (128 if quick else 8192)
    batch = getattr(args, "batch", None) or (32 if quick else 2048)
    in_flight = getattr(args, "in_flight", None) or 2
    repeat = 1 if quick else 3
    out_dir = getattr(args, "out", None) or "bench-results"
    with data_folder(getattr(args, "path", None), "gpuzarr-bench-shards-") as root:
        paths = write_variants(root, steps, nlat, nlon, shard_t=4)
        nbytes = steps * nlat * nlon * 4
        print(f"array: float32 ({steps}, {nlat}, {nlon}), zstd level 0, {nbytes / 1e9:.2f} GB decompressed; "
              f"stored: " + ", ".join(f"{k} {_stored(p) / 1e9:.2f} GB" for k, p in paths.items()))
        print(f"device: {device} ({gpu_status()[1]}); {threads} threads; {platform.node()}; files in the page cache")
        names = {"inner256k": OURS, "inner1m": "gpuzarr-dist, sharded 1 MiB inner chunks",
                 "unsharded": "gpuzarr-dist, unsharded (1, 721, 1440) chunks" if not quick else "gpuzarr-dist, unsharded"}
        from gpuzarr_dist.runtime import stages

        rows, stage_tables = [], []
        for k, p in paths.items():
            stages.enable()
            stages.reset()
            rows.append(Row(names[k], "warm", best_of(_mean(p, device, threads), repeat), nbytes))
            stage_tables.append((names[k], stages.snapshot()))
            stages.enable(False)
        print("(a) time mean, sharded against unsharded")
        print(format_table(rows, OURS))
        for name, st in stage_tables:
            print(f"  stages of {name} ({repeat + 1} runs; a call is one block; seconds summed over threads):")
            print(stages.format_stages(st))
        un = next(r for r in rows if r.name == names["unsharded"])
        for r in rows:
            if r is not un:
                print(f"    {r.name}: {r.gbps / un.gbps:.2f}x the unsharded rate (target >= 1)")
        print(f"(b) random windows {window} of the sharded array (256 KiB inner chunks), {max(n_windows, batch)} windows a row")
        rates, st = window_rates(paths["inner256k"], device, window, n_windows, batch, in_flight=in_flight)
        print(f"  stages of our calls of {batch} windows, one at a time (the sharded store's stages are inside "
              "'read + decode'):")
        print(stages.format_stages(st))
        print("  fairness: tensorstore gets as many reads in flight as each of our rows has windows in flight; "
              "'with a chunk cache per group' gives it a fresh cache pool per group of reads")
        ours = next(rate for name, rate, _ in rates if name == f"gpuzarr-dist WindowSampler, {batch} windows per call")
        for name, rate, note in rates:
            print(f"    {name:<62} {rate:10.1f} windows/s   ours ({batch} per call)/this {ours / rate:6.2f}   {note}")
        for line in window_ratios(rates, batch, in_flight):
            print("    " + line)
        wbytes = int(np.prod(window)) * 4
        rows += [Row(name, "warm", 1.0 / rate, wbytes, note=f"{rate:.1f} windows/s") for name, rate, _ in rates]
        meta = {"device": device, "threads": threads, "time_steps": steps, "grid": [nlat, nlon], "window": list(window),
                "windows": n_windows, "batch": batch, "in_flight": in_flight, "quick": quick, "host": platform.node(),
                "windows_per_s": {name: rate for name, rate, _ in rates}}
        written = save(rows, out_dir, "bench-shards", f"sharded vs unsharded, random windows, {device}", meta)
        print("saved:", ", ".join(written))
    return 0
