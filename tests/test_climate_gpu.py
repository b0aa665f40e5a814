"""``gpuzarr_dist.xarray.groupby``: the grouped mean and grouped arithmetic against xarray on numpy.

Every test runs on numpy blocks here and on cupy blocks on a GPU machine
(``device="gpu"``, marked ``gpu``): the same functions, the same reference
(xarray's own ``groupby`` on the values copied to numpy). On the GPU the
results must also stay on the device.
"""

from __future__ import annotations

import json
import operator

import dask
import dask.array as da
import numpy as np
import pandas as pd
import pytest
import xarray as xr

import gpuzarr_dist as gz
from gpuzarr_dist.xarray.groupby import BlockGroupBy, groupby, grouped_apply, grouped_mean

DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


def _xp(device: str):
    if device == "gpu":
        import cupy

        return cupy
    return np


def _host(x):
    return x.get() if hasattr(x, "get") else np.asarray(x)


def _on_device(arr: xr.DataArray, device: str) -> bool:
    data = arr.data
    sample = data._meta if isinstance(data, da.Array) else data
    return type(sample).__module__.split(".")[0] == ("cupy" if device == "gpu" else "numpy")


def _values(dtype="float32", nan=True, shape=(3, 400, 5), seed=0):
    rng = np.random.default_rng(seed)
    v = (280 + 10 * rng.standard_normal(shape)).astype(dtype)
    if nan:
        v[0, 5, 1] = np.nan
        v[1, 12:41, 2] = np.nan  # every February value of one point (days 12..40 and from 378 on,
        v[1, 378:, 2] = np.nan  # counted from 2000-01-20): its February mean is NaN
    return v


def _array(values, device, chunks=None, dims=("lat", "time", "lon")):
    """A DataArray over ``values`` (daily from 2000-01-20) on ``device``, in dask blocks when ``chunks``."""
    xp = _xp(device)
    t = pd.date_range("2000-01-20", periods=values.shape[dims.index("time")], freq="D")
    if chunks is None:
        data = xp.asarray(values)
    else:
        data = da.from_array(values, chunks=chunks)
        if device == "gpu":
            data = data.map_blocks(xp.asarray, dtype=values.dtype, meta=xp.empty((0,) * values.ndim, values.dtype))
    coords = {"time": t, "lat": [10.0, 20.0, 30.0][: values.shape[dims.index("lat")]],
              "lon": np.arange(values.shape[dims.index("lon")], dtype=float), "step": ("time", np.arange(t.size))}
    return xr.DataArray(data, dims=dims, coords=coords, name="t2m", attrs={"units": "K"})


def _reference(values, dims=("lat", "time", "lon")) -> xr.DataArray:
    return _array(values, "cpu", dims=dims)


