"""``gpuzarr-dist bench climate --quick``: every row's output against xarray computed on numpy.

The reference is the workload computed directly by xarray on the whole
dataset loaded into memory (numpy, xarray's own groupby), independently of
both the benchmark's CPU row and gpuzarr-dist's groupby.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import xarray as xr
import zarr

from gpuzarr_dist.bench.climate import OUT_NAME, check_disk, compare_outputs
from gpuzarr_dist.cli import main


def _reference(store: str, steps: int | None = None) -> tuple[xr.DataArray, float]:
    """xarray's anomaly on numpy, and the error allowed: a few float32 roundings of the input's largest value.

    xarray's float32 mean on numpy is itself a few units in the last place off
    the float64 mean (the benchmark's rows sum in float64), and the error of
    the climatology is the error of the anomaly.
    """
    t2m = xr.open_zarr(store).t2m.load()
    if steps is not None:
        t2m = t2m.isel(time=slice(0, steps))
    clim = t2m.groupby("time.month").mean("time")
    return t2m.groupby("time.month") - clim, 8 * float(np.finfo(np.float32).eps) * float(np.abs(t2m).max())


def _check(path: str, reference: tuple[xr.DataArray, float]) -> None:
    ref, atol = reference
    got = xr.open_zarr(path)[OUT_NAME].load()
    assert got.shape == ref.shape and got.dtype == np.float32
    np.testing.assert_array_equal(got.time.values, ref.time.values)
    np.testing.assert_array_equal(got.month.values, ref.month.values)
    np.testing.assert_allclose(got.values, ref.values, rtol=0, atol=atol)


def test_bench_climate_quick(tmp_path, capsys):
    """Quick run on CPU workers, the CPU row over part of the time axis: exit 0, a table with every row, the
    JSON, and every output (the CPU row's, each row's warm-up over the same steps, the last full-size one)
    equal to xarray's on numpy."""
    code = main(["bench", "climate", "--quick", "--device", "cpu", "--repeats", "1", "--cpu-gb", "0.01",
                 "--path", str(tmp_path / "data"), "--out", str(tmp_path / "res")])
    out = capsys.readouterr().out
    assert code == 0, out
    for name in ("dask on the CPU", "gpuzarr-dist, 1 CPU worker", "gpuzarr-dist, 2 CPU workers"):
        assert name in out
    with open(tmp_path / "res" / "bench-climate.json") as f:
        res = json.load(f)
    assert res["meta"]["failures"] == []
    assert set(res["meta"]["speedup_over_cpu"]) == {"1", "2"}
    assert len(res["rows"]) == 3 and all(r["gbps"] > 0 for r in res["rows"])
    assert (tmp_path / "res" / "bench-climate.txt").read_text().count("\n") == 5
    store = str(tmp_path / "data" / "era5-daily.zarr")
    subset = res["meta"]["cpu_time_steps"]
    assert subset < res["meta"]["time_steps"]
    ref_subset = _reference(store, subset)
    _check(str(tmp_path / "data" / "anomaly-cpu.zarr"), ref_subset)
    for n in (1, 2):  # the warm-up runs, over the CPU row's steps
        _check(str(tmp_path / "data" / f"anomaly-{n}-check.zarr"), ref_subset)
    _check(str(tmp_path / "data" / "anomaly-2.zarr"), _reference(store))  # the last full-size output is kept
    # one more, staged run per row: the workers together read every stored chunk of the input once per phase and
    # wrote every chunk of the output once (the files on disk; the staged run's output is byte-identical)
    read, written = _stored(os.path.join(store, "t2m")), _stored(str(tmp_path / "data" / "anomaly-2.zarr" / OUT_NAME))
    for row in res["rows"][1:]:
        phases = row["extra"]["stages"]
        assert set(phases) == {"climatology", "anomaly"}
        for phase, got in phases.items():
            assert len(got["workers"]) == int(row["name"].split(", ")[1][0]) and got["seconds"] > 0
            total = {k: sum(w[k]["bytes"] for w in got["workers"].values()) for k in ("file reads", "object writes")}
            assert total == {"file reads": read, "object writes": written if phase == "anomaly" else 0}, phase
    assert not (tmp_path / "data" / "anomaly-2-staged.zarr").exists()
    assert "gpuzarr-dist, 2 CPU workers against gpuzarr-dist, 1 CPU worker, anomaly, per worker: file reads" in out


def _stored(array_folder: str) -> int:
    """Bytes of an array's chunk files (everything under its folder but its metadata)."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(array_folder) for f in files
               if f != "zarr.json")


def test_compare_outputs_sees_a_difference(tmp_path):
    """The check behind the benchmark's exit code reports a changed value, and refuses moved NaNs."""
    data = np.random.default_rng(0).standard_normal((5, 3, 4)).astype("float32")
    for name, values in (("a", data), ("b", data + np.float32(0.5) * (np.arange(5) == 3)[:, None, None]),
                         ("c", np.where(np.arange(5)[:, None, None] == 1, np.nan, data))):
        arr = zarr.create_array(str(tmp_path / name), name=OUT_NAME, shape=data.shape, chunks=(1, 3, 4), dtype="f4")
        arr[...] = values
    err, scale = compare_outputs(str(tmp_path / "a"), str(tmp_path / "a"))
    assert err == 0 and scale == pytest.approx(float(np.abs(data).max()))
    err, _ = compare_outputs(str(tmp_path / "b"), str(tmp_path / "a"), slab=2)
    assert err == pytest.approx(0.5, rel=1e-5)
    with pytest.raises(AssertionError, match="NaN"):
        compare_outputs(str(tmp_path / "c"), str(tmp_path / "a"))


def test_check_disk_refuses_too_little_room(tmp_path):
    check_disk(str(tmp_path), 10**9, have_data=False, free=2 * 10**9)
    with pytest.raises(SystemExit, match="--path"):
        check_disk(str(tmp_path), 10**9, have_data=False, free=10**9)
    check_disk(str(tmp_path), 10**9, have_data=True, free=10**9)
    assert os.path.isdir(tmp_path)


_BLOCKS_RUN: list[int] = []


def _count_block(block: np.ndarray, block_info: dict | None = None) -> np.ndarray:
    if block_info:  # None when dask calls it on an empty array to learn the output's type
        _BLOCKS_RUN.append(block_info[0]["chunk-location"][0])
    return block


def test_every_repeat_computes_its_persisted_climatology():
    """The runs build identical keys (as ``gz.open_dataset`` does); a result held from one run must not
    stand in for the next run's persist, or the timed run skips the climatology's read."""
    import dask.array as da
    import distributed

    from gpuzarr_dist.bench.climate import _timed, _wait

    def run() -> tuple[float, float, object]:
        x = da.ones((8, 4), chunks=(2, 4), name="source-fixed")
        clim = x.map_blocks(_count_block, dtype=x.dtype, name="clim-fixed").persist()
        _wait(clim)
        assert np.array_equal(clim.compute(), np.ones((8, 4)))
        return 0.0, 0.0, clim

    _BLOCKS_RUN.clear()
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            distributed.Client(cluster):
        _timed(run, 3)
    assert sorted(_BLOCKS_RUN) == sorted([0, 1, 2, 3] * 3)
