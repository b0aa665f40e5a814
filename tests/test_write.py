"""``to_zarr_gpu``: everything written is read back by zarr-python and tensorstore and compared with numpy.

Each round trip runs on both devices (the GPU case, marked ``gpu``, gives the
writer cupy blocks and so encodes with nvCOMP).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import dask
import dask.array as da
import numcodecs
import numpy as np
import pytest
import zarr
from conftest import assert_same, dev, make_data, write_array

import gpuzarr_dist as gz
from gpuzarr_dist.errors import ArrayExistsError, ChunkWriteError, MetadataError

ts = pytest.importorskip("tensorstore")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def on_device(data: np.ndarray, chunks) -> da.Array:
    """A dask array of ``data`` with numpy blocks (cpu) or cupy blocks (gpu)."""
    x = da.from_array(data, chunks=chunks)
    if dev() == "gpu":
        import cupy

        x = x.map_blocks(cupy.asarray, dtype=data.dtype.newbyteorder("="))
    return x


def read_zarr(path: str, component: str | None = None) -> np.ndarray:
    return zarr.open_array(path, path=component or "", mode="r")[...]


def read_ts(path: str) -> np.ndarray:
    t = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": path}}, open=True).result()
    return t.read().result()


def check_both(path: str, expected: np.ndarray) -> None:
    assert_same(np.asarray(read_zarr(path)), expected)
    assert_same(np.asarray(read_ts(path)), expected)


def stored_files(path: str) -> list[str]:
    out = []
    for d, _, names in os.walk(path):
        out += [os.path.relpath(os.path.join(d, n), path) for n in names if n != "zarr.json"]
    return sorted(out)


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("codec", ["zstd", "gzip", "none"])
@pytest.mark.parametrize("crc32c", [False, True], ids=["plain", "crc32c"])
@pytest.mark.parametrize("sharded", [False, True], ids=["chunks", "shards"])
def test_round_trip_codecs(tmp_path, device, codec, crc32c, sharded):
    data = make_data("float32", (45, 34), seed=1)
    path = str(tmp_path / "out.zarr")
    kw = {"shards": (20, 16), "chunks": (10, 8)} if sharded else {"chunks": (10, 8)}
    gz.to_zarr_gpu(on_device(data, (20, 16)), path, codec=codec, crc32c=crc32c, **kw)
    check_both(path, data)
    meta = zarr.open_array(path, mode="r").metadata.to_dict()
    codecs = meta["codecs"]
    if sharded:
        assert codecs[0]["name"] == "sharding_indexed"
        assert tuple(codecs[0]["configuration"]["chunk_shape"]) == (10, 8)
        codecs = codecs[0]["configuration"]["codecs"]
    names = [c["name"] for c in codecs]
    assert names == ["bytes"] + ([codec] if codec != "none" else []) + (["crc32c"] if crc32c else [])


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint16", "int32", "int64", "float16", "float64", "complex64", ">f8", ">i4", "<u8"])
def test_round_trip_dtypes(tmp_path, device, dtype):
    if dev() == "gpu" and np.dtype(dtype).byteorder == ">":
        pytest.skip("cupy has no big-endian arrays")
    data = make_data(dtype, (13, 9), seed=2)
    path = str(tmp_path / "out.zarr")
    gz.to_zarr_gpu(on_device(data, (5, 4)), path)
    check_both(path, data)
    assert zarr.open_array(path, mode="r").dtype == np.dtype(dtype).newbyteorder("=")


@pytest.mark.parametrize(
    "shape,blocks,kw",
    [
        ((50,), (16,), {}),
        ((7, 11, 5), (3, 4, 5), {}),
        ((6, 5, 4, 9), (2, 5, 3, 4), {"shards": (4, 5, 3, 8), "chunks": (2, 5, 1, 4)}),
        ((17, 3), (17, 3), {"shards": True, "chunks": (4, 2)}),
    ],
    ids=["1d", "3d-edges", "4d-sharded", "shard-per-block"],
)
def test_round_trip_shapes(tmp_path, device, shape, blocks, kw):
    data = make_data("int16", shape, seed=3)
    path = str(tmp_path / "out.zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the 4-d case realigns blocks to shards
        gz.to_zarr_gpu(on_device(data, blocks), path, **kw)
    check_both(path, data)


def test_chunk_files_are_standard(tmp_path):
    """Each chunk file is exactly what numcodecs' zstd makes of the padded chunk's little-endian bytes."""
    data = make_data("float64", (5, 7), seed=4)
    path = str(tmp_path / "out.zarr")
    gz.to_zarr_gpu(da.from_array(data, chunks=(3, 4)), path, level=5)
    assert stored_files(path) == ["c/0/0", "c/0/1", "c/1/0", "c/1/1"]
    with open(os.path.join(path, "c", "1", "1"), "rb") as f:
        raw = numcodecs.Zstd().decode(f.read())
    edge = np.frombuffer(raw, dtype="<f8").reshape(3, 4)
    np.testing.assert_array_equal(edge[:2, :3], data[3:, 4:])
    assert (edge[2:] == 0).all() and (edge[:, 3:] == 0).all()  # padded with the fill value (0)
    assert zarr.open_array(path, mode="r").metadata.to_dict()["codecs"][1]["configuration"]["level"] == 5


def test_default_layout(tmp_path):
    """chunks=None: small blocks become chunks; big blocks split into ~4 MiB chunks; shards get ~1 MiB inner chunks."""
    small = da.zeros((40, 30), chunks=(10, 30), dtype="f4")
    a = gz.to_zarr_gpu(small, str(tmp_path / "s.zarr"), compute=False)
    assert zarr.open_array(str(tmp_path / "s.zarr"), mode="r").chunks == (10, 30)
    big = da.zeros((64, 256, 256), chunks=(32, 256, 256), dtype="f8")  # 16 MiB blocks: kept
    gz.to_zarr_gpu(big, str(tmp_path / "b.zarr"), compute=False)
    assert zarr.open_array(str(tmp_path / "b.zarr"), mode="r").chunks == (32, 256, 256)
    bigger = da.zeros((64, 256, 256), chunks=(64, 256, 256), dtype="f8")  # 32 MiB: split
    gz.to_zarr_gpu(bigger, str(tmp_path / "c.zarr"), compute=False)
    assert zarr.open_array(str(tmp_path / "c.zarr"), mode="r").chunks == (8, 256, 256)
    gz.to_zarr_gpu(bigger, str(tmp_path / "d.zarr"), shards=True, compute=False)
    arr = zarr.open_array(str(tmp_path / "d.zarr"), mode="r")
    assert arr.shards == (64, 256, 256) and arr.chunks == (2, 256, 256)
    del a


def test_misaligned_blocks_rechunk_with_warning(tmp_path, device):
    data = make_data("int32", (30, 20), seed=5)
    path = str(tmp_path / "out.zarr")
    with pytest.warns(UserWarning, match=r"not whole multiples.*\(8, 10\).*per block"):
        gz.to_zarr_gpu(on_device(data, (7, 10)), path, chunks=(4, 5))
    check_both(path, data)


# --------------------------------------------------------------------------- targets and modes


def test_component_into_group_and_group_target(tmp_path, device):
    data = make_data("float32", (8, 6), seed=6)
    root = str(tmp_path / "g.zarr")
    zarr.open_group(root, mode="w").attrs["title"] = "kept"
    gz.to_zarr_gpu(on_device(data, (4, 3)), root, "surface/t2m", attributes={"units": "K"})
    assert_same(read_zarr(root, "surface/t2m"), data)
    grp = zarr.open_group(root, mode="r")
    assert grp.attrs["title"] == "kept"
    assert grp["surface/t2m"].attrs["units"] == "K"
    group = zarr.open_group(root, mode="r+")
    gz.to_zarr_gpu(on_device(data * 2, (4, 3)), group, "other")
    assert_same(read_zarr(root, "other"), data * 2)
    assert_same(read_ts(os.path.join(root, "other")), data * 2)


def test_zarr_store_target(tmp_path):
    data = make_data("uint8", (9, 9), seed=7)
    store = zarr.storage.MemoryStore()
    gz.to_zarr_gpu(da.from_array(data, chunks=(3, 9)), store, "x", codec="gzip")
    assert_same(zarr.open_array(store, path="x", mode="r")[...], data)


def test_compute_false_writes_metadata_only_until_computed(tmp_path, device):
    data = make_data("float64", (12, 4), seed=8)
    path = str(tmp_path / "out.zarr")
    lazy = gz.to_zarr_gpu(on_device(data, (3, 4)), path, compute=False)
    assert isinstance(lazy, da.Array)
    assert os.path.exists(os.path.join(path, "zarr.json")) and stored_files(path) == []
    assert (read_zarr(path) == 0).all()
    stored = int(lazy.compute())
    assert stored == sum(os.path.getsize(os.path.join(path, f)) for f in stored_files(path))
    check_both(path, data)


def test_overwrite_rules(tmp_path):
    data = make_data("int16", (6, 6), seed=9)
    path = str(tmp_path / "out.zarr")
    gz.to_zarr_gpu(da.from_array(data, chunks=3), path)
    with pytest.raises(ArrayExistsError, match=r"out.zarr: a Zarr array exists there already.*overwrite=True"):
        gz.to_zarr_gpu(da.from_array(data + 1, chunks=3), path)
    assert_same(read_zarr(path), data)  # untouched
    gz.to_zarr_gpu(da.from_array(data[:4] + 1, chunks=2), path, overwrite=True, codec="gzip")
    assert_same(read_zarr(path), data[:4] + 1)
    assert stored_files(path) == sorted(f"c/{i}/{j}" for i in range(2) for j in range(3))  # old chunks gone
    zarr.open_group(str(tmp_path / "grp.zarr"), mode="w")
    with pytest.raises(ArrayExistsError, match="group exists"):
        gz.to_zarr_gpu(da.from_array(data, chunks=3), str(tmp_path / "grp.zarr"))
    with pytest.raises(ValueError, match="contradict"):
        gz.to_zarr_gpu(da.from_array(data, chunks=3), path, overwrite=True, resume=True)


def test_bad_arguments(tmp_path):
    x = da.zeros((4, 4), chunks=2)
    with pytest.raises(ValueError, match="codec must be one of"):
        gz.to_zarr_gpu(x, str(tmp_path / "a.zarr"), codec="brotli")
    with pytest.raises(ValueError, match="whole multiples of the chunks"):
        gz.to_zarr_gpu(x, str(tmp_path / "b.zarr"), chunks=(3, 3), shards=(4, 4))
    with pytest.raises(TypeError, match="numeric and bool"):
        gz.to_zarr_gpu(da.from_array(np.array(["a", "b"])), str(tmp_path / "c.zarr"))
    with pytest.raises(ValueError, match="3 entries"):
        gz.to_zarr_gpu(x, str(tmp_path / "d.zarr"), chunks=(2, 2, 2))


# --------------------------------------------------------------------------- fusion


def _n_tasks(arr) -> int:
    """Tasks after dask's optimisation, not counting aliases (a key that only renames another)."""
    from dask._task_spec import Alias

    (opt,) = dask.optimize(arr)
    return sum(not isinstance(t, Alias) for t in dict(opt.__dask_graph__()).values())


