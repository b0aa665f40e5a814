"""``to_zarr_gpu(dataset, ...)`` writes what ``ds.to_zarr`` writes.

The reference is xarray itself: the same dataset written by ``ds.to_zarr``
(Zarr v3) and opened by ``xr.open_zarr`` must be identical to ours opened by
``xr.open_zarr``; ours is also read by zarr-python element for element.
On the GPU the dataset comes from ``gz.open_dataset(device="gpu")`` (cupy
blocks), so unpacking, re-packing, encoding and writing all run on the device.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import xarray as xr
import zarr
from conftest import dev
from test_xarray import cf_dataset

import gpuzarr_dist as gz

pytestmark = [
    pytest.mark.usefixtures("device"),
    pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*are not multiples of the Zarr chunk size:UserWarning"),
]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("src") / "cf.zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cf_dataset(nt=12).to_zarr(path, mode="w", zarr_format=3)
    return path


def opened(path: str) -> xr.Dataset:
    return gz.open_dataset(path, device=dev())


def reference(ds: xr.Dataset, path: str, **kw) -> xr.Dataset:
    """``ds`` written by xarray itself (host data) and opened by ``xr.open_zarr``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.as_numpy().to_zarr(path, mode="w", zarr_format=3, **kw)
    return xr.open_zarr(path)


def assert_written_like_xarray(ours: str, ref: xr.Dataset) -> None:
    back = xr.open_zarr(ours)
    xr.testing.assert_identical(back, ref)
    for name in ref.data_vars:
        a, b = zarr.open_array(ours, path=name), zarr.open_array(ref.encoding["source"], path=name)
        assert a.dtype == b.dtype, name
        np.testing.assert_array_equal(a[...], b[...], err_msg=name)


def test_cf_dataset_round_trip(source, tmp_path):
    ds = opened(source)
    out = str(tmp_path / "ours.zarr")
    g = gz.to_zarr_gpu(ds, out)
    assert isinstance(g, zarr.Group)
    assert_written_like_xarray(out, reference(ds, str(tmp_path / "ref.zarr")))
    # packed int16 stays packed, with xarray's attributes
    air = zarr.open_array(out, path="air")
    assert air.dtype == np.int16 and air.attrs["scale_factor"] == 0.01


def test_computed_anomalies_with_new_variables(source, tmp_path):
    ds = opened(source)
    clim = ds.air.mean("time")
    result = xr.Dataset({"anomaly": ds.air - clim, "sst": ds.sst}).drop_encoding()
    result["anomaly"].attrs = {"units": "K"}
    result["sst"].encoding = {"dtype": "int16", "scale_factor": 0.001, "add_offset": 290.0, "_FillValue": -32768}
    out = str(tmp_path / "anom.zarr")
    gz.to_zarr_gpu(result, out, chunks={"time": 4}, codec="gzip")
    expected = result.copy()
    for name in expected.data_vars:  # in the variables' own encoding: xarray's encoding= would replace it
        expected[name].encoding = {**result[name].encoding, "chunks": (4, 5, 8)}
    ref = reference(expected, str(tmp_path / "ref.zarr"))
    assert_written_like_xarray(out, ref)
    assert zarr.open_array(out, path="anomaly").chunks == (4, 5, 8)
    assert [c.to_dict()["name"] for c in zarr.open_array(out, path="anomaly").metadata.codecs] == ["bytes", "gzip"]


def test_group_sharded_and_compute_false(source, tmp_path):
    ds = opened(source)[["air", "count"]]
    out = str(tmp_path / "g.zarr")
    lazy = gz.to_zarr_gpu(ds, out, "run1", shards=True, compute=False)
    assert int(lazy.compute()) > 0
    ref = reference(ds, str(tmp_path / "ref.zarr"))
    back = xr.open_zarr(out, group="run1")
    xr.testing.assert_identical(back, ref)
    assert zarr.open_array(out, path="run1/air").shards is not None


def test_existing_target_is_refused_unless_overwrite(source, tmp_path):
    ds = opened(source)[["sst"]]
    out = str(tmp_path / "x.zarr")
    gz.to_zarr_gpu(ds, out)
    with pytest.raises(gz.ArrayExistsError, match="x.zarr.*overwrite=True"):
        gz.to_zarr_gpu(ds, out)
    gz.to_zarr_gpu(ds * 2, out, overwrite=True)
    np.testing.assert_array_equal(xr.open_zarr(out).sst.values, (ds.sst * 2).as_numpy().values)


def test_array_only_arguments_are_refused_for_datasets(source, tmp_path):
    with pytest.raises(TypeError, match="resume"):
        gz.to_zarr_gpu(opened(source), str(tmp_path / "y.zarr"), resume=True)
