"""``gpuzarr-dist bench train``: a small U-Net learning the next time step of an ERA5-like group, fed by
:class:`~gpuzarr_dist.ml.ZarrLoader` and by the loaders a user would write instead.

Data: a Zarr group of ``--channels`` variables, each float32 (time, 721, 1440) in chunks of one time step,
zstd level 0 (the layout of :func:`~gpuzarr_dist.synthetic.make_era5_like`). A sample is the window
``{"time": 2, "latitude": 720}`` (every longitude) of every variable: ``(channels, 2, 720, 1440)``; the
model maps the first step to the second. Rows, each the best and median of ``--repeats`` timed windows
after a warm-up:

- (a) ``ZarrLoader`` (GPU decode, prefetch, DLPack to torch);
- (b) torch's ``DataLoader`` over zarr-python, ``num_workers`` = CPU cores, pinned memory, copied up;
- (c) the same over tensorstore;

each alone (the loader's samples/s, batches moved to the GPU and waited for) and with the training step
(samples/s and the fraction of the wall time the GPU spent in the step: CUDA events around each step on
torch's stream, and, where ``pynvml`` is installed, the driver's utilisation sampled). With two GPUs
visible, (a) also trains with DDP on 2 GPUs (``torch.multiprocessing`` spawn, NCCL).

``--quick`` (or no GPU) runs a tiny CPU version of the loaders alone in seconds; rows whose tool (torch,
tensorstore) is missing are listed with a note.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from gpuzarr_dist.bench.files import data_folder
from gpuzarr_dist.bench.report import Row, save, selected

NAMES = ("t2m", "u10", "v10", "msl", "tcwv", "sp", "t850", "z500")
OURS = "(a) ZarrLoader"


# ---------------------------------------------------------------------------- data
def make_group(path: str, channels: int, time_steps: int, nlat: int = 721, nlon: int = 1440) -> list[str]:
    """An ERA5-like group of ``channels`` variables (time, nlat, nlon) at ``path`` (reused when complete)."""
    import zarr
    from zarr.codecs import ZstdCodec

    from gpuzarr_dist.synthetic import Field, slabs

    names = list(NAMES[:channels]) + [f"var{i}" for i in range(len(NAMES), channels)]
    marker = {"channels": channels, "time_steps": time_steps, "nlat": nlat, "nlon": nlon}
    done = os.path.join(path, ".complete.json")
    if os.path.exists(done):
        with open(done) as f:
            if json.load(f) == marker:
                return names
    g = zarr.open_group(path, mode="w", zarr_format=3)
    for c, name in enumerate(names):
        a = g.create_array(name, shape=(time_steps, nlat, nlon), chunks=(1, nlat, nlon), dtype="float32",
                           compressors=ZstdCodec(level=0), dimension_names=("time", "latitude", "longitude"))
        t0 = 0
        for slab in slabs(Field(100 + c, nlat, nlon), time_steps):
            a[t0 : t0 + len(slab)] = slab
            t0 += len(slab)
    with open(done, "w") as f:
        json.dump(marker, f)
    return names


# ---------------------------------------------------------------------------- the other loaders
class ZarrPythonDataset:
    """Sample ``i``: every variable's ``[i : i + 2, :lat]`` through zarr-python (opened in each worker)."""

    def __init__(self, path: str, names: list[str], lat: int, steps: int):
        self.path, self.names, self.lat, self.steps = path, names, lat, steps
        self._arrays: list[Any] | None = None

    def __len__(self) -> int:
        return self.steps - 1

    def _open(self) -> list[Any]:
        import zarr

        return [zarr.open_array(self.path, path=n, mode="r") for n in self.names]

    def __getitem__(self, i: int) -> np.ndarray:
        if self._arrays is None:
            self._arrays = self._open()
        return np.stack([a[i : i + 2, : self.lat] for a in self._arrays])

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_arrays": None}


class TensorstoreDataset(ZarrPythonDataset):
    """The same samples through tensorstore."""

    def _open(self) -> list[Any]:
        import tensorstore as ts

        return [ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.join(self.path, n)}},
                        read=True).result() for n in self.names]

    def __getitem__(self, i: int) -> np.ndarray:
        if self._arrays is None:
            self._arrays = self._open()
        futures = [a[i : i + 2, : self.lat].read() for a in self._arrays]
        return np.stack([f.result() for f in futures])


