"""The Cubed variant's anomaly plan (issue 7's throughput work), on the CPU (numpy backend).

- the source is a plan input (SourceArray), so ``x - mean(x)`` does not copy x into an intermediate;
- the mean's structured partials are read and written through our batched paths;
- ``optimize_dag`` computes a broadcast operand once instead of once per consumer task;
- ``OpTimings`` reports each operation's tasks and bytes.
Results are compared with numpy on zarr-python's read; memory with the tracemalloc measure.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import gpuzarr_dist.cubed as gc

gc.use_backend("cpu")  # before cubed is imported here: the numpy backend
cubed = pytest.importorskip("cubed")
xp = pytest.importorskip("cubed.array_api")

from conftest import make_data, reference, write_array  # noqa: E402


@pytest.fixture
def series(tmp_path):
    """float32 (96, 30, 40) (460 kB), chunks (4, 10, 10): 20x the allowed_mem used with it."""
    data = make_data("float32", (96, 30, 40), seed=11, specials=False)
    path = str(tmp_path / "s.zarr")
    write_array(path, data, (4, 10, 10))
    return path, reference(path), data.nbytes // 20


def _plan_ops(arr, optimize_function=None):
    from cubed.core.plan import arrays_to_plan

    dag = arrays_to_plan(arr)._finalize(optimize_function=optimize_function).dag
    return {n: d for n, d in dag.nodes(data=True) if d.get("primitive_op") is not None and n != "create-arrays"}


def _written_shapes(ops):
    return [tuple(p.array.shape) for d in ops.values() for p in d["pipeline"].config.writes_map.values()]


def test_source_is_not_copied_into_an_intermediate(series, tmp_path):
    path, ref, allowed = series
    s = gc.spec(allowed, str(tmp_path / "w"), device="cpu")
    x = gc.from_zarr_gpu(path, spec=s)
    from gpuzarr_dist.cubed.reader import SourceArray

    assert isinstance(x._zarray, SourceArray) and x.chunksize == x._zarray.chunks
    y = x - xp.mean(x, axis=0)
    ops = _plan_ops(y)
    # only the output has x's shape: no operation writes x whole to an intermediate (the old read op did)
    assert _written_shapes(ops).count(ref.shape) == 1, _written_shapes(ops)
    out = str(tmp_path / "a.zarr")
    cubed.to_zarr(y, out)
    np.testing.assert_allclose(reference(out), ref - ref.astype("f8").mean(0), rtol=1e-5, atol=1e-5)


def test_source_array_reads_like_zarr(series, tmp_path):
    path, ref, allowed = series
    x = gc.from_zarr_gpu(path, spec=gc.spec(allowed, str(tmp_path / "w"), device="cpu"))
    np.testing.assert_array_equal(np.asarray(x.compute()), ref)
    np.testing.assert_array_equal(np.asarray(x[5:70:3, 7, 3:33].compute()), ref[5:70:3, 7, 3:33])
    np.testing.assert_array_equal(np.asarray((x[2:90:5, 1:29, :] * 2).compute()), ref[2:90:5, 1:29, :] * 2)
    src = x._zarray
    assert src.nbytes == ref.nbytes and src.dtype == ref.dtype and src.shape == ref.shape
    assert src.nchunks == int(np.prod(x.numblocks))


def test_structured_partials_go_through_our_paths(series, tmp_path, monkeypatch):
    from gpuzarr_dist.cubed import storage

    path, ref, allowed = series
    s = gc.spec(allowed, str(tmp_path / "w"), device="cpu")
    reads, opens = [], []
    original_get = storage.IntermediateArray.__getitem__
    monkeypatch.setattr(storage.IntermediateArray, "__getitem__",
                        lambda self, sel: reads.append((self.path, self.dtype)) or original_get(self, sel))
    original_open = storage.IntermediateProxy.open

    def count_open(self):
        if self._opened is None:
            opens.append(self.array)
        return original_open(self)

    monkeypatch.setattr(storage.IntermediateProxy, "open", count_open)
    storage.reset_write_stats()
    x = gc.from_zarr_gpu(path, spec=s)
    ev = gc.OpTimings()
    mean = np.asarray(xp.mean(x, axis=0).compute(callbacks=[ev]))
    np.testing.assert_allclose(mean, ref.astype("f8").mean(0), rtol=1e-6, atol=1e-5)
    assert {np.dtype(d).kind for _, d in reads} >= {"i", "f"}, reads  # n (int64) and total (float64) fields
    stats = storage.write_stats()
    assert stats["zarr_writes"] == 0 and stats["blocks_encoded"] > 0, stats
    tasks = sum(r["tasks"] for r in ev.rows() if r["kind"] != "create-arrays")
    assert len(opens) < tasks, (len(opens), tasks)  # opened once per operation, not per block


def test_fan_out_consumers_and_optimize_dag(series, tmp_path):
    from gpuzarr_dist.cubed.fusion import fan_out_consumers

    path, ref, allowed = series
    s = gc.spec(allowed, str(tmp_path / "w"), device="cpu")
    x = gc.from_zarr_gpu(path, spec=s)
    y = x - xp.mean(x, axis=0)
    default, ours = _plan_ops(y), _plan_ops(y, gc.optimize_dag)
    assert len(ours) == len(default) + 1  # the mean is its own operation, written once
    mean_shape = ref.shape[1:]
    assert mean_shape not in _written_shapes(default) and mean_shape in _written_shapes(ours)
    assert all(d["primitive_op"].projected_mem <= s.allowed_mem for d in ours.values())
    from cubed.core.plan import arrays_to_plan

    assert fan_out_consumers(arrays_to_plan(y).dag)  # the subtract, whose mean input has fewer tasks
    # an elementwise chain has no fan-out: the same plan as cubed's
    z = (x * 2) + 1
    assert len(_plan_ops(z, gc.optimize_dag)) == len(_plan_ops(z)) == 1
    out = str(tmp_path / "a.zarr")
    cubed.to_zarr(y, out, optimize_function=gc.optimize_dag)
    np.testing.assert_allclose(reference(out), ref - ref.astype("f8").mean(0), rtol=1e-5, atol=1e-5)


def test_anomaly_peak_within_allowed_mem(tmp_path):
    data = make_data("float32", (64, 100, 160), seed=9, specials=False)  # 4.1 MB
    path = str(tmp_path / "m.zarr")
    write_array(path, data, (4, 50, 40))
    allowed = 2_000_000
    s = gc.spec(allowed, str(tmp_path / "work"), device="cpu",
                executor=gc.ThreadsExecutor(1, device="cpu", measure="tracemalloc"))
    x = gc.from_zarr_gpu(path, spec=s)
    for opt in (None, gc.optimize_dag):
        ev = gc.OpTimings()
        out = str(tmp_path / f"a-{opt is None}.zarr")
        cubed.to_zarr(x - xp.mean(x, axis=0), out, callbacks=[ev], optimize_function=opt)
        tol = 2 * np.finfo("f4").eps * float(np.abs(data).max())  # float32 rounding of x - mean
        np.testing.assert_allclose(reference(out), data - data.astype("f8").mean(0), rtol=0, atol=tol)
        rows = [r for r in ev.rows() if r["kind"] != "create-arrays"]
        biggest = max(r["peak"] for r in rows)
        assert biggest >= x.chunksize[0] * x.chunksize[1] * x.chunksize[2] * 4, "the measure sees no block"
        assert biggest <= allowed, rows
        assert all(r["projected_mem"] <= allowed for r in rows)


def test_op_timings_rows(series, tmp_path):
    from gpuzarr_dist.cubed.timing import format_rows

    path, ref, allowed = series
    s = gc.spec(allowed, str(tmp_path / "w"), device="cpu")
    x = gc.from_zarr_gpu(path, spec=s)
    ev = gc.OpTimings()
    cubed.to_zarr(x - xp.mean(x, axis=0), str(tmp_path / "a.zarr"), callbacks=[ev],
                  optimize_function=gc.optimize_dag)
    rows = ev.rows()
    assert rows and all(r["tasks_done"] == r["tasks"] for r in rows), rows
    assert all(r["wall_s"] >= 0 and r["task_s"] >= 0 for r in rows)
    # measured: x is read twice whole (mean, subtract) and the anomaly written once; the small mean in between
    first = next(r for r in rows if r["tasks"] and r["kind"] != "create-arrays")
    assert first["read_bytes"] == ref.nbytes  # the mean's partial sums read the source once
    subtract = max(rows, key=lambda r: r["write_bytes"])
    assert subtract["write_bytes"] == ref.nbytes and subtract["stored_bytes"] > 0  # float32, as stored
    # plus the mean's tile for each task (here a quarter of x's bytes): far from reading x twice
    assert ref.nbytes < subtract["read_bytes"] < 1.5 * ref.nbytes
    assert 2 * ref.nbytes < sum(r["read_bytes"] for r in rows) < 3 * ref.nbytes  # and the partial sums, in rounds
    # cubed's own lists of the operation's arrays count at least that (fused operations keep their predecessors')
    assert all(r["plan_read_bytes"] >= r["read_bytes"] for r in rows)
    # time in block reads and writes is part of the time in tasks (threads executor: same process)
    assert 0 < subtract["read_s"] and 0 < subtract["write_s"]
    assert subtract["read_s"] + subtract["write_s"] <= subtract["task_s"] * 1.05 + 0.01
    text = format_rows(rows)
    assert subtract["op"] in text and "tasks" in text


@pytest.mark.filterwarnings("ignore:.*structured.*:UserWarning", "ignore::zarr.errors.UnstableSpecificationWarning")
def test_proxy_leaves_unknown_structured_arrays_to_cubed(tmp_path):
    import zarr

    from gpuzarr_dist.cubed import storage

    class Proxy:  # a structured array opened as one zarr array (not a group of fields)
        def __init__(self, arr):
            self.array, self.chunks = arr, arr.chunks

        def open(self):
            return self.array

    z = zarr.create_array(str(tmp_path / "st.zarr"), shape=(4,), chunks=(2,), dtype=[("n", "i8"), ("t", "f8")],
                          fill_value=None)
    p = storage.IntermediateProxy(Proxy(z), "cpu")
    assert p.open() is z
    plain = zarr.create_array(str(tmp_path / "p.zarr"), shape=(4,), chunks=(2,), dtype="f4")
    plain[:] = np.arange(4, dtype="f4")
    q = storage.IntermediateProxy(Proxy(plain), "cpu")
    opened = q.open()
    assert isinstance(opened, storage.IntermediateArray) and q.open() is opened  # opened once
    np.testing.assert_array_equal(opened[1:3], np.array([1, 2], dtype="f4"))
    import cloudpickle

    assert cloudpickle.loads(cloudpickle.dumps(q))._opened is None  # reopened where it is unpickled


# -- gc.to_zarr: the output laid out for batched encodes --------------------------------------


def test_output_chunks_rule():
    from gpuzarr_dist.cubed.output import output_chunks

    assert output_chunks((72, 181, 360), 4, None, "t") == (12, 181, 360)  # 18.8 MB: ~4 MiB chunks dividing it
    assert output_chunks((8, 10, 10), 4, None, "t") == (8, 10, 10)  # small: the block is the chunk
    assert output_chunks((8, 10, 10), 4, (4, -1, 5), "t") == (4, 10, 5)
    with pytest.raises(ValueError, match=r"t: chunks \(3, 10, 10\) do not divide .* axis 0"):
        output_chunks((8, 10, 10), 4, (3, 10, 10), "t")


def test_to_zarr_writes_whole_chunk_batches_that_zarr_reads(series, tmp_path):
    import zarr

    from gpuzarr_dist.cubed import storage
    from gpuzarr_dist.errors import ArrayExistsError

    path, ref, allowed = series
    s = gc.spec(allowed, str(tmp_path / "work"), device="cpu")
    x = gc.from_zarr_gpu(path, spec=s)
    block = tuple(x.chunksize)
    chunks = tuple(max(1, b // 2) if b % 2 == 0 else b for b in block)
    assert chunks != block  # several chunks per task's block
    out = str(tmp_path / "anomaly.zarr")
    storage.reset_write_stats()
    z = gc.to_zarr(x - xp.mean(x, axis=0), out, chunks=chunks)
    assert tuple(z.chunks) == chunks
    stats = storage.write_stats()
    assert stats["zarr_writes"] == 0 and stats["blocks_encoded"] >= x.npartitions
    got = zarr.open_array(out, mode="r")[:]
    np.testing.assert_allclose(got, ref - ref.astype("f8").mean(0), rtol=1e-5, atol=1e-5)
    assert zarr.open_array(out, mode="r").metadata.codecs[-1].to_dict()["name"] == "zstd"
    with pytest.raises(ArrayExistsError, match="anomaly.zarr"):
        gc.to_zarr(x, out)
    z = gc.to_zarr(x, out, overwrite=True, codec="gzip", optimize_function=gc.optimize_dag)
    np.testing.assert_array_equal(zarr.open_array(out, mode="r")[:], ref)
    assert tuple(z.chunks) == block


def test_to_zarr_computes_a_broadcast_mean_once_by_default(series, tmp_path):
    """gc.to_zarr optimises with gc.optimize_dag unless told otherwise: the mean is written once and read per
    subtract task, where cubed's fusion recombines the mean's partial sums in every subtract task."""
    path, ref, allowed = series
    s = gc.spec(allowed, str(tmp_path / "work"), device="cpu")
    x = gc.from_zarr_gpu(path, spec=s)
    expect = ref - ref.astype("f8").mean(0)
    read = {}
    for name, kwargs in (("ours", {}), ("cubed", {"optimize_function": None})):
        ev = gc.OpTimings()
        out = str(tmp_path / f"{name}.zarr")
        gc.to_zarr(x - xp.mean(x, axis=0), out, callbacks=[ev], **kwargs)
        np.testing.assert_allclose(reference(out), expect, rtol=1e-5, atol=1e-5)
        read[name] = sum(r["read_bytes"] for r in ev.rows())
        if name == "ours":  # the mean (ref.shape[1:]) is an operation's output of its own
            assert any(r["tasks"] and r["write_bytes"] == math.prod(ref.shape[1:]) * 4 for r in ev.rows()), ev.rows()
    assert read["ours"] < read["cubed"], read


def test_to_zarr_refuses_chunks_across_blocks(series, tmp_path):
    path, _, allowed = series
    s = gc.spec(allowed, str(tmp_path / "work"), device="cpu")
    x = gc.from_zarr_gpu(path, spec=s)
    bad = (x.chunksize[0] + 1,) + tuple(x.chunksize[1:])
    with pytest.raises(ValueError, match="do not divide the array's blocks"):
        gc.to_zarr(x, str(tmp_path / "o.zarr"), chunks=bad)