def _assert_same(got: xr.DataArray, ref: xr.DataArray, device: str, atol: float = 0.0) -> None:
    """Same dims, coords, name, attrs and dtype as xarray's result; values within a float32 rounding or two."""
    assert _on_device(got, device), type(got.data)
    host = got.copy(data=_host(got.compute().data))
    assert host.dims == ref.dims and host.dtype == ref.dtype and host.name == ref.name and host.attrs == ref.attrs
    assert sorted(map(str, host.coords)) == sorted(map(str, ref.coords))
    xr.testing.assert_allclose(host, ref, rtol=2e-6, atol=atol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("chunks", [None, (3, 37, 5), (2, 64, 3)], ids=["in-memory", "time-blocks", "2d-blocks"])
def test_mean_and_anomaly(device, chunks):
    """The climatology and the anomaly of daily data equal xarray's, NaNs skipped, in memory and in blocks."""
    values = _values()
    a = _array(values, device, chunks)
    ref = _reference(values)
    clim = groupby(a, "time.month").mean("time")
    clim_ref = ref.groupby("time.month").mean("time")
    assert isinstance(clim.data, da.Array) == (chunks is not None)
    _assert_same(clim, clim_ref, device)
    assert np.isnan(_host(clim.compute().data)[1, 1, 2])  # an all-NaN group gives NaN, as in xarray
    anom = groupby(a, "time.month") - clim
    _assert_same(anom, ref.groupby("time.month") - clim_ref, device, atol=3e-4)  # xarray: 3 roundings at 280
    if chunks is not None:
        assert anom.data.chunks == a.data.chunks  # the operand's blocks, not a rechunked graph


@pytest.mark.parametrize("device", DEVICES)
def test_other_dtypes_and_skipna(device):
    """Integers (counted on the host, float64 means), skipna=False, float64, a time axis first."""
    dims = ("time", "lat", "lon")
    ints = (_values(nan=False, shape=(120, 3, 4)) * 10).astype("int16")
    _assert_same(groupby(_array(ints, device, (50, 3, 4), dims), "time.month").mean(),
                 _reference(ints, dims).groupby("time.month").mean("time"), device)
    values = _values(shape=(3, 400, 5))
    _assert_same(groupby(_array(values, device, (3, 50, 5)), "time.month").mean("time", skipna=False),
                 _reference(values).groupby("time.month").mean("time", skipna=False), device)
    f64 = _values(dtype="float64", shape=(3, 200, 5))
    _assert_same(groupby(_array(f64, device, (3, 30, 5)), "time.month").mean(["time"]),
                 _reference(f64).groupby("time.month").mean("time"), device)


@pytest.mark.parametrize("device", DEVICES)
def test_arithmetic_and_reflexive(device):
    """+, *, / with the climatology; grouped_apply's reflexive form (clim - x) against numpy."""
    values = _values(nan=False)
    a, ref = _array(values, device, (3, 45, 5)), _reference(values)
    clim, clim_ref = groupby(a, "time.month").mean("time"), ref.groupby("time.month").mean("time")
    for op in (operator.add, operator.mul, operator.truediv):
        _assert_same(op(groupby(a, "time.month"), clim), op(ref.groupby("time.month"), clim_ref), device, atol=1e-3)
    g = groupby(a, "time.month")
    got = grouped_apply(a.data, clim.data, g.codes, 1, operator.sub, reflexive=True).compute()
    expected = clim_ref.values[:, g.codes, :] - values
    np.testing.assert_allclose(_host(got), expected, rtol=0, atol=3e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_store_climatology_written_back(device, tmp_path):
    """A Zarr store read by gpuzarr (cupy blocks on the GPU): climatology, anomaly written by to_zarr_gpu,
    read back by xarray (zarr-python) equal to xarray's anomaly on numpy."""
    from gpuzarr_dist.synthetic import make_era5_dataset

    store = make_era5_dataset(tmp_path / "in.zarr", 100, nlat=9, nlon=16).path
    ds = gz.open_dataset(store, device=device, chunks={"time": 17})
    t2m = ds.t2m
    assert _on_device(t2m, device)
    clim = groupby(t2m, "time.month").mean("time")
    anom = groupby(t2m, "time.month") - clim
    assert _on_device(anom, device)
    gz.to_zarr_gpu(anom.to_dataset(name="anom").drop_encoding(), str(tmp_path / "out.zarr"), device=device)
    ref_t2m = xr.open_zarr(store).t2m.load()
    ref = ref_t2m.groupby("time.month") - ref_t2m.groupby("time.month").mean("time")
    back = xr.open_zarr(str(tmp_path / "out.zarr")).anom.load()
    np.testing.assert_allclose(back.values, ref.values, rtol=0, atol=8 * np.finfo(np.float32).eps * 320)
    np.testing.assert_array_equal(back.month.values, ref.month.values)


def test_one_task_per_block_and_one_read(monkeypatch):
    """The mean's graph: one task per block, a combine tree, one division; each block read once."""
    from gpuzarr_dist.array import reader

    x = da.from_array(_values(nan=False, shape=(100, 4, 4)), chunks=(10, 4, 4))
    codes = np.arange(100) // 9 % 12
    m = grouped_mean(x, codes, 12, 0, split_every=4)
    layer = dict(m.__dask_graph__().layers[m.name])
    kinds = sorted({k[0].rsplit("-", 1)[0] for k in layer})
    assert kinds == ["groupby-combine", "groupby-mean", "groupby-sums"]
    assert sum(k[0].startswith("groupby-sums") for k in layer) == 10
    assert sum(k[0].startswith("groupby-combine") for k in layer) == 3 + 1  # 10 -> 3 -> 1
    np.testing.assert_allclose(m.compute(), np.stack([x.compute()[codes == g].mean(0) for g in range(12)]),
                               rtol=1e-6)

    calls = []
    original = reader.BlockReader.__getitem__

    def counted(self, key):
        calls.append(key)
        return original(self, key)

    import zarr

    store = zarr.create_array({}, shape=(96, 3, 4), chunks=(1, 3, 4), dtype="f4")
    store[...] = _values(nan=False, shape=(96, 3, 4))
    y = gz.from_zarr_gpu(store, chunks=(24, 3, 4), device="cpu")
    monkeypatch.setattr(reader.BlockReader, "__getitem__", counted)
    with dask.config.set(scheduler="sync"):
        grouped_mean(y, np.arange(96) % 12, 12, 0).compute()
    assert len(calls) == 4


def test_partial_sums_cross_workers_once_on_a_placed_cluster():
    """On a cluster with block placement, the mean's first combines add only one worker's blocks: one partial
    crosses between the two workers (a flat combine of all blocks pulled every other worker's partials)."""
    distributed = pytest.importorskip("distributed")
    import zarr

    from gpuzarr_dist.xarray.groupby import _block_workers, _runs_of

    values = _values(nan=False, shape=(96, 6, 5))
    codes = np.arange(96) // 8 % 12
    store = zarr.create_array({}, shape=values.shape, chunks=(1, 6, 5), dtype="f4")
    store[...] = values
    expected = np.stack([values[codes == g].astype(np.float64).mean(0) for g in range(12)])
    assert _block_workers((12, 1, 1)) is None  # no client: the plain tree
    with gz.start_cluster(2, threads_per_gpu=1, device="cpu", quiet=True, dashboard_address=None,
                          silence_logs=40) as client:
        owners = _block_workers((12, 1, 1))
        assert owners.reshape(-1).tolist() == [0] * 6 + [1] * 6  # the placement plugin's runs
        y = gz.from_zarr_gpu(store, chunks=(8, 6, 5), device="cpu")
        m = grouped_mean(y, codes, 12, 0)
        layer = dict(m.__dask_graph__().layers[m.name])
        first = {k: v for k, v in layer.items() if k[0].startswith("groupby-combine") and k[1] == 0}
        sums_of = {i: k for k in layer if k[0].startswith("groupby-sums") for i in [k[1]]}
        runs = [[sums_of[i] for i in range(6)], [sums_of[i] for i in range(6, 12)]]
        assert sorted(v[1] for v in first.values()) == runs  # each worker's six blocks, added where they are
        with distributed.get_task_stream(client) as ts:
            got = m.compute()
        np.testing.assert_allclose(got, expected, rtol=1e-6)
        transfers = sum(1 for t in ts.data for ss in t["startstops"] if ss["action"] == "transfer")
        assert transfers <= 2, ts.data  # one partial crosses (slack for work stealing, as in test_placement)
        with dask.config.set({"gpuzarr.cluster.placement": False}):
            assert _block_workers((12, 1, 1)) is None
    assert _runs_of(list("abcdefg"), [0, 0, 0, 1, 1, 0, 0], 2) == [["a", "b"], ["c"], ["d", "e"], ["f", "g"]]


def test_dataset_fallbacks_and_errors():
    """A Dataset's mean; what is handed to xarray (other reductions, a missing label); bad input."""
    values = _values(shape=(3, 120, 5))
    a, ref = _array(values, "cpu", (3, 40, 5)), _reference(values)
    ds, ds_ref = a.to_dataset(), ref.to_dataset()
    xr.testing.assert_allclose(groupby(ds, "time.month").mean("time").compute(),
                               ds_ref.groupby("time.month").mean("time"))
    xr.testing.assert_allclose(groupby(a, "time.month").max("time").compute(), ref.groupby("time.month").max("time"))
    xr.testing.assert_allclose(groupby(a, "time.month").mean(("time", "lon")).compute(),
                               ref.groupby("time.month").mean(("time", "lon")))
    # a climatology lacking a month: that month's anomalies are NaN, as xarray gives
    clim = ref.groupby("time.month").mean("time").isel(month=slice(1, None))
    xr.testing.assert_allclose((groupby(a, "time.month") - clim).compute(), ref.groupby("time.month") - clim)
    labels = xr.DataArray(np.where(np.arange(120) < 3, np.nan, np.arange(120) // 30), dims="time", name="blk",
                          coords={"time": a.time})
    g = groupby(a, labels)
    assert isinstance(g, BlockGroupBy) and not g.complete
    xr.testing.assert_allclose(g.mean("time").compute(), ref.groupby(labels).mean("time"))
    with pytest.raises(ValueError, match="group codes"):
        grouped_mean(a.data, np.zeros(7, dtype=int), 1, 1)
    with pytest.raises(ValueError, match="does not match"):
        grouped_apply(a.data, da.zeros((3, 12, 4)), g.codes.clip(0), 1)
    with pytest.raises(TypeError, match="DataArray or Dataset"):
        groupby(values, "time.month")


@pytest.mark.gpu
def test_bench_climate_quick_on_gpu(tmp_path, capsys):
    """``bench climate --quick`` on one GPU: the GPU rows' output equals the CPU row's (exit 0)."""
    from gpuzarr_dist.cli import main

    code = main(["bench", "climate", "--quick", "--device", "gpu", "--gpus", "1", "--repeats", "1",
                 "--cpu-gb", "0.01", "--path", str(tmp_path / "data"), "--out", str(tmp_path / "res")])
    out = capsys.readouterr().out
    assert code == 0, out
    with open(tmp_path / "res" / "bench-climate.json") as f:
        res = json.load(f)
    assert res["meta"]["device"] == "gpu" and res["meta"]["failures"] == []
    assert any(r["name"] == "gpuzarr-dist, 1 GPU" for r in res["rows"])


@pytest.mark.gpu
def test_bench_climate_xarray_row_on_gpu(tmp_path, capsys):
    """``--xarray-row``: xarray's own groupby (no flox) on cupy blocks runs and matches the CPU row."""
    from gpuzarr_dist.cli import main

    code = main(["bench", "climate", "--quick", "--device", "gpu", "--gpus", "1", "--repeats", "1",
                 "--cpu-gb", "0.01", "--xarray-row", "--path", str(tmp_path / "data"), "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "xarray's own groupby (no flox), 1 GPU" in out
