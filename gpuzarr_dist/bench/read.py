"""``gpuzarr-dist bench read``: the time mean of an ERA5-like array through gpuzarr-dist and,
in the same run on the same files, through the tools a user would pick instead.

Rows: the raw file-read ceiling (no decode), gpuzarr-dist, zarr-python (numpy),
zarr-python with ``zarr.config.enable_gpu()`` (GPU only), zarr-python with
zarrs' Rust codec pipeline and tensorstore when installed, and
``dask.array.from_zarr`` with threads; each warm (files in the page cache) and
cold (files dropped from it first).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np

from gpuzarr_dist.bench.files import chunk_files, data_folder, drop_page_cache, read_ceiling
from gpuzarr_dist.bench.report import Row, format_table, save

OURS = "gpuzarr-dist from_zarr_gpu().mean(0)"


def _sync(device: str) -> None:
    if device == "gpu":
        import cupy

        cupy.cuda.runtime.deviceSynchronize()


def _ours(path: str, device: str, threads: int, block: str | None = None, settings: dict | None = None) -> Callable[[], None]:
    import dask

    from gpuzarr_dist.array.read import from_zarr_gpu

    def run() -> None:
        x = from_zarr_gpu(path, device=device, chunks=block or "auto")
        with dask.config.set(settings or {}, scheduler="threads", num_workers=threads):
            m = x.mean(axis=0).compute()
        float(m[0, 0])
        _sync(device)

    return run


def _zarr_python(path: str, gpu: bool) -> Callable[[], None]:
    import zarr

    def run() -> None:
        a = zarr.open_array(path, mode="r")
        if gpu:
            with zarr.config.enable_gpu():
                v = a[:]
            float(v.mean(axis=0)[0, 0])
            _sync("gpu")
        else:
            float(a[:].mean(axis=0)[0, 0])

    return run


def _dask_from_zarr(path: str, threads: int) -> Callable[[], None]:
    import dask
    import dask.array as da

    def run() -> None:
        with dask.config.set(scheduler="threads", num_workers=threads):
            float(da.from_zarr(path).mean(axis=0).compute()[0, 0])

    return run


def _tensorstore(path: str, driver: str = "zarr3") -> Callable[[], None] | None:
    try:
        import tensorstore as ts
    except ImportError:
        return None

    def run() -> None:
        t = ts.open({"driver": driver, "kvstore": {"driver": "file", "path": path}}, open=True).result()
        float(t.read().result().mean(axis=0)[0, 0])

    return run


def _zarrs(path: str) -> Callable[[], None] | None:
    """zarr-python with zarrs' Rust codec pipeline (``codec_pipeline.path``): what a CPU user picks for speed."""
    try:
        import zarr
        import zarrs  # noqa: F401
    except ImportError:
        return None

    def run() -> None:
        with zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"}):
            a = zarr.open_array(path, mode="r")
            float(a[:].mean(axis=0)[0, 0])

    return run


def _time(fn: Callable[[], None], repeat: int, files: list[str] | None) -> float:
    """Median seconds of ``repeat`` runs; with ``files``, each run starts from a cold page cache."""
    times = []
    for _ in range(repeat):
        if files is not None:
            drop_page_cache(files)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(args) -> int:
    """Entry point of ``gpuzarr-dist bench read``; returns the exit status."""
    from gpuzarr_dist.cuda.device import resolve_device
    from gpuzarr_dist.synthetic import make_era5_like

    device = resolve_device(getattr(args, "device", "auto") or "auto")
    quick = bool(getattr(args, "quick", False))
    threads = int(getattr(args, "threads", None) or min(16, os.cpu_count() or 1))
    # 2400 steps on a GPU (9.97 GB decoded): at 1200 or fewer a warm pass takes under a quarter of a second, of
    # which the first block's read and the last blocks' decode with the GPU half idle are a large, noisy share
    steps = getattr(args, "time_steps", None) or (8 if quick else (GPU_STEPS if device == "gpu" else 48))
    repeat = 1 if quick else 3
    out_dir = getattr(args, "out", None) or "bench-results"
    given = getattr(args, "path", None)
    # --path names the zstd store; the folder it sits in holds the Blosc copy too
    with data_folder(None if given is None else os.path.dirname(os.path.abspath(given)), "gpuzarr-bench-") as root:
        path = given if given is not None else os.path.join(root, "era5.zarr")
        make_era5_like(path, steps)
        codecs = {"both": ["zstd", "blosc"]}.get(getattr(args, "codec", None) or "both", [getattr(args, "codec", None)])
        for codec in codecs:
            array_path = path
            if codec == "blosc":
                full = os.path.abspath(path)  # the Blosc copy sits next to the zstd store
                array_path = os.path.join(os.path.dirname(full), os.path.basename(full).removesuffix(".zarr") + "-blosc.zarr")
                _blosc_copy(path, array_path, steps)
            _run_one(array_path, codec, device, threads, steps, repeat, quick, out_dir, args)
            print()
    return 0


