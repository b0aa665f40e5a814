"""The local object writer's folders and temporary names: made once, made again when removed, made ahead
of a block's writes, and never mistaken for chunks."""

from __future__ import annotations

import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from conftest import make_data

import gpuzarr_dist as gz
from gpuzarr_dist.errors import ChunkWriteError
from gpuzarr_dist.stores import writer as writer_mod
from gpuzarr_dist.stores.writer import LocalObjectWriter


def _objects(keys: list[str], seed: int = 0) -> list[tuple[str, bytes]]:
    rng = np.random.default_rng(seed)
    return [(k, rng.integers(0, 256, int(rng.integers(1, 5000)), dtype=np.uint8).tobytes()) for k in keys]


def _files(root) -> dict[str, bytes]:
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            out[os.path.relpath(os.path.join(d, n), root).replace(os.sep, "/")] = open(os.path.join(d, n), "rb").read()
    return out


def test_folder_removed_between_two_calls_is_made_again(tmp_path):
    w = LocalObjectWriter(str(tmp_path), "arr")
    first = _objects([f"c/{i}/0/0" for i in range(6)], seed=1)
    assert w.put_many(first) == sum(len(d) for _, d in first)
    shutil.rmtree(tmp_path / "c")  # the writer made these folders and remembers them
    second = _objects([f"c/{i}/0/0" for i in range(6)], seed=2)
    w.put_many(second)
    w.put_many(second[:1])  # the lone-object path too
    assert _files(tmp_path) == dict(second)


def test_many_threads_write_into_one_new_folder(tmp_path):
    """Every I/O thread finds the folder missing at once; all objects land, no temporary file is left."""
    objs = _objects([f"a/b/c/{i}" for i in range(200)], seed=3)
    w = LocalObjectWriter(str(tmp_path), "arr")
    with dask.config.set({"gpuzarr.io-threads": 16}):
        w.put_many(objs)
    assert _files(tmp_path) == dict(objs)


def test_prepare_then_write_at_once(tmp_path):
    """Writes racing the background folder threads of prepare still land whole."""
    keys = [f"c/{i}/{j}/0" for i in range(30) for j in range(3)]
    objs = _objects(keys, seed=4)
    w = LocalObjectWriter(str(tmp_path), "arr")
    with dask.config.set({"gpuzarr.io-threads": 8}):
        w.prepare(keys)
        w.put_many(objs)
    assert _files(tmp_path) == dict(objs)


def test_prepare_makes_the_folders(tmp_path):
    w = LocalObjectWriter(str(tmp_path), "arr")
    w.prepare([f"c/{i}/0/0" for i in range(5)] + ["c/0/0/1", "top"])
    for _ in range(500):  # background threads: wait for them
        if all((tmp_path / "c" / str(i) / "0").is_dir() for i in range(5)):
            break
        time.sleep(0.01)
    assert all((tmp_path / "c" / str(i) / "0").is_dir() for i in range(5))
    assert _files(tmp_path) == {}


def test_no_makedirs_or_stat_when_folders_exist(tmp_path, monkeypatch):
    """Objects into folders that exist cost the open/write/close/rename alone (a fresh writer too)."""
    objs = _objects([f"c/{i}/0/0" for i in range(20)], seed=5)
    LocalObjectWriter(str(tmp_path)).put_many(objs)
    calls = []
    real_makedirs, real_stat = os.makedirs, os.stat
    monkeypatch.setattr(os, "makedirs", lambda *a, **k: (calls.append(a), real_makedirs(*a, **k))[1])
    monkeypatch.setattr(os, "stat", lambda *a, **k: (calls.append(a), real_stat(*a, **k))[1])
    again = _objects([k for k, _ in objs], seed=6)
    LocalObjectWriter(str(tmp_path)).put_many(again)
    assert calls == []
    assert _files(tmp_path) == dict(again)


def test_key_whose_folder_is_a_file_names_the_key(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "0").write_bytes(b"in the way")
    w = LocalObjectWriter(str(tmp_path), "arr")
    w.prepare(["c/0/0/0"])  # quietly fails in the background; the write says why
    with pytest.raises(ChunkWriteError, match=r"arr: writing 'c/0/0/0' failed: .*file stands in the way") as e:
        w.put_many(_objects(["c/1/0/0", "c/0/0/0"]))
    assert e.value.key == "c/0/0/0" and e.value.array == "arr"
    with pytest.raises(ChunkWriteError, match=r"'c/0/1'.*file stands in the way"):
        w.put("c/0/1", b"x")  # the file is the object's own folder
    assert (tmp_path / "c" / "0").read_bytes() == b"in the way"


@pytest.mark.parametrize("key", ["../x", "c/../../x", "c//0", "", "c/./0"])
def test_key_leaving_the_array_folder_is_refused(tmp_path, key):
    w = LocalObjectWriter(str(tmp_path / "a"), "arr")
    with pytest.raises(ChunkWriteError, match="not a valid object key"):
        w.put_many([(key, b"x"), ("0", b"y")])
    assert not (tmp_path / "x").exists()


def test_temporary_names_are_unique_across_threads():
    with ThreadPoolExecutor(8) as pool:
        tags = [t for batch in pool.map(lambda _: [writer_mod._temp_tag() for _ in range(500)], range(8)) for t in batch]
    assert len(set(tags)) == len(tags)
    assert all(t.startswith(f"{os.getpid():x}") for t in tags)


