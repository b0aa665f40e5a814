"""Remote object stores on loopback: moto's S3 server and an HTTP server that answers ranges
(including suffix ranges) as object stores do. Arrays written by zarr-python and tensorstore
(sharded with the index at either end, crc32c index codec, missing inner chunks; unsharded v2
and v3) are read over each transport and compared with zarr-python's reading of the local copy.
Bad input (damaged shards, 403, 404, 5xx) raises errors naming the array, shard, chunk and URL,
and credentials appear in no repr, task, log line or message."""

from __future__ import annotations

import logging
import os
import pathlib
import pickle
import shutil

import dask
import numpy as np
import pytest
import zarr
import zarr.codecs as zc
from conftest import assert_same, compute_checked, dev, make_data, reference

import gpuzarr_dist as gz
from tests.helpers.servers import TEST_KEY, TEST_SECRET, moto_s3_server, range_http_server, upload_tree

pytest.importorskip("obstore")
pytestmark = pytest.mark.usefixtures("device")

SHAPE = (6, 30, 40)


def _sharded(path, data, location, partial=False, shards=(3, 20, 20), inner=(1, 10, 5)):
    a = zarr.create_array(
        path, shape=data.shape, dtype=data.dtype, chunks=shards, fill_value=-1, compressors=None, filters=None,
        serializer=zc.ShardingCodec(chunk_shape=inner, codecs=[zc.BytesCodec(), zc.ZstdCodec()],
                                    index_codecs=[zc.BytesCodec(), zc.Crc32cCodec()], index_location=location),
    )
    if partial:  # some inner chunks of some shards; shard (1, 1, 1) never written
        a[0:2, 0:12, 0:7] = data[0:2, 0:12, 0:7]
        a[4:, 21:, 3:19] = data[4:, 21:, 3:19]
    else:
        a[...] = data


def _tensorstore(path, data, location):
    ts = pytest.importorskip("tensorstore")
    t = ts.open({
        "driver": "zarr3", "kvstore": {"driver": "file", "path": path}, "create": True,
        "metadata": {
            "shape": list(data.shape), "data_type": str(data.dtype), "fill_value": 0,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [3, 15, 20]}},
            "codecs": [{"name": "sharding_indexed", "configuration": {
                "chunk_shape": [1, 5, 10], "index_location": location,
                "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "gzip", "configuration": {"level": 1}}],
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
            }}],
        },
    }).result()
    t[1:5, 2:29, :33].write(data[1:5, 2:29, :33]).result()


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """Arrays on local disk under one root, and zarr-python's reading of each."""
    root = str(tmp_path_factory.mktemp("remote"))
    data = make_data("float32", SHAPE, seed=21)
    _sharded(f"{root}/end.zarr", data, "end")
    _sharded(f"{root}/start.zarr", data, "start")
    _sharded(f"{root}/partial.zarr", data, "end", partial=True)
    ints = make_data("int32", SHAPE, seed=22)
    _tensorstore(f"{root}/ts_end.zarr", ints, "end")
    _tensorstore(f"{root}/ts_start.zarr", ints, "start")
    zarr.create_array(f"{root}/plain.zarr", data=data, chunks=(2, 16, 16), compressors=zc.ZstdCodec())
    zarr.create_array(f"{root}/v2.zarr", data=data, chunks=(2, 16, 16), zarr_format=2)
    g = zarr.open_group(f"{root}/group.zarr", mode="w")
    g.create_array("t", data=data, chunks=(3, 15, 20))
    os.makedirs(f"{root}/broken.zarr")
    pathlib.Path(f"{root}/broken.zarr/zarr.json").write_text('{"zarr_format": 3, "node_type": "array", "shape": [')
    expected = {name: reference(f"{root}/{name}") for name in ("end.zarr", "start.zarr", "partial.zarr", "ts_end.zarr",
                                                                 "ts_start.zarr", "plain.zarr", "v2.zarr")}
    expected["group.zarr/t"] = reference(f"{root}/group.zarr", "t")
    return root, expected