#: time steps of the array on a GPU when ``--time-steps`` is not given
GPU_STEPS = 2400

#: how each benchmark array is stored, and the file stem of its results
CODECS = {
    "zstd": ("Zarr v3, zstd level 0", "bench-read"),
    "blosc": ("Zarr v2, Blosc(cname='lz4', clevel=5, shuffle=SHUFFLE), zarr-python's format-2 default", "bench-read-blosc"),
}


def _blosc_copy(src: str, dst: str, steps: int) -> None:
    """The ERA5-like array again as Zarr format 2 with the default Blosc compressor (kept and reused)."""
    import numcodecs
    import zarr

    try:
        old = zarr.open_array(dst, mode="r")
        if old.shape[0] == steps and old.attrs.get("complete"):
            return
    except Exception:  # absent or unreadable: write it
        pass
    a = zarr.open_array(src, mode="r")
    b = zarr.create_array(dst, shape=a.shape, chunks=a.chunks, dtype=a.dtype, zarr_format=2, overwrite=True,
                          compressors=numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE),
                          fill_value=float("nan"))
    for t in range(0, steps, 8):
        b[t : t + 8] = a[t : t + 8]
    b.attrs["complete"] = True


def _run_one(path: str, codec: str, device: str, threads: int, steps: int, repeat: int, quick: bool,
             out_dir: str, args) -> None:
    """All rows for one stored array: the file-read ceiling, ours, and the alternatives, warm and cold."""
    from gpuzarr_dist.cuda.device import gpu_status

    files = chunk_files(path)
    compressed = sum(os.path.getsize(p) for p in files)
    nbytes = steps * 721 * 1440 * 4
    ratio = nbytes / compressed
    how, stem = CODECS[codec]
    print(f"array: float32 ({steps}, 721, 1440), chunks (1, 721, 1440), {how}; "
          f"{nbytes / 1e9:.2f} GB decompressed, {compressed / 1e9:.2f} GB stored (ratio {ratio:.2f})")
    from gpuzarr_dist.config import (
        deflate_check,
        gpu_decode_combine,
        gpu_read_slots,
        gpu_sync_wait,
        nvcomp_api,
        zstd_check,
    )

    # the GPU walks' depth and how threads wait for the GPU set the GPU's rate
    checks = (f"zstd check {zstd_check()}, deflate check {deflate_check()}, sync-wait {gpu_sync_wait()}, "
              f"read-slots {gpu_read_slots() or 'any'}, decode-combine {'on' if gpu_decode_combine() else 'off'}, "
              f"nvcomp-api {nvcomp_api()}")
    print(f"device: {device} ({gpu_status()[1]}); {threads} threads; {checks}; {platform.node()}")

    blocks = list(getattr(args, "block_size", None) or [None])
    flip = not gpu_decode_combine()  # --decode-combine: a row with the setting the other way round
    combine_rows = [(f"gpuzarr-dist, decode-combine {'on' if flip else 'off'}",
                     _ours(path, device, threads, blocks[0], {"gpuzarr.gpu.decode-combine": flip}))
                    ] if getattr(args, "decode_combine", False) else []
    other_api = "python" if nvcomp_api() == "c" else "c"  # --nvcomp-api: a row with nvCOMP's other interface
    api_rows = [(f"gpuzarr-dist, nvcomp-api {other_api}",
                 _ours(path, device, threads, blocks[0], {"gpuzarr.gpu.nvcomp-api": other_api}))
                ] if getattr(args, "nvcomp_api", False) else []
    candidates: list[tuple[str, Callable[[], None] | None]] = [
        (OURS, _ours(path, device, threads, blocks[0])),
        *((f"gpuzarr-dist, blocks of {b}", _ours(path, device, threads, b)) for b in blocks[1:]),
        *((f"gpuzarr-dist, read-slots {n or 'any'}", _ours(path, device, threads, blocks[0], {"gpuzarr.gpu.read-slots": n}))
          for n in (getattr(args, "read_slots", None) or [])),
        *combine_rows,
        *api_rows,
        ("zarr-python a[:].mean(0)", _zarr_python(path, gpu=False)),
        ("zarr-python enable_gpu() a[:].mean(0)", _zarr_python(path, gpu=True) if device == "gpu" else None),
        ("zarr-python + zarrs pipeline a[:].mean(0)", _zarrs(path)),
        (f"dask.array.from_zarr().mean(0), {threads} threads", _dask_from_zarr(path, threads)),
        ("tensorstore read().mean(0)", _tensorstore(path, "zarr" if codec == "blosc" else "zarr3")),
    ]
    rows: list[Row] = []
    failed: dict[str, str] = {}  # another tool that cannot read this array is reported, not fatal
    for cache in ("warm", "cold"):
        cold = files if cache == "cold" else None
        t_ceiling = min(read_ceiling(files, threads, device)[0] for _ in range(repeat)) if cold is None else None
        if cold is not None:
            drop_page_cache(files)
            t_ceiling = read_ceiling(files, threads, device)[0]
        rows.append(Row(f"ceiling: {threads}-thread file reads" + (" + copy to GPU" if device == "gpu" else ""),
                        cache, t_ceiling, nbytes, note=f"{compressed / t_ceiling / 1e9:.2f} GB/s stored bytes, no decode"))
        for name, fn in candidates:
            if fn is None or name in failed:
                continue
            try:
                if cache == "warm":
                    fn()  # warm-up: imports, CUDA context, nvCOMP handles, page cache
                rows.append(Row(name, cache, _time(fn, 1 if cold is not None else repeat, cold), nbytes))
            except Exception as e:  # noqa: BLE001 - only the other tools' rows may fail
                if name == OURS:
                    raise
                failed[name] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"
    table = format_table(rows, OURS)
    print(table)
    for name, why in failed.items():
        print(f"{name}: failed on this array ({why})")
    ours = {r.cache: r for r in rows if r.name == OURS}
    ceil = {r.cache: r for r in rows if r.name.startswith("ceiling")}
    for cache in ("warm", "cold"):
        print(f"{cache}: gpuzarr-dist reaches {ours[cache].gbps / ceil[cache].gbps:.0%} of the file-read ceiling")
    for line in stage_times(path, device, blocks[0]) + thread_scaling(path, device, blocks[0]):
        print(line)
    meta = {"device": device, "threads": threads, "time_steps": steps, "compressed_bytes": compressed,
            "nbytes": nbytes, "host": platform.node(), "quick": quick, "codec": codec,
            "zstd_check": zstd_check(), "deflate_check": deflate_check(), "sync_wait": gpu_sync_wait(),
            "read_slots": gpu_read_slots(), "decode_combine": gpu_decode_combine(), "nvcomp_api": nvcomp_api()}
    written = save(rows, out_dir, stem, f"time mean of float32 ({steps}, 721, 1440), {codec}, {device}", meta)
    print("saved:", ", ".join(written))


