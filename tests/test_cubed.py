"""gpuzarr_dist.cubed on the CPU (numpy backend): spec, from_zarr_gpu, executors, memory, progress, backend.

Results are compared with zarr-python's read of the same store and numpy on it.
GPU runs happen in a fresh process (cubed's backend is fixed at its import),
through ``tests/helpers/cubed_gpu_check.py``.
"""

from __future__ import annotations

import io
import math
import os
import subprocess
import sys
import types

import numpy as np
import pytest

import gpuzarr_dist.cubed as gc

gc.use_backend("cpu")  # before cubed is imported here: the numpy backend
cubed = pytest.importorskip("cubed")
xp = pytest.importorskip("cubed.array_api")

from conftest import assert_same, make_data, reference, write_array  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    e.pop("CUBED_BACKEND_ARRAY_API_MODULE", None)
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=120)


@pytest.fixture
def series(tmp_path):
    """A float32 (time, y, x) store 20x the allowed_mem used with it; chunks of 8 time steps x 10 x 10 (3.2 kB)."""
    data = make_data("float32", (120, 40, 50), seed=7, specials=False)
    path = str(tmp_path / "series.zarr")
    write_array(path, data, (8, 10, 10))
    allowed = data.nbytes // 20  # 48 kB: read blocks of at most allowed // 8 = 6 kB, one chunk each
    return path, reference(path), allowed


class Events(cubed.Callback):
    def __init__(self):
        self.tasks = []
        self.ops = {}

    def on_compute_start(self, event):
        for name, d in event.dag.nodes(data=True):
            if d.get("pipeline") is not None and "primitive_op" in d:
                self.ops[name] = d["primitive_op"]

    def on_task_end(self, event):
        self.tasks.append(event)


# -- spec ---------------------------------------------------------------------------------


def test_spec_defaults_and_formula():
    s = gc.spec("80 MB", device="cpu")
    assert isinstance(s, cubed.Spec)
    assert s.allowed_mem == 80_000_000
    assert s.gpuzarr_read_block == 10_000_000
    assert s.reserved_mem == 10_000_000  # CPU: 1.0 x the read block (compressed bytes, ratio 1)
    assert isinstance(s.executor, gc.ThreadsExecutor)
    # the GPU formula, computed without a GPU: nvCOMP's zstd scratch (3.05 bytes per decoded byte of a call,
    # measured) for a call of half the block, for the largest read block whose projection, reserved + 4 x the
    # block, fits allowed_mem
    from gpuzarr_dist.cubed.memory import decode_limit, default_read_block

    rb = default_read_block(80_000_000, "gpu")
    assert rb == 14_479_638  # 80 MB / 5.525
    reserved = gc.default_reserved_mem(80_000_000, "gpu")
    assert reserved == math.ceil(1.525 * rb) + (2 << 20)
    # the GPU reads decode half a read block per nvCOMP call at most, whose scratch is what reserved_mem holds
    spec = types.SimpleNamespace(gpuzarr_read_block=rb, allowed_mem=80_000_000, reserved_mem=reserved)
    assert decode_limit(spec, "gpu") == math.ceil(rb / 2) and 3.05 * decode_limit(spec, "gpu") <= reserved
    assert decode_limit(spec, "cpu") is None
    plain = types.SimpleNamespace(allowed_mem=80_000_000, reserved_mem=20_000_000)  # a cubed.Spec of the user's
    assert decode_limit(plain, "gpu") == 7_500_000  # half of what cubed's projection leaves a block
    assert reserved + 4 * rb <= 80_000_000 + (2 << 20)  # the pool slack is the only overshoot, and the block
    assert default_read_block(80_000_000, "cpu") == 10_000_000  # shrinks by it (from_zarr_gpu's budget)


def test_spec_explicit_values_and_errors(tmp_path):
    s = gc.spec(10**6, str(tmp_path), device="cpu", reserved_mem="100 kB", read_block=50_000)
    assert (s.allowed_mem, s.reserved_mem, s.gpuzarr_read_block, s.work_dir) == (10**6, 100_000, 50_000, str(tmp_path))
    with pytest.raises(ValueError, match="reserved_mem"):
        gc.spec(1000, device="cpu", reserved_mem=1000)
    with pytest.raises(ValueError, match="allowed_mem"):
        gc.spec(0, device="cpu")


