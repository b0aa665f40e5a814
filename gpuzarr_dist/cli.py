"""The ``gpuzarr-dist`` command line: ``demo``, ``info`` and ``bench``.

This module only parses arguments and prints; the work is done by
:mod:`gpuzarr_dist.demo`, :mod:`gpuzarr_dist.bench` and the library itself.
``main`` returns the exit status: 0 on success, 1 when a demo's check fails,
2 for a usage error or a store that cannot be read (one line on stderr, no
traceback).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from typing import Any

PROG = "gpuzarr-dist"
EXIT_USAGE = 2


class _CliError(Exception):
    """An error reported as one line on stderr with exit status 2."""


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a number of at least 1, got {n}")
    return n


def _version() -> str:
    from gpuzarr_dist import __version__

    return f"{PROG} {__version__}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="GPU-batched Zarr reading for dask: a demo, a look at a store, benchmarks.",
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = sub.add_parser(
        "demo",
        help="write an ERA5-like Zarr store and compute its time mean",
        description="Write an ERA5-like float32 Zarr v3 store (time, 721, 1440), one chunk per time step, "
        "zstd level 0; compute its time mean with gpuzarr-dist; check it and report GB/s.",
    )
    demo.add_argument("--path", metavar="DIR", help="where the store goes (kept; reused when complete). "
                      "Default: a temporary directory, removed at the end")
    demo.add_argument("--time-steps", metavar="N", type=_positive_int,
                      help="time steps to write (default: 600 per GPU, about 2.5 GB each; 48 on a CPU)")
    demo.add_argument("--gpus", metavar="N", type=_positive_int,
                      help="GPUs to use (default: all; with several, one dask-cuda worker per GPU)")
    demo.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto",
                      help="where to decode and compute (default: auto, the GPU when one is usable)")
    demo.add_argument("--keep", action="store_true", help="keep the temporary store and print where it is")
    demo.set_defaults(func=_cmd_demo)

    info = sub.add_parser(
        "info",
        help="describe a Zarr array or group: shape, chunks, codecs, blocks",
        description="Describe a Zarr array (or list the arrays of a group): shape, dtype, chunks, the codec "
        "chain and which codecs decode on the GPU, and the dask blocks chunks='auto' would choose.",
    )
    info.add_argument("path", metavar="PATH", nargs="?",
                      help="a local path or URL of a Zarr store (without one: this machine's GPUs)")
    info.add_argument("--component", metavar="NAME", help="the array's path inside a group")
    info.set_defaults(func=_cmd_info)

    bench = sub.add_parser("bench", help="benchmarks against the tools a user would pick instead",
                           description="Benchmarks: our figure and the alternatives' on the same data.")
    bench_sub = bench.add_subparsers(dest="bench", metavar="BENCHMARK")
    read = bench_sub.add_parser("read", help="read throughput of a whole array (and its time mean)")
    read.add_argument("--quick", action="store_true", help="a small array and fewer repeats")
    read.add_argument("--time-steps", metavar="N", type=_positive_int, help="time steps of the ERA5-like array")
    read.add_argument("--path", metavar="STORE", help="the zstd store to read (kept and reused; the Blosc copy goes beside it)")
    read.add_argument("--out", metavar="DIR", help="folder for the result tables")
    read.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto", help="device (default: auto)")
    read.add_argument("--threads", metavar="N", type=_positive_int, help="dask threads (default: min(16, CPUs))")
    read.add_argument("--block-size", metavar="SIZE", action="append",
                      help="block size for our rows, e.g. '256 MiB' (repeat for more rows; default: the config)")
    read.add_argument("--read-slots", metavar="N", type=int, action="append",
                      help="another row of ours with gpuzarr.gpu.read-slots N (0: every block reads at once; repeatable)")
    read.add_argument("--decode-combine", action="store_true",
                      help="another row of ours with gpuzarr.gpu.decode-combine the other way round")
    read.add_argument("--nvcomp-api", action="store_true",
                      help="another row of ours with nvCOMP's other interface (gpuzarr.gpu.nvcomp-api c / python)")
    read.add_argument("--codec", choices=("zstd", "blosc", "both"), default="both",
                      help="stored array: Zarr v3 zstd, Zarr v2 with the default Blosc(lz4, shuffle), or both (default)")
    write = bench_sub.add_parser("write", help="write throughput of to_zarr_gpu against zarr-python and dask.array.to_zarr")
    write.add_argument("--quick", action="store_true", help="a small array, one repeat (runs on the CPU in seconds)")
    write.add_argument("--time-steps", metavar="N", type=_positive_int, help="time steps of the ERA5-like array")
    write.add_argument("--block-steps", metavar="N", type=_positive_int, help="time steps per dask block (default 64)")
    write.add_argument("--path", metavar="DIR", help="folder for the written stores (default: the system's temporary folder)")
    write.add_argument("--out", metavar="DIR", help="folder for the result tables")
    write.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto", help="device (default: auto)")
    write.add_argument("--threads", metavar="N", type=_positive_int, help="dask threads (default: min(16, CPUs))")
    write.add_argument("--chunk-mib", metavar="MIB", type=float, action="append",
                       help="also a to_zarr_gpu row with chunks of about MIB MiB, many per block (repeat for more; "
                            "default 1 and 0.25)")
    write.add_argument("--no-stages", action="store_true", help="skip the per-stage timings and thread scaling")
    for name, help_text in (("shards", "sharded vs unsharded reads, and random windows vs zarr-python and tensorstore"),
                            ("remote", "reads from a loopback S3 server vs the raw GET rate of the same client")):
        b = bench_sub.add_parser(name, help=help_text)
        b.add_argument("--quick", action="store_true", help="a small array and fewer repeats")
        b.add_argument("--time-steps", metavar="N", type=_positive_int, help="time steps of the ERA5-like array")
        b.add_argument("--path", metavar="DIR", help="where the data goes (kept and reused)")
        b.add_argument("--out", metavar="DIR", help="folder for the result tables")
        b.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto", help="device (default: auto)")
        b.add_argument("--threads", metavar="N", type=_positive_int, help="dask threads (default: min(16, CPUs))")
        if name == "shards":
            b.add_argument("--windows", metavar="N", type=_positive_int,
                           help="random windows each row reads (default 8192; at least --batch)")
            b.add_argument("--batch", metavar="N", type=_positive_int,
                           help="the most windows per WindowSampler call (default 2048); rows also at an eighth and a "
                                "half of it, and tensorstore with as many reads in flight")
            b.add_argument("--in-flight", metavar="N", type=_positive_int,
                           help="WindowSampler.batches: --batch windows in flight as this many calls (default 2)")
        if name == "remote":
            b.add_argument("--server", choices=("process", "thread"), default="process",
                           help="moto's server in its own process (default) or in threads of this one")
    scale = bench_sub.add_parser("scale", help="read + time mean on 1, 2, 4 GPUs of this machine, "
                                 "beside the aggregate read ceiling; a reduction larger than one GPU's memory")
    scale.add_argument("--quick", action="store_true", help="a small array on 1 and 2 CPU workers, in seconds")
    scale.add_argument("--gb-per-gpu", metavar="GB", type=float, action="append",
                       help="decompressed GB per GPU (repeat for several sizes; default 8 and 40)")
    scale.add_argument("--repeats", metavar="N", type=_positive_int, help="timed runs per row after a warm-up (default 3)")
    scale.add_argument("--no-report", action="store_true", help="do not save dask performance reports (HTML)")
    scale.add_argument("--gpus", metavar="N", type=_positive_int, action="append",
                       help="GPU counts to run (repeat; default 1, 2, 4 up to the GPUs present)")
    scale.add_argument("--path", metavar="DIR", help="where the data goes (kept and reused)")
    scale.add_argument("--out", metavar="DIR", help="folder for the result tables")
    scale.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto", help="device (default: auto)")
    scale.add_argument("--threads", metavar="N", type=_positive_int, help="threads per worker (default 8)")
    scale.add_argument("--no-large", action="store_true", help="skip the larger-than-one-GPU reduction")
    cub = bench_sub.add_parser("cubed", help="time mean and anomaly, bounded memory: our Cubed variant, our dask "
                               "path and Cubed on the CPU",
                               description="A time mean and a time anomaly (x - x.mean(0), written to Zarr) over an "
                               "array at least 10x allowed_mem, through gpuzarr-dist's Cubed variant, its dask path "
                               "and plain Cubed on the CPU, each in its own process; GB/s, ratios, peak per task.")
    cub.add_argument("--quick", action="store_true", help="a small array (seconds, on the CPU without a GPU)")
    cub.add_argument("--time-steps", metavar="N", type=_positive_int, help="time steps of the (time, 721, 1440) array "
                     "(default: 2400, 9.3 GiB, on the GPU; 96 on the CPU)")
    cub.add_argument("--allowed-mem", metavar="SIZE", help="per-task memory budget (default: the array's size / 10)")
    cub.add_argument("--path", metavar="DIR", help="where the data goes (kept and reused)")
    cub.add_argument("--out", metavar="DIR", help="folder for bench-cubed.json")
    cub.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto", help="device (default: auto)")
    cub.add_argument("--threads", metavar="N", type=_positive_int, help="threads of every row (default: our rows 8 on "
                     "the GPU, Cubed on the CPU min(16, CPUs))")
    cub.add_argument("--no-progress", action="store_true", help="no progress bars")
    cub.add_argument("--repeats", metavar="N", type=_positive_int, help="timed runs of each row's mean and anomaly "
                     "after a warm-up (default 3, 1 with --quick; plain Cubed on the CPU 1)")
    cub.add_argument("--rows", metavar="ROWS", help="comma-separated rows to run (default: all): ours-cubed, "
                     "ours-dask, cubed-cpu")
    tr = bench_sub.add_parser("train", help="a U-Net fed by ZarrLoader vs torch DataLoader over zarr-python and "
                              "tensorstore: samples/s and GPU busy, loaders alone, 1 and 2 GPUs (DDP)")
    tr.add_argument("--quick", action="store_true", help="a tiny CPU version of the loaders alone (seconds; no torch needed)")
    tr.add_argument("--channels", metavar="N", type=_positive_int, help="variables of the group (default 4)")
    tr.add_argument("--time-steps", metavar="N", type=_positive_int, help="time steps of each variable (default 96)")
    tr.add_argument("--batch", metavar="N", type=_positive_int, help="samples per batch (default 4)")
    tr.add_argument("--prefetch", metavar="N", type=_positive_int, help="ZarrLoader batches read ahead (default 4)")
    tr.add_argument("--workers", metavar="N", type=_positive_int, help="DataLoader workers (default: CPU cores)")
    tr.add_argument("--base", metavar="N", type=_positive_int, help="U-Net channels at full resolution (default 16)")
    tr.add_argument("--repeats", metavar="N", type=_positive_int, help="timed windows per row (default 3)")
    tr.add_argument("--seconds", metavar="S", type=float, help="length of a timed window (default 4)")
    tr.add_argument("--no-ddp", action="store_true", help="skip the 2-GPU DDP row")
    tr.add_argument("--loaders", metavar="LIST", help="comma-separated loaders to run (default: all): ours, "
                    "zarr-python, tensorstore")
    tr.add_argument("--no-train", action="store_true", help="the loaders alone only: no U-Net rows and no DDP row")
    tr.add_argument("--path", metavar="DIR", help="where the data goes (kept and reused)")
    tr.add_argument("--out", metavar="DIR", help="folder for bench-train.json")
    tr.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto", help="device (default: auto)")
    clim = bench_sub.add_parser("climate", help="monthly climatology + anomaly written back, on 1, 2, 4 GPUs vs "
                                "dask on every CPU core")
    clim.add_argument("--quick", action="store_true", help="a small grid on 1 and 2 CPU workers, in seconds")
    clim.add_argument("--gb", metavar="GB", type=float, help="decompressed GB of the dataset (default 40; 20 with one GPU)")
    clim.add_argument("--time-steps", metavar="N", type=_positive_int, help="daily time steps (instead of --gb)")
    clim.add_argument("--cpu-gb", metavar="GB", type=float, help="GB the CPU row runs over (default 0.1 per core)")
    clim.add_argument("--gpus", metavar="N", type=_positive_int, action="append",
                      help="GPU counts to run (repeat; default 1, 2, 4 up to the GPUs present)")
    clim.add_argument("--repeats", metavar="N", type=_positive_int, help="timed runs per row after a warm-up (default 3)")
    clim.add_argument("--xarray-row", action="store_true", help="also xarray's own groupby on one GPU")
    clim.add_argument("--path", metavar="DIR", help="where the data and outputs go (kept and reused)")
    clim.add_argument("--out", metavar="DIR", help="folder for bench-climate.json and .txt")
    clim.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto", help="device (default: auto)")
    clim.add_argument("--threads", metavar="N", type=_positive_int, help="threads per GPU worker (default 8)")
    bench.set_defaults(func=_cmd_bench, bench_parser=bench)
    _add_cluster_parser(sub)
    return parser


# -- demo -------------------------------------------------------------------------


def _cmd_demo(args: argparse.Namespace) -> int:
    from gpuzarr_dist.demo import run_demo

    result = run_demo(path=args.path, time_steps=args.time_steps, device=args.device, keep=args.keep,
                      gpus=args.gpus)
    if not result.ok:
        print(f"{PROG} demo: the result does not match the reference (max relative error "
              f"{result.max_rel_error:.1e})", file=sys.stderr)
        return 1
    return 0


# -- info -------------------------------------------------------------------------


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def _open_group(path: str, component: str | None) -> Any:
    """The zarr.Group at ``path``/``component``, or None when it is not a group."""
    import zarr

    try:
        node = zarr.open_group(path, path=component or "", mode="r")
    except Exception:  # an array, a missing path or bad metadata: open_source says which
        return None
    return node if isinstance(node, zarr.Group) else None


def _print_group(group: Any, where: str) -> None:
    members = sorted(group.members(max_depth=None), key=lambda kv: kv[0])
    arrays = [(name, node) for name, node in members if not hasattr(node, "members")]
    print(f"{where}")
    print(f"  Zarr group (format {group.metadata.zarr_format}), {len(arrays)} array(s):")
    width = max((len(n) for n, _ in arrays), default=0)
    for name, arr in arrays:
        print(f"    {name:<{width}}  {arr.dtype!s:<8} shape {tuple(arr.shape)}  chunks {tuple(arr.chunks)}")
    if arrays:
        print(f"  look at one with: {PROG} info {where} --component {arrays[0][0]}")


def _display_name(path: str, component: str | None) -> str:
    """``path``/``component`` as a user would write it: local paths absolute, URLs as given."""
    from urllib.parse import urlparse

    url = urlparse(path)
    if url.scheme in ("", "file"):
        path = os.path.abspath(os.path.expanduser(url.path if url.scheme == "file" else path))
    path = path.rstrip("/") or "/"
    return f"{path}/{component.strip('/')}" if component else path


def _codec_config(c: Any) -> str:
    return json.dumps(c.configuration, sort_keys=True, default=str) if c.configuration else "{}"


def _codec_rows(spec: Any) -> tuple[list[tuple[str, str, str, str]], list[str]]:
    """One row per codec (name, configuration, kind, GPU decode) and notes on unsupported ones."""
    from gpuzarr_dist.codecs import get_codec
    from gpuzarr_dist.errors import GpuZarrError

    rows, notes = [], []
    for c in spec.codecs:
        config = _codec_config(c)
        try:
            codec = get_codec(c, spec.name)
        except GpuZarrError as e:
            rows.append((c.name, config, "?", "not readable by gpuzarr-dist yet"))
            notes.append(str(e))
            continue
        kind = codec.kind.replace("_", "->")
        gpu = "GPU decode: yes" if codec.gpu_decode else "GPU decode: no (decoded on the CPU)"
        if codec.name == "blosc":  # the inner compressor decides (blosclz and snappy have no GPU decoder)
            from gpuzarr_dist.codecs.blosc_frames import GPU_CNAMES

            if codec.config.get("cname", "lz4") not in GPU_CNAMES:
                gpu = "GPU decode: no (decoded on the CPU)"
        rows.append((c.name, config, kind, gpu))
    return rows, notes


def _print_array(spec: Any, stored: int | None, name: str) -> None:
    from gpuzarr_dist import config
    from gpuzarr_dist.array.read import auto_block_shape
    from gpuzarr_dist.cuda.device import gpu_memory_bytes, gpu_status

    chunks = math.prod(spec.grid_shape)
    nbytes = math.prod(spec.shape) * spec.dtype.itemsize
    print(name)
    print(f"  zarr format  {spec.zarr_format}")
    print(f"  shape        {spec.shape}")
    print(f"  dtype        {spec.dtype}")
    if spec.shard_shape is not None:
        print(f"  shard shape  {spec.shard_shape}  ({math.prod(spec.chunks_per_shard)} chunks per shard, "
              f"index at the {spec.shard_index_location}: {', '.join(c.name for c in spec.shard_index_codecs)})")
    print(f"  chunk shape  {spec.chunk_shape}  ({_size(spec.chunk_nbytes)} per chunk)")
    print(f"  chunks       {chunks}  (grid {' x '.join(map(str, spec.grid_shape)) or '1'})")
    size = f"{_size(nbytes)} decompressed"
    if stored is not None:
        size += f", {_size(stored)} stored (ratio {nbytes / stored:.2f})" if stored else ", nothing stored yet"
    print(f"  size         {size}")
    fill = spec.fill_value.item() if hasattr(spec.fill_value, "item") else spec.fill_value
    print(f"  fill value   {fill!r}")
    note = " (Zarr v2 filters/compressor in the v3 form)" if spec.zarr_format == 2 else ""
    note += " (of the chunks inside each shard)" if spec.shard_shape is not None else ""
    print(f"  codecs       {len(spec.codecs)}, encode order{note}:")
    rows, notes = _codec_rows(spec)
    w0 = max((len(r[0]) for r in rows), default=0)
    w1 = max((len(r[1]) for r in rows), default=0)
    w2 = max((len(r[2]) for r in rows), default=0)
    for name, cfg, kind, gpu in rows:
        print(f"    {name:<{w0}}  {cfg:<{w1}}  {kind:<{w2}}  {gpu}")
    for note in notes:
        print(f"    note: {note}")
    print("  auto blocks  (chunks='auto': whole chunks, about gpuzarr.block-size bytes)")
    for dev in ("cpu", "gpu"):
        target = config.block_size_bytes(dev, gpu_memory_bytes)
        block = auto_block_shape(spec, target)
        nblocks = math.prod(math.ceil(s / b) if b else 1 for s, b in zip(spec.shape, block))
        per = math.prod(block) * spec.dtype.itemsize
        print(f"    {dev}  {block}  {_size(per)} per block, {nblocks} block(s)  (target {_size(target)})")
    ok, why = gpu_status()
    print(f"  device       {'gpu' if ok else 'cpu'} ({why if ok else 'no usable GPU: ' + why})")


def _stored_bytes(store: Any, spec: Any, limit: int = 100_000) -> int | None:
    """Bytes of a local array's chunk files, or None for remote stores and huge arrays."""
    root = getattr(store, "root", None)
    if not root or not os.path.isdir(root) or math.prod(spec.grid_shape) > limit:
        return None
    total = 0
    for d, _, files in os.walk(root):
        for f in files:
            if f not in ("zarr.json", ".zarray", ".zattrs", ".zgroup"):
                total += os.path.getsize(os.path.join(d, f))
    return total


