"""Not-found errors, new users' mistakes and install hints: GpuZarrError subclasses that are also the builtins
callers catch, with messages naming the array, the argument or the file."""

from __future__ import annotations

import difflib
import errno
import inspect
import json
import os
import pathlib
import pickle
import subprocess
import sys

import numpy as np
import pytest
import xarray as xr
import zarr

import gpuzarr_dist as gz
from gpuzarr_dist import errors

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _group(path: str, names=("temperature", "precipitation", "time")) -> None:
    g = zarr.open_group(path, mode="w")
    for n in names:
        g.create_array(n, shape=(4,), chunks=(2,), dtype="f4")[:] = np.arange(4, dtype="f4")


# --------------------------------------------------------------------------- the family


def _error_classes() -> list[type]:
    return [c for _, c in inspect.getmembers(errors, inspect.isclass)
            if issubclass(c, BaseException) and c.__module__ == errors.__name__ and not c.__name__.startswith("_")]


def test_every_error_class_is_exported_and_a_gpuzarr_error():
    for cls in _error_classes():
        assert issubclass(cls, gz.GpuZarrError), cls
        assert cls.__name__ in gz.__all__, cls
        assert getattr(gz, cls.__name__) is cls


@pytest.mark.parametrize("cls, builtin", [
    (gz.ArrayNotFoundError, FileNotFoundError),
    (gz.GroupNotFoundError, FileNotFoundError),
    (gz.ComponentNotFoundError, FileNotFoundError),
    (gz.ComponentNotFoundError, KeyError),
    (gz.NotAnArrayError, ValueError),
    (gz.NotAGroupError, ValueError),
    (gz.MissingDependencyError, ImportError),
])
def test_not_found_errors_are_also_the_builtins(cls, builtin):
    assert issubclass(cls, gz.GpuZarrError) and issubclass(cls, builtin)


@pytest.mark.parametrize("error", [
    errors.ChunkReadError("a.zarr", "c/0", "EIO"),
    errors.ChunkWriteError("a.zarr", "c/0", "ENOSPC"),
    errors.ChunkDecodeError("a.zarr", "c/0", "truncated", "zstd"),
    errors.ChunkEncodeError("a.zarr", "c/0", "refused", "zstd"),
    errors.UnsupportedCodecError("bz3", "a.zarr", ["zstd"]),
    errors.GpuOutOfMemoryError("a.zarr", "block of 80 GB"),
    errors.ArrayNotFoundError("/data/a.zarr"),
    errors.GroupNotFoundError("/data/g.zarr", "no group"),
    errors.ComponentNotFoundError("/g.zarr/x", "x", ["xx", "y"], "/g.zarr"),
    errors.NotAnArrayError("/g.zarr", "a group"),
    errors.MissingDependencyError("needs cubed", name="cubed", extra="cubed"),
    errors.MetadataError("bad"),
])
def test_errors_survive_pickling(error):
    """dask sends a worker's error to the client pickled: class, message and attributes arrive whole."""
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error)
    assert str(back) == str(error)
    assert back.__dict__ == error.__dict__
    if isinstance(error, OSError):
        assert (back.errno, back.filename) == (error.errno, error.filename)


# --------------------------------------------------------------------------- not found, with names


def test_missing_store_is_array_not_found(tmp_path):
    path = str(tmp_path / "nope.zarr")
    with pytest.raises(gz.ArrayNotFoundError) as info:
        gz.from_zarr_gpu(path, device="cpu")
    e = info.value
    assert isinstance(e, FileNotFoundError) and e.errno == errno.ENOENT and e.filename == path
    assert path in str(e)


