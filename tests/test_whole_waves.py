"""Block counts in whole waves of a worker's threads (``gpuzarr.cluster.whole-waves``): the block
layout against dask's own count of the blocks, and the values against zarr-python."""

from __future__ import annotations

import dask
import numpy as np
import pytest
import zarr

from gpuzarr_dist import from_zarr_gpu
from gpuzarr_dist.array.read import WAVE_GROW, WAVE_SHRINK, auto_block_shape, block_count, whole_wave_block_shape
from gpuzarr_dist.stores.source import open_source

STEP = 8 * 8 * 4  # bytes of one (8, 8) float32 time step, the chunk


def _spec(tmp_path, steps: int):
    path = str(tmp_path / f"a{steps}.zarr")
    zarr.create_array(path, shape=(steps, 8, 8), chunks=(1, 8, 8), dtype="float32")
    return open_source(path, None, None)[1]


@pytest.mark.parametrize(
    ("steps", "per_block", "threads", "expected"),
    [
        (1926, 225, 8, 8),  # 9 blocks on 8 threads: one fewer, each a ninth larger
        (9631, 225, 8, 40),  # 43: down to 40
        (2700, 225, 8, 16),  # 12: 8 would make blocks 1.5x larger, so up to 16
        (1800, 225, 8, 8),  # 8 already
        (1350, 225, 8, 6),  # 6 blocks on 8 threads: one wave, left alone
        (1926, 225, 1, 9),  # one thread: left alone
    ],
)
def test_block_count_is_a_multiple_of_the_threads_where_near(tmp_path, steps, per_block, threads, expected):
    spec = _spec(tmp_path, steps)
    target = per_block * STEP
    shape = whole_wave_block_shape(spec, target, threads)
    chunks = dask.array.core.normalize_chunks(shape, spec.shape)
    assert np.prod([len(c) for c in chunks]) == block_count(spec, shape) == expected
    sizes = chunks[0]
    if expected != block_count(spec, auto_block_shape(spec, target)):
        assert min(sizes) >= 0.9 * max(sizes)  # balanced: no short remainder block
        assert WAVE_SHRINK * target <= max(sizes) * STEP <= WAVE_GROW * target * 1.01


def test_from_zarr_gpu_on_a_client_makes_whole_waves(tmp_path):
    distributed = pytest.importorskip("distributed")
    path = str(tmp_path / "t.zarr")
    data = np.random.default_rng(0).standard_normal((1926, 8, 8)).astype("float32")
    a = zarr.create_array(path, shape=data.shape, chunks=(1, 8, 8), dtype="float32")
    a[:] = data
    size = {"gpuzarr.block-size.cpu": 225 * STEP}
    with dask.config.set(size):
        assert from_zarr_gpu(path, device="cpu").numblocks[0] == 9  # no client
        with distributed.LocalCluster(n_workers=1, threads_per_worker=8, processes=False, dashboard_address=None) as c, \
                distributed.Client(c):
            x = from_zarr_gpu(path, device="cpu")
            assert x.numblocks[0] == 8
            ref = zarr.open_array(path, mode="r")[:].astype("float64").sum(axis=0)
            np.testing.assert_allclose(x.astype("float64").sum(axis=0).compute(), ref, rtol=1e-12, atol=1e-9)
            with dask.config.set({"gpuzarr.cluster.whole-waves": False}):
                assert from_zarr_gpu(path, device="cpu").numblocks[0] == 9