def _cmd_info(args: argparse.Namespace) -> int:
    from gpuzarr_dist.errors import ComponentNotFoundError, GpuZarrError
    from gpuzarr_dist.stores.source import bad_document_error, open_source

    if args.path is None:
        _print_machine()
        return 0
    source = args.path
    name = _display_name(source, args.component)
    try:
        group = _open_group(source, args.component)
        if group is not None:
            where = source.rstrip("/") + (f"/{args.component}" if args.component else "")
            _print_group(group, where)
            return 0
        store, spec = open_source(source, args.component)
        _print_array(spec, _stored_bytes(store, spec), name)
        _print_gpus("  ")
    except ComponentNotFoundError as e:  # lists the arrays there
        raise _CliError(str(e)) from e
    except FileNotFoundError as e:
        raise _CliError(f"no Zarr array or group at {name}") from e
    except (GpuZarrError, ValueError, OSError) as e:
        damaged = bad_document_error(source, e)  # a member's document that is not JSON: name the file
        raise _CliError(str(damaged or e)) from e
    return 0


def _print_gpus(indent: str = "") -> None:
    """The driver's GPUs (name, memory, driver version), one line each."""
    from gpuzarr_dist.distributed.gpus import list_gpus, visible_devices

    gpus = list_gpus()
    visible = visible_devices()
    note = f" (CUDA_VISIBLE_DEVICES={','.join(visible)})" if visible is not None else ""
    print(f"{indent}gpus         {len(gpus)}{note}" if indent else f"GPUs: {len(gpus)}{note}")
    for g in gpus:
        print(f"{indent}  {g.describe()}")