def test_read_compute_encode_write_fuse_into_one_task_per_block(tmp_path, monkeypatch):
    src = str(tmp_path / "src.zarr")
    data = make_data("float32", (40, 12), seed=10, specials=False)
    write_array(src, data, (5, 6))
    x = gz.from_zarr_gpu(src, chunks=(10, 12), device="cpu")
    m = float(data.mean())
    lazy = gz.to_zarr_gpu(x - m, str(tmp_path / "out.zarr"), chunks=(5, 6), compute=False)
    assert _n_tasks(lazy) == x.npartitions + 1  # one task per block, plus the total
    from gpuzarr_dist.codecs.encode import CpuBlockEncoder

    batches = []
    original = CpuBlockEncoder.launch

    def launch(self, sel, keys):
        rows = self.chunks[sel]
        batches.append((len(rows), max(c.nbytes for c in rows)))
        return original(self, sel, keys)

    monkeypatch.setattr(CpuBlockEncoder, "launch", launch)
    lazy.compute(scheduler="sync")
    assert batches == [(4, 5 * 6 * 4)] * x.npartitions  # each task: one batch of its 4 chunks
    assert_same(read_ts(str(tmp_path / "out.zarr")), data - np.float32(m))


# --------------------------------------------------------------------------- interruptions


def test_failed_put_leaves_no_file(tmp_path, monkeypatch):
    """An object whose write fails part-way leaves neither the object nor its temporary file."""
    data = make_data("int32", (4, 4), seed=11)
    path = str(tmp_path / "out.zarr")
    real_write = os.write

    def half_write(fd, buf):
        real_write(fd, bytes(buf)[: max(1, len(buf) // 2)])
        raise OSError(28, "No space left on device")

    def half_writev(fd, bufs, *offset):
        half_write(fd, b"".join(bytes(b) for b in bufs))

    monkeypatch.setattr(os, "write", half_write)
    monkeypatch.setattr(os, "writev", half_writev)  # the writer stores objects given as lists of buffers with writev
    with pytest.raises(ChunkWriteError, match=r"out.zarr.*'c/0/0'.*No space left"):
        gz.to_zarr_gpu(da.from_array(data, chunks=4), path)
    monkeypatch.undo()
    assert stored_files(path) == []
    assert (read_zarr(path) == 0).all()


KILLED_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import dask, dask.array as da, numpy as np
    import gpuzarr_dist as gz
    from gpuzarr_dist.array.write import BlockWriter

    path, die_after = sys.argv[1], int(sys.argv[2])
    data = np.arange(24 * 10, dtype="float64").reshape(24, 10) * 1.5
    done = []
    original = BlockWriter.write

    def write(self, block, start):
        if len(done) == die_after:
            os.kill(os.getpid(), 9)  # killed mid-run, like a node lost or a job out of time
        n = original(self, block, start)
        done.append(start)
        return n

    BlockWriter.write = write
    gz.to_zarr_gpu(da.from_array(data, chunks=(4, 10)), path, chunks=(2, 5), shards=SHARDS)
    """
)


@pytest.mark.parametrize("shards", [None, (4, 10)], ids=["chunks", "shards"])
def test_killed_write_then_resume(tmp_path, shards):
    path = str(tmp_path / "out.zarr")
    script = KILLED_SCRIPT.replace("SHARDS", repr(shards))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
               DASK_SCHEDULER="sync")
    r = subprocess.run([sys.executable, "-c", script, path, "3"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == -9, r.stderr
    expected = np.arange(24 * 10, dtype="float64").reshape(24, 10) * 1.5
    got = read_zarr(path)  # every object present decodes; absent ones read as the fill value
    present = ~np.all(got == 0, axis=1)
    assert present.sum() == 12, present  # three blocks of 4 rows each were written before the kill
    np.testing.assert_array_equal(got[present], expected[present])
    assert (got[~present] == 0).all()
    assert_same(read_ts(path)[present], expected[present])
    # a plain rerun refuses; resume completes it, rewriting only the missing blocks
    data = da.from_array(expected, chunks=(4, 10))
    with pytest.raises(ArrayExistsError, match="resume=True"):
        gz.to_zarr_gpu(data, path, chunks=(2, 5), shards=shards)
    from gpuzarr_dist.array.write import BlockWriter

    lazy = gz.to_zarr_gpu(data, path, chunks=(2, 5), shards=shards, resume=True, compute=False)
    assert _n_tasks(lazy) == 3 + 1  # 6 blocks, 3 already stored
    lazy.compute()
    check_both(path, expected)
    assert not [f for f in stored_files(path) if f.endswith(".tmp")]
    del BlockWriter


def test_resume_refuses_different_metadata(tmp_path):
    path = str(tmp_path / "out.zarr")
    x = da.zeros((8, 8), chunks=4, dtype="f4")
    gz.to_zarr_gpu(x, path, compute=False)
    with pytest.raises(MetadataError, match=r"resume=True.*codecs"):
        gz.to_zarr_gpu(x, path, codec="gzip", resume=True)
    with pytest.raises(MetadataError, match=r"resume=True.*data_type"):
        gz.to_zarr_gpu(x.astype("f8"), path, resume=True)
    # resume on a missing array just writes it
    gz.to_zarr_gpu(x + 1, str(tmp_path / "new.zarr"), resume=True)
    assert (read_zarr(str(tmp_path / "new.zarr")) == 1).all()


# --------------------------------------------------------------------------- object store


@pytest.fixture(scope="module")
def s3_endpoint():
    moto_server = pytest.importorskip("moto.server")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    url = f"http://127.0.0.1:{port}"
    import boto3

    boto3.client("s3", endpoint_url=url, aws_access_key_id="k", aws_secret_access_key="s",
                 region_name="us-east-1").create_bucket(Bucket="bucket")
    yield url
    server.stop()


def _s3_reference(endpoint: str, prefix: str) -> zarr.Array:
    """The array under ``s3://bucket/<prefix>`` as zarr-python reads it, over a client built here (not ours)."""
    from obstore.store import S3Store

    s3 = S3Store("bucket", prefix=prefix, config={"endpoint": endpoint, "access_key_id": "k",
                                                   "secret_access_key": "s", "region": "us-east-1"},
                 client_options={"allow_http": True})
    return zarr.open_array(store=zarr.storage.ObjectStore(s3, read_only=True), mode="r")


def test_s3_round_trip(s3_endpoint, device):
    """Written to a loopback S3 server (moto) with s3fs-style options, read back by zarr-python and by us."""
    opts = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"}}
    data = make_data("float32", (20, 9), seed=12)
    url = f"s3://bucket/{dev()}/out.zarr"
    gz.to_zarr_gpu(on_device(data, (10, 9)), url, chunks=(5, 9), shards=(10, 9), crc32c=True,
                   storage_options=opts, overwrite=True)
    assert_same(_s3_reference(s3_endpoint, f"{dev()}/out.zarr")[...], data)
    with pytest.raises(ArrayExistsError, match=r"s3://bucket/.*/out.zarr"):
        gz.to_zarr_gpu(on_device(data, (10, 9)), url, storage_options=opts)
    back = gz.from_zarr_gpu(url, device="cpu", storage_options=opts).compute()
    assert_same(back, data)


def test_s3_write_errors_hold_no_credentials(s3_endpoint):
    """A write into a bucket that does not exist fails, and neither key nor secret is in the error or its chain."""
    import traceback

    opts = {"key": "AKIDEXAMPLE7", "secret": "s3cr3t-value-99",
            "client_kwargs": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"}}
    with pytest.raises(Exception) as info:
        gz.to_zarr_gpu(da.zeros((10, 4), chunks=5), "s3://no-such-bucket/x.zarr", storage_options=opts)
    text = "".join(traceback.format_exception(info.value))
    assert "no-such-bucket" in text or "NoSuchBucket" in text
    assert "s3cr3t-value-99" not in text and "AKIDEXAMPLE7" not in text


# --------------------------------------------------------------------------- GPU only


@pytest.mark.gpu
@pytest.mark.parametrize("codec", ["zstd", "gzip", "none"])
def test_gpu_blocks_encode_on_the_device(tmp_path, monkeypatch, codec):
    """cupy blocks never take the CPU encoder (it is made to fail here), and the result reads back everywhere."""
    import cupy

    from gpuzarr_dist.codecs.pipeline import CodecPipeline

    def no_cpu(self, *args, **kwargs):
        raise AssertionError("encoded on the CPU")

    from gpuzarr_dist.codecs.encode import CpuBlockEncoder

    monkeypatch.setattr(CodecPipeline, "encode_batch", no_cpu)
    monkeypatch.setattr(CpuBlockEncoder, "launch", no_cpu)
    data = make_data("float32", (64, 70), seed=13)
    x = da.from_array(data, chunks=(32, 70)).map_blocks(cupy.asarray)
    path = str(tmp_path / "out.zarr")
    gz.to_zarr_gpu(x, path, codec=codec, chunks=(8, 35), crc32c=True)
    check_both(path, data)


@pytest.mark.gpu
def test_gpu_read_compute_write_fused(tmp_path):
    src = str(tmp_path / "src.zarr")
    data = make_data("float32", (40, 64), seed=14, specials=False)
    write_array(src, data, (5, 64))
    x = gz.from_zarr_gpu(src, chunks=(20, 64), device="gpu")
    lazy = gz.to_zarr_gpu(x * 2 - 1, str(tmp_path / "out.zarr"), shards=True, compute=False)
    assert _n_tasks(lazy) == x.npartitions + 1
    lazy.compute()
    check_both(str(tmp_path / "out.zarr"), data * 2 - 1)


# --------------------------------------------------------------------------- odd shapes, pickling


@pytest.mark.parametrize("shape,blocks", [((), ()), ((0, 4), (2, 2)), ((3, 0, 4), (2, 1, 2))], ids=["0-d", "empty", "empty-middle"])
def test_zero_d_and_empty_arrays(tmp_path, shape, blocks):
    data = np.full(shape, 3.5)
    path = str(tmp_path / "out.zarr")
    gz.to_zarr_gpu(da.from_array(data, chunks=blocks), path)
    check_both(path, data)


def test_graph_pickles_and_runs_in_another_process(tmp_path):
    """The write graph (BlockWriter, object writer) goes to worker processes by pickle."""
    import pickle
    from concurrent.futures import ProcessPoolExecutor

    data = make_data("int64", (12, 6), seed=15)
    path = str(tmp_path / "out.zarr")
    lazy = gz.to_zarr_gpu(da.from_array(data, chunks=(8, 6)), path, shards=(8, 6), chunks=(4, 3), compute=False)
    lazy = pickle.loads(pickle.dumps(lazy))
    import multiprocessing

    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        with dask.config.set(pool=pool, scheduler="processes"):
            lazy.compute()
    check_both(path, data)


def test_encode_failure_names_array_and_chunk(tmp_path, monkeypatch):
    from gpuzarr_dist.codecs.compressors import Zstd

    def broken(self, data):
        raise MemoryError("out of memory in the encoder")

    monkeypatch.setattr(Zstd, "encode", broken)
    path = str(tmp_path / "out.zarr")
    with pytest.raises(gz.ChunkEncodeError, match=r"out.zarr: chunk 'c/0/0' failed to encode with codec 'zstd'.*out of memory"):
        gz.to_zarr_gpu(da.zeros((4, 4), chunks=4), path)
