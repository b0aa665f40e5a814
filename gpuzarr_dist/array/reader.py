"""The block reader: an array-like whose ``__getitem__`` reads a whole selection in one batch.

``from_zarr_gpu`` hands a :class:`BlockReader` to dask as the source array, so
each dask task is ``getter(reader, block_slices)``: read the bytes of every
chunk the block touches (one batched read), decode them (one batched decode
call), and place them into the block. Dask's slice fusion composes a user's
``x[3:17, ::2]`` with the block's slice before the read, so only the chunks
the selection needs are read.

The reader holds only picklable, GPU-free state (a chunk store and an
:class:`~gpuzarr_dist.core.metadata.ArraySpec`); the codec pipeline and any device
resources are created lazily in the process that runs the task.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuzarr_dist.codecs.pipeline import CodecPipeline
from gpuzarr_dist.core.metadata import ArraySpec
from gpuzarr_dist.core.selection import Plan, finish, plan_selection, split_fancy
from gpuzarr_dist.cuda.device import block_memory
from gpuzarr_dist.errors import GpuOutOfMemoryError, UnsupportedDtypeError
from gpuzarr_dist.runtime.stages import stage_timer
from gpuzarr_dist.runtime.threads import decode_pool
from gpuzarr_dist.stores.base import ChunkStore


class BlockReader:
    """Reads selections of one Zarr array on one device ("cpu" or "gpu")."""

    def __init__(self, store: ChunkStore, spec: ArraySpec, device: str = "cpu", decode_bytes: int | None = None):
        if device not in ("cpu", "gpu"):
            raise ValueError(f"BlockReader device must be 'cpu' or 'gpu', got {device!r}")
        if decode_bytes is not None and decode_bytes < 1:
            raise ValueError(f"BlockReader decode_bytes must be a positive number of bytes or None, got {decode_bytes!r}")
        self.store = store
        self.spec = spec
        self.device = device
        #: on the GPU, decode a block in calls of at most this many decoded bytes each (whole rows of its chunk
        #: grid, at least one; None: one call). Bounds nvCOMP's scratch (3.05 bytes per decoded byte for zstd)
        #: and the decoded chunks held at once; the Cubed variant sets it from its memory budget.
        self.decode_bytes = decode_bytes
        self._pipeline: CodecPipeline | None = None
        if device == "gpu" and not spec.numeric:  # when the graph is built, not when a task runs
            raise UnsupportedDtypeError(spec.name, spec.dtype)
        pipeline = CodecPipeline(spec)  # fail early, in the client, on codecs we cannot decode
        if isinstance(store, ChunkStore) and store.object_limit is None:  # a chunk larger than its codecs make:
            store.object_limit = pipeline.stored_limit  # refused unread (see ChunkStore.object_limit)

    # -- array-like surface used by dask.array.from_array ------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self.spec.shape

    @property
    def dtype(self) -> np.dtype:
        return self.spec.dtype

    @property
    def ndim(self) -> int:
        return self.spec.ndim

    @property
    def chunks(self) -> tuple[int, ...]:
        return self.spec.chunk_shape

    def __len__(self) -> int:
        return self.spec.shape[0]

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_pipeline"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        # in a worker process: the store libraries' log records are redacted there too
        from gpuzarr_dist.core.redact import install_log_filter

        install_log_filter()

    def __repr__(self) -> str:
        return f"BlockReader({self.spec.name!r}, shape={self.shape}, dtype={self.dtype}, device={self.device!r})"

    @property
    def pipeline(self) -> CodecPipeline:
        if self._pipeline is None:
            self._pipeline = CodecPipeline(self.spec)
        return self._pipeline

    def __getitem__(self, index: Any) -> Any:
        box, rest = split_fancy(index, self.spec.shape)
        plan = plan_selection(self.spec, box, block_memory(self.device))  # a block that cannot fit fails here
        if self.device == "gpu":
            from gpuzarr_dist.cuda.blocks import read_plan_gpu
            from gpuzarr_dist.cuda.memory import is_out_of_memory, out_of_memory_error, release_cached_device_memory

            try:
                try:
                    out = read_plan_gpu(self, plan)
                except Exception as e:
                    # once more after the pool's cached blocks go back to CUDA (nvCOMP allocates outside the
                    # pool), even where this thread's release found nothing: tasks that fail at the same time
                    # race for it, and the one that released the blocks frees them for all
                    if not is_out_of_memory(e) or isinstance(e, GpuOutOfMemoryError):
                        raise
                    release_cached_device_memory()
                    out = read_plan_gpu(self, plan)
            except Exception as e:
                if is_out_of_memory(e) and not isinstance(e, GpuOutOfMemoryError):
                    raise out_of_memory_error(self.spec.name, plan.out_shape, self.spec.dtype, plan.n_parts, e) from e
                raise
        else:
            out = self.read_plan_cpu(plan)
        out = finish(out, plan)
        return out if rest is None else out[rest]

    # -- CPU device ---------------------------------------------------------------
    def read_plan_cpu(self, plan: Plan, out: np.ndarray | None = None) -> np.ndarray:
        """Read the chunks of ``plan`` on the CPU into ``out`` (a new array where ``None``); return it."""
        spec = self.spec
        if out is None:
            out = np.empty(plan.out_shape, dtype=spec.dtype)
        if not plan.n_parts:
            return out
        keys = spec.chunk_keys(plan.coords())
        timed = stage_timer()
        raw = self.store.read_many(keys)
        timed("chunk reads", sum(memoryview(b).nbytes for b in raw if b is not None))
        present = [i for i, b in enumerate(raw) if b is not None]
        for i, b in enumerate(raw):
            if b is None:
                out[plan.parts[i].out_sel] = spec.fill_value

        def place(j: int, chunk: np.ndarray) -> None:
            part = plan.parts[present[j]]
            out[part.out_sel] = chunk[part.chunk_sel]

        if present:
            self.pipeline.decode_batch(
                [raw[i] for i in present], [keys[i] for i in present], decode_pool(), sink=place
            )
        return out