def torch_loader(dataset: Any, batch: int, workers: int, seed: int) -> Any:
    import torch

    g = torch.Generator()
    g.manual_seed(seed)
    return torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True, drop_last=True, num_workers=workers,
                                       pin_memory=torch.cuda.is_available(), persistent_workers=workers > 0,
                                       prefetch_factor=2 if workers else None, generator=g,
                                       multiprocessing_context="spawn" if workers else None)


def endless(loader: Any, set_epoch: bool) -> Iterator[Any]:
    """The loader's batches, epoch after epoch."""
    epoch = 0
    while True:
        if set_epoch:
            loader.set_epoch(epoch)
        yield from loader
        epoch += 1


# ---------------------------------------------------------------------------- the model
def unet(channels: int, base: int = 16) -> Any:
    """A small U-Net (three levels) mapping ``channels`` fields to ``channels`` fields of the same size
    (height and width divisible by 8)."""
    import torch
    from torch import nn

    def block(i: int, o: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.GroupNorm(4, o), nn.SiLU(),
                             nn.Conv2d(o, o, 3, padding=1), nn.GroupNorm(4, o), nn.SiLU())

    class UNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            w = [base, base * 2, base * 4, base * 8]
            self.down = nn.ModuleList([block(channels, w[0]), block(w[0], w[1]), block(w[1], w[2])])
            self.mid = block(w[2], w[3])
            self.up = nn.ModuleList([nn.ConvTranspose2d(w[3], w[2], 2, 2), nn.ConvTranspose2d(w[2], w[1], 2, 2),
                                     nn.ConvTranspose2d(w[1], w[0], 2, 2)])
            self.dec = nn.ModuleList([block(w[3], w[2]), block(w[2], w[1]), block(w[1], w[0])])
            self.out = nn.Conv2d(w[0], channels, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            skips = []
            for d in self.down:
                x = d(x)
                skips.append(x)
                x = nn.functional.max_pool2d(x, 2)
            x = self.mid(x)
            for up, dec, skip in zip(self.up, self.dec, reversed(skips)):
                x = dec(torch.cat([up(x), skip], dim=1))
            return self.out(x)

    return UNet()


class Trainer:
    """One optimisation step per batch ``(B, C, 2, H, W)``: predict ``[:, :, 1]`` from ``[:, :, 0]``; CUDA events
    around each step on torch's current stream measure the time the GPU spends in it."""

    def __init__(self, model: Any, device: Any):
        import torch

        self.torch, self.model, self.device = torch, model, device
        self.opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        self.events: list[tuple[Any, Any]] = []

    def step(self, batch: Any) -> None:
        torch = self.torch
        cuda = self.device.type == "cuda"
        if cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
        x, y = batch[:, :, 0], batch[:, :, 1]
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        if cuda:
            end.record()
            self.events.append((start, end))

    def busy_seconds(self) -> float:
        """GPU seconds inside the steps since the last call (waits for them)."""
        if not self.events:
            return 0.0
        self.events[-1][1].synchronize()
        total = sum(s.elapsed_time(e) for s, e in self.events) / 1e3
        self.events.clear()
        return total


class Utilisation:
    """The driver's GPU utilisation sampled every 50 ms (``pynvml``); ``None`` where it is not installed."""

    def __init__(self, index: int):
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handle, self.nvml = pynvml.nvmlDeviceGetHandleByIndex(index), pynvml
        except Exception:  # noqa: BLE001 - no NVML: the row has the event figure only
            self.handle = None
        self.samples: list[int] = []
        self._stop = threading.Event()

    def __enter__(self) -> Utilisation:
        if self.handle is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.samples.append(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self.handle is not None:
            self._thread.join()

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.samples) / 100 if self.samples else None


# ---------------------------------------------------------------------------- timing
def timed_windows(batches: Iterator[Any], work: Callable[[Any], None], finish: Callable[[], float], batch: int,
                  repeats: int, seconds: float, warmup: int) -> dict[str, Any]:
    """Run ``work`` on batches: ``warmup`` of them, then ``repeats`` windows of at least ``seconds`` (and 3 batches)
    each; ``finish`` waits for the device and returns its busy seconds in the window."""
    for _ in range(warmup):
        work(next(batches))
    finish()
    rates, busy = [], []
    for _ in range(repeats):
        n, t0 = 0, time.perf_counter()
        while n < 3 or time.perf_counter() - t0 < seconds:
            work(next(batches))
            n += 1
        gpu = finish()
        wall = time.perf_counter() - t0
        rates.append(n * batch / wall)
        busy.append(gpu / wall)
    best = max(range(repeats), key=lambda i: rates[i])
    return {"best": rates[best], "median": statistics.median(rates), "busy": busy[best], "busy_median": statistics.median(busy),
            "rates": rates}


def _torch_device() -> Any:
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


_DATALOADERS: dict[str, Any] = {}


def run_row(kind: str, mode: str, cfg: dict, rank: int = 0, world: int = 1) -> dict[str, Any]:
    """One row: ``kind`` in ours / zarr-python / tensorstore, ``mode`` "alone" or "train"."""
    device = cfg["device"]
    names, B, lat = cfg["names"], cfg["batch"], cfg["lat"]
    if kind == "ours":
        from gpuzarr_dist.ml import ZarrLoader

        output = "torch" if cfg["torch"] else "numpy"
        loader = ZarrLoader(cfg["path"], variables=names, window={"time": 2, "latitude": lat}, stride={"time": 1},
                            batch_size=B, seed=0, rank=rank, world_size=world, prefetch=cfg["prefetch"], device=device,
                            output=output)
        batches = endless(loader, True)
    else:  # one DataLoader per tool, its worker processes kept from row to row
        loader = _DATALOADERS.get(kind)
        if loader is None:
            dataset = (ZarrPythonDataset if kind == "zarr-python" else TensorstoreDataset)(cfg["path"], names, lat, cfg["steps"])
            loader = _DATALOADERS[kind] = torch_loader(dataset, B, cfg["workers"], seed=rank)
        batches = endless(loader, False)
    tdev = _torch_device() if cfg["torch"] else None
    gpu = tdev is not None and tdev.type == "cuda"
    if gpu and kind != "ours":
        host = batches
        batches = (b.to(tdev, non_blocking=True) for b in host)
    trainer = None
    if mode == "train":
        model = unet(len(names), cfg["base"]).to(tdev)
        if world > 1:
            import torch

            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[tdev.index])
        trainer = Trainer(model, tdev)
        work = trainer.step

        def finish() -> float:
            return trainer.busy_seconds()
    else:
        def work(b: Any) -> None:
            pass

        def finish() -> float:
            if gpu:
                import torch

                torch.cuda.synchronize()
            return 0.0
    with Utilisation(tdev.index if gpu else 0) if gpu and mode == "train" else _Null() as util:
        # the warm-up also drains what the loader read ahead while it started, so each window is its steady rate
        if kind == "ours":  # the reads ahead, in whole reads, and the rest of the first read
            ahead = (loader.reads_ahead + 1) * loader.read_batches
        else:
            ahead = 2 * cfg["workers"]  # DataLoader: prefetch_factor 2 per worker
        res = timed_windows(batches, work, finish, B, cfg["repeats"], cfg["seconds"], cfg["warmup"] + ahead)
    res["nvml"] = getattr(util, "mean", None)
    if kind == "ours":
        loader.close()
    return res


