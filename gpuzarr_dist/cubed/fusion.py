"""``optimize_dag``: cubed's operation fusion, except where fusing would recompute a broadcast input per task.

Cubed's default optimisation (``multiple_inputs_optimize_dag``) fuses an
operation with every predecessor that has no other consumer. For
``x - mean(x, axis=0)`` that fuses the mean's last stages (combine the
partial sums, divide, squeeze: one task per spatial block) into the subtract
(one task per time x spatial block): each subtract task re-reads the mean's
last partials (``n`` int64 and ``total`` float64 per point, several time
partials deep) and recombines them: with blocks of a few time steps, the
partials it re-reads are as many bytes as the block of ``x`` itself. Dask
computes the mean once and broadcasts it.

``optimize_dag`` does what cubed does but never fuses an operation into a
consumer that has more tasks than it (a fan-out: each of its blocks would be
recomputed by several consumer tasks). The broadcast operand is then written
once (a small array, through our write path) and each consumer task reads
its block of it. Every operation still has its own ``projected_mem`` within
``allowed_mem`` (unfused operations never project more than fused ones).

Use it per computation, as cubed takes it::

    cubed.to_zarr(x - xp.mean(x, axis=0), "anomaly.zarr", optimize_function=gc.optimize_dag)

Importing this module imports cubed.
"""

from __future__ import annotations

from typing import Any

import networkx as nx
from cubed.core.optimization import multiple_inputs_optimize_dag


def _ops(dag: nx.MultiDiGraph) -> dict[str, Any]:
    return {n: d["primitive_op"] for n, d in dag.nodes(data=True) if d.get("primitive_op") is not None}


def _predecessor_ops(dag: nx.MultiDiGraph, name: str) -> set[str]:
    """Ops that produce the arrays ``name`` reads (op -> array -> op in cubed's DAG)."""
    return {op for arr in dag.predecessors(name) for op in dag.predecessors(arr)}


def fan_out_consumers(dag: nx.MultiDiGraph) -> set[str]:
    """Operations with a fusable predecessor operation (its output read by this one only) that has fewer tasks."""
    ops = _ops(dag)
    out = set()
    for name, op in ops.items():
        for pre in _predecessor_ops(dag, name):
            p = ops.get(pre)
            if p is None:
                continue
            sole = all(len(set(dag.successors(arr))) == 1 for arr in dag.successors(pre))
            if sole and int(p.num_tasks) < int(op.num_tasks):
                out.add(name)
    return out


def optimize_dag(dag: nx.MultiDiGraph, *, array_names: Any = None, never_fuse: Any = None,
                 **kwargs: Any) -> nx.MultiDiGraph:
    """cubed's ``multiple_inputs_optimize_dag`` plus :func:`fan_out_consumers` in ``never_fuse``.

    Takes and passes on the same keyword arguments as cubed's function
    (``max_total_source_arrays``, ``max_total_num_input_blocks``, ``always_fuse``, ``never_fuse``).
    """
    never = set(never_fuse or ()) | fan_out_consumers(dag)
    return multiple_inputs_optimize_dag(dag, array_names=array_names, never_fuse=never, **kwargs)