def _print_machine() -> None:
    import importlib.util
    import platform

    from gpuzarr_dist.cuda.device import gpu_status

    print(f"{_version()} on {platform.node()}, Python {platform.python_version()}, {os.cpu_count()} CPU cores")
    _print_gpus()
    ok, why = gpu_status()
    print(f"GPU reads: {'yes, ' + why if ok else 'no: ' + why}")
    cuda = importlib.util.find_spec("dask_cuda") is not None
    print(f"start_cluster: {'one dask-cuda worker per GPU' if ok and cuda else 'a CPU cluster'}"
          f"{'' if cuda else ' (dask-cuda is not installed)'}")
    print(f"look at a store with: {PROG} info PATH")


# -- cluster ----------------------------------------------------------------------


def _add_cluster_parser(sub: Any) -> None:
    cluster = sub.add_parser(
        "cluster",
        help="start a local dask cluster (one worker per GPU) and wait",
        description="Start a local dask cluster with gpuzarr_dist.start_cluster (one dask-cuda worker per GPU, "
        "or worker processes on the CPU), print its address and dashboard, and wait until Ctrl-C. "
        "Connect from Python with gpuzarr_dist.start_cluster(address=...) or distributed.Client(...).",
    )
    cluster.add_argument("--n-gpus", metavar="N", type=_positive_int,
                         help="GPUs to use, one worker each (default: all visible); worker processes on the CPU")
    cluster.add_argument("--threads-per-gpu", metavar="N", type=_positive_int, help="threads per worker (default 8)")
    cluster.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto",
                         help="auto (default): a GPU cluster when GPUs and dask-cuda are usable")
    cluster.add_argument("--scheduler-file", metavar="FILE", help="write the scheduler's address to FILE")
    cluster.add_argument("--dashboard-address", metavar="ADDR", default="localhost:8787",
                         help="dashboard address (default localhost:8787, this machine only; ':8787' for every interface; 'none' for no dashboard)")
    cluster.add_argument("--host", metavar="HOST", help="interface address the scheduler listens on "
                         "(default: localhost only)")
    cluster.add_argument("--run-for", metavar="SECONDS", type=float, help=argparse.SUPPRESS)
    cluster.set_defaults(func=_cmd_cluster)