# -- from_zarr_gpu -------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", [3, 2])
def test_from_zarr_gpu_equals_zarr_python(tmp_path, fmt):
    data = make_data("int32", (37, 23), seed=3, specials=False)
    path = str(tmp_path / "a.zarr")
    write_array(path, data, (4, 5), which="some", fill_value=-7, zarr_format=fmt)
    ref = reference(path)
    s = gc.spec("2 MB", str(tmp_path / "work"), device="cpu")
    x = gc.from_zarr_gpu(path, spec=s)
    assert isinstance(x, cubed.Array)
    assert x.shape == ref.shape and x.dtype == ref.dtype
    # blocks are whole multiples of the Zarr chunks
    assert all(c % 4 == 0 for c in x.chunks[0][:-1]) and all(c % 5 == 0 for c in x.chunks[1][:-1])
    assert_same(np.asarray(x.compute()), ref)
    assert_same(np.asarray((x[3:30, 2:17] * 2).compute()), ref[3:30, 2:17] * 2)


def test_from_zarr_gpu_group_component(tmp_path):
    import zarr

    g = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    data = make_data("float64", (20, 9), seed=4, specials=False)
    write_array(g.store, data, (5, 9), name="t2m")
    s = gc.spec("1 MB", str(tmp_path / "work"), device="cpu")
    x = gc.from_zarr_gpu(str(tmp_path / "g.zarr"), "t2m", spec=s)
    assert_same(np.asarray(x.compute()), reference(str(tmp_path / "g.zarr"), "t2m"))


def test_chunk_bigger_than_budget_is_a_clear_error(tmp_path):
    data = make_data("float32", (8, 100, 100), seed=1, specials=False)
    path = str(tmp_path / "big.zarr")
    write_array(path, data, (1, 100, 100))  # 40 kB chunks
    s = gc.spec("100 kB", device="cpu")  # read blocks of 12.5 kB
    with pytest.raises(gc.MemoryBudgetError, match=r"big\.zarr.*chunk \(1, 100, 100\) is 40000 bytes") as e:
        gc.from_zarr_gpu(path, spec=s)
    assert "at least 320000 bytes" in str(e.value)
    gc.from_zarr_gpu(path, spec=gc.spec(320_000, device="cpu"))  # the size the message names is enough


# -- bounded-memory computations -------------------------------------------------------------


def _spec_for(allowed, tmp_path, **kw):
    return gc.spec(allowed, str(tmp_path / "work"), device="cpu", **kw)


def test_time_mean_and_anomaly_at_10x_allowed_mem(series, tmp_path, monkeypatch):
    from gpuzarr_dist.cubed import storage

    path, ref, allowed = series
    s = _spec_for(allowed, tmp_path)
    assert ref.nbytes >= 10 * s.allowed_mem
    reads = []
    original = storage.IntermediateArray.__getitem__
    monkeypatch.setattr(storage.IntermediateArray, "__getitem__",
                        lambda self, sel: reads.append(self.path) or original(self, sel))
    x = gc.from_zarr_gpu(path, spec=s)
    ev = Events()
    mean = np.asarray(xp.mean(x, axis=0).compute(callbacks=[ev]))
    np.testing.assert_allclose(mean, ref.astype("f8").mean(0), rtol=1e-5, atol=1e-6)
    anomaly = np.asarray((x - xp.mean(x, axis=0)).compute())
    np.testing.assert_allclose(anomaly, ref - ref.astype("f8").mean(0), rtol=1e-5, atol=1e-5)
    assert len(ev.tasks) > 10
    assert all(op.projected_mem <= s.allowed_mem for op in ev.ops.values())
    assert reads, "intermediates were not read back through gpuzarr-dist's read path"


# -- intermediates through our write path ----------------------------------------------------