@pytest.fixture(scope="module")
def http(tree):
    with range_http_server(tree[0]) as (url, faults):
        yield url, faults


@pytest.fixture(scope="module")
def s3(tree):
    pytest.importorskip("moto.server")
    pytest.importorskip("boto3")
    with moto_s3_server() as endpoint:
        upload_tree(endpoint, "arrays", tree[0], "data")
        yield endpoint


def _open(transport, http, s3, name, **kwargs):
    component = None
    if "/" in name:
        name, component = name.split("/", 1)
    if transport == "http":
        return gz.from_zarr_gpu(f"{http[0]}/{name}", component, device=dev(), **kwargs)
    opts = {"endpoint_url": s3, "key": TEST_KEY, "secret": TEST_SECRET, "region": "us-east-1"}
    return gz.from_zarr_gpu(f"s3://arrays/data/{name}", component, device=dev(), storage_options=opts, **kwargs)


ARRAYS = ["end.zarr", "start.zarr", "partial.zarr", "ts_end.zarr", "ts_start.zarr", "plain.zarr", "v2.zarr", "group.zarr/t"]


@pytest.mark.parametrize("name", ARRAYS)
@pytest.mark.parametrize("transport", ["http", "s3"])
def test_remote_reads_like_zarr_python(tree, http, s3, transport, name):
    expected = tree[1][name]
    x = _open(transport, http, s3, name)
    assert_same(compute_checked(x), expected)
    for sel in (np.s_[1:5, 7:23, ::3], np.s_[4, -9:, 11:35]):
        assert_same(compute_checked(x[sel]), expected[sel])


def test_index_at_end_is_a_suffix_range_and_data_only_the_needed_bytes(tree, http):
    _, faults = http
    faults.clear()
    with dask.config.set({"gpuzarr.shards.merge-gap": 0}):
        x = gz.from_zarr_gpu(f"{http[0]}/end.zarr", device=dev())
        assert_same(compute_checked(x[1, 0:10, 5:10]), tree[1]["end.zarr"][1, 0:10, 5:10])  # one inner chunk
    shard = [(p, r) for p, r in faults.requests if p.endswith("/c/0/0/0")]
    n_index = 3 * 2 * 4 * 16 + 4
    assert shard[0] == ("/end.zarr/c/0/0/0", f"bytes=-{n_index}")
    assert len(shard) == 2 and shard[1][1].startswith("bytes=") and not shard[1][1].startswith("bytes=-")
    lo, hi = map(int, shard[1][1][6:].split("-"))
    assert hi - lo + 1 < 400  # one compressed inner chunk of 200 bytes, not the shard


@pytest.mark.parametrize("name", ["end.zarr", "start.zarr", "partial.zarr", "ts_end.zarr"])
def test_a_shard_needed_whole_is_one_request(tree, http, name):
    """A block needing every inner chunk of a shard GETs the object once, index included; no index range."""
    _, faults = http
    faults.clear()
    x = gz.from_zarr_gpu(f"{http[0]}/{name}", device=dev(), chunks=SHAPE)  # one block: every shard whole
    assert_same(compute_checked(x), tree[1][name])
    shard_requests = [(p, r) for p, r in faults.requests if "/c/" in p]
    paths = [p for p, _ in shard_requests]
    assert shard_requests and len(paths) == len(set(paths)), shard_requests  # one request per shard object
    assert all(r is None for _, r in shard_requests), shard_requests  # whole objects, not ranges
    faults.clear()  # part of a shard: its index (a range) and then the chunks' range, as before
    assert_same(compute_checked(x[1:2, 0:10, 0:5]), tree[1][name][1:2, 0:10, 0:5])
    assert any(r is not None for p, r in faults.requests if "/c/" in p), faults.requests


def test_many_requests_in_flight_per_task(tree, http):
    _, faults = http
    faults.clear()
    faults.delay = 0.05
    try:
        with dask.config.set({"gpuzarr.shards.merge-gap": 0, "scheduler": "sync"}):
            x = gz.from_zarr_gpu(f"{http[0]}/plain.zarr", device=dev(), chunks=SHAPE)  # one task, 24 chunks
            assert_same(compute_checked(x), tree[1]["plain.zarr"])
    finally:
        faults.delay = 0.0
    assert faults.max_inflight >= 8


