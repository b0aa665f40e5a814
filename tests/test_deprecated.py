"""Old module paths still give the names that moved, for one release, each with a DeprecationWarning."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

#: old module, new module, a public name that moved
MOVED = [
    ("gpuzarr_dist.graph", "gpuzarr_dist.array.read", "from_zarr_gpu"),
    ("gpuzarr_dist.windows", "gpuzarr_dist.array.windows", "WindowSampler"),
    ("gpuzarr_dist.xarray_backend", "gpuzarr_dist.xarray.backend", "GpuZarrBackendEntrypoint"),
    ("gpuzarr_dist.xarray_backend", "gpuzarr_dist.xarray.backend", "open_dataset"),
    ("gpuzarr_dist.runtime.cluster", "gpuzarr_dist.distributed.cluster", "start_cluster"),
    ("gpuzarr_dist.runtime.jobqueue", "gpuzarr_dist.distributed.jobqueue", "jobqueue_cluster"),
    ("gpuzarr_dist.runtime.preload", "gpuzarr_dist.distributed.preload", "dask_setup"),
    ("gpuzarr_dist.runtime.device", "gpuzarr_dist.cuda.device", "resolve_device"),
]


@pytest.mark.parametrize(("old", "new", "name"), MOVED, ids=[f"{o}.{n}" for o, _, n in MOVED])
def test_old_path_warns_and_gives_the_same_object(old, new, name):
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated.*import {name} from {new}$"):
        got = getattr(module, name)
    assert got is getattr(importlib.import_module(new), name)


@pytest.mark.parametrize("old", sorted({o for o, _, _ in MOVED}))
def test_old_path_unknown_name_is_an_attribute_error(old):
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning), pytest.raises(AttributeError):
        module.no_such_name  # noqa: B018


def test_importing_the_package_uses_no_old_path():
    code = ("import warnings; warnings.simplefilter('always')\n"
            "with warnings.catch_warnings(record=True) as seen:\n"
            "    import gpuzarr_dist, gpuzarr_dist.cli, gpuzarr_dist.bench, gpuzarr_dist.cubed\n"
            "print([str(w.message) for w in seen if 'will be removed in the next release' in str(w.message)])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_xarray_finds_the_backend_at_its_new_path():
    from importlib.metadata import entry_points

    import xarray as xr

    eps = [ep for ep in entry_points(group="xarray.backends") if ep.name == "gpuzarr"]
    if not eps:
        pytest.skip("gpuzarr-dist is not installed (its entry points are in the installed metadata)")
    assert eps[0].value == "gpuzarr_dist.xarray.backend:GpuZarrBackendEntrypoint"
    assert "gpuzarr" in xr.backends.list_engines()