def test_intermediates_written_by_our_encoder_and_read_by_zarr_python(series, tmp_path, monkeypatch):
    """Every plain intermediate block goes through BlockWriter; the files are Zarr that zarr-python reads back."""
    import zarr

    from gpuzarr_dist.array import write
    from gpuzarr_dist.cubed import storage

    path, ref, allowed = series
    s = _spec_for(allowed, tmp_path)
    written: dict[str, dict] = {}
    original = write.BlockWriter.write

    def spy(self, block, start):
        written.setdefault(self.spec.name, {})[start] = np.array(block, copy=True)
        return original(self, block, start)

    monkeypatch.setattr(write.BlockWriter, "write", spy)
    storage.reset_write_stats()
    x = gc.from_zarr_gpu(path, spec=s)
    out = str(tmp_path / "anomaly.zarr")
    cubed.to_zarr(x - xp.mean(x, axis=0), out)
    expected = ref - ref.astype("f8").mean(0)
    np.testing.assert_allclose(reference(out), expected, rtol=1e-5, atol=1e-5)
    stats = storage.write_stats()
    assert stats["blocks_encoded"] == sum(len(v) for v in written.values()) > 0
    assert stats["bytes_stored"] > 0
    assert stats["zarr_writes"] == 0, stats  # every plain-dtype write was ours (structured ones are not wrapped)
    # an intermediate (not the output): zarr-python reads exactly what the tasks wrote
    inter = [n for n in written if "anomaly.zarr" not in n]
    assert inter, list(written)
    for name in inter:
        local = name[len("file://"):] if name.startswith("file://") else name
        z = zarr.open_array(local, mode="r")
        assert [c.to_dict()["name"] for c in z.metadata.codecs] == ["bytes", "zstd"]
        got = z[...]
        for start, block in written[name].items():
            sel = tuple(slice(a, a + n) for a, n in zip(start, block.shape))
            np.testing.assert_array_equal(got[sel], block)
        covered = sum(b.size for b in written[name].values())
        assert covered == got.size, (name, covered, got.size)  # every element written by us
    assert "anomaly.zarr" in " ".join(written)  # cubed's to_zarr target too


def _intermediate(tmp_path, compressors, chunks=(4, 5), shape=(10, 12)):
    import zarr

    from gpuzarr_dist.cubed import storage

    z = zarr.create_array(str(tmp_path / "i.zarr"), shape=shape, chunks=chunks, dtype="f8",
                          compressors=compressors, fill_value=0)
    return storage.IntermediateArray(zarr.open_array(str(tmp_path / "i.zarr"), mode="r+"), "cpu"), z


@pytest.mark.parametrize("codec", ["zstd", "gzip+crc32c", "none"])
def test_intermediate_setitem_encodes_whole_chunk_blocks(tmp_path, codec):
    import zarr

    from gpuzarr_dist.cubed import storage

    comps = {"zstd": zarr.codecs.ZstdCodec(level=0), "none": None,
             "gzip+crc32c": [zarr.codecs.GzipCodec(level=5), zarr.codecs.Crc32cCodec()]}[codec]
    ia, _ = _intermediate(tmp_path, comps)
    data = make_data("float64", (10, 12), seed=5, specials=False)
    storage.reset_write_stats()
    ia[0:8, 0:10] = data[0:8, 0:10]  # 2 x 2 chunks in one batch
    ia[8:10, 10:12] = data[8:10, 10:12]  # the edge chunk (stored whole, padded)
    ia[0:8, 10:12] = data[0:8, 10:12]
    ia[8:10, 0:10] = data[8:10, 0:10]
    assert storage.write_stats() == {"blocks_encoded": 4, "bytes_stored": storage.write_stats()["bytes_stored"],
                                     "zarr_writes": 0}
    assert_same(reference(str(tmp_path / "i.zarr")), data)


