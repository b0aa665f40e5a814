"""Benchmarks behind ``gpuzarr-dist bench``: our figure and the alternatives', same data, same run."""

from __future__ import annotations


def main(args) -> int:
    """Dispatch ``gpuzarr-dist bench <name>``."""
    name = getattr(args, "bench", None) or getattr(args, "name", None) or "read"
    if name == "read":
        from .read import run

        return run(args)
    if name == "cubed":
        from .cubed import run as run_cubed

        return run_cubed(args)
    raise SystemExit(f"unknown benchmark {name!r}; available: read, cubed")