@pytest.mark.parametrize("name", ["plain.zarr", "end.zarr"])
def test_auto_blocks_over_an_object_store_are_capped(tree, http, name):
    """``gpuzarr.remote.block-size`` caps ``chunks="auto"`` blocks of an array in an object store (several blocks
    decode while others' requests are in flight), in whole chunks or shards; a local copy keeps the device's
    block size, and ``0`` lifts the cap. Values as zarr-python reads them."""
    root, expected = tree
    unit = 2 * 16 * 16 * 4 if name == "plain.zarr" else 3 * 20 * 20 * 4  # a chunk of plain, a shard of end
    with dask.config.set({"gpuzarr.remote.block-size": 2 * unit}):
        x = gz.from_zarr_gpu(f"{http[0]}/{name}", device=dev())
        local = gz.from_zarr_gpu(f"{root}/{name}", device=dev())
        assert np.prod(x.numblocks) > 1
        assert max(x.chunks[0]) * max(x.chunks[1]) * max(x.chunks[2]) * 4 <= 2 * unit  # the largest block's bytes
        assert local.numblocks == (1, 1, 1)
        assert_same(compute_checked(x), expected[name])
    with dask.config.set({"gpuzarr.remote.block-size": 0}):
        assert gz.from_zarr_gpu(f"{http[0]}/{name}", device=dev()).numblocks == (1, 1, 1)


def test_aws_environment_variables_without_storage_options(tree, s3, monkeypatch):
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", TEST_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", TEST_SECRET)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    x = gz.from_zarr_gpu("s3://arrays/data/end.zarr", device=dev())
    assert_same(compute_checked(x), tree[1]["end.zarr"])