class _Null:
    def __enter__(self) -> _Null:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def _ddp_worker(rank: int, world: int, cfg: dict, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    torch.backends.cudnn.benchmark = True
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    try:
        res = run_row("ours", "train", cfg, rank, world)
        gathered = [None] * world
        dist.all_gather_object(gathered, res)
        if rank == 0:
            with open(out, "w") as f:
                json.dump(gathered, f)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ddp_rows(cfg: dict, world: int) -> dict[str, Any]:
    """(a) with the training step on ``world`` GPUs through DDP; samples/s of all ranks together."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "ddp.json")
        mp.spawn(_ddp_worker, args=(world, cfg, _free_port(), out), nprocs=world, join=True)
        with open(out) as f:
            per_rank = json.load(f)
    rates = [sum(r["rates"][i] for r in per_rank) for i in range(len(per_rank[0]["rates"]))]
    return {"best": max(rates), "median": statistics.median(rates), "busy": min(r["busy"] for r in per_rank),
            "busy_median": min(r["busy_median"] for r in per_rank), "rates": rates, "nvml": None}


# ---------------------------------------------------------------------------- the command
LOADERS = ("ours", "zarr-python", "tensorstore")


def selected_loaders(loaders: str | None) -> list[str]:
    """The loaders ``--loaders`` names (comma-separated), in :data:`LOADERS` order; all of them by default."""
    return selected(loaders, LOADERS, "bench train", "loader")


def run(args: Any) -> int:
    from gpuzarr_dist.cuda.device import gpu_status, resolve_device

    device = resolve_device(getattr(args, "device", "auto") or "auto")
    loaders = selected_loaders(getattr(args, "loaders", None))  # a wrong name fails before any data is made
    quick = bool(getattr(args, "quick", False)) or device == "cpu"
    if device == "cpu" and not getattr(args, "quick", False):
        print("no GPU: running the quick CPU version (the loaders alone)")
    try:
        import torch
    except ImportError:
        torch = None
    have_torch = torch is not None
    cuda = have_torch and device == "gpu" and torch.cuda.is_available()
    channels = getattr(args, "channels", None) or (2 if quick else 4)
    steps = getattr(args, "time_steps", None) or (12 if quick else 96)
    nlat, nlon = (32, 64) if quick else (721, 1440)
    lat = nlat // 8 * 8  # the U-Net halves three times
    cores = os.cpu_count() or 1
    cfg = {"device": device, "batch": getattr(args, "batch", None) or (4 if quick else 4),
           "prefetch": getattr(args, "prefetch", None) or (2 if quick else 4), "lat": lat, "steps": steps,
           "workers": getattr(args, "workers", None) or (0 if quick else cores), "torch": have_torch,
           "base": getattr(args, "base", None) or 16, "repeats": getattr(args, "repeats", None) or 3,
           "seconds": 0.3 if quick else (getattr(args, "seconds", None) or 4.0), "warmup": 2 if quick else 4}
    with data_folder(getattr(args, "path", None), "gpuzarr-train-") as root:
        path = os.path.join(root, f"era5-group-{channels}x{steps}-{nlat}x{nlon}.zarr")
        t0 = time.perf_counter()
        cfg["names"] = make_group(path, channels, steps, nlat, nlon)
        cfg["path"] = path
        sample_bytes = channels * 2 * lat * nlon * 4
        print(f"group of {channels} variables (time={steps}, {nlat}, {nlon}) float32 zstd, one chunk per step "
              f"({time.perf_counter() - t0:.1f} s to make or find); samples ({channels}, 2, {lat}, {nlon}), "
              f"{sample_bytes / 1e6:.2f} MB; batch {cfg['batch']}")
        print(f"device: {device} ({gpu_status()[1]}); torch: {torch.__version__ if have_torch else 'not installed'}; "
              f"{cfg['workers']} DataLoader workers; {platform.node()}")

        if cuda:
            torch.backends.cudnn.benchmark = True  # one input shape throughout
        rows: list[Row] = []
        results: dict[tuple[str, str], dict] = {}
        labels = {"ours": OURS, "zarr-python": "(b) DataLoader + zarr-python", "tensorstore": "(c) DataLoader + tensorstore"}
        train = cuda and not quick and not getattr(args, "no_train", False)
        modes = ["alone"] + (["train"] if train else [])
        for kind in loaders:
            for mode in modes:
                name = f"{labels[kind]}, {'loader alone' if mode == 'alone' else 'U-Net, 1 ' + ('GPU' if cuda else 'CPU')}"
                why = None
                if kind != "ours" and not have_torch:
                    why = "skipped: torch is not installed"
                elif kind == "tensorstore":
                    try:
                        import tensorstore  # noqa: F401
                    except ImportError:
                        why = "skipped: tensorstore is not installed"
                if why:
                    rows.append(Row(name, "warm", float("nan"), 0, note=why))
                    continue
                res = run_row(kind, mode, cfg)
                results[(kind, mode)] = res
                rows.append(_row(name, res, cfg["batch"], sample_bytes, mode))
        _DATALOADERS.clear()  # their worker processes end
        gpus = torch.cuda.device_count() if cuda else 0
        ddp = train and "ours" in loaders and not getattr(args, "no_ddp", False)
        if ddp and gpus >= 2:
            res = run_ddp_rows(cfg, 2)
            results[("ours", "ddp2")] = res
            rows.append(_row(f"{OURS}, U-Net, 2 GPUs DDP", res, cfg["batch"], sample_bytes, "train"))
        elif ddp:
            rows.append(Row(f"{OURS}, U-Net, 2 GPUs DDP", "warm", float("nan"), 0, note=f"skipped: {gpus} GPU visible"))

        print(f"\n{'row':<52} {'samples/s best':>14} {'median':>8} {'GPU busy':>9} {'nvml':>6}  note")
        for r in rows:
            e = r.extra
            busy = f"{e['gpu_busy']:.0%}" if e.get("gpu_busy") is not None else "-"
            nv = f"{e['nvml']:.0%}" if e.get("nvml") is not None else "-"
            best = f"{e['samples_per_s']:.1f}" if "samples_per_s" in e else "-"
            med = f"{e['samples_per_s_median']:.1f}" if "samples_per_s" in e else "-"
            print(f"{r.name:<52} {best:>14} {med:>8} {busy:>9} {nv:>6}  {r.note}")
        summary = _summary(results, cuda and not quick)
        for line in summary:
            print(line)
        meta = {"device": device, "quick": quick, "channels": channels, "time_steps": steps, "shape": [nlat, nlon],
                "sample_shape": [channels, 2, lat, nlon], "host": platform.node(), "gpus": gpus,
                "torch": torch.__version__ if have_torch else None, "summary": summary,
                **{k: cfg[k] for k in ("batch", "prefetch", "workers", "base", "repeats", "seconds")}}
        out_dir = getattr(args, "out", None) or "bench-results"
        print("saved:", ", ".join(save(rows, out_dir, "bench-train", "training loaders: samples/s", meta)))
    return 0


def _row(name: str, res: dict, batch: int, sample_bytes: int, mode: str) -> Row:
    seconds = batch / res["best"] if res["best"] else float("nan")  # one batch at the best rate
    note = f"median {res['median']:.1f} samples/s of {len(res['rates'])} windows"
    extra = {"samples_per_s": res["best"], "samples_per_s_median": res["median"], "rates": res["rates"],
             "gpu_busy": res["busy"] if mode == "train" else None, "gpu_busy_median": res.get("busy_median") if mode == "train" else None,
             "nvml": res.get("nvml")}
    return Row(name, "warm", seconds, batch * sample_bytes, note=note, extra=extra)


def _summary(results: dict, gpu: bool) -> list[str]:
    lines = []
    a, b = results.get(("ours", "alone")), results.get(("zarr-python", "alone"))
    c = results.get(("tensorstore", "alone"))
    if a and b:
        lines.append(f"loader alone: ZarrLoader {a['best'] / b['best']:.1f}x DataLoader + zarr-python"
                     + (f", {a['best'] / c['best']:.1f}x DataLoader + tensorstore" if c else "")
                     + (f" (target >= 10x: {'met' if a['best'] >= 10 * b['best'] else 'NOT met'})" if gpu else ""))
    if gpu:
        ta, tb = results.get(("ours", "train")), results.get(("zarr-python", "train"))
        if ta:
            lines.append(f"U-Net, 1 GPU: GPU busy {ta['busy']:.0%} with ZarrLoader (target >= 90%: "
                         f"{'met' if ta['busy'] >= 0.9 else 'NOT met'})"
                         + (f", {tb['busy']:.0%} with DataLoader + zarr-python" if tb else ""))
        d = results.get(("ours", "ddp2"))
        if d and ta:
            lines.append(f"U-Net, 2 GPUs DDP: {d['best'] / ta['best']:.2f}x one GPU (target >= 1.9x: "
                         f"{'met' if d['best'] >= 1.9 * ta['best'] else 'NOT met'})")
    return lines
