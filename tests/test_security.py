"""Security: keys and paths from metadata stay inside the store, nothing from a store is unpickled or
evaluated, and credentials never reach error messages, reprs, task names or logs."""

from __future__ import annotations

import functools
import http.server
import json
import logging
import os
import pathlib
import pickle
import re
import threading

import numpy as np
import pytest
import zarr
import zarr.codecs as zc
from conftest import assert_same, compute_checked, dev, make_data, reference, write_array

import gpuzarr_dist as gz
from gpuzarr_dist.core.redact import option_secrets, redact_url, scrub
from gpuzarr_dist.stores.base import check_key
from gpuzarr_dist.stores.local import LocalChunkStore
from gpuzarr_dist.stores.zarrstore import ZarrChunkStore

PACKAGE = pathlib.Path(gz.__file__).parent

# --------------------------------------------------------------------------- keys and paths


@pytest.mark.parametrize("key", ["../x", "c/../../x", "/etc/passwd", "c/./0", "c//0", "", "..", "c\\..\\x", "c/0\x00"])
def test_keys_that_leave_the_array_folder_are_refused(tmp_path, key):
    (tmp_path / "x").write_bytes(b"outside")
    arr = tmp_path / "a.zarr"
    arr.mkdir()
    with pytest.raises(gz.ChunkReadError) as info:
        LocalChunkStore(str(arr)).read_many([key])
    assert info.value.key == key and "outside the array's folder" in str(info.value)
    with pytest.raises(gz.ChunkReadError):
        ZarrChunkStore(zarr.storage.LocalStore(str(tmp_path)), "a.zarr", "a").read_many([key])


@pytest.mark.parametrize("key", ["c/0/1", "0.1", "0/1", "c", "0", "c.0.1"])
def test_keys_built_from_coordinates_are_accepted(key):
    assert check_key("a", key) == key


@pytest.mark.parametrize("fmt,doc,field,value", [
    (2, ".zarray", "dimension_separator", "/../"),
    (2, ".zarray", "dimension_separator", ".."),
    (2, ".zarray", "dimension_separator", "/"),  # fine: nested keys inside the folder
    (3, "zarr.json", "chunk_key_encoding", {"name": "default", "configuration": {"separator": "/../"}}),
    (3, "zarr.json", "chunk_key_encoding", {"name": "v2", "configuration": {"separator": "../"}}),
])
def test_separators_from_metadata_cannot_build_escaping_paths(tmp_path, fmt, doc, field, value):
    outside = tmp_path / "outside"
    outside.mkdir()
    path = str(tmp_path / "s.zarr")
    data = make_data("int32", (4, 3), seed=1)
    write_array(path, data, (2, 3), zarr_format=fmt)
    meta = json.loads(pathlib.Path(path, doc).read_text())
    meta[field] = value
    pathlib.Path(path, doc).write_text(json.dumps(meta))
    if value == "/":  # a legal separator: the chunks are not where it says, so fill values come back
        np.testing.assert_array_equal(gz.from_zarr_gpu(path, device="cpu").compute(), np.zeros((4, 3), "i4"))
        return
    with pytest.raises(gz.MetadataError) as info:
        gz.from_zarr_gpu(path, device="cpu")
    assert path in str(info.value)


def test_sharded_keys_stay_inside_the_array(tmp_path):
    path = str(tmp_path / "sh.zarr")
    data = make_data("uint16", (8, 8), seed=2)
    write_array(path, data, (2, 2), shards=(4, 4))
    x = gz.from_zarr_gpu(path, device="cpu")
    assert_same(x.compute(), reference(path))
    with pytest.raises(gz.ChunkReadError):
        LocalChunkStore(path).read_many(["c/../../0[0,0]"])


# --------------------------------------------------------------------------- no unpickling, no eval