def test_intermediate_setitem_falls_back_to_zarr(tmp_path):
    """Blosc (not encoded by us) and partial-chunk selections are written by zarr-python, correctly."""
    import zarr

    from gpuzarr_dist.cubed import storage

    data = make_data("float64", (10, 12), seed=6, specials=False)
    ia, _ = _intermediate(tmp_path, zarr.codecs.BloscCodec(cname="lz4"))
    storage.reset_write_stats()
    with pytest.warns(RuntimeWarning, match=r"written through zarr-python.*blosc"):
        ia[0:4, 0:5] = data[0:4, 0:5]
    ia[4:10, :] = data[4:10, :]
    ia[0:4, 5:12] = data[0:4, 5:12]
    assert storage.write_stats()["zarr_writes"] == 3 and storage.write_stats()["blocks_encoded"] == 0
    assert_same(reference(str(tmp_path / "i.zarr")), data)

    import shutil

    shutil.rmtree(tmp_path / "i.zarr")
    ia, _ = _intermediate(tmp_path, zarr.codecs.ZstdCodec(level=0))
    storage.reset_write_stats()
    ia[0:4, 0:5] = data[0:4, 0:5]  # whole chunk: ours
    ia[4:6, 0:5] = data[4:6, 0:5]  # part of a chunk: zarr reads, merges, writes
    ia[1:3, 7:9] = data[1:3, 7:9]  # unaligned start
    ia[6:8, 0:5] = 1.5  # broadcast value
    assert storage.write_stats()["blocks_encoded"] == 1 and storage.write_stats()["zarr_writes"] == 3
    expected = np.zeros((10, 12))
    expected[0:6, 0:5] = data[0:6, 0:5]
    expected[1:3, 7:9] = data[1:3, 7:9]
    expected[6:8, 0:5] = 1.5
    assert_same(reference(str(tmp_path / "i.zarr")), expected)


def test_intermediate_compressor_for_each_cubed_version():
    """cubed 0.27 takes a numcodecs config, 0.28 a Zarr v3 codec; both mean zstd, which zarr-python accepts."""
    import zarr

    from gpuzarr_dist.cubed.spec import ZSTD_V3, intermediate_compressor

    assert intermediate_compressor("0.27.0") == {"id": "zstd", "level": 0}
    assert intermediate_compressor("0.28.0") == ZSTD_V3
    assert intermediate_compressor("0.28.1.dev3+g1234") == ZSTD_V3
    assert intermediate_compressor("1.0.0") == ZSTD_V3
    assert intermediate_compressor("0.9.0") == {"id": "zstd", "level": 0}
    s = gc.spec("1 MB", device="cpu")
    assert s.zarr_compressor == intermediate_compressor(cubed.__version__)
    assert gc.spec("1 MB", device="cpu", zarr_compressor="auto").zarr_compressor == "auto"  # passed through
    # what cubed 0.28 hands to zarr.create_array(compressors=...): a zstd chain our write path encodes
    z = zarr.create_array(zarr.storage.MemoryStore(), shape=(4,), chunks=(2,), dtype="f4", compressors=ZSTD_V3)
    assert [c.to_dict() for c in z.metadata.codecs][1] == {"name": "zstd", "configuration": {"level": 0, "checksum": False}}
    import numcodecs

    assert numcodecs.get_codec({"id": "zstd", "level": 0}).codec_id == "zstd"  # what cubed 0.27 + zarr 2 would build


def test_measured_peak_per_task_within_allowed_mem(tmp_path):
    data = make_data("float32", (64, 100, 160), seed=9, specials=False)  # 4.1 MB
    path = str(tmp_path / "m.zarr")
    write_array(path, data, (4, 50, 40))  # 32 kB chunks; read blocks of 7 chunks (224 kB)
    allowed = 2_000_000
    assert data.nbytes >= 2 * allowed
    s = gc.spec(allowed, str(tmp_path / "work"), device="cpu",
                executor=gc.ThreadsExecutor(1, device="cpu", measure="tracemalloc"))
    x = gc.from_zarr_gpu(path, spec=s)
    ev = Events()
    out = np.asarray(xp.mean(x - 1.5, axis=0).compute(callbacks=[ev]))
    np.testing.assert_allclose(out, data.astype("f8").mean(0) - 1.5, rtol=1e-5, atol=1e-5)
    peaks = [(t.name, t.peak_measured_mem_end) for t in ev.tasks if t.name in ev.ops]
    assert peaks and all(p is not None for _, p in peaks)
    read_peak = max(p for _, p in peaks)
    assert read_peak >= 224_000, "the measurement sees no array data: it could not catch an overrun"
    over = [(n, p) for n, p in peaks if p > allowed]
    assert not over, over


