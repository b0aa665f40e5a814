"""A real multi-process dask cluster: the graph and the reader travel to workers and read right."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import assert_same, make_data, reference, write_array

import gpuzarr_dist as gz

distributed = pytest.importorskip("distributed")


@pytest.mark.slow
def test_reduction_on_process_cluster(tmp_path):
    v3 = str(tmp_path / "v3.zarr")
    v2 = str(tmp_path / "v2.zarr")
    data = make_data("float64", (30, 22), seed=51, specials=False)
    write_array(v3, data, (4, 5), which="some", fill_value=np.nan)
    write_array(v2, data.astype(">i4"), (7, 3), zarr_format=2, order="F")
    ref3, ref2 = reference(v3), reference(v2)

    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=40
    ) as cluster, distributed.Client(cluster) as client:
        x = gz.from_zarr_gpu(v3, chunks=(8, 10), device="cpu")
        y = gz.from_zarr_gpu(v2, chunks=(7, 6), device="cpu")
        mean, total, part, count = client.compute(
            [
                np.nanmean(x * 2 + 1, axis=0),
                y.sum(dtype="int64"),
                x[3:17, ::2],
                (y > 0).sum(),
            ],
            sync=True,
        )
        # the work really ran in the worker processes
        workers = client.run(lambda: __import__("os").getpid())
        assert len(set(workers.values())) == 2
        assert os.getpid() not in workers.values()

    np.testing.assert_allclose(mean, np.nanmean(ref3 * 2 + 1, axis=0), rtol=1e-12)
    assert int(total) == int(ref2.astype("int64").sum())
    assert_same(part, ref3[3:17, ::2])
    assert int(count) == int((ref2 > 0).sum())
