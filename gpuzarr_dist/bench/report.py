"""Benchmark results: one row per tool, printed as a table with ratios, saved as JSON and a bar chart."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from typing import Any


def timed(fn: Callable[[], Any], repeats: int, warm: bool = True) -> list[float]:
    """Seconds of ``repeats`` calls of ``fn``, after one untimed call when ``warm``."""
    if warm:
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def selected(given: str | None, choices: Collection[str], command: str, noun: str) -> list[str]:
    """The names a comma-separated option (``given``) picks from ``choices``, in ``choices`` order; all of them
    when it is empty. An unknown name exits with a message naming ``command`` and the ``noun``."""
    if not given:
        return list(choices)
    names = [n.strip() for n in given.split(",") if n.strip()]
    unknown = [n for n in names if n not in choices]
    if unknown or not names:
        raise SystemExit(f"{command}: unknown {noun}(s) {unknown or given!r}; choose from {', '.join(choices)}")
    return [n for n in choices if n in names]


def best_of(fn: Callable[[], Any], repeats: int = 3) -> float:
    """The fastest of ``repeats`` timed calls of ``fn`` after one untimed call."""
    return min(timed(fn, repeats))


@dataclass
class Row:
    name: str  # what ran
    cache: str  # "warm" or "cold"
    seconds: float
    nbytes: int  # decompressed bytes the row delivered
    note: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def gbps(self) -> float:
        return self.nbytes / self.seconds / 1e9 if self.seconds > 0 else float("nan")


def format_table(rows: list[Row], ours: str) -> str:
    """A fixed-width table; each row's ratio is ours / that row, within the same cache state."""
    best = {}
    for r in rows:
        if r.name == ours:
            best[r.cache] = r.gbps
    lines = [f"{'tool':<44} {'cache':<5} {'seconds':>8} {'GB/s':>7} {'ours/this':>9}  note"]
    lines.append("-" * len(lines[0]))
    for r in rows:
        ratio = best.get(r.cache, float("nan")) / r.gbps if r.gbps else float("nan")
        lines.append(f"{r.name:<44} {r.cache:<5} {r.seconds:8.3f} {r.gbps:7.2f} {ratio:9.2f}  {r.note}")
    return "\n".join(lines)


def save(rows: list[Row], out_dir: str, stem: str, title: str, meta: dict) -> list[str]:
    """Write ``stem.json`` and, where matplotlib is installed, ``stem.png``; return the paths written."""
    os.makedirs(out_dir, exist_ok=True)
    written = []
    path = os.path.join(out_dir, f"{stem}.json")
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": [asdict(r) | {"gbps": r.gbps} for r in rows]}, f, indent=1)
    written.append(path)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return written
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.2))
    labels = [f"{r.name} ({r.cache})" for r in rows]
    colors = ["tab:green" if "gpuzarr" in r.name else ("tab:gray" if "ceiling" in r.name else "tab:blue") for r in rows]
    ax.barh(range(len(rows)), [r.gbps for r in rows], color=colors)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("GB/s of decompressed data")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    png = os.path.join(out_dir, f"{stem}.png")
    fig.savefig(png, dpi=110)
    plt.close(fig)
    written.append(png)
    return written