def test_single_buffer_short_writes_are_resumed(tmp_path, monkeypatch):
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, b: real(fd, bytes(memoryview(b)[:7])))
    data = np.arange(1000, dtype=np.uint16)
    LocalObjectWriter(str(tmp_path)).put("x/y", data)
    assert (tmp_path / "x" / "y").read_bytes() == data.tobytes()


def test_leftover_temporary_files_are_ignored_and_resume_completes(tmp_path):
    """A killed writer's temporary files (and a missing chunk) do not disturb zarr-python or a resumed write."""
    data = make_data("float32", (12, 10, 8), seed=7)
    path = str(tmp_path / "a.zarr")
    x = da.from_array(data, chunks=(4, 10, 8))
    gz.to_zarr_gpu(x, path, chunks=(1, 5, 8), device="cpu")
    os.remove(os.path.join(path, "c", "5", "1", "0"))
    for folder in ("c/5/1", "c/0/0"):
        with open(os.path.join(path, *folder.split("/"), f".0.{os.getpid():x}dead-1.tmp"), "wb") as f:
            f.write(b"\x00garbage")
    with pytest.raises(Exception):  # a chunk is missing: zarr-python reads the fill value there, not garbage
        np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], data)
    got = zarr.open_array(path, mode="r")[...]
    np.testing.assert_array_equal(np.delete(got, 5, axis=0), np.delete(data, 5, axis=0))
    gz.to_zarr_gpu(x, path, chunks=(1, 5, 8), device="cpu", resume=True)
    np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], data)
    gz.to_zarr_gpu(x, path, chunks=(1, 5, 8), device="cpu", overwrite=True)  # removes the leftovers too
    assert not [n for _, _, ns in os.walk(path) for n in ns if n.endswith(".tmp")]
    np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], data)


def test_fresh_v3_layout_many_folders_reads_back(tmp_path):
    """One folder per time step (prepare racing the writes on every block), read by zarr-python."""
    data = make_data("int16", (40, 9, 7), seed=8)
    path = str(tmp_path / "a.zarr")
    with dask.config.set({"gpuzarr.io-threads": 8}):
        gz.to_zarr_gpu(da.from_array(data, chunks=(8, 9, 7)), path, chunks=(1, 3, 7), device="cpu")
    np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], data)
    names = [n for _, _, ns in os.walk(path) for n in ns]
    assert not [n for n in names if n.endswith(".tmp")]


def test_writer_keyword_lists_match_both_signatures():
    """The one list of keywords ``to_zarr_gpu`` hands to the Dataset writer is what both functions take."""
    import inspect

    from gpuzarr_dist.api import ARRAY_ONLY_KEYWORDS, DATASET_KEYWORDS, to_zarr_gpu
    from gpuzarr_dist.xarray.write import dataset_to_zarr_gpu

    def kwonly(fn):
        return [p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY]

    assert sorted(kwonly(to_zarr_gpu)) == sorted([*DATASET_KEYWORDS, *ARRAY_ONLY_KEYWORDS])
    assert set(DATASET_KEYWORDS) <= set(kwonly(dataset_to_zarr_gpu))
    for name in DATASET_KEYWORDS:  # same defaults on both sides
        assert (inspect.signature(to_zarr_gpu).parameters[name].default
                == inspect.signature(dataset_to_zarr_gpu).parameters[name].default), name


def test_compute_false_makes_no_folder_until_computed(tmp_path):
    """Building a write graph (compute=False) makes no object folder, now or later; compute() writes what
    zarr-python reads."""
    import time

    import dask.array as da
    import numpy as np
    import zarr

    import gpuzarr_dist
    data = np.arange(6 * 4 * 5, dtype="float32").reshape(6, 4, 5)
    path = str(tmp_path / "out.zarr")
    lazy = gpuzarr_dist.to_zarr_gpu(da.from_array(data, chunks=(2, 4, 5)), path, chunks=(1, 2, 5), compute=False,
                                    device="cpu")
    time.sleep(0.5)  # what background threads would have made by now
    assert not (tmp_path / "out.zarr" / "c").exists()
    lazy.compute()
    np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], data)


def test_old_write_path_still_resolves_every_name():
    """``gpuzarr_dist.write`` (deprecated) gives the public ``to_zarr_gpu`` (arrays and Datasets) and the names
    that moved out of the old module to their new homes, each with a DeprecationWarning naming the home."""
    import gpuzarr_dist
    from gpuzarr_dist.array import write as array_write
    from gpuzarr_dist.codecs import encode
    from gpuzarr_dist.core import layout
    from gpuzarr_dist.stores import target

    old = __import__("gpuzarr_dist.write", fromlist=["x"])
    for name, home in [("to_zarr_gpu", gpuzarr_dist), ("split_shape", layout), ("plan_layout", layout),
                       ("create_metadata", target), ("CODECS", target), ("chunk_grid", encode),
                       ("CpuBlockEncoder", encode), ("BlockWriter", array_write), ("write_array_graph", array_write)]:
        with pytest.warns(DeprecationWarning, match=f"import {name} from {home.__name__}$"):
            assert getattr(old, name) is getattr(home, name)
    with pytest.warns(DeprecationWarning), pytest.raises(AttributeError):
        old.no_such_name
