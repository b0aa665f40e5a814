"""The file-write ceiling of ``gpuzarr-dist bench write``: our output's stored bytes written by plain threads.

``to_zarr_gpu`` cannot write faster than the machine takes files into its page
cache. These rows take the compressed objects ``to_zarr_gpu`` just stored (the
same count and sizes, read back into host memory) and write them into fresh
files under the same folder layout, with the same number of threads, in ways
that cost ever less around the write itself:

- ``open/write/close``: one task per file on a pool of threads, plain ``open(path, "wb")``;
- ``temp + os.replace``: the same with a temporary name renamed over the final one, as
  :class:`~gpuzarr_dist.stores.writer.LocalObjectWriter` does for atomic objects;
- ``one thread per file batch``: each thread writes one contiguous run of files (no per-file hand-off);
- ``LocalObjectWriter.put_many``: the writer ``to_zarr_gpu`` uses, alone (its own thread pool),
  once into folders made before the clock starts (like for like with the rows above), once
  making its own folders, next to ``temp + os.replace`` making each file's folder in the
  task (``os.makedirs``): the like-for-like ceiling for that one.

Folders are made before the clock starts except where a row says so. Making
folders costs: a fresh Zarr v3 array of one chunk per time step makes two
folders per chunk, and on some filesystems a ``mkdir`` costs as much as
writing megabytes (``to_zarr_gpu`` makes a block's folders while it encodes
it, see :meth:`~gpuzarr_dist.stores.writer.LocalObjectWriter.prepare`). GB/s are given both ways: of stored bytes, and of the
uncompressed data those bytes hold (stored x compression ratio), which is the
unit of the benchmark's other rows.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from gpuzarr_dist.bench.files import chunk_files
from gpuzarr_dist.bench.report import Row


def load_objects(path: str) -> list[tuple[str, bytes]]:
    """``(relative key, stored bytes)`` of every chunk or shard file of the array at ``path``."""
    out = []
    for f in sorted(chunk_files(path)):
        with open(f, "rb") as fh:
            out.append((os.path.relpath(f, path).replace(os.sep, "/"), fh.read()))
    return out


def _plain(root: str, key: str, data: bytes) -> None:
    with open(os.path.join(root, key), "wb") as f:
        f.write(data)


def _replace(root: str, key: str, data: bytes) -> None:
    final = os.path.join(root, key)
    tmp = f"{final}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        view = memoryview(data)
        while view:  # os.write may write less than asked
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    os.replace(tmp, final)


def _replace_making_folder(root: str, key: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(os.path.join(root, key)), exist_ok=True)
    _replace(root, key, data)


def ceiling_rows(objects: list[tuple[str, bytes]], uncompressed: int, threads: int, folder: str,
                 repeat: int = 3) -> tuple[list[Row], list[str]]:
    """Rows (GB/s of uncompressed-equivalent data) and printable lines for writing ``objects`` as files."""
    from gpuzarr_dist.stores.writer import LocalObjectWriter

    stored = sum(len(d) for _, d in objects)
    ratio = uncompressed / stored if stored else 1.0
    folders = sorted({os.path.dirname(k) for k, _ in objects})

    def fresh(name: str, make: bool = True) -> str:
        root = os.path.join(folder, name)
        shutil.rmtree(root, ignore_errors=True)
        if make:
            for d in folders:
                os.makedirs(os.path.join(root, d), exist_ok=True)
        return root

    def per_file(fn: Callable[[str, str, bytes], None]) -> Callable[[str, ThreadPoolExecutor], None]:
        def go(root: str, pool: ThreadPoolExecutor) -> None:
            list(pool.map(lambda kd: fn(root, *kd), objects))

        return go

    def batches(root: str, pool: ThreadPoolExecutor) -> None:
        n = len(objects)
        runs = [objects[n * i // threads : n * (i + 1) // threads] for i in range(threads)]
        list(pool.map(lambda run: [_replace(root, k, d) for k, d in run], runs))

    def writer(root: str, pool: ThreadPoolExecutor) -> None:
        LocalObjectWriter(root, "ceiling").put_many(objects)

    cases = [
        (f"files: open/write/close, {threads} threads", per_file(_plain), True),
        (f"files: temp + os.replace, {threads} threads", per_file(_replace), True),
        ("files: temp + replace, a thread per batch", batches, True),
        ("files: LocalObjectWriter.put_many, folders made", writer, True),
        (f"files: temp + replace + makedirs, {threads} threads", per_file(_replace_making_folder), False),
        ("files: LocalObjectWriter.put_many", writer, False),
    ]
    rows, lines = [], [f"file-write ceiling: {len(objects)} objects, {stored / 1e6:.0f} MB stored "
                       f"(mean {stored / max(len(objects), 1) / 1e6:.2f} MB), compression ratio {ratio:.3f}; "
                       f"{threads} threads, fresh files in {folder}:"]
    with ThreadPoolExecutor(threads) as pool:
        for name, fn, make in cases:
            times = []
            for i in range(repeat + 1):  # the first is a warm-up
                root = fresh(f"ceiling-{i % 2}", make)
                t0 = time.perf_counter()
                fn(root, pool)
                if i:
                    times.append(time.perf_counter() - t0)
            shutil.rmtree(os.path.join(folder, "ceiling-0"), ignore_errors=True)
            shutil.rmtree(os.path.join(folder, "ceiling-1"), ignore_errors=True)
            sec = statistics.median(times)
            rows.append(Row(name, "warm", sec, uncompressed,
                            note=f"{stored / sec / 1e9:.2f} GB/s stored x ratio {ratio:.3f}", extra={"ratio": ratio}))
            lines.append(f"  {name:<44} {stored / sec / 1e9:7.2f} GB/s stored {uncompressed / sec / 1e9:7.2f} "
                         "GB/s uncompressed-equivalent")
    return rows, lines