def stage_times(path: str, device: str, block: str | None) -> list[str]:
    """Time the stages of one block's read on one thread, one by one (warm cache), to find the limit."""
    from gpuzarr_dist.array.read import from_zarr_gpu
    from gpuzarr_dist.core.selection import plan_selection

    x = from_zarr_gpu(path, device=device, chunks=block or "auto")
    reader = next(iter(x.dask.values())).args[0].value
    sel = tuple(slice(0, c[0]) for c in x.chunks)
    nbytes = int(np.prod([c[0] for c in x.chunks])) * x.dtype.itemsize
    keys = [reader.spec.chunk_key(p.coords) for p in plan_selection(reader.spec, sel).parts]
    lines = [f"stages of one block ({len(keys)} chunks, {nbytes / 1e6:.0f} MB decompressed), one thread, best of 3:"]

    def best(fn: Callable[[], None]) -> float:
        fn()
        return min(_time(fn, 1, None) for _ in range(3))

    if device == "gpu":
        import cupy

        from gpuzarr_dist.cuda.decode import decode_batch_gpu
        from gpuzarr_dist.cuda.streams import ALIGN, pinned_staging, thread_stream

        stream = thread_stream()
        host, offs, sizes = reader.store.read_into(keys, pinned_staging, ALIGN)
        stored = sum(sizes)
        t_read = best(lambda: reader.store.read_into(keys, pinned_staging, ALIGN))
        dev = cupy.empty(max(o + n for o, n in zip(offs, sizes)), dtype=cupy.uint8)

        def copy() -> None:
            dev.set(host[: dev.size], stream=stream)
            stream.synchronize()

        def decode() -> None:
            decode_batch_gpu(reader.pipeline, host, offs, sizes, keys, stream)
            stream.synchronize()

        t_copy, t_dec = best(copy), best(decode)
        t_all = best(lambda: (reader[sel], stream.synchronize()))
        lines += [
            f"  read files into pinned memory : {t_read * 1e3:7.1f} ms  {stored / t_read / 1e9:6.1f} GB/s stored",
            f"  copy to the device            : {t_copy * 1e3:7.1f} ms  {stored / t_copy / 1e9:6.1f} GB/s stored",
            f"  checks + copy + nvCOMP decode : {t_dec * 1e3:7.1f} ms  {nbytes / t_dec / 1e9:6.1f} GB/s decoded",
            f"  whole block read              : {t_all * 1e3:7.1f} ms  {nbytes / t_all / 1e9:6.1f} GB/s decoded",
        ]
    else:
        raw = reader.store.read_many(keys)
        stored = sum(len(b) for b in raw)
        t_read = best(lambda: reader.store.read_many(keys))
        t_all = best(lambda: reader[sel])
        lines += [
            f"  read files                    : {t_read * 1e3:7.1f} ms  {stored / t_read / 1e9:6.1f} GB/s stored",
            f"  whole block read + decode     : {t_all * 1e3:7.1f} ms  {nbytes / t_all / 1e9:6.1f} GB/s decoded",
        ]
    return lines