def test_task_error_names_array_and_chunk(series, tmp_path):
    path, _, allowed = series
    with open(os.path.join(path, "c", "4", "0", "3"), "r+b") as f:
        f.seek(0)
        f.write(b"\x00" * 16)
    s = _spec_for(allowed, tmp_path)
    x = gc.from_zarr_gpu(path, spec=s)
    from gpuzarr_dist import ChunkDecodeError

    with pytest.raises(ChunkDecodeError, match=r"c/4/0/3") as e:
        xp.sum(x).compute()
    assert any(n.startswith("in cubed operation 'op-") and "task" in n for n in getattr(e.value, "__notes__", []))


# -- executors ------------------------------------------------------------------------------


def test_threads_executor_several_threads_and_progress(series, tmp_path):
    path, ref, allowed = series
    s = _spec_for(allowed, tmp_path, executor=gc.ThreadsExecutor(3, device="cpu"))
    x = gc.from_zarr_gpu(path, spec=s)
    buf = io.StringIO()
    bar = gc.TextProgress(file=buf, every=0)
    ev = Events()
    out = np.asarray(xp.max(x, axis=0).compute(callbacks=[bar, ev]))
    assert_same(out, ref.max(0))
    lines = buf.getvalue().splitlines()
    for name, op in ev.ops.items():
        assert f"  {name}: {op.num_tasks}/{op.num_tasks} tasks" in lines
    assert bar.events == len(ev.tasks) == sum(op.num_tasks for op in ev.ops.values())
    assert gc.progress_bar() is not None


def test_threads_executor_gpu_threads_follow_free_memory(monkeypatch):
    """On the GPU the default is as many threads per device as fit allowed_mem in 90% of its free memory, at most
    8; an explicit count that does not fit is refused."""
    import types

    from gpuzarr_dist.cuda import device as cd

    gib = 1 << 30
    free = {0: 139 * gib, 1: 3 * gib}
    monkeypatch.setattr(cd, "device_count", lambda: 2)
    monkeypatch.setattr(cd, "device_memory_info", lambda d: (free[d], 141 * gib))
    spec = types.SimpleNamespace(allowed_mem=gib)
    assert gc.ThreadsExecutor(device="gpu", devices=[0])._plan_threads("gpu", spec) == (8, [0])
    assert gc.ThreadsExecutor(device="gpu")._plan_threads("gpu", spec) == (4, [0, 1])  # 2 fit GPU 1: 2 per GPU
    with pytest.raises(ValueError, match="do not fit"):
        gc.ThreadsExecutor(6, device="gpu")._plan_threads("gpu", spec)


@pytest.mark.slow
def test_distributed_executor_on_a_process_cluster(series, tmp_path):
    distributed = pytest.importorskip("distributed")
    path, ref, allowed = series
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=40) as cluster, distributed.Client(cluster) as client:
        s = _spec_for(allowed, tmp_path, executor=gc.DistributedExecutor(client, device="cpu"))
        x = gc.from_zarr_gpu(path, spec=s)
        ev = Events()
        anomaly = np.asarray((x - xp.mean(x, axis=0)).compute(callbacks=[ev]))
        pids = set(client.run(os.getpid).values())
        ran = {t.result for t in ev.tasks}  # noqa: F841  (results are None for blockwise tasks)
        env = client.run(lambda: os.environ.get("CUBED_BACKEND_ARRAY_API_MODULE"))
        # a damaged chunk: the worker's error comes back naming the chunk, with the operation and task noted
        with open(os.path.join(path, "c", "4", "0", "3"), "r+b") as f:
            f.write(b"\x00" * 16)
        from gpuzarr_dist import ChunkDecodeError

        with pytest.raises(ChunkDecodeError, match=r"c/4/0/3") as e:
            xp.sum(gc.from_zarr_gpu(path, spec=s)).compute()
    assert any(n.startswith("in cubed operation 'op-") for n in getattr(e.value, "__notes__", []))
    np.testing.assert_allclose(anomaly, ref - ref.astype("f8").mean(0), rtol=1e-5, atol=1e-5)
    assert len(pids) == 2 and os.getpid() not in pids
    assert all(v is None for v in env.values())  # numpy backend on the CPU
    assert all(t.peak_measured_mem_end for t in ev.tasks if t.name in ev.ops)


