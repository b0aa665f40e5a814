"""What a device's block read needs of the block reader: :class:`PlanReader`.

:class:`gpuzarr_dist.array.reader.BlockReader` is one; the GPU's block read
(:func:`gpuzarr_dist.cuda.blocks.read_plan_gpu`) takes any, so the device
seam does not import the dask layer above it.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from gpuzarr_dist.core.metadata import ArraySpec
from gpuzarr_dist.core.selection import Plan


class PlanReader(Protocol):
    """A reader of one Zarr array's selection plans: its spec, chunk store and codec pipeline, and its CPU read."""

    spec: ArraySpec
    #: the array's chunk store (:class:`gpuzarr_dist.stores.base.ChunkStore`)
    store: Any

    @property
    def pipeline(self) -> Any:
        """The array's codec pipeline (:class:`gpuzarr_dist.codecs.pipeline.CodecPipeline`)."""

    def read_plan_cpu(self, plan: Plan, out: np.ndarray | None = None) -> np.ndarray:
        """Read the chunks of ``plan`` on the CPU into ``out`` (a new array where ``None``); return it."""
