"""``gpuzarr-dist bench remote``: reads from a loopback S3 server against the raw GET rate.

Starts moto's S3 server on 127.0.0.1 in a process of its own (the ``test``
extra installs it; ``--server thread`` runs it in this process instead),
uploads the benchmark arrays of ``bench shards`` (unsharded and sharded), and
times, on the same objects with the same obstore client and the same number of
requests in flight (``gpuzarr.remote.concurrency``):

- raw GETs of every stored object (no decode): the ceiling;
- gpuzarr-dist's time mean through ``s3://`` (read, decode, reduce);
- for reference, s3fs raw GETs at the same concurrency (why obstore was chosen).

Rates are of stored (compressed) bytes, so the rows compare like with like;
target: gpuzarr-dist at least 80% of the raw GET rate. A loopback server runs
on the same cores as the client: the absolute figures say more about the
server than about a real object store.

The array has 480 time steps on the GPU by default (1.5 GB stored per
variant), 48 on the CPU (whose decode, not the server, sets the pace there).
moto serves the 13 MB shard objects at about 5 GB/s, so at 192 steps the raw
GETs of a sharded copy took 0.12 s, and our row's fixed costs (opening the
array, about 20 ms; the last block's copy and decode after its GET, about 40
ms) were half of the difference measured: a figure of start-up latency, not
of a rate. At 480 steps the raw GETs take about 0.3 s.
"""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from gpuzarr_dist import config
from gpuzarr_dist.bench.files import data_folder
from gpuzarr_dist.bench.report import Row, best_of, format_table, save
from gpuzarr_dist.bench.shards import _stored, write_variants


def _objects(root: str) -> list[str]:
    out = []
    for d, _, names in os.walk(root):
        out += [os.path.relpath(os.path.join(d, n), root).replace(os.sep, "/") for n in names if n != ".complete"]
    return sorted(out)


def _raw_obstore(store, keys: list[str], concurrency: int) -> float:
    import obstore

    async def go() -> int:
        sem = asyncio.Semaphore(concurrency)

        async def one(k: str) -> int:
            async with sem:
                r = await obstore.get_async(store, k)
                return len(await r.bytes_async())

        return sum(await asyncio.gather(*(one(k) for k in keys)))

    t0 = time.perf_counter()
    asyncio.run(go())
    return time.perf_counter() - t0


def _raw_s3fs(endpoint: str, bucket: str, keys: list[str], concurrency: int) -> float | None:
    try:
        import s3fs
    except ImportError:
        return None
    loop = asyncio.new_event_loop()
    try:
        fs = s3fs.S3FileSystem(key="bench", secret="bench", endpoint_url=endpoint, asynchronous=True, loop=loop)

        async def go() -> None:
            await fs.set_session()
            sem = asyncio.Semaphore(concurrency)

            async def one(k: str) -> None:
                async with sem:
                    await fs._cat_file(f"{bucket}/{k}")

            await asyncio.gather(*(one(k) for k in keys))
            await fs._s3.close() if getattr(fs, "_s3", None) else None

        t0 = time.perf_counter()
        loop.run_until_complete(go())
        return time.perf_counter() - t0
    finally:
        loop.close()


