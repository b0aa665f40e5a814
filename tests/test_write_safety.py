"""Writes that race, fail, get killed or never run: what they leave behind, and errors without credentials."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import traceback

import dask.array as da
import numpy as np
import pytest
import zarr

import gpuzarr_dist as gz
from gpuzarr_dist.core.redact import error_chain
from tests.helpers.servers import free_port

ROOT = pathlib.Path(__file__).resolve().parents[1]
SECRET = "hunter2-very-secret-password"


def _temporaries(path: str) -> list[str]:
    return [os.path.join(d, f) for d, _, files in os.walk(path) for f in files if f.endswith(".tmp")]


def _everything_shown(error: BaseException) -> str:
    """All text of ``error`` and of every error chained below it, suppressed ones included, and its traceback."""
    parts = []
    for e in error_chain(error):
        parts += [str(e), repr(e), repr(e.args), str(getattr(e, "filename", ""))]
    parts += traceback.format_exception(error)
    return "\n".join(parts)


# --------------------------------------------------------------------------- concurrent creation


def test_creation_race_loser_gets_array_exists(tmp_path, monkeypatch):
    """The other writer creates the array between the check and the create: ArrayExistsError, not zarr's
    ContainsArrayError."""
    import gpuzarr_dist.stores.target as target

    path = str(tmp_path / "a.zarr")
    zarr.create_array(path, shape=(4,), chunks=(2,), dtype="f8")  # the winner, written by zarr-python
    monkeypatch.setattr(target, "_existing", lambda t: None)  # this writer looked before the winner wrote
    with pytest.raises(gz.ArrayExistsError) as info:
        gz.to_zarr_gpu(np.arange(4.0), path, chunks=(2,), device="cpu")
    assert path in str(info.value) and isinstance(info.value, FileExistsError)


def test_creation_race_with_resume_continues(tmp_path, monkeypatch):
    import gpuzarr_dist.stores.target as target

    path = str(tmp_path / "a.zarr")
    gz.to_zarr_gpu(np.arange(4.0), path, chunks=(2,), device="cpu", compute=False)  # metadata only
    real = target._existing
    calls = []

    def first_none(t):
        calls.append(t)
        return None if len(calls) == 1 else real(t)

    monkeypatch.setattr(target, "_existing", first_none)
    gz.to_zarr_gpu(np.arange(4.0), path, chunks=(2,), device="cpu", resume=True)
    np.testing.assert_array_equal(zarr.open_array(path, mode="r")[:], np.arange(4.0))


def test_concurrent_writers_of_one_array(tmp_path):
    """Writers started at once on one new array (local disk): exactly one writes it, the others get
    ArrayExistsError."""
    path = str(tmp_path / "a.zarr")
    data = np.arange(64.0).reshape(8, 8)
    n = 6
    barrier = threading.Barrier(n)
    outcomes: list[BaseException | None] = [None] * n

    def write(i: int) -> None:
        barrier.wait()
        try:
            gz.to_zarr_gpu(da.from_array(data, chunks=(4, 8)), path, chunks=(4, 4), device="cpu")
        except BaseException as e:  # noqa: BLE001 (collected and checked below)
            outcomes[i] = e

    threads = [threading.Thread(target=write, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    errors = [e for e in outcomes if e is not None]
    assert all(isinstance(e, gz.ArrayExistsError) for e in errors), [type(e).__name__ for e in errors]
    assert len(errors) == n - 1
    np.testing.assert_array_equal(zarr.open_array(path, mode="r")[:], data)


def test_creating_an_array_in_a_group_keeps_the_group(tmp_path):
    path = str(tmp_path / "g.zarr")
    zarr.open_group(path, mode="w").attrs["title"] = "kept"
    gz.to_zarr_gpu(np.arange(4.0), path, component="surface/t2m", chunks=(2,), device="cpu")
    group = zarr.open_group(path, mode="r")
    assert group.attrs["title"] == "kept"
    assert isinstance(group["surface"], zarr.Group)
    np.testing.assert_array_equal(group["surface/t2m"][:], np.arange(4.0))
    assert _temporaries(path) == []


# --------------------------------------------------------------------------- compute=False, failed writes


def test_lazy_write_creates_nothing_after_returning(tmp_path):
    """compute=False: a target deleted after the call stays deleted (no folder made in the background)."""
    path = tmp_path / "lazy.zarr"
    x = da.zeros((400, 400), chunks=(100, 400))
    gz.to_zarr_gpu(x, str(path), chunks=(4, 4), compute=False, device="cpu")  # 10,000 chunk folders' worth
    shutil.rmtree(path)
    time.sleep(1.0)
    assert not path.exists()


def test_failed_write_creates_nothing_after_raising(tmp_path):
    """The folders made ahead stop with the call (the synchronous scheduler: no other write task is running when
    the error leaves, as dask's thread pool may still have)."""
    import dask

    path = tmp_path / "failed.zarr"

    def boom(block, block_info=None):
        if block_info[0]["chunk-location"][0] == 3:
            raise RuntimeError("a block fails")
        return block

    x = da.zeros((400, 400), chunks=(100, 400)).map_blocks(boom, dtype="f8")
    with dask.config.set(scheduler="synchronous"), pytest.raises(RuntimeError, match="a block fails"):
        gz.to_zarr_gpu(x, str(path), chunks=(4, 4), device="cpu")
    shutil.rmtree(path)
    time.sleep(1.0)
    assert not path.exists()


def test_lazy_write_computes_what_zarr_reads(tmp_path):
    path = str(tmp_path / "lazy.zarr")
    data = np.arange(400.0).reshape(20, 20)
    lazy = gz.to_zarr_gpu(da.from_array(data, chunks=(10, 20)), path, chunks=(5, 5), compute=False, device="cpu")
    assert not os.path.exists(os.path.join(path, "c"))
    assert int(lazy.compute()) > 0
    np.testing.assert_array_equal(zarr.open_array(path, mode="r")[:], data)


# --------------------------------------------------------------------------- temporaries


def test_a_write_that_fails_removes_its_temporary(tmp_path, monkeypatch):
    """Whatever stops a write between its temporary file and the rename, the temporary goes."""
    import gpuzarr_dist.stores.writer as writer

    def fail(fd, view):
        os.write(fd, bytes(view[:10]))  # part of the object is in the temporary file
        raise RuntimeError("stopped mid-write")

    monkeypatch.setattr(writer, "_write_view", fail)
    path = str(tmp_path / "a.zarr")
    with pytest.raises(RuntimeError, match="stopped mid-write"):
        gz.to_zarr_gpu(np.arange(64.0), path, chunks=(8,), device="cpu")
    assert _temporaries(path) == []


_KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys
    import numpy as np, dask.array as da
    import gpuzarr_dist as gz
    import gpuzarr_dist.stores.writer as writer

    real = os.replace
    def replace(src, dst):
        if os.path.basename(dst) == "3":  # killed between a temporary file and its rename
            os.kill(os.getpid(), signal.SIGKILL)
        return real(src, dst)
    writer.os.replace = replace
    import dask
    dask.config.set(scheduler="synchronous")
    x = da.from_array(np.arange(64.0), chunks=8)
    gz.to_zarr_gpu(x, sys.argv[1], chunks=(8,), device="cpu")
""")


def test_resume_removes_a_killed_writes_temporaries(tmp_path):
    path = str(tmp_path / "a.zarr")
    out = subprocess.run([sys.executable, "-c", _KILLED_WRITER, path], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == -9, out.stderr
    left = _temporaries(path)
    assert left, "the killed write left no temporary file"
    keep = os.path.join(path, "c", "notes.tmp")  # not this writer's name pattern: left alone
    pathlib.Path(keep).write_text("mine")
    gz.to_zarr_gpu(np.arange(64.0), path, chunks=(8,), device="cpu", resume=True)
    assert _temporaries(path) == [keep]
    np.testing.assert_array_equal(zarr.open_array(path, mode="r")[:], np.arange(64.0))


# --------------------------------------------------------------------------- credentials and unreachable stores


def test_url_password_is_in_no_chained_error():
    port = free_port()  # nothing listens there
    url = f"https://reader:{SECRET}@127.0.0.1:{port}/data.zarr"
    with pytest.raises(Exception) as info:
        gz.from_zarr_gpu(url, device="cpu")
    assert SECRET not in _everything_shown(info.value)


def test_url_password_is_in_no_chained_error_of_a_chunk_read():
    from gpuzarr_dist.stores.remote import ObjectChunkStore

    port = free_port()
    store = ObjectChunkStore(f"http://reader:{SECRET}@127.0.0.1:{port}/data.zarr")
    with pytest.raises(gz.ChunkReadError) as info:
        store.read_many(["c/0"])
    assert SECRET not in _everything_shown(info.value)


def test_unreachable_object_store_write_is_one_clear_paragraph():
    port = free_port()
    options = {"endpoint_url": f"http://127.0.0.1:{port}", "key": "AKIAUNREACHABLE", "secret": SECRET}
    with pytest.raises(gz.ChunkWriteError) as info:
        gz.to_zarr_gpu(np.arange(4.0), "s3://bucket/out.zarr", storage_options=options, device="cpu")
    e = info.value
    message = str(e)
    assert len(message.splitlines()) == 1
    assert "s3://bucket/out.zarr" in message and "zarr.json" in message
    assert "did not answer" in message
    assert SECRET not in _everything_shown(e)
    assert e.__context__ is None


def test_unreachable_object_store_chunk_write_is_one_line():
    """The chunk writer over an object store: one line per failed object, no credential in it or its chain."""
    from gpuzarr_dist.stores.target import open_target

    port = free_port()
    options = {"endpoint_url": f"http://127.0.0.1:{port}", "key": "AKIAUNREACHABLE", "secret": SECRET}
    t = open_target("s3://bucket/out.zarr", None, options)
    with pytest.raises(gz.ChunkWriteError) as info:
        t.writer(t.name).put_many([("c/0", b"abc")])
    assert len(str(info.value).splitlines()) == 1 and "c/0" in str(info.value)
    assert SECRET not in _everything_shown(info.value)


def test_password_quoted_by_a_zarr_store_is_in_no_chunk_read_error():
    """A zarr-python store (fsspec, ...) whose error quotes a URL with a password: redacted, not chained."""

    class Leaky(zarr.storage.MemoryStore):
        async def get(self, key, prototype=None, byte_range=None):
            if key == "c/1":  # one chunk: one failed request
                raise OSError(f"GET https://reader:{SECRET}@data.example/{key}: connection reset")
            return await super().get(key, prototype, byte_range)

    store = Leaky()
    zarr.create_array(store, shape=(4,), chunks=(2,), dtype="f8")
    with pytest.raises(gz.ChunkReadError) as info:
        gz.from_zarr_gpu(store, device="cpu").compute()
    assert "'c/1'" in str(info.value) and "***" in str(info.value)
    assert SECRET not in _everything_shown(info.value)


def test_unreachable_http_write_names_the_target_without_its_password():
    port = free_port()
    with pytest.raises(gz.ChunkWriteError) as info:
        gz.to_zarr_gpu(np.arange(4.0), f"http://writer:{SECRET}@127.0.0.1:{port}/out.zarr", device="cpu")
    message = str(info.value)
    assert f"http://127.0.0.1:{port}/out.zarr" in message and "did not answer" in message
    assert len(message.splitlines()) == 1
    assert SECRET not in _everything_shown(info.value)
