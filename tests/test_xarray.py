"""``gpuzarr_dist.open_dataset`` and ``engine="gpuzarr"`` give the dataset ``xr.open_zarr`` gives.

Stores are written by xarray (CF-encoded: packed int16, NaN and integer fill
values, ``_Unsigned``, times and timedeltas, attributes, variables chunked
differently, Zarr formats 2 and 3, consolidated or not) and by zarr-python
directly. Every comparison is ``xr.testing.assert_identical`` against
``xr.open_zarr`` on the same store, plus each variable's encoding.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from functools import partial

import dask
import dask.array as da
import numcodecs
import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr
from conftest import dev

import gpuzarr_dist as gz
from gpuzarr_dist.xarray.backend import GpuZarrArray, GpuZarrBackendEntrypoint, _device_step, _mask, _OnHost

pytestmark = [
    pytest.mark.usefixtures("device"),
    pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part:UserWarning"),
    pytest.mark.filterwarnings("ignore:Failed to open Zarr store with consolidated metadata:RuntimeWarning"),
    # blocks={"time": 4} on purpose cuts through sst's chunks of 5 time steps
    pytest.mark.filterwarnings("ignore:.*are not multiples of the Zarr chunk size:UserWarning"),
]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# --------------------------------------------------------------------------- data


def cf_dataset(nt: int = 12) -> xr.Dataset:
    """A small dataset in the shape of a reanalysis file, with every CF encoding xarray writes."""
    rng = np.random.default_rng(0)
    time = pd.date_range("2001-01-01", periods=nt, freq="6h")
    lat = np.linspace(60.0, -60.0, 5)
    lon = np.arange(0.0, 360.0, 45.0)
    shape = (nt, lat.size, lon.size)
    air = (rng.normal(280.0, 12.0, shape)).astype("float32")
    air[0, 0, :3] = np.nan
    sst = rng.normal(290.0, 3.0, shape).astype("float32")
    sst[:, 1, 2] = np.nan  # land
    flags = rng.integers(0, 255, shape, endpoint=True).astype("uint8")
    ds = xr.Dataset(
        {
            "air": (("time", "lat", "lon"), air, {"units": "degK", "long_name": "4xDaily Air temperature",
                                                  "valid_range": [185.16, 322.1]}),
            "sst": (("time", "lat", "lon"), sst, {"units": "K", "standard_name": "sea_surface_temperature"}),
            "precip": (("time", "lat", "lon"), rng.gamma(0.5, 2.0, shape), {"units": "mm"}),
            "count": (("time", "lat", "lon"), rng.integers(-5, 50, shape).astype("int32"), {}),
            "flags": (("time", "lat", "lon"), flags, {"flag_meanings": "a b c"}),
            "land": (("lat", "lon"), rng.random((lat.size, lon.size)) > 0.5, {}),
            "lead": (("time",), pd.to_timedelta(np.arange(nt), unit="h").values, {}),
            "valid": (("time",), time + pd.Timedelta("3h"), {}),
            "station": (("lat",), np.array(["a", "bb", "ccc", "dd", "e"]), {}),
            "crs": ((), np.float64(0.0), {"grid_mapping_name": "latitude_longitude"}),
        },
        coords={
            "time": time,
            "lat": ("lat", lat, {"units": "degrees_north"}),
            "lon": ("lon", lon, {"units": "degrees_east"}),
            "area": (("lat", "lon"), np.cos(np.deg2rad(lat))[:, None] * np.ones(lon.size)),
        },
        attrs={"title": "4x daily NMC reanalysis (synthetic)", "Conventions": "CF-1.8", "levels": [1000, 850]},
    )
    ds["air"].encoding = {"dtype": "int16", "scale_factor": 0.01, "add_offset": 280.0, "_FillValue": -32767,
                          "chunks": (4, 5, 4)}
    ds["sst"].encoding = {"chunks": (5, 2, 8)}
    ds["precip"].encoding = {"chunks": (nt, 1, 8), "_FillValue": -9.0, "missing_value": -9.0}
    ds["count"].encoding = {"chunks": (3, 5, 8), "_FillValue": -1}
    ds["flags"].encoding = {"dtype": "int8", "_Unsigned": "true", "_FillValue": -1, "chunks": (6, 5, 8)}
    ds["precip"][1, 1, 1] = np.nan
    return ds


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, str]:
    """The dataset written by xarray in each layout, once per module."""
    root = tmp_path_factory.mktemp("xr")
    ds = cf_dataset()
    out = {}
    for name, kw in {
        "v2": dict(zarr_format=2),
        "v3": dict(zarr_format=3),
        "v3-unconsolidated": dict(zarr_format=3, consolidated=False),
    }.items():
        path = str(root / f"{name}.zarr")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds.to_zarr(path, mode="w", **kw)
        out[name] = path
    return out


# --------------------------------------------------------------------------- helpers

NUMERIC_VARS = {"air", "sst", "precip", "count", "flags", "land", "crs"}


def read_by_gpuzarr(ds: xr.Dataset) -> set[str]:
    """Names of the data variables whose data is a dask array read by gpuzarr (cupy chunks on the GPU)."""
    out = set()
    for name, v in ds.data_vars.items():
        data = v.variable.data
        if isinstance(data, da.Array) and any(str(k).startswith("from-zarr-gpu-") for k in data.dask.layers):
            if dev() == "gpu":
                import cupy

                assert isinstance(data._meta, cupy.ndarray), (name, type(data._meta))
            out.add(name)
    return out


def read_lazily_by_gpuzarr(ds: xr.Dataset) -> set[str]:
    """Names of the data variables whose lazily indexed data xarray reads through a GpuZarrArray."""
    out = set()
    for name, v in ds.data_vars.items():
        data = v.variable._data
        while hasattr(data, "array") and not isinstance(data, GpuZarrArray):
            data = data.array
        if isinstance(data, GpuZarrArray):
            out.add(name)
    return out


def assert_same_dataset(actual: xr.Dataset, expected: xr.Dataset) -> None:
    """assert_identical (values, dtypes, attributes, coordinates), and the same encodings."""
    assert repr(actual.encoding) == repr(expected.encoding)
    for name, v in expected.variables.items():
        assert repr(actual[name].encoding) == repr(v.encoding), name  # repr: NaN fill values compare equal
    if dev() == "gpu":
        actual = actual.as_numpy()  # cupy chunks: copy to the host to compare
    xr.testing.assert_identical(actual, expected)


def open_gz(path: str, **kw) -> xr.Dataset:
    return gz.open_dataset(path, device=dev(), **kw)


# --------------------------------------------------------------------------- same dataset as xr.open_zarr


@pytest.mark.parametrize("layout", ["v2", "v3", "v3-unconsolidated"])
def test_open_dataset_identical_to_open_zarr(stores, layout):
    path = stores[layout]
    ds = open_gz(path)
    assert read_by_gpuzarr(ds) == NUMERIC_VARS
    assert_same_dataset(ds, xr.open_zarr(path))
    assert ds.chunks  # plain dask arrays, seen by xarray as chunked
    # times, timedeltas and strings are decoded by xarray on the host
    assert ds.valid.dtype.kind == "M" and ds.lead.dtype.kind == "m" and ds.station.dtype.kind == "U"


@pytest.mark.parametrize("layout", ["v2", "v3"])
def test_engine_gpuzarr_identical_to_open_zarr(stores, layout):
    assert "gpuzarr" in xr.backends.list_engines()
    path = stores[layout]
    ds = xr.open_dataset(path, engine="gpuzarr", device=dev())
    assert read_lazily_by_gpuzarr(ds) == NUMERIC_VARS  # lazily indexed, as with engine="zarr"
    assert not ds.chunks
    assert_same_dataset(ds, xr.open_dataset(path, engine="zarr"))


def test_engine_accepts_blocks_and_backend_class(stores):
    ds = xr.open_dataset(stores["v3"], engine=GpuZarrBackendEntrypoint, device=dev(), blocks={"time": 4})
    assert read_lazily_by_gpuzarr(ds) == NUMERIC_VARS
    assert_same_dataset(ds, xr.open_dataset(stores["v3"], engine="zarr"))


def test_engine_with_xarray_chunks_gives_dask_arrays(stores):
    ds = xr.open_dataset(stores["v3"], engine="gpuzarr", device=dev(), chunks={})
    ref = xr.open_zarr(stores["v3"])
    assert ds.air.chunks == ref.air.chunks  # xarray's chunks: the Zarr chunks (preferred_chunks)
    xr.testing.assert_identical(ds.load(), ref.load())


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(decode_cf=False),
        dict(mask_and_scale=False),
        dict(decode_times=False),
        dict(drop_variables=["sst", "valid"]),
        dict(decode_coords="all"),
    ],
    ids=lambda k: next(iter(k)),
)
def test_xarray_decoding_options(stores, kwargs):
    path = stores["v2"]
    assert_same_dataset(open_gz(path, **kwargs), xr.open_zarr(path, **kwargs))


def test_consolidated_metadata_is_used(stores, tmp_path):
    """Per-array metadata documents gone, the consolidated ones suffice: nothing reads them again."""
    import shutil

    path = str(tmp_path / "c.zarr")
    shutil.copytree(stores["v2"], path)
    for name in NUMERIC_VARS:
        os.remove(os.path.join(path, name, ".zarray"))
    expected = xr.open_zarr(path)
    assert_same_dataset(open_gz(path), expected)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr: "Object at air is not recognized as a component"
        unconsolidated = open_gz(path, consolidated=False)
    assert NUMERIC_VARS.isdisjoint(unconsolidated.variables)  # the documents really are gone


def test_groups(tmp_path):
    path = str(tmp_path / "g.zarr")
    ds = cf_dataset(nt=4)[["air", "count"]]
    ds.to_zarr(path, group="model/run1", zarr_format=3, consolidated=False)
    (ds * 2).to_zarr(path, group="model/run2", zarr_format=3, consolidated=False)
    for group in ("model/run1", "/model/run2"):
        assert_same_dataset(open_gz(path, group=group), xr.open_zarr(path, group=group))


# --------------------------------------------------------------------------- stores written by others


@pytest.mark.filterwarnings("ignore:variable 'z500' has multiple fill values")
def test_store_written_by_zarr_python(tmp_path):
    """CF attributes set by hand: big-endian packed int16 (v2, fill_value masks), missing_value, v3 floats."""
    v2 = str(tmp_path / "v2.zarr")
    g = zarr.open_group(v2, mode="w", zarr_format=2)
    t = g.create_array("time", shape=(10,), chunks=(10,), dtype="i4", attributes={
        "_ARRAY_DIMENSIONS": ["time"], "units": "hours since 1979-01-01", "calendar": "standard"})
    t[:] = np.arange(10) * 6
    z = g.create_array("z500", shape=(10, 7, 9), chunks=(3, 7, 5), dtype=">i2", fill_value=-9999, attributes={
        "_ARRAY_DIMENSIONS": ["time", "y", "x"], "scale_factor": 0.5, "add_offset": 5000.0,
        "missing_value": -9998, "units": "m"})
    raw = np.random.default_rng(1).integers(-9999, 3000, (10, 7, 9)).astype(">i2")
    raw[0, 0, 0], raw[0, 0, 1] = -9999, -9998
    z[:] = raw
    zarr.consolidate_metadata(v2)

    v3 = str(tmp_path / "v3.zarr")
    g = zarr.open_group(v3, mode="w", zarr_format=3)
    a = g.create_array("tp", shape=(6, 4), chunks=(4, 4), dtype="f4", fill_value=np.nan,
                       dimension_names=("time", "x"), attributes={"units": "m", "missing_value": -1.0})
    data = np.random.default_rng(2).random((6, 4)).astype("f4")
    data[0, 0], data[1, 1] = -1.0, np.nan
    a[:4] = data[:4]  # the last chunk is missing: zarr's fill value
    for path in (v2, v3):
        ds = open_gz(path)
        assert read_by_gpuzarr(ds) == ({"z500"} if path == v2 else {"tp"})
        assert_same_dataset(ds, xr.open_zarr(path))


def test_era5_like_demo_store(tmp_path):
    from gpuzarr_dist.demo import make_era5_like

    path = str(tmp_path / "era5.zarr")
    make_era5_like(path, 2, component="t2m")
    ds = open_gz(path)
    assert read_by_gpuzarr(ds) == {"t2m"}
    assert ds.t2m.variable.data.chunks == ((2,), (721,), (1440,))  # "auto": the whole array is one block
    assert_same_dataset(ds, xr.open_zarr(path))


def test_codec_only_numcodecs_decodes_is_read_by_gpuzarr(tmp_path):
    path = str(tmp_path / "bz2.zarr")
    ds = xr.Dataset({"a": (("x",), np.arange(10.0)), "b": (("x",), np.arange(10.0) * 2)})
    ds.to_zarr(path, zarr_format=2, encoding={"a": {"compressors": [numcodecs.BZ2()]}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the GPU device decodes bz2 on the host, with one warning
        got = open_gz(path)
    assert read_by_gpuzarr(got) == {"a", "b"}
    xr.testing.assert_identical(got.as_numpy() if dev() == "gpu" else got, xr.open_zarr(path))


# --------------------------------------------------------------------------- blocks


def test_blocks_auto_are_whole_multiples_of_zarr_chunks(stores):
    ds = open_gz(stores["v3"], chunks="600 B")
    for name in ("air", "sst", "precip", "count"):
        x, zchunks = ds[name].variable.data, ds[name].encoding["chunks"]
        for blocks, c, n in zip(x.chunks, zchunks, x.shape):
            assert all(b % c == 0 for b in blocks[:-1]) and sum(blocks) == n, (name, x.chunks, zchunks)
        assert x.npartitions > 1


def test_blocks_by_dimension_name(stores):
    ds = open_gz(stores["v3"], chunks={"time": 6})
    assert ds.air.variable.data.chunks[0] == (6, 6)
    assert ds.land.variable.data.chunks == ((5,), (8,))  # no time axis: "auto"
    with pytest.raises(ValueError, match="level"):
        open_gz(stores["v3"], chunks={"level": 1})


def test_read_and_decoding_fuse_into_one_task_per_block(stores):
    ds = gz.open_dataset(stores["v2"], device="cpu", chunks={"time": 4})
    y = ds.air.mean("time").data
    n = ds.air.data.npartitions
    assert n == 3
    (yo,) = dask.optimize(y)
    assert n <= len(yo.__dask_graph__()) < 2 * n  # read + mask + unpack + partial mean, then the aggregation


# --------------------------------------------------------------------------- devices


def test_gpu_chunks_are_cupy_and_decoding_is_lazy(stores):
    if dev() != "gpu":
        pytest.skip("GPU only")
    import cupy

    ds = open_gz(stores["v3"])
    x = ds.air.variable.data
    assert {str(k).split("-")[0] for k in x.dask.layers} >= {"_mask", "_scale_offset_decoding"}
    block = x.blocks[0].compute()
    assert isinstance(block, cupy.ndarray) and block.dtype == x.dtype
    anomaly = (ds.air - ds.air.mean("time")).mean(("lat", "lon")).compute()
    assert isinstance(anomaly.variable._data, cupy.ndarray)
    expected = xr.open_zarr(stores["v3"]).air
    np.testing.assert_allclose(anomaly.as_numpy().values, (expected - expected.mean("time")).mean(("lat", "lon")).values,
                               rtol=1e-6, atol=1e-9)


def test_device_gpu_without_gpu_says_why(stores):
    if dev() == "gpu" or gz.gpu_available():
        pytest.skip("a GPU is usable here")
    with pytest.raises(gz.DeviceUnavailableError):
        gz.open_dataset(stores["v3"], device="gpu")


def test_opening_on_cpu_does_not_import_cupy(stores):
    if dev() == "gpu" or gz.gpu_available():
        pytest.skip("device='auto' picks the GPU here")
    code = (
        "import sys, xarray as xr\n"
        f"ds = xr.open_dataset({stores['v3']!r}, engine='gpuzarr')\n"
        "float(ds.air.mean().values)\n"
        "assert 'cupy' not in sys.modules, 'cupy was imported'\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize(
    "script,args,expect",
    [
        ("air_temperature_anomalies.py", [], "monthly mean over the grid (K)"),
        ("era5_climatology.py", ["--time-steps", "2"], "northern hemisphere mean anomaly"),
    ],
)
def test_example_scripts_run(script, args, expect):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    r = subprocess.run([sys.executable, os.path.join(REPO, "examples", script), "--device", dev(), *args],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr
    assert expect in r.stdout and "with to_zarr_gpu; read back" in r.stdout
    assert ("cupy chunks" if dev() == "gpu" else "numpy chunks") in r.stdout


# --------------------------------------------------------------------------- errors


def test_missing_store_names_it(tmp_path):
    path = str(tmp_path / "nowhere.zarr")
    with pytest.raises(FileNotFoundError, match="nowhere.zarr"):
        open_gz(path)
    with pytest.raises(FileNotFoundError, match="nowhere.zarr"):
        xr.open_dataset(path, engine="gpuzarr", device=dev())


@pytest.mark.parametrize("consolidated", [None, False])
def test_missing_group_names_it_and_lists_groups(tmp_path, consolidated):
    path = str(tmp_path / "g.zarr")
    xr.Dataset({"a": ("x", np.arange(3))}).to_zarr(path, group="run1", zarr_format=3)
    with pytest.raises(FileNotFoundError, match=r"'run9'.*\['run1'\]"):
        open_gz(path, group="run9", consolidated=consolidated)
    with pytest.raises(ValueError, match="'run1/a'.*is a Zarr array, not a group"):
        open_gz(path, group="run1/a", consolidated=consolidated)


def test_store_that_is_an_array(tmp_path):
    path = str(tmp_path / "a.zarr")
    zarr.create_array(path, shape=(3,), dtype="i4")
    with pytest.raises(ValueError, match="is a Zarr array, not a group"):
        open_gz(path)


def test_open_dataset_rejects_xarray_chunking_arguments(stores):
    with pytest.raises(TypeError, match="engine"):
        gz.open_dataset(stores["v3"], engine="zarr")


# --------------------------------------------------------------------------- the masking step itself


@pytest.mark.parametrize(
    "data,fills,decoded,dtype",
    [
        (np.array([-32767, 0, 5, 9999], dtype="i2"), {-32767, 9999}, np.nan, np.float32),
        (np.array([0, 255, 7], dtype="u1"), {np.uint8(255)}, np.nan, np.float32),
        (np.array([1e20, 1.5, np.nan], dtype="f4"), {np.float32(1e20)}, np.nan, np.float32),
        (np.array([3, -1, 4], dtype="i8"), {-1}, np.iinfo(np.int64).min, np.int64),
        (np.array([1.0, 2.0], dtype="f8"), set(), np.nan, np.float64),
    ],
)
def test_mask_step_matches_xarray(data, fills, decoded, dtype):
    from xarray.coding.variables import _apply_mask

    expected = _apply_mask(data, encoded_fill_values=fills, decoded_fill_value=decoded, dtype=dtype)
    got = partial(_mask, encoded_fill_values=fills, decoded_fill_value=decoded, dtype=dtype)(data)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)
    if dev() == "gpu":
        import cupy

        on_gpu = _mask(cupy.asarray(data), fills, decoded, dtype)
        assert isinstance(on_gpu, cupy.ndarray)
        np.testing.assert_array_equal(on_gpu.get(), expected)


def test_decoding_step_without_device_version_runs_on_host_for_gpu_blocks():
    step = partial(np.multiply, 2)  # stands for a decoding function of a newer xarray
    assert _device_step(step, "cpu", "v") is step
    with pytest.warns(UserWarning, match="'v'.*runs on the host"):
        on_host = _device_step(step, "gpu", "v")
    assert isinstance(on_host, _OnHost)
    np.testing.assert_array_equal(on_host(np.arange(3)), [0, 2, 4])
    if dev() == "gpu":
        import cupy

        out = on_host(cupy.arange(3))
        assert isinstance(out, cupy.ndarray)
        np.testing.assert_array_equal(out.get(), [0, 2, 4])