class _Canary:
    """Unpickling this creates ``path``: proof that something unpickled store bytes."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.path),))


def _plant_pickle(chunk_file: str, canary: str) -> None:
    with open(chunk_file, "wb") as f:
        f.write(pickle.dumps([_Canary(canary)]))


@pytest.mark.parametrize("where", ["compressor", "filters", "v3-codec", "object-dtype"])
def test_pickle_codecs_and_object_arrays_are_refused_before_any_chunk_is_read(tmp_path, where):
    path = str(tmp_path / "p.zarr")
    canary = str(tmp_path / "UNPICKLED")
    if where == "v3-codec":
        write_array(path, make_data("int32", (4,), seed=3), (2,))
        meta = json.loads(pathlib.Path(path, "zarr.json").read_text())
        meta["codecs"].append({"name": "numcodecs.pickle", "configuration": {"protocol": 5}})
        pathlib.Path(path, "zarr.json").write_text(json.dumps(meta))
        chunk = os.path.join(path, "c", "0")
    else:
        write_array(path, make_data("int32", (4,), seed=3), (2,), zarr_format=2)
        meta = json.loads(pathlib.Path(path, ".zarray").read_text())
        if where == "compressor":
            meta["compressor"] = {"id": "pickle", "protocol": 5}
        elif where == "filters":
            meta["filters"] = [{"id": "pickle", "protocol": 5}]
        else:
            meta.update(dtype="|O", filters=[{"id": "pickle", "protocol": 5}], fill_value=None)
        pathlib.Path(path, ".zarray").write_text(json.dumps(meta))
        chunk = os.path.join(path, "0")
    _plant_pickle(chunk, canary)
    with pytest.raises(gz.MetadataError) as info:
        gz.from_zarr_gpu(path, device=dev()).compute()
    assert path in str(info.value)
    assert not os.path.exists(canary), "a chunk was unpickled"


def test_fill_value_text_is_never_evaluated(tmp_path):
    path = str(tmp_path / "e.zarr")
    canary = tmp_path / "EVALUATED"
    write_array(path, make_data("float64", (4,), seed=4), (2,), zarr_format=2, which="none")
    meta = json.loads(pathlib.Path(path, ".zarray").read_text())
    meta["fill_value"] = f"__import__('pathlib').Path({str(canary)!r}).touch()"
    pathlib.Path(path, ".zarray").write_text(json.dumps(meta))
    try:
        gz.from_zarr_gpu(path, device="cpu").compute()
    except gz.MetadataError:
        pass
    assert not canary.exists()


def test_the_package_has_no_unpickling_or_eval_of_stored_data():
    """A source scan: no pickle/marshal loads, eval, exec or yaml.load anywhere in the package."""
    pattern = re.compile(r"\b(pickle\.loads?|marshal\.loads?|cloudpickle\.loads?|eval|exec|yaml\.load|yaml\.unsafe_load)\s*\(")
    hits = [f"{p.relative_to(PACKAGE)}:{i}: {line.strip()}"
            for p in PACKAGE.rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1)
            if pattern.search(line) and not line.lstrip().startswith("#")]
    # the one exception: the Cubed executor's task payload, cloudpickled by our own client and sent
    # through distributed (which unpickles every task it runs anyway); never bytes from a store
    allowed = {"cubed/tasks.py"}
    assert [h for h in hits if h.split(":")[0] not in allowed] == []


# --------------------------------------------------------------------------- credentials

SECRET = "s3cr3t-Zq81"  # never to appear anywhere


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def http_store(tmp_path):
    """An HTTP server on loopback serving a folder with one Zarr array whose chunk c/1/0 is damaged."""
    root = tmp_path / "www"
    root.mkdir()
    path = str(root / "a.zarr")
    write_array(path, make_data("int32", (8, 6), seed=5), (4, 3), compressors=[zc.ZstdCodec(level=1)])
    pathlib.Path(path, "c", "1", "0").write_bytes(b"garbage, not zstd")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()


def _everything_shown(x, error: BaseException | None) -> str:
    import traceback

    parts = [repr(x), str(x), x.name, repr(dict(x.dask)), repr(x.dask), str(x.dask.layers)]
    if error is not None:
        parts += [str(error), repr(error), "".join(traceback.format_exception(error))]
    return "\n".join(parts)


@pytest.mark.parametrize("how", ["password-in-url", "header"])
def test_credentials_never_reach_messages_reprs_graphs_or_logs(http_store, how, caplog):
    plain = f"http://{http_store}/a.zarr"
    url = f"http://reader:{SECRET}@{http_store}/a.zarr" if how != "header" else plain
    options = {"client_kwargs": {"headers": {"Authorization": f"Bearer {SECRET}"}}} if how != "password-in-url" else None
    caplog.set_level(logging.DEBUG)
    x = gz.from_zarr_gpu(url, storage_options=options, device=dev())
    with pytest.raises(gz.ChunkDecodeError) as info:
        x.compute()
    assert info.value.key == "c/1/0"
    shown = _everything_shown(x, info.value) + "\n".join(r.getMessage() for r in caplog.records)
    assert SECRET not in shown
    assert http_store in str(info.value)  # the location is still named
    assert_same(compute_checked(x[:4]), zarr.open_array(plain, mode="r")[:4])  # intact chunks read as zarr-python reads them


@pytest.mark.parametrize("missing", ["array", "server"])
def test_credentials_never_reach_open_errors(http_store, missing):
    host = http_store if missing == "array" else "127.0.0.1:9"
    url = f"https://user:{SECRET}@{host}/nothere.zarr?token={SECRET}" if missing == "server" else f"http://user:{SECRET}@{host}/nothere.zarr"
    options = {"client_kwargs": {"headers": {"Authorization": f"Bearer {SECRET}"}}}
    import traceback

    with pytest.raises(Exception) as info:
        gz.from_zarr_gpu(url, storage_options=options, device="cpu")
    assert SECRET not in "".join(traceback.format_exception(info.value))


def test_memory_store_with_secret_options_keeps_them_out_of_reprs():
    url = "memory://sec/a.zarr"
    arr = zarr.create_array(url, shape=(6,), chunks=(3,), dtype="f8", storage_options={"key": SECRET}, overwrite=True)
    arr[:] = np.arange(6.0)
    x = gz.from_zarr_gpu(url, storage_options={"key": SECRET}, device=dev())
    assert_same(compute_checked(x), np.arange(6.0))
    assert SECRET not in _everything_shown(x, None)


def test_redaction_helpers():
    assert redact_url(f"https://u:{SECRET}@h/p?X-Amz-Signature={SECRET}&v=1") == "https://u:***@h/p?X-Amz-Signature=***&v=1"
    assert redact_url(f"s3://{SECRET}@bucket/k") == "s3://***@bucket/k"
    assert redact_url("/local/path") == "/local/path" and redact_url("https://h/p?v=1") == "https://h/p?v=1"
    secrets = option_secrets({"key": "AKIA1234", "secret": SECRET, "client_kwargs": {"headers": {"Authorization": f"Bearer {SECRET}"}},
                              "endpoint_url": "http://h", "anon": False})
    assert "http://h" not in secrets and SECRET in secrets and "AKIA1234" in secrets
    assert scrub(f"failed for {SECRET} and AKIA1234", secrets) == "failed for *** and ***"


def test_log_records_of_store_libraries_are_redacted_in_any_process(monkeypatch, caplog):
    """Unpickling a reader (what a dask worker does) installs the filter; URL passwords and signatures are masked."""
    import logging
    import pickle as pk

    from gpuzarr_dist.array.reader import BlockReader
    from gpuzarr_dist.core import redact
    from gpuzarr_dist.stores.source import open_source

    logger = logging.getLogger("fsspec.http")
    for f in [f for f in logger.filters if isinstance(f, redact.RedactingFilter)]:  # as in a fresh worker process
        monkeypatch.setattr(logger, "filters", [g for g in logger.filters if g is not f])
    monkeypatch.setattr(redact, "_filter", None)
    store = zarr.storage.MemoryStore()
    zarr.create_array(store, shape=(2,), dtype="i1")
    pk.loads(pk.dumps(BlockReader(*open_source(store), "cpu")))
    assert any(isinstance(f, redact.RedactingFilter) for f in logger.filters)
    caplog.set_level(logging.DEBUG, logger="fsspec.http")
    logger.debug("GET %s", f"https://user:{SECRET}@host/a.zarr/c/0?X-Amz-Signature={SECRET}&v=1")
    records = [r.getMessage() for r in caplog.records if r.name == "fsspec.http"]
    assert records and SECRET not in records[0] and "user:***@host" in records[0] and "v=1" in records[0]
