"""Train a small U-Net to predict the next time step of a multi-variable climate store, fed by ZarrLoader.

    python examples/train_unet.py --device cpu                   # makes a small group first, trains on the CPU
    python examples/train_unet.py era5_group.zarr --variables t2m,u10,v10 --epochs 5
    torchrun --nproc-per-node 2 examples/train_unet.py era5_group.zarr --variables t2m,u10,v10   # DDP, one GPU each

``gpuzarr_dist.ml.ZarrLoader`` yields batches ``(batch, channels, 2, lat, lon)``
(the group's variables stacked as channels, two consecutive time steps):
the model maps the first step to the second. On a GPU the loader reads and
decodes the next batches on its own threads and streams while the step runs,
and hands each batch to torch through DLPack, on this rank's GPU, ready on
torch's current stream. Under ``torchrun`` each rank reads its own share of
every epoch (``rank`` and ``world_size`` come from ``torch.distributed``).
Without a store argument the script writes a group of three variables
(time, 32, 64) with zarr-python. Needs torch.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import zarr
from torch import nn

from gpuzarr_dist.ml import ZarrLoader


def write_group(path: str, names: list[str], steps: int = 16, ny: int = 32, nx: int = 64) -> None:
    """A small group of (time, lat, lon) float32 variables: travelling waves plus noise, one chunk per step."""
    rng = np.random.default_rng(0)
    y, x = np.meshgrid(np.linspace(-1, 1, ny), np.linspace(0, 2 * np.pi, nx), indexing="ij")
    g = zarr.open_group(path, mode="w", zarr_format=3)
    for c, name in enumerate(names):
        t = np.arange(steps)[:, None, None]
        field = np.cos(x[None] - 0.2 * (c + 1) * t) * (1 - y[None] ** 2) + 0.05 * rng.standard_normal((steps, ny, nx))
        a = g.create_array(name, shape=field.shape, chunks=(1, ny, nx), dtype="float32",
                           dimension_names=("time", "latitude", "longitude"))
        a[...] = field.astype("float32")


class UNet(nn.Module):
    """Two levels of down- and up-sampling with skip connections (height and width divisible by 4)."""

    def __init__(self, channels: int, base: int = 16):
        super().__init__()

        def block(i: int, o: int) -> nn.Module:
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.SiLU(), nn.Conv2d(o, o, 3, padding=1), nn.SiLU())

        self.d1, self.d2, self.mid = block(channels, base), block(base, 2 * base), block(2 * base, 4 * base)
        self.u2, self.u1 = nn.ConvTranspose2d(4 * base, 2 * base, 2, 2), nn.ConvTranspose2d(2 * base, base, 2, 2)
        self.e2, self.e1 = block(4 * base, 2 * base), block(2 * base, base)
        self.out = nn.Conv2d(base, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s1 = self.d1(x)
        s2 = self.d2(nn.functional.max_pool2d(s1, 2))
        m = self.mid(nn.functional.max_pool2d(s2, 2))
        x = self.e2(torch.cat([self.u2(m), s2], 1))
        x = self.e1(torch.cat([self.u1(x), s1], 1))
        return self.out(x)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("store", nargs="?", help="a Zarr group with (time, latitude, longitude) variables")
    p.add_argument("--variables", default="t2m,u10,v10", help="comma-separated variables, stacked as channels")
    p.add_argument("--lat", type=int, help="window height (default: the grid's, rounded down to a multiple of 4)")
    p.add_argument("--lon", type=int, help="window width (default: the grid's, rounded down to a multiple of 4)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto")
    args = p.parse_args()
    names = args.variables.split(",")

    distributed = "WORLD_SIZE" in os.environ  # started by torchrun
    cuda = args.device != "cpu" and torch.cuda.is_available()
    if distributed:
        local = int(os.environ.get("LOCAL_RANK", 0))
        if cuda:
            torch.cuda.set_device(local)  # the rank's GPU: the loader reads on it too
        dist.init_process_group("nccl" if cuda else "gloo")
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")

    tmp = None
    store = args.store
    if store is None:
        tmp = tempfile.TemporaryDirectory()
        store = os.path.join(tmp.name, "group.zarr")
        if not distributed or dist.get_rank() == 0:
            write_group(store, names)
        if distributed:
            dist.barrier()
    shape = zarr.open_array(store, path=names[0], mode="r").shape
    lat = args.lat or shape[1] // 4 * 4
    lon = args.lon or shape[2] // 4 * 4

    loader = ZarrLoader(store, variables=names, window={"time": 2, "latitude": lat, "longitude": lon},
                        stride={"time": 1}, batch_size=args.batch, shuffle=True, seed=0, prefetch=2,
                        device="gpu" if cuda else "cpu", output="torch")
    torch.manual_seed(0)  # the same initial weights on every rank and every run
    model = UNet(len(names)).to(dev)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[dev.index] if cuda else None)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rank = dist.get_rank() if distributed else 0
    if rank == 0:
        print(f"{loader!r}: {len(loader)} batches per epoch per rank, on {dev}")
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        t0, total, n = time.perf_counter(), 0.0, 0
        for batch in loader:
            x, y = batch[:, :, 0], batch[:, :, 1]  # (B, C, lat, lon): this step and the next
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.item()  # (a host sync per step: fine for a printout)
            n += len(batch)
        if rank == 0:
            print(f"epoch {epoch}: loss {total / max(len(loader), 1):.4f}, "
                  f"{n * (dist.get_world_size() if distributed else 1) / (time.perf_counter() - t0):.1f} samples/s")
    loader.close()
    if distributed:
        dist.destroy_process_group()
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