def test_distributed_executor_without_client_says_so(series, tmp_path):
    distributed = pytest.importorskip("distributed")
    try:
        distributed.get_client()
        pytest.skip("a default dask client exists in this process")
    except ValueError:
        pass
    path, _, allowed = series
    s = _spec_for(allowed, tmp_path, executor=gc.DistributedExecutor(device="cpu"))
    x = gc.from_zarr_gpu(path, spec=s)
    with pytest.raises(ValueError, match="needs a dask client"):
        xp.sum(x).compute()


# -- backend ----------------------------------------------------------------------------------


def test_import_imports_neither_cubed_nor_cupy():
    """Not cubed (its backend is chosen later); cupy only as far as dask.array itself imports it.

    ``dask.array`` imports cupy at its own import where cupy is installed
    (``dask.array.chunk_types``), so on a GPU machine cupy is there either way.
    """
    r = _run("import sys, dask.array; print('cupy' in sys.modules)")
    assert r.returncode == 0, r.stderr
    dask_imports_cupy = r.stdout.split()[-1]
    r = _run("import sys, gpuzarr_dist.cubed; print('cubed' in sys.modules, 'cupy' in sys.modules)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", dask_imports_cupy]


def test_backend_set_before_cubed_import():
    r = _run("import os, gpuzarr_dist.cubed as gc; print(gc.use_backend('gpu')); "
             "print(os.environ['CUBED_BACKEND_ARRAY_API_MODULE'])")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["array_api_compat.cupy", "array_api_compat.cupy"]
    assert gc.worker_environ("gpu") == {"CUBED_BACKEND_ARRAY_API_MODULE": "array_api_compat.cupy"}
    assert gc.worker_environ("cpu") == {}


def test_too_late_backend_change_is_reported():
    r = _run("import cubed, gpuzarr_dist.cubed as gc; gc.use_backend('gpu')")
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert "CubedBackendError" in last and "already imported" in last and "numpy" in last
    assert "array_api_compat.cupy" in last and "before anything imports cubed" in last


# -- GPU (in a fresh process: cubed's backend is fixed at its import) ----------------------------