def test_misspelled_component_lists_the_arrays_close_matches_first(tmp_path):
    path = str(tmp_path / "g.zarr")
    _group(path)
    with pytest.raises(gz.ComponentNotFoundError) as info:
        gz.from_zarr_gpu(path, "temprature", device="cpu")
    e = info.value
    assert isinstance(e, KeyError) and isinstance(e, FileNotFoundError)
    there = sorted(name for name, _ in zarr.open_group(path, mode="r").arrays())  # zarr-python's own listing
    assert sorted(e.available) == there
    best = difflib.get_close_matches("temprature", there, n=1)[0]
    assert best == "temperature"
    message = str(e)
    assert os.path.join(path, "temprature") in message
    assert f"did you mean {best!r}" in message
    listed = message.split("arrays in ")[1].split(": ", 1)[1].split(", ")
    assert listed[0] == best and sorted(listed) == there


def test_misspelled_component_of_a_zarr_group_object(tmp_path):
    path = str(tmp_path / "g.zarr")
    _group(path)
    group = zarr.open_group(path, mode="r")
    with pytest.raises(KeyError) as info:
        gz.from_zarr_gpu(group, "precip", device="cpu")
    assert isinstance(info.value, gz.ComponentNotFoundError)
    assert "precipitation" in str(info.value)


def test_nested_component_lists_nested_arrays(tmp_path):
    path = str(tmp_path / "g.zarr")
    g = zarr.open_group(path, mode="w")
    g.create_group("surface").create_array("t2m", shape=(2,), dtype="f4")
    with pytest.raises(gz.ComponentNotFoundError) as info:
        gz.from_zarr_gpu(path, "surface/t2n", device="cpu")
    assert "did you mean 'surface/t2m'" in str(info.value)


def test_group_without_component_is_not_an_array(tmp_path):
    path = str(tmp_path / "g.zarr")
    _group(path)
    with pytest.raises(gz.NotAnArrayError) as info:
        gz.from_zarr_gpu(path, device="cpu")
    assert isinstance(info.value, ValueError)
    for name in ("temperature", "precipitation", "time"):
        assert name in str(info.value)


def test_missing_array_in_an_object_store_is_array_not_found():
    from tests.helpers.servers import TEST_KEY, TEST_SECRET, moto_s3_server

    pytest.importorskip("moto")
    with moto_s3_server() as endpoint:
        import boto3

        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=TEST_KEY, aws_secret_access_key=TEST_SECRET,
                     region_name="us-east-1").create_bucket(Bucket="data")
        options = {"endpoint_url": endpoint, "key": TEST_KEY, "secret": TEST_SECRET}
        with pytest.raises(gz.ArrayNotFoundError) as info:
            gz.from_zarr_gpu("s3://data/absent.zarr", storage_options=options, device="cpu")
    assert isinstance(info.value, FileNotFoundError)
    assert "s3://data/absent.zarr" in str(info.value) and TEST_SECRET not in str(info.value)


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "gpuzarr_dist.cli", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_info_misspelled_component_lists_the_arrays(tmp_path):
    path = str(tmp_path / "g.zarr")
    _group(path)
    out = _cli("info", path, "--component", "temprature")
    assert out.returncode != 0
    assert "did you mean 'temperature'" in out.stderr and "precipitation" in out.stderr


# --------------------------------------------------------------------------- damaged member documents


def _damage(path: str, member: str) -> str:
    doc = os.path.join(path, member, "zarr.json")
    with open(doc, "w") as f:
        f.write('{"zarr_format": 3, "node_type": ')  # cut short
    return doc


def test_info_names_a_damaged_member_document(tmp_path):
    path = str(tmp_path / "g.zarr")
    _group(path)
    doc = _damage(path, "precipitation")
    with pytest.raises(json.JSONDecodeError):  # what zarr-python raises for it, naming no file
        dict(zarr.open_group(path, mode="r").members())
    out = _cli("info", path)
    assert out.returncode != 0
    assert doc in out.stderr and "not valid JSON" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_damaged_member_document_under_xarray_is_named(tmp_path):
    """xarray's zarr engine lets the bare JSONDecodeError out; bad_document_error turns it into a MetadataError
    naming the file."""
    from gpuzarr_dist.stores.source import bad_document_error

    path = str(tmp_path / "g.zarr")
    _group(path)
    doc = _damage(path, "time")
    with pytest.raises(ValueError) as info:
        xr.open_dataset(path, engine="zarr", consolidated=False)
    error = bad_document_error(path, info.value)
    assert isinstance(error, gz.MetadataError) and doc in str(error)
    assert bad_document_error(path, ValueError("something else")) is not None  # the store is damaged either way
    os.remove(doc)
    assert bad_document_error(path, info.value) is None  # nothing damaged left: no invented culprit


