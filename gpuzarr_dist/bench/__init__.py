"""Benchmarks behind ``gpuzarr-dist bench``: our figure and the alternatives', same data, same run."""

from __future__ import annotations


def main(args) -> int:
    """Dispatch ``gpuzarr-dist bench <name>``."""
    name = getattr(args, "bench", None) or getattr(args, "name", None) or "read"
    if name == "read":
        from gpuzarr_dist.bench.read import run

        return run(args)
    if name == "write":
        from gpuzarr_dist.bench.write import run as run_write

        return run_write(args)
    if name == "shards":
        from gpuzarr_dist.bench.shards import run as run_shards

        return run_shards(args)
    if name == "remote":
        from gpuzarr_dist.bench.remote import run as run_remote

        return run_remote(args)
    if name == "scale":
        from gpuzarr_dist.bench.scale import run as run_scale

        return run_scale(args)
    if name == "cubed":
        from gpuzarr_dist.bench.cubed import run as run_cubed

        return run_cubed(args)
    if name == "train":
        from gpuzarr_dist.bench.train import run as run_train

        return run_train(args)
    if name == "climate":
        from gpuzarr_dist.bench.climate import run as run_climate

        return run_climate(args)
    raise SystemExit(f"unknown benchmark {name!r}; available: read, write, shards, remote, scale, climate, cubed, train")
