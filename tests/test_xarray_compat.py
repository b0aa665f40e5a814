"""xarray's contracts around gpuzarr's reader and writer.

Loading: ``xr.open_dataset(engine="gpuzarr")`` variables materialise on
``load``/``compute``/``load_async`` and are read once; ``gz.open_dataset``
variables compute to arrays. Opening works in a fresh interpreter (engines
passed as a class). Writing: Datasets read from Zarr v2, DataArrays, chunk
mappings checked against the dimensions, and failed writes that leave no store
that opens. Every comparison is against xarray's own reading (``xr.open_zarr``,
``xr.open_dataarray``) of a store xarray wrote, or of ours.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import warnings

import dask.array as da
import numcodecs
import numpy as np
import pytest
import xarray as xr
import zarr
from conftest import dev
from test_xarray import cf_dataset

import gpuzarr_dist as gz
from gpuzarr_dist.xarray.write import PENDING_DOCUMENT

pytestmark = [
    pytest.mark.usefixtures("device"),
    pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part:UserWarning"),
    pytest.mark.filterwarnings("ignore:Failed to open Zarr store with consolidated metadata:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:.*are not multiples of the Zarr chunk size:UserWarning"),
]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA_VARS = ["air", "sst", "precip", "count", "flags"]


def _write(ds: xr.Dataset, path: str, **kw) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.to_zarr(path, mode="w", **kw)
    return path


@pytest.fixture(scope="module")
def v2_store(tmp_path_factory) -> str:
    """The CF dataset written by xarray as Zarr v2: numcodecs Blosc compressors, one variable zstd with a filter."""
    path = str(tmp_path_factory.mktemp("compat") / "v2.zarr")
    return _write(cf_dataset(), path, zarr_format=2, encoding={
        "sst": {"compressors": [numcodecs.Zstd(level=5)], "filters": [numcodecs.Delta(dtype="f4")]},
    })


def _on_host(ds: xr.Dataset) -> xr.Dataset:
    return ds.as_numpy() if dev() == "gpu" else ds


# --------------------------------------------------------------------------- loading


@pytest.mark.parametrize("how", ["load", "compute", "load_async"])
def test_engine_load_materialises_numpy_read_once(v2_store, tmp_path, how):
    path = shutil.copytree(v2_store, str(tmp_path / "copy.zarr"))
    ds = xr.open_dataset(path, engine="gpuzarr", device=dev())
    if how == "load":
        got = ds.load()
        assert got is ds
    elif how == "compute":
        got = ds.compute()
    else:
        got = asyncio.run(ds.load_async())
    for name in DATA_VARS:
        assert type(got[name].variable._data) is np.ndarray, (name, type(got[name].variable._data))
    shutil.rmtree(path)  # loaded: nothing reads the store again
    expected = xr.open_dataset(v2_store, engine="zarr").load()
    xr.testing.assert_identical(got, expected)
    assert float(got.air.sum()) == float(expected.air.sum())


def test_engine_values_are_cached_and_selections_read_their_chunks(v2_store, tmp_path):
    path = shutil.copytree(v2_store, str(tmp_path / "copy.zarr"))
    ds = xr.open_dataset(path, engine="gpuzarr", device=dev())
    ref = xr.open_dataset(v2_store, engine="zarr")
    sel = dict(time=[0, 7, 3], lat=slice(1, 4), lon=-1)
    for name in DATA_VARS:
        np.testing.assert_array_equal(ds[name].isel(**sel).values, ref[name].isel(**sel).values)
    first = ds.air.values
    assert ds.air.variable._in_memory  # xarray cached what it read
    shutil.rmtree(path)
    np.testing.assert_array_equal(ds.air.values, first)
    np.testing.assert_array_equal(first, ref.air.values)


def test_gz_open_dataset_load_computes_the_dask_arrays(v2_store):
    ds = gz.open_dataset(v2_store, device=dev())
    assert isinstance(ds.air.data, da.Array)
    got = ds.load()
    for name in DATA_VARS:
        data = got[name].variable._data
        assert not isinstance(data, da.Array), name
        assert type(data).__module__.split(".")[0] == ("cupy" if dev() == "gpu" else "numpy"), (name, type(data))
    xr.testing.assert_identical(_on_host(got), xr.open_zarr(v2_store).load())


@pytest.mark.parametrize("entry", ["gz.open_dataset", "engine-class"])
def test_options_in_a_fresh_interpreter(v2_store, entry):
    """xarray fills an engine's parameter list only once it lists the engines: nothing here may rely on that."""
    opener = {
        "gz.open_dataset": f"gz.open_dataset({v2_store!r}, device='cpu', decode_cf=False, mask_and_scale=False)",
        "engine-class": (f"xr.open_dataset({v2_store!r}, engine=GpuZarrBackendEntrypoint, device='cpu', "
                         "decode_cf=False, mask_and_scale=False)"),
    }[entry]
    code = (
        "import warnings; warnings.simplefilter('ignore')\n"
        "import xarray as xr, gpuzarr_dist as gz\n"
        "from gpuzarr_dist.xarray.backend import GpuZarrBackendEntrypoint\n"
        f"ds = {opener}\n"
        f"ref = xr.open_zarr({v2_store!r}, decode_cf=False, mask_and_scale=False)\n"
        "xr.testing.assert_identical(ds.load(), ref.load())\n"
        "assert ds.air.dtype == 'int16', ds.air.dtype\n"
        "print('ok')\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr


# --------------------------------------------------------------------------- writing


def test_dataset_read_from_zarr_v2_is_written(v2_store, tmp_path):
    ds = gz.open_dataset(v2_store, device=dev())
    assert isinstance(ds.sst.encoding["compressors"][0], numcodecs.Zstd)  # what made zarr refuse the write
    assert isinstance(ds.time.encoding["compressors"][0], numcodecs.Blosc)
    out = str(tmp_path / "out.zarr")
    gz.to_zarr_gpu(ds, out)
    back = xr.open_zarr(out)
    xr.testing.assert_identical(back.load(), xr.open_zarr(v2_store).load())
    assert zarr.open_group(out).metadata.zarr_format == 3
    codecs = [c.to_dict()["name"] for c in zarr.open_array(out, path="sst").metadata.codecs]
    assert codecs == ["bytes", "zstd"]  # the call's codec, not the source's


def test_misspelled_dimension_is_refused(v2_store, tmp_path):
    ds = gz.open_dataset(v2_store, device=dev())
    out = str(tmp_path / "x.zarr")
    with pytest.raises(ValueError, match=r"\['tiem'\].*'time'.*'lat'.*'lon'"):
        gz.to_zarr_gpu(ds, out, chunks={"tiem": 4})
    with pytest.raises(ValueError, match=r"shards.*\['latt'\]"):
        gz.to_zarr_gpu(ds, out, shards={"latt": 5})
    assert not os.path.exists(out)


@pytest.mark.parametrize("name", ["air", None, "lat"], ids=["named", "unnamed", "named-like-a-coordinate"])
def test_dataarray_is_written_as_xarray_writes_it(v2_store, tmp_path, name):
    x = gz.open_dataset(v2_store, device=dev()).air.rename(name)
    ours, ref = str(tmp_path / "ours.zarr"), str(tmp_path / "ref.zarr")
    gz.to_zarr_gpu(x, ours)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _on_host(x).drop_encoding().to_zarr(ref, zarr_format=3)
    back, expected = xr.open_dataarray(ours, engine="zarr"), xr.open_dataarray(ref, engine="zarr")
    assert back.name == expected.name == name
    xr.testing.assert_identical(back.load(), expected.load())
    xr.testing.assert_identical(xr.open_zarr(ours).load(), xr.open_zarr(ref).load())


def _failing(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with one more variable whose last block raises when computed."""

    def boom(block, block_info=None):
        if block_info[0]["chunk-location"][0] == 2:
            raise RuntimeError("the data of 'broken' cannot be computed")
        return block

    bad = ds.copy()
    bad["broken"] = ds.air.copy(data=ds.air.data.rechunk({0: 4}).map_blocks(boom, dtype=ds.air.dtype))
    return bad


def test_failed_write_removes_what_it_created_and_a_retry_succeeds(v2_store, tmp_path):
    ds = gz.open_dataset(v2_store, device=dev())[["air", "count"]]
    out = str(tmp_path / "out.zarr")
    with pytest.raises(RuntimeError, match="'broken' cannot be computed"):
        gz.to_zarr_gpu(_failing(ds), out)
    assert not os.path.exists(out)
    with pytest.raises(FileNotFoundError):
        xr.open_zarr(out)
    gz.to_zarr_gpu(ds, out)  # the retry: nothing in its way
    xr.testing.assert_identical(xr.open_zarr(out).load(), xr.open_zarr(v2_store)[["air", "count"]].load())


def test_failed_write_into_a_group_keeps_the_rest_of_the_store(v2_store, tmp_path):
    ds = gz.open_dataset(v2_store, device=dev())[["air"]]
    out = str(tmp_path / "out.zarr")
    gz.to_zarr_gpu(ds, out, "run1")
    with pytest.raises(RuntimeError, match="'broken' cannot be computed"):
        gz.to_zarr_gpu(_failing(ds), out, "run2")
    assert not os.path.exists(os.path.join(out, "run2"))
    xr.testing.assert_identical(xr.open_zarr(out, group="run1").load(), xr.open_zarr(v2_store)[["air"]].load())


def test_unfinished_write_does_not_open_and_is_replaced(v2_store, tmp_path):
    """A lazy write whose compute fails stands for a killed one: the group document is still held back."""
    ds = gz.open_dataset(v2_store, device=dev())[["air", "count"]]
    out = str(tmp_path / "out.zarr")
    lazy = gz.to_zarr_gpu(_failing(ds), out, compute=False)
    for _ in range(2):  # before its compute, and after the compute failed
        assert os.path.exists(os.path.join(out, PENDING_DOCUMENT))
        assert not os.path.exists(os.path.join(out, "zarr.json"))
        with pytest.raises(Exception, match="[Nn]o group"):
            xr.open_zarr(out)
        with pytest.raises(zarr.errors.GroupNotFoundError):
            zarr.open_group(out, mode="r")
        with pytest.raises(gz.MetadataError, match="did not finish"):
            gz.open_dataset(out, device=dev())
        with pytest.raises(gz.MetadataError, match="did not finish"):
            xr.open_dataset(out, engine="gpuzarr", device=dev())
        with pytest.raises(RuntimeError, match="'broken' cannot be computed"):
            lazy.compute()
    gz.to_zarr_gpu(ds, out)  # not refused as an existing group: an unfinished write is replaced
    assert not os.path.exists(os.path.join(out, PENDING_DOCUMENT))
    assert sorted(xr.open_zarr(out).data_vars) == ["air", "count"]
    xr.testing.assert_identical(xr.open_zarr(out).load(), xr.open_zarr(v2_store)[["air", "count"]].load())


def test_lazy_write_completes_on_compute(v2_store, tmp_path):
    ds = gz.open_dataset(v2_store, device=dev())[["air", "flags"]]
    out = str(tmp_path / "out.zarr")
    lazy = gz.to_zarr_gpu(ds, out, compute=False)
    with pytest.raises(Exception, match="[Nn]o group"):
        xr.open_zarr(out)
    assert int(lazy.compute()) > 0
    assert not os.path.exists(os.path.join(out, PENDING_DOCUMENT))
    xr.testing.assert_identical(xr.open_zarr(out).load(), xr.open_zarr(v2_store)[["air", "flags"]].load())


def test_unfinished_write_into_a_group_is_not_in_the_consolidated_metadata_above(v2_store, tmp_path):
    """xarray consolidates the groups above the one written: they must not list it before its data is there."""
    ds = gz.open_dataset(v2_store, device=dev())[["count"]]
    out = str(tmp_path / "out.zarr")
    gz.to_zarr_gpu(ds, out, "model/run1")
    lazy = gz.to_zarr_gpu(ds * 2, out, "model/run2", compute=False)
    for consolidated in (True, None, False):
        with pytest.raises((KeyError, FileNotFoundError, zarr.errors.GroupNotFoundError)):
            xr.open_zarr(out, group="model/run2", consolidated=consolidated)
    xr.testing.assert_identical(xr.open_zarr(out, group="model/run1", consolidated=True).load(), _on_host(ds).load())
    lazy.compute()
    for consolidated in (True, False):
        back = xr.open_zarr(out, group="model/run2", consolidated=consolidated)
        xr.testing.assert_identical(back.load(), _on_host(ds * 2).load())
    with open(os.path.join(out, "zarr.json")) as f:  # the root lists it again, once written
        assert "model/run2/count" in json.load(f)["consolidated_metadata"]["metadata"]
