"""``OpTimings``: a cubed callback that says where a computation's time goes, operation by operation.

For each operation of the plan: its name and cubed op name (``blockwise``,
``partial_reduce``, ``create-arrays``, ...), its tasks, its wall time (first
task start to operation end, as :class:`~gpuzarr_dist.cubed.ThreadsExecutor`
and :class:`~gpuzarr_dist.cubed.DistributedExecutor` send them), the summed
time inside its tasks, the decoded bytes its tasks read and wrote through
gpuzarr-dist's read and write paths (the source and the intermediates) with
the seconds spent there, the bytes our write path stored (compressed), and the
largest measured per-task peak. Bytes, seconds in reads and writes and stored
bytes are measured in this process, i.e. with the threads executor; with the
distributed one they stay 0.

``plan_read_bytes`` / ``plan_write_bytes`` are the sizes of the arrays cubed
lists as the operation's inputs and outputs, each counted whole. They are an
upper bound: an operation fused from several keeps its predecessors' arrays in
its list (the anomaly's subtract listed the source twice, 2x what it read).
Cubed's virtual inputs (the empty and offsets arrays of ``map_blocks``) count
zero. Importing this module imports cubed.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
from cubed.runtime.types import Callback

_VIRTUAL = ("VirtualEmptyArray", "VirtualOffsetsArray", "VirtualFullArray", "VirtualInMemoryArray")


def _nbytes(arr: Any) -> int:
    if arr is None or type(arr).__name__ in _VIRTUAL:
        return 0
    try:
        return int(math.prod(arr.shape) * np.dtype(arr.dtype).itemsize)
    except Exception:  # a target without shape/dtype
        return 0


class OpTimings(Callback):
    """Per-operation tasks, seconds and bytes of the last computation(s); :meth:`rows` / :meth:`table`.

    Pass it in ``callbacks=[...]`` to ``compute``/``to_zarr``; it accumulates
    over several computations until :meth:`reset`.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.ops: dict[str, dict[str, Any]] = {}
        self._order: list[str] = []

    def on_compute_start(self, event: Any) -> None:
        for name, d in event.dag.nodes(data=True):
            op = d.get("primitive_op")
            pipe = d.get("pipeline")
            if op is None or pipe is None or name in self.ops:
                continue
            cfg = pipe.config
            reads = writes = 0
            if hasattr(cfg, "reads_map"):
                reads = sum(_nbytes(p.array) for p in cfg.reads_map.values())
                writes = sum(_nbytes(p.array) for p in cfg.writes_map.values())
            self.ops[name] = {"op": name, "kind": d.get("op_name", name), "tasks": int(op.num_tasks),
                              "projected_mem": int(op.projected_mem), "plan_read_bytes": reads,
                              "plan_write_bytes": writes, "read_bytes": 0, "write_bytes": 0,
                              "tasks_done": 0, "task_s": 0.0, "wall_s": 0.0, "peak": 0, "stored_bytes": 0,
                              "read_s": 0.0, "write_s": 0.0, "_start": None, "_stored0": None, "_io0": None}
            self._order.append(name)

    def on_operation_start(self, event: Any) -> None:
        r = self.ops.get(event.name)
        if r is not None:
            r["_start"] = time.perf_counter()
            r["_stored0"] = _stored()
            r["_io0"] = _io()

    def on_operation_end(self, event: Any) -> None:
        r = self.ops.get(event.name)
        if r is not None and r["_start"] is not None:
            r["wall_s"] += time.perf_counter() - r["_start"]
            r["stored_bytes"] += max(0, _stored() - (r["_stored0"] or 0))
            io, io0 = _io(), r["_io0"] or {}
            for k in ("read_s", "write_s", "read_bytes", "write_bytes"):
                r[k] += max(0, io[k] - io0.get(k, 0))
            r["_start"] = None

    def on_task_end(self, event: Any) -> None:
        r = self.ops.get(event.name)
        if r is None:
            return
        r["tasks_done"] += int(getattr(event, "num_tasks", 1) or 1)
        s, e = getattr(event, "function_start_tstamp", None), getattr(event, "function_end_tstamp", None)
        if s is not None and e is not None:
            r["task_s"] += e - s
        end, start = getattr(event, "peak_measured_mem_end", None), getattr(event, "peak_measured_mem_start", None)
        if end is not None:
            r["peak"] = max(r["peak"], int(end) - int(start or 0))

    def rows(self) -> list[dict[str, Any]]:
        """One dict per operation, in plan order: op, kind, tasks, wall_s, task_s, read/write/stored bytes, peak."""
        return [{k: v for k, v in self.ops[n].items() if not k.startswith("_")} for n in self._order]

    def table(self) -> str:
        return format_rows(self.rows())


def _stored() -> int:
    from gpuzarr_dist.cubed.storage import write_stats

    return int(write_stats()["bytes_stored"])


def _io() -> dict[str, float]:
    from gpuzarr_dist.cubed.storage import io_totals

    return io_totals()


def format_rows(rows: list[dict[str, Any]]) -> str:
    """A text table of :meth:`OpTimings.rows` (also used by ``bench cubed`` for rows read back from JSON)."""
    from dask.utils import format_bytes

    lines = [f"  {'op':<14} {'kind':<16} {'tasks':>6} {'wall s':>8} {'task s':>8} {'in reads':>8} {'in writes':>9} "
             f"{'read':>10} {'written':>10} {'stored':>10} {'peak/task':>10}"]
    for r in rows:
        lines.append(f"  {r['op']:<14} {str(r['kind'])[:16]:<16} {r['tasks']:>6} {r['wall_s']:>8.3f} "
                     f"{r['task_s']:>8.3f} {r.get('read_s', 0.0):>8.3f} {r.get('write_s', 0.0):>9.3f} "
                     f"{format_bytes(r['read_bytes']):>10} {format_bytes(r['write_bytes']):>10} "
                     f"{format_bytes(r['stored_bytes']):>10} {format_bytes(r['peak']):>10}")
    return "\n".join(lines)