def _cmd_cluster(args: argparse.Namespace) -> int:
    import time

    from gpuzarr_dist.distributed.cluster import start_cluster

    kwargs: dict[str, Any] = {}
    if args.scheduler_file:
        kwargs["scheduler_kwargs"] = {"scheduler_file": args.scheduler_file}
    if args.host:
        kwargs["host"] = args.host
    dashboard = None if args.dashboard_address.lower() == "none" else args.dashboard_address
    client = start_cluster(args.n_gpus, threads_per_gpu=args.threads_per_gpu, device=args.device,
                           dashboard_address=dashboard, **kwargs)
    try:
        print(f"connect with: gpuzarr_dist.start_cluster(address={client.scheduler.address!r})"
              + (f" or start_cluster(scheduler_file={args.scheduler_file!r})" if args.scheduler_file else ""))
        print("press Ctrl-C to stop the cluster", flush=True)
        end = None if args.run_for is None else time.monotonic() + args.run_for
        while end is None or time.monotonic() < end:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        client.close()
    print("cluster stopped", flush=True)
    return 0


# -- bench ------------------------------------------------------------------------


def _cmd_bench(args: argparse.Namespace) -> int:
    import importlib

    try:
        bench = importlib.import_module("gpuzarr_dist.bench")
    except ImportError as e:
        if getattr(e, "name", None) != "gpuzarr_dist.bench":
            print(f"benchmarks: gpuzarr_dist.bench could not be imported: {e}", file=sys.stderr)
            return EXIT_USAGE
        bench = None
    bench_main = getattr(bench, "main", None)
    if bench_main is None:
        print("benchmarks: not available in this build", file=sys.stderr)
        return EXIT_USAGE
    if not getattr(args, "bench", None):
        args.bench_parser.print_help(sys.stderr)
        return EXIT_USAGE
    code = bench_main(args)
    return int(code) if isinstance(code, int) else 0


# -- entry point ------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    from gpuzarr_dist.errors import GpuZarrError

    try:
        return args.func(args)
    except _CliError as e:
        print(f"{PROG} {args.command}: error: {e}", file=sys.stderr)
    except (GpuZarrError, FileExistsError, OSError) as e:
        print(f"{PROG} {args.command}: error: {e}", file=sys.stderr)
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: interrupted", file=sys.stderr)
        return 130
    return EXIT_USAGE


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