# --------------------------------------------------------------------------- chunks=


@pytest.mark.parametrize("chunks", [-3, (2, -3), {0: -3}, 0, (0, 2), {1: 0}])
def test_invalid_block_sizes_name_the_array_and_the_argument(tmp_path, chunks):
    path = str(tmp_path / "a.zarr")
    zarr.create_array(path, shape=(4, 6), chunks=(2, 2), dtype="f4")
    with pytest.raises(ValueError) as info:
        gz.from_zarr_gpu(path, chunks=chunks, device="cpu")
    message = str(info.value)
    assert path in message and f"chunks={chunks!r}" in message
    assert "Empty tuples" not in message


def test_chunks_that_do_not_fit_name_the_array(tmp_path):
    path = str(tmp_path / "a.zarr")
    zarr.create_array(path, shape=(4, 6), chunks=(2, 2), dtype="f4")
    for chunks in [(2,), ((2, 2), (3,)), "not a size"]:
        with pytest.raises(ValueError) as info:
            gz.from_zarr_gpu(path, chunks=chunks, device="cpu")
        assert path in str(info.value) and "chunks=" in str(info.value)


@pytest.mark.parametrize("chunks, expect", [(-1, ((4,), (6,))), ((None, 2), ((4,), (2, 2, 2))),
                                            (((2, 2), (6,)), ((2, 2), (6,)))])
def test_valid_block_sizes_still_work(tmp_path, chunks, expect):
    path = str(tmp_path / "a.zarr")
    z = zarr.create_array(path, shape=(4, 6), chunks=(2, 2), dtype="f4")
    z[:] = np.arange(24, dtype="f4").reshape(4, 6)
    x = gz.from_zarr_gpu(path, chunks=chunks, device="cpu")
    assert x.chunks == expect
    np.testing.assert_array_equal(x.compute(), z[:])


# --------------------------------------------------------------------------- install hints


def test_no_hint_names_an_unpublished_package():
    """``pip install 'gpuzarr-dist[...]'`` names a package no index has: hints say how to install from a checkout."""
    offenders = []
    for folder in ("gpuzarr_dist", "docs", "cluster", "examples"):
        for p in (ROOT / folder).rglob("*"):
            if p.is_file() and p.suffix in (".py", ".md", ".yaml", ".yml", ".ipynb", ".txt"):
                for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
                    if "gpuzarr-dist[" in line:
                        offenders.append(f"{p.relative_to(ROOT)}:{n}")
    assert not offenders, offenders


def test_gpu_hint_says_how_to_install():
    from gpuzarr_dist.cuda.device import gpu_status

    assert ".[gpu]" in errors.GPU_INSTALL_HINT and "cupy-cuda12x" in errors.GPU_INSTALL_HINT
    assert "nvidia-nvcomp-cu12" in errors.GPU_INSTALL_HINT and "dask-cuda" in errors.GPU_INSTALL_HINT
    ok, why = gpu_status()
    if not ok and "not installed" in why:
        assert errors.GPU_INSTALL_HINT in why


def test_cubed_without_its_extra_says_which_extra():
    code = (
        "import sys; sys.modules['cubed'] = None\n"  # as if cubed were not installed
        "import gpuzarr_dist\n"
        "try:\n"
        "    import gpuzarr_dist.cubed\n"
        "except ImportError as e:\n"
        "    print(type(e).__name__, isinstance(e, gpuzarr_dist.GpuZarrError), e.extra, '|', e)\n"
        "else:\n"
        "    print('imported')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("MissingDependencyError True cubed |"), out.stdout
    assert "pip install '.[cubed]'" in out.stdout