def thread_scaling(path: str, device: str, block: str | None, counts: tuple[int, ...] = (1, 2, 4, 8, 16)) -> list[str]:
    """GB/s of whole-block reads (no dask) on 1..16 threads, and of each GPU stage alone, to see what scales."""
    from concurrent.futures import ThreadPoolExecutor

    from gpuzarr_dist.array.read import from_zarr_gpu
    from gpuzarr_dist.core.selection import plan_selection
    from gpuzarr_dist.cuda.memory import release_cached_device_memory

    x = from_zarr_gpu(path, device=device, chunks=block or "auto")
    reader = next(iter(x.dask.values())).args[0].value
    edges = np.cumsum((0,) + x.chunks[0])
    sels = [(slice(int(a), int(b)),) for a, b in zip(edges[:-1], edges[1:])]
    nbytes = x.nbytes
    stages: dict[str, Callable[[tuple], None]] = {"whole block": lambda sel: reader[sel]}
    if device == "gpu":
        from gpuzarr_dist.cuda.decode import decode_batch_gpu
        from gpuzarr_dist.cuda.streams import ALIGN, pinned_staging, thread_stream

        keys = {sel: [reader.spec.chunk_key(p.coords) for p in plan_selection(reader.spec, sel).parts] for sel in sels}
        staged = {sel: reader.store.read_into(keys[sel], pinned_staging, ALIGN) for sel in sels}

        def read_only(sel: tuple) -> None:
            reader.store.read_into(keys[sel], pinned_staging, ALIGN)

        def decode_only(sel: tuple) -> None:
            host, offs, sizes = staged[sel]
            decode_batch_gpu(reader.pipeline, host, offs, sizes, keys[sel], thread_stream())
            thread_stream().synchronize()

        stages = {"read into pinned": read_only, "copy + decode": decode_only, **stages}
    lines = ["thread scaling, GB/s of decoded data (all blocks once, after one warm-up pass):"]
    lines.append(f"  {'stage':<18}" + "".join(f"{n:>8}" for n in counts))
    for name, fn in stages.items():
        row = []
        for n in counts:
            with ThreadPoolExecutor(n) as pool:
                list(pool.map(fn, sels))
                t0 = time.perf_counter()
                list(pool.map(fn, sels))
                _sync(device)
                row.append(nbytes / (time.perf_counter() - t0) / 1e9)
            if device == "gpu":  # each pool's threads leave their streams' cached blocks behind
                release_cached_device_memory()
        lines.append(f"  {name:<18}" + "".join(f"{v:8.1f}" for v in row))
    return lines