def run(args) -> int:
    """Entry point of ``gpuzarr-dist bench remote``."""
    from gpuzarr_dist.cuda.device import gpu_status, resolve_device
    from gpuzarr_dist.stores.remote import ObjectChunkStore

    try:
        import boto3
        import moto.server  # noqa: F401
    except ImportError:
        print("bench remote needs moto[server] and boto3 (from a gpuzarr-dist checkout: pip install '.[test]')")
        return 2
    device = resolve_device(getattr(args, "device", "auto") or "auto")
    quick = bool(getattr(args, "quick", False))
    threads = int(getattr(args, "threads", None) or min(16, os.cpu_count() or 1))
    steps = getattr(args, "time_steps", None) or (8 if quick else 480 if device == "gpu" else 48)
    nlat, nlon = (181, 360) if quick else (721, 1440)
    repeat = 1 if quick else 3
    concurrency = config.remote_concurrency()
    out_dir = getattr(args, "out", None) or "bench-results"
    with data_folder(getattr(args, "path", None), "gpuzarr-bench-remote-") as root:
        paths = write_variants(root, steps, nlat, nlon, shard_t=4)
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        in_process = getattr(args, "server", None) == "thread"
        server = _start_moto(port, in_process)
        endpoint, bucket = f"http://127.0.0.1:{port}", "bench"
        opts = {"endpoint_url": endpoint, "key": "bench", "secret": "bench", "region": "us-east-1"}
        rows: list[Row] = []
        try:
            s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="bench", aws_secret_access_key="bench",
                              region_name="us-east-1")
            s3.create_bucket(Bucket=bucket)
            for name, path in paths.items():
                for key in _objects(path):
                    s3.upload_file(os.path.join(path, *key.split("/")), bucket, f"{name}.zarr/{key}")
            where = "in this process (its threads share the client's GIL)" if in_process else "in its own process"
            print(f"loopback S3 (moto) at {endpoint}, {where}; {concurrency} requests in flight; device {device} "
                  f"({gpu_status()[1]}); {threads} threads; {platform.node()}, {os.cpu_count()} CPUs shared by server "
                  "and client")
            for name, path in paths.items():
                stored = _stored(path)
                keys = [f"{name}.zarr/{k}" for k in _objects(path) if not k.endswith("zarr.json")]
                client = ObjectChunkStore(f"s3://{bucket}", storage_options=opts).store
                t_raw = min(_raw_obstore(client, keys, concurrency) for _ in range(repeat))
                rows.append(Row(f"{name}: raw GET, obstore", "warm", t_raw, stored, note="no decode"))
                t_fs = _raw_s3fs(endpoint, bucket, keys, concurrency)
                if t_fs is not None:
                    rows.append(Row(f"{name}: raw GET, s3fs", "warm", t_fs, stored, note="no decode"))
                t_ours = best_of(_mean_s3(f"s3://{bucket}/{name}.zarr", opts, device, threads), repeat)
                rows.append(Row(f"{name}: gpuzarr-dist mean(0) over s3://", "warm", t_ours, stored,
                                note=f"{t_raw / t_ours:.0%} of the raw GET rate (target >= 80%)"))
        finally:
            server.stop()
        print("GB/s of stored bytes")
        print(format_table(rows, rows[0].name))
        meta = {"device": device, "concurrency": concurrency, "time_steps": steps, "grid": [nlat, nlon], "quick": quick,
                "host": platform.node(), "cpus": os.cpu_count()}
        written = save(rows, out_dir, "bench-remote", f"loopback S3, {device}", meta)
        print("saved:", ", ".join(written))
    return 0


def _start_moto(port: int, in_process: bool) -> Any:
    """moto's S3 server on 127.0.0.1:``port``: its own Python process (default), or threads of this one.

    In this process, the server's request handling (Python) takes the GIL
    from the client's tasks, so the client's figure measured the server's
    share of one interpreter as much as the client; a real object store never
    runs in the reader's interpreter. Either way the result has ``stop()``.
    """
    if in_process:
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        return server
    return _MotoProcess(port)


class _MotoProcess:
    """moto's server in a child process, listening when constructed; its log goes to a temporary file.

    A pipe that nobody reads fills up with the log (a line per request) and
    stalls the server mid-benchmark; a file does not.
    """

    def __init__(self, port: int, timeout: float = 60) -> None:
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                     stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return
            except OSError:
                if self.proc.poll() is not None:
                    self.log.seek(0)
                    err = self.log.read().decode(errors="replace").strip().splitlines()[-3:]
                    self.log.close()
                    raise RuntimeError(f"moto's server exited ({self.proc.returncode}): {' | '.join(err)}") from None
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto's server did not listen on 127.0.0.1:{port} within {timeout:g} s") from None
                time.sleep(0.1)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def _mean_s3(url: str, opts: dict, device: str, threads: int):
    import dask

    from gpuzarr_dist.array.read import from_zarr_gpu

    def run() -> None:
        x = from_zarr_gpu(url, device=device, storage_options=opts)
        with dask.config.set(scheduler="threads", num_workers=threads):
            float(x.mean(axis=0).compute()[0, 0])

    return run