@pytest.mark.gpu
def test_gpu_check_script():
    r = subprocess.run([sys.executable, "-m", "tests.helpers.cubed_gpu_check"], cwd=ROOT,
                       capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
    print(r.stdout[-4000:], r.stderr[-4000:])
    assert r.returncode == 0


# -- CLI ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_bench_cubed_quick(tmp_path):
    from gpuzarr_dist.cli import main

    code = main(["bench", "cubed", "--quick", "--device", "cpu", "--threads", "2", "--out", str(tmp_path)])
    assert code == 0
    import json

    res = json.load(open(tmp_path / "bench-cubed.json"))
    assert res["nbytes"] >= 10 * res["allowed_mem"]
    kinds = {r["kind"]: r for r in res["rows"]}
    assert set(kinds) == {"ours-cubed", "ours-dask", "cubed-cpu"}
    for r in kinds.values():
        assert "error" not in r, r
        assert r["err_mean"] < 1e-3 and r["err_anomaly"] < 1e-3
    oc = kinds["ours-cubed"]
    assert oc["anomaly_one_chunk_s"] > 0 and oc["out_chunks"]  # gc.to_zarr and cubed.to_zarr, both checked
    assert all(r["threads"] == 2 for r in kinds.values())  # --threads sets every row
    cores = (os.cpu_count() or 1) * 1.05  # CPU seconds over wall: at most every core (timer slack)
    assert all(0 < r["mean_cores"] <= cores and 0 < r["anomaly_cores"] <= cores for r in kinds.values())


def test_cli_bench_cubed_repeats(tmp_path, capsys):
    """--repeats N: every row times its mean and its anomaly N times (best and median); each written anomaly
    is checked against numpy."""
    from gpuzarr_dist.bench.cubed import row_repeats
    from gpuzarr_dist.cli import main

    assert [row_repeats(k, None, False) for k in ("ours-cubed", "ours-dask", "cubed-cpu")] == [3, 3, 1]
    assert row_repeats("ours-dask", None, True) == 1 and row_repeats("cubed-cpu", 2, False) == 2
    code = main(["bench", "cubed", "--quick", "--device", "cpu", "--threads", "2", "--repeats", "2",
                 "--rows", "ours-cubed,ours-dask", "--out", str(tmp_path)])
    assert code == 0
    import json

    res = json.load(open(tmp_path / "bench-cubed.json"))
    for r in res["rows"]:
        assert "error" not in r, r
        for key in ("mean", "anomaly"):
            times = r[f"{key}_times"]
            assert len(times) == 2 and r[f"{key}_s"] == min(times)
            assert r[f"{key}_median_s"] == pytest.approx(sum(times) / 2)
        assert r["err_mean"] < 1e-3 and r["err_anomaly"] < 1e-3
    out = capsys.readouterr().out
    assert out.count("median of 2 runs") == 2 and "(medians: " in out


def test_bench_cubed_threads_per_row(monkeypatch):
    from gpuzarr_dist.bench import cubed as bc

    monkeypatch.setattr(bc.os, "cpu_count", lambda: 32)
    assert bc.row_threads(None, "gpu") == (8, 16)  # the executor's GPU default; the CPU anchor gets the cores
    assert bc.row_threads(None, "cpu") == (16, 16)
    assert bc.row_threads(4, "gpu") == (4, 4)
    monkeypatch.setattr(bc.os, "cpu_count", lambda: 2)
    assert bc.row_threads(None, "gpu") == (2, 2)


def test_bench_cubed_data_matches_numpy(tmp_path):
    """The generated array, read back by zarr-python, has the mean write_data returns, and no repeated steps."""
    import zarr

    from gpuzarr_dist.bench.cubed import write_data

    shape, chunks = (72, 10, 12), (8, 5, 6)
    mean = write_data(str(tmp_path), shape, chunks)
    x = np.asarray(zarr.open_array(str(tmp_path / "x.zarr"), mode="r")[:])
    assert x.shape == shape and x.dtype == np.float32
    np.testing.assert_allclose(mean, x.astype("f8").mean(axis=0), rtol=1e-12)
    flat = x.reshape(shape[0], -1)
    assert len({row.tobytes() for row in flat}) == shape[0]  # the noise pool is reused, the steps differ
    assert write_data(str(tmp_path), shape, chunks) is not None  # reused when complete


def test_cli_bench_cubed_rows():
    from gpuzarr_dist.bench.cubed import ROWS, selected_rows

    assert selected_rows(None) == list(ROWS)
    assert selected_rows("cubed-cpu, ours-cubed") == ["ours-cubed", "cubed-cpu"]  # in the table's order
    with pytest.raises(SystemExit, match="unknown row.*'gpu-cubed'.*choose from ours-cubed"):
        selected_rows("gpu-cubed")


def test_bench_cubed_refuses_a_disk_too_small(tmp_path):
    from gpuzarr_dist.bench.cubed import check_disk

    gib = 1 << 30
    check_disk(str(tmp_path), 2 * gib, have_data=False, free=5 * gib)  # 4.4 GiB needed
    with pytest.raises(SystemExit, match=r"needs about 4\.40 GiB free in .*the array and one anomaly.*--time-steps"):
        check_disk(str(tmp_path), 2 * gib, have_data=False, free=4 * gib)
    check_disk(str(tmp_path), 2 * gib, have_data=True, free=3 * gib)  # the array is there: one anomaly
    with pytest.raises(SystemExit, match=r"needs about 2\.20 GiB free in .*\(one anomaly at a time\)"):
        check_disk(str(tmp_path), 2 * gib, have_data=True, free=2 * gib)


def test_bench_cubed_timed_sections_start_after_the_page_cache_is_written_out(monkeypatch):
    """Each timed section begins with os.sync(), so no section pays for the writeback of the one before."""
    from gpuzarr_dist.bench import cubed as bc

    calls = []
    monkeypatch.setattr(bc.os, "sync", lambda: calls.append("sync"), raising=False)
    clock = bc._Clock()
    res: dict = {}
    clock.stop(res, "mean")
    assert calls == ["sync"] and res["mean_s"] >= 0


def test_bench_cubed_check_flags_nan_and_drops_the_output(tmp_path):
    """A NaN in a written anomaly is an infinite error, not a pass; each output is deleted once checked."""
    import zarr

    from gpuzarr_dist.bench import cubed as bc

    shape, chunks = (16, 6, 8), (8, 3, 4)
    mean = bc.write_data(str(tmp_path), shape, chunks)
    x = np.asarray(zarr.open_array(str(tmp_path / "x.zarr"), mode="r")[:])
    good = tmp_path / "good.zarr"
    zarr.create_array(str(good), shape=shape, chunks=chunks, dtype="f4")[:] = (x - mean).astype("f4")
    res: dict = {}
    bc._check_and_drop(str(tmp_path), str(good), mean, res)
    assert res["err_mean"] == 0.0 and res["err_anomaly"] < 1e-4 and not good.exists()
    bad = tmp_path / "bad.zarr"
    y = (x - mean).astype("f4")
    y[shape[0] // 2, 1, 2] = np.nan  # a step _check reads
    zarr.create_array(str(bad), shape=shape, chunks=chunks, dtype="f4")[:] = y
    bc._check_and_drop(str(tmp_path), str(bad), mean, res)
    assert res["err_anomaly"] == float("inf") and not bad.exists()
    # a whole tile of one step, away from the first, middle and last step, written as x (a mean of 0)
    wrong = tmp_path / "wrong.zarr"
    y = (x - mean).astype("f4")
    y[3, :3, 4:] = x[3, :3, 4:]
    zarr.create_array(str(wrong), shape=shape, chunks=chunks, dtype="f4")[:] = y
    res = {}
    bc._check_and_drop(str(tmp_path), str(wrong), mean, res)
    assert res["err_anomaly"] > 1.0 and not wrong.exists()


def test_bench_cubed_checks_every_block_of_the_benchmark_array():
    """The checked steps reach every block of 2400 steps cut into 4 to 300 blocks (blocks of 8 or more steps)."""
    from gpuzarr_dist.bench import cubed as bc

    steps = bc.checked_steps(2400)
    assert steps[0] == 0 and steps[-1] == 2399 and 1200 in steps
    for block in (600, 480, 448, 400, 120, 80):
        assert {t // block for t in steps} == set(range(-(-2400 // block)))


@pytest.mark.parametrize("n, fit", [(300, 67), (300, 56), (300, 300), (7, 3), (10, 1)])
def test_balanced_blocks_split_the_axis_evenly(n, fit):
    """``auto_block_shape(balance=True)``, the Cubed reader's blocks: as many blocks as the unbalanced shape needs,
    none above the target, and the smallest regular block size that needs no more (cubed's chunks are regular
    but for the last: 300 chunks that fit 67 give 5 blocks of 60, not 4 of 67 and one of 32)."""
    from types import SimpleNamespace

    from gpuzarr_dist.array.read import auto_block_shape

    spec = SimpleNamespace(read_unit=(8, 181, 360), shape=(8 * n, 181, 360), dtype=np.dtype("f4"))
    target = fit * 8 * 181 * 360 * 4
    plain, even = auto_block_shape(spec, target)[0] // 8, auto_block_shape(spec, target, balance=True)[0] // 8
    assert plain == min(n, fit)
    sizes = [min(even, n - i) for i in range(0, n, even)]  # chunks per block along the split axis
    assert len(sizes) == math.ceil(n / plain)  # no more tasks than before
    assert even == 1 or math.ceil(n / (even - 1)) > len(sizes)  # one chunk less per block would need more
    assert even <= fit and sum(sizes) == n
    if (n, fit) == (300, 67):
        assert sizes == [60] * 5


def test_from_zarr_gpu_reads_through_map_blocks_when_cubed_internals_differ(tmp_path, monkeypatch):
    """Another cubed's internals (``_as_source`` gives up): the map_blocks read operation, equal to zarr-python."""
    import gpuzarr_dist.cubed.reader as cr

    data = make_data("float32", (20, 12), seed=9, specials=False)
    path = str(tmp_path / "a.zarr")
    write_array(path, data, (4, 6))
    monkeypatch.setattr(cr, "_as_source", lambda *a, **k: None)
    s = gc.spec("2 MB", str(tmp_path / "work"), device="cpu")
    x = gc.from_zarr_gpu(path, spec=s, chunks=(8, 12))
    assert type(getattr(x, "_zarray", None)).__name__ != "SourceArray"
    np.testing.assert_array_equal(np.asarray(x.compute()), reference(path))