def test_credentials_never_appear(tree, s3, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    opts = {"endpoint_url": s3, "key": TEST_KEY, "secret": TEST_SECRET, "region": "us-east-1"}
    x = gz.from_zarr_gpu("s3://arrays/data/end.zarr", device=dev(), storage_options=opts)
    y = (x + 1).sum(axis=0)
    texts = [repr(x), repr(x.dask), str(dict(y.dask)), repr(y.__dask_keys__()), str(x.name)]
    texts += [repr(v) for v in dict(x.dask).values()]
    readers = [a.value for t in dict(x.dask).values() for a in getattr(t, "args", ()) if hasattr(getattr(a, "value", None), "store")]
    assert readers
    for r in readers:
        texts += [repr(r), repr(r.store), repr(r.store.__dict__), repr(r.store.base.__dict__), r.store.token()]
    compute_checked(y)
    texts.append(caplog.text)
    # an error from a server that rejects the request: S3 signed by the same credentials, answered by the fault server
    (tmp_path / "arrays").mkdir()
    (tmp_path / "arrays" / "data").symlink_to(tree[0])  # path-style S3 URLs: /bucket/key
    with range_http_server(str(tmp_path)) as (url, faults):
        faults.set("arrays/data/end.zarr/c/0/0/0", 403)
        with pytest.raises(gz.ChunkReadError) as info:
            gz.from_zarr_gpu("s3://arrays/data/end.zarr", device=dev(), storage_options={**opts, "endpoint_url": url}).compute()
    texts.append(str(info.value))
    assert "403" in str(info.value) and "c/0/0/0" in str(info.value)
    for t in texts:
        assert TEST_SECRET not in t and TEST_KEY not in t
    # the pickled store still carries the credentials to the workers, and reads there
    clone = pickle.loads(pickle.dumps(readers[0]))
    assert_same(np.asarray(clone[0:2, 0:5, 0:5]), tree[1]["end.zarr"][0:2, 0:5, 0:5]) if dev() == "cpu" else None


def test_user_and_password_in_an_http_url_stay_out_of_messages(tree, http):
    url = http[0].replace("http://", "http://alice:hunter2pass@")
    _, faults = http
    faults.clear()
    faults.set("end.zarr/c/1/0/1", 403)
    try:
        with pytest.raises(gz.ChunkReadError) as info:
            gz.from_zarr_gpu(f"{url}/end.zarr", device=dev()).compute()
    finally:
        faults.clear()
    msg = str(info.value)
    assert "hunter2pass" not in msg and "alice" not in msg
    assert "end.zarr" in msg and "c/1/0/1[" in msg and "403" in msg and "127.0.0.1" in msg


# ------------------------------------------------------------------------- bad input


@pytest.fixture
def damaged(tree, http, tmp_path):
    """A copy of end.zarr served over HTTP, for tests that damage a shard."""
    src = pathlib.Path(tree[0], "end.zarr")
    name = f"damaged-{tmp_path.name}.zarr"
    dst = pathlib.Path(tree[0], name)
    shutil.copytree(src, dst)
    yield dst, f"{http[0]}/{name}"
    shutil.rmtree(dst)


@pytest.mark.parametrize("damage", ["truncated-index", "index-checksum", "range-past-end"])
def test_damaged_shards_name_array_shard_and_chunk(damaged, damage):
    path, url = damaged
    shard = path / "c" / "1" / "0" / "1"
    raw = bytearray(shard.read_bytes())
    n = 3 * 2 * 4 * 16
    if damage == "truncated-index":
        raw = raw[:50]
    elif damage == "index-checksum":
        raw[-7] ^= 0x5A
    else:  # a valid index whose first chunk ends past the object
        import google_crc32c

        index = np.frombuffer(bytes(raw[-(n + 4):-4]), dtype="<u8").copy()
        index[1] = len(raw) * 4
        body = index.tobytes()
        raw = raw[: -(n + 4)] + body + google_crc32c.value(body).to_bytes(4, "little")
    shard.write_bytes(bytes(raw))
    with pytest.raises(gz.ChunkDecodeError) as info:
        gz.from_zarr_gpu(url, device=dev()).compute()
    msg = str(info.value)
    assert url in msg and "c/1/0/1" in msg
    if damage == "range-past-end":
        assert "c/1/0/1[0,0,0]" in msg and "past the end" in msg
    elif damage == "truncated-index":
        assert "truncated" in msg
    else:
        assert "crc32c" in msg.lower() or "checksum" in msg.lower()


def test_404_on_a_shard_is_a_missing_shard_and_404_after_its_index_is_an_error(tree, http):
    _, faults = http
    faults.clear()
    expected = tree[1]["end.zarr"].copy()
    try:
        faults.set("end.zarr/c/1/1/1", 404)  # as if never written: the fill value, as zarr-python reads it
        x = gz.from_zarr_gpu(f"{http[0]}/end.zarr", device=dev())
        got = compute_checked(x)
        expected[3:6, 20:30, 20:40] = -1
        assert_same(got, expected)
        faults.clear()
        faults.set("end.zarr/c/1/1/1", 404, after=1)  # the index read, then the object is gone
        with pytest.raises(gz.ChunkReadError) as info:  # part of the shard: its index, then a range
            gz.from_zarr_gpu(f"{http[0]}/end.zarr", device=dev())[:, :, :35].compute()
        assert "c/1/1/1[" in str(info.value) and f"{http[0]}/end.zarr" in str(info.value)
    finally:
        faults.clear()


def test_transient_503_is_retried(tree, http):
    _, faults = http
    faults.clear()
    faults.set("end.zarr/c/0/1/0", 503, times=2)
    faults.set("end.zarr/c/1/0/0", 500, times=1, after=1)
    sel = np.s_[:, :, 5:]  # the shards at x 0-20 without their first inner chunks: index, then data ranges
    try:
        with dask.config.set({"gpuzarr.remote.backoff": 0.01}):
            x = gz.from_zarr_gpu(f"{http[0]}/end.zarr", device=dev())
            assert_same(compute_checked(x[sel]), tree[1]["end.zarr"][sel])
            assert sum(p == "/end.zarr/c/0/1/0" for p, _ in faults.requests) >= 4  # 2 failures, index, data
            faults.clear()
            faults.set("end.zarr/c/0/1/0", 503, times=2)
            assert_same(compute_checked(x), tree[1]["end.zarr"])  # shards needed whole: one GET each, retried
            assert sum(p == "/end.zarr/c/0/1/0" for p, _ in faults.requests) == 3  # 2 failures, the object
    finally:
        faults.clear()


def test_persistent_503_is_retried_then_reported_with_the_url(tree, http):
    _, faults = http
    faults.clear()
    faults.set("end.zarr/c/0/0/1", 503)
    try:
        with dask.config.set({"gpuzarr.remote.backoff": 0.01, "gpuzarr.remote.retries": 3}):
            with pytest.raises(gz.ChunkReadError) as info:
                gz.from_zarr_gpu(f"{http[0]}/end.zarr", device=dev()).compute()
        assert sum(p == "/end.zarr/c/0/0/1" for p, _ in faults.requests) == 4
    finally:
        faults.clear()
    msg = str(info.value)
    assert f"{http[0]}/end.zarr/c/0/0/1" in msg and "503" in msg and "after 4 attempts" in msg
    assert "c/0/0/1[" in msg  # the inner chunk that needed the shard


def test_a_v3_array_opens_with_one_metadata_request(tree, http, s3):
    """``zarr.json`` only (zarr-python's opening asked for ``.zarray`` and ``.zattrs`` too); a v2 array, a
    group and a damaged document still open, or fail, as zarr-python's opening says."""
    _, faults = http
    faults.clear()
    x = gz.from_zarr_gpu(f"{http[0]}/end.zarr", device=dev())
    assert [p for p, _ in faults.requests] == ["/end.zarr/zarr.json"]
    assert_same(compute_checked(x[2:4]), tree[1]["end.zarr"][2:4])
    faults.clear()
    x = gz.from_zarr_gpu(f"{http[0]}/group.zarr", "t", device=dev())
    assert [p for p, _ in faults.requests] == ["/group.zarr/t/zarr.json"]
    assert_same(compute_checked(x), tree[1]["group.zarr/t"])
    assert_same(compute_checked(gz.from_zarr_gpu(f"{http[0]}/v2.zarr", device=dev())), tree[1]["v2.zarr"])
    with pytest.raises(ValueError, match=r"group.zarr is a Zarr group; pass component= naming one of its arrays: "
                                         r"\(this store cannot list them\)"):  # plain HTTP: no listing
        gz.from_zarr_gpu(f"{http[0]}/group.zarr", device=dev())
    with pytest.raises(gz.GpuZarrError, match="broken.zarr: could not read the Zarr metadata"):
        gz.from_zarr_gpu(f"{http[0]}/broken.zarr", device=dev())
    with pytest.raises(ValueError, match=r"group.zarr is a Zarr group; pass component= naming one of its arrays: \['t'\]"):
        _open("s3", http, s3, "group.zarr")  # S3 lists


def test_missing_array_and_403_on_metadata(http):
    _, faults = http
    with pytest.raises(FileNotFoundError):
        gz.from_zarr_gpu(f"{http[0]}/nothing-here.zarr", device=dev())
    faults.set("plain.zarr/zarr.json", 403)
    try:
        with pytest.raises((gz.GpuZarrError, PermissionError, OSError)) as info:
            gz.from_zarr_gpu(f"{http[0]}/plain.zarr", device=dev())
    finally:
        faults.clear()
    assert "plain.zarr" in str(info.value)


@pytest.mark.parametrize("transport", ["http", "s3"])
def test_read_into_puts_each_object_at_its_aligned_slot(tree, http, s3, transport):
    """The GPU path's ``read_into`` of an unsharded array in an object store, run here with plain memory: each
    chunk object's bytes (compared with the file on disk) at its slot, missing chunks -1, on one or several threads."""
    from gpuzarr_dist.stores import copies

    x = _open(transport, http, s3, "plain.zarr")
    reader = next(iter(x.dask.values())).args[0].value
    store = reader.store
    keys = [reader.spec.chunk_key((t, i, j)) for t in range(3) for i in range(2) for j in range(3)] + ["c/99/0/0"]
    for parallel in (copies.PARALLEL_BYTES, 1):  # the one-thread path, then the threads'
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(copies, "PARALLEL_BYTES", parallel)
            buf, offsets, sizes = store.read_into(keys, lambda n: np.zeros(n, dtype=np.uint8), 256, 0)
        assert sizes[-1] == -1 and all(o % 256 == 0 for o in offsets)
        for key, o, n in zip(keys[:-1], offsets, sizes):
            with open(f"{tree[0]}/plain.zarr/{key}", "rb") as f:
                assert bytes(buf[o : o + n]) == f.read(), key


def test_stores_of_one_url_and_options_share_one_client(monkeypatch):
    """A client per URL, options, settings and environment, kept for the process: a second store (another
    from_zarr_gpu, an unpickled task's copy) reuses it and its open connections; anything that changes the
    client makes another. The cache's keys are hashes: no credential is held in them."""
    from gpuzarr_dist.stores import remote

    monkeypatch.setattr(remote, "_clients", type(remote._clients)())
    opts = {"endpoint_url": "http://127.0.0.1:9", "key": "AKIDKEEPME", "secret": "s3cr3t-value", "region": "us-east-1"}
    a = remote.ObjectChunkStore("s3://bucket/a.zarr", storage_options=opts)
    b = remote.ObjectChunkStore("s3://bucket/a.zarr", storage_options=dict(opts))
    assert a.store is b.store
    assert pickle.loads(pickle.dumps(a)).store is a.store
    assert remote.ObjectChunkStore("s3://bucket/b.zarr", storage_options=opts).store is not a.store
    assert remote.ObjectChunkStore("s3://bucket/a.zarr", storage_options={**opts, "secret": "other"}).store is not a.store
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    assert remote.ObjectChunkStore("s3://bucket/a.zarr", storage_options=opts).store is not a.store
    with dask.config.set({"gpuzarr.remote.timeout": 5}):
        assert remote.ObjectChunkStore("s3://bucket/a.zarr", storage_options=opts).store is not a.store
    assert not any("s3cr3t" in k or "AKID" in k for k in remote._clients)
    monkeypatch.setattr(remote, "_CLIENTS_MAX", 2)
    for i in range(4):
        remote.ObjectChunkStore(f"s3://bucket/{i}.zarr", storage_options=opts).store
    assert len(remote._clients) == 2


def test_an_oversized_chunk_object_is_refused_before_its_body_is_read(tree, s3, tmp_path):
    """A chunk object far larger than its chunk can be stored (a replaced or hostile object) raises
    ChunkReadError from the size in the response, without downloading it; the other chunks still read."""
    import boto3

    root = tmp_path / "big"
    data = make_data("float32", (4, 16, 16), seed=3)
    zarr.create_array(str(root / "a.zarr"), data=data, chunks=(2, 16, 16), compressors=zc.ZstdCodec())
    upload_tree(s3, "arrays", str(root), "big")
    client = boto3.client("s3", endpoint_url=s3, aws_access_key_id=TEST_KEY, aws_secret_access_key=TEST_SECRET,
                          region_name="us-east-1")
    client.put_object(Bucket="arrays", Key="big/a.zarr/c/1/0/0", Body=b"\0" * (8 << 20))  # 8 MiB for a 2 KiB chunk
    opts = {"endpoint_url": s3, "key": TEST_KEY, "secret": TEST_SECRET, "region": "us-east-1"}
    x = gz.from_zarr_gpu("s3://arrays/big/a.zarr", device=dev(), storage_options=opts, chunks=(2, 16, 16))
    assert_same(compute_checked(x[:2]), data[:2])
    with pytest.raises(gz.ChunkReadError, match=r"c/1/0/0.*holds 8388608 bytes.*refusing to read it"):
        x[2:].compute()
