"""Random windows (``WindowSampler`` / ``sample_windows``): every window equals zarr-python's and
tensorstore's read of the same box, for sharded and unsharded arrays, at array edges, with
missing chunks, and all windows of a batch come from one batched read."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
import zarr.codecs as zc
from conftest import dev, make_data, reference

import gpuzarr_dist as gz
from tests.helpers.shard_helpers import record_ranges

pytestmark = pytest.mark.usefixtures("device")


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _sharded(path, data, shards=(4, 24, 30), inner=(1, 8, 10), partial=False):
    a = zarr.create_array(path, shape=data.shape, dtype=data.dtype, chunks=shards, fill_value=-3, compressors=None,
                          serializer=zc.ShardingCodec(chunk_shape=inner, codecs=[zc.BytesCodec(), zc.ZstdCodec()]))
    if partial:
        a[0:5, 3:40, 7:50] = data[0:5, 3:40, 7:50]
    else:
        a[...] = data
    return reference(path)


@pytest.mark.parametrize("kind", ["sharded", "partial", "plain"])
def test_windows_equal_zarr_python(tmp_path, kind):
    data = make_data("float32", (9, 45, 62), seed=31)
    path = str(tmp_path / "w.zarr")
    if kind == "plain":
        zarr.create_array(path, data=data, chunks=(2, 10, 16))
        expected = reference(path)
    else:
        expected = _sharded(path, data, partial=kind == "partial")
    s = gz.WindowSampler(path, (4, 12, 13), device=dev())
    starts = np.concatenate([s.random_starts(40, rng=1), [[0, 0, 0], [5, 33, 49], [5, 0, 49], [3, 8, 10]]])
    got = s.sample(starts)
    assert got.shape == (len(starts), 4, 12, 13) and got.dtype == expected.dtype
    if dev() == "gpu":
        import cupy

        assert isinstance(got, cupy.ndarray)
    got = _host(got)
    z = zarr.open_array(path, mode="r")
    for w, (t, y, x) in zip(got, starts):
        np.testing.assert_array_equal(w, expected[t:t + 4, y:y + 12, x:x + 13])
        np.testing.assert_array_equal(w, z[t:t + 4, y:y + 12, x:x + 13])


def test_windows_equal_tensorstore(tmp_path):
    ts = pytest.importorskip("tensorstore")
    data = make_data("int16", (6, 40, 50), seed=32)
    path = str(tmp_path / "t.zarr")
    _sharded(path, data, shards=(3, 20, 25), inner=(1, 5, 5))
    t = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": path}}).result()
    starts = np.random.default_rng(2).integers(0, [3, 25, 40], size=(30, 3))
    got = _host(gz.sample_windows(path, starts, (4, 16, 11), device=dev()))
    for w, (a, b, c) in zip(got, starts):
        np.testing.assert_array_equal(w, t[a:a + 4, b:b + 16, c:c + 11].read().result())


def test_one_batched_read_per_batch(tmp_path, monkeypatch):
    data = make_data("int8", (8, 48, 60), seed=33)
    path = str(tmp_path / "b.zarr")
    _sharded(path, data)
    s = gz.WindowSampler(path, (2, 8, 10), device=dev())
    log = record_ranges(monkeypatch)
    starts = s.random_starts(64, rng=3)
    s.sample(starts)
    shards = {f"c/{a}/{b}/{c}" for a, b, c in zip(starts[:, 0] // 4, starts[:, 1] // 24, starts[:, 2] // 30)}
    index_keys = [r.key for r in log["index"]]
    assert len(index_keys) == len(set(index_keys)) >= len(shards)  # each shard's index read once for the batch


def test_bad_windows_are_refused(tmp_path):
    path = str(tmp_path / "p.zarr")
    zarr.create_array(path, data=np.zeros((4, 5)), chunks=(2, 2))
    with pytest.raises(ValueError, match="does not fit"):
        gz.WindowSampler(path, (5, 1), device=dev())
    s = gz.WindowSampler(path, (2, 2), device=dev())
    with pytest.raises(IndexError, match="outside"):
        s.sample([[3, 0]])
    assert _host(s.sample(np.zeros((0, 2), dtype=int))).shape == (0, 2, 2)


@pytest.mark.parametrize("case", ["none missing", "some missing", "all missing"])
@pytest.mark.parametrize("dtype, chunk, window", [("float32", (2, 5, 7), (3, 9, 4)), ("int16", (4, 3), (5, 8)),
                                                  ("uint8", (2, 2, 3, 4), (2, 3, 5, 4)), ("float64", (6,), (13,)),
                                                  ("bool", (3, 4), (3, 4)), ("complex64", (2, 3, 3), (1, 1, 1))])
def test_window_cut_matches_a_mosaic_of_the_chunks(case, dtype, chunk, window):
    """The cut (the device's kernel on the GPU, slice copies on the host) with no, some and only missing
    chunks, for several dtypes and dimensions, against the window cut from a mosaic of its chunk grid."""
    from gpuzarr_dist.array.windows import _cut_windows

    rng = np.random.default_rng(5)
    grid = tuple((w + c - 2) // c + 1 for w, c in zip(window, chunk))
    n, m = 12, (0 if case == "all missing" else 20)
    chunks = (rng.standard_normal((m, *chunk)) * 50).astype(dtype)
    idx = rng.integers(0, m + (case != "none missing"), size=(n, *grid))  # m: the fill chunk
    offsets = np.stack([rng.integers(0, c, size=n) for c in chunk], axis=1)
    fill = np.array(-9).astype(dtype)[()]  # 247 for uint8, True for bool
    if dev() == "gpu":
        import cupy

        got = _cut_windows(cupy.asarray(chunks), idx, offsets, window, fill)
        assert isinstance(got, cupy.ndarray)
    else:
        got = _cut_windows(chunks, idx, offsets, window, fill)
    got = _host(got)
    assert got.shape == (n, *window) and got.dtype == np.dtype(dtype)
    pool = np.concatenate([chunks, np.full((1, *chunk), fill, dtype=dtype)])
    nd = len(chunk)
    for w in range(n):  # tile the window's chunk grid, then cut
        tiles = pool[idx[w]]  # (*grid, *chunk)
        order = [a for d in range(nd) for a in (d, nd + d)]
        mosaic = tiles.transpose(order).reshape([g * c for g, c in zip(grid, chunk)])
        expected = mosaic[tuple(slice(o, o + s) for o, s in zip(offsets[w], window))]
        np.testing.assert_array_equal(got[w], expected)
    assert _host(_cut_windows(chunks[:0] if dev() == "cpu" else __import__("cupy").asarray(chunks[:0]),
                              idx[:0], offsets[:0], window, fill)).shape == (0, *window)


@pytest.mark.parametrize("in_flight", [1, 3])
def test_batches_equal_zarr_python_in_order(tmp_path, in_flight):
    """batches(): each batch equals zarr-python's windows, in the order asked, with calls overlapping."""
    data = make_data("float32", (9, 45, 62), seed=34)
    path = str(tmp_path / "w.zarr")
    _sharded(path, data)
    z = zarr.open_array(path, mode="r")
    s = gz.WindowSampler(path, (3, 10, 11), device=dev())
    asked = [s.random_starts(k, rng=k) for k in (5, 1, 8, 3, 6, 2, 7)]  # different sizes: the order shows
    got = list(s.batches(iter(asked), in_flight=in_flight))
    assert len(got) == len(asked)
    for starts, out in zip(asked, got):
        out = _host(out)
        assert out.shape == (len(starts), 3, 10, 11)
        for w, (t, y, x) in zip(out, starts):
            np.testing.assert_array_equal(w, z[t:t + 3, y:y + 10, x:x + 11])


def test_batches_raise_at_the_bad_batch_and_stop(tmp_path):
    """A bad batch raises where it would have been yielded; the earlier ones arrive, later ones are not read."""
    data = make_data("int16", (6, 40, 50), seed=35)
    path = str(tmp_path / "t.zarr")
    _sharded(path, data, shards=(3, 20, 25), inner=(1, 5, 5))
    z = zarr.open_array(path, mode="r")
    s = gz.WindowSampler(path, (2, 4, 4), device=dev())
    consumed = []

    def starts():
        for i in range(50):
            consumed.append(i)
            yield [[0, 0, 0]] if i != 2 else [[5, 0, 0]]  # batch 2's window runs past the time axis

    it = s.batches(starts(), in_flight=2)
    for _ in range(2):
        np.testing.assert_array_equal(_host(next(it))[0], z[0:2, 0:4, 0:4])
    with pytest.raises(IndexError, match="outside"):
        next(it)
    assert max(consumed) <= 2 + 2  # reads ran at most in_flight batches ahead of the failure
    with pytest.raises(StopIteration):
        next(it)
    with pytest.raises(ValueError, match="in_flight"):
        next(s.batches([[[0, 0, 0]]], in_flight=0))


def test_batches_closed_early_waits_for_running_calls(tmp_path):
    data = make_data("float32", (8, 48, 60), seed=36)
    path = str(tmp_path / "b.zarr")
    _sharded(path, data)
    s = gz.WindowSampler(path, (2, 8, 10), device=dev())
    it = s.batches((s.random_starts(16, rng=i) for i in range(1000)), in_flight=4)
    first = _host(next(it))
    it.close()  # the generator's cleanup: cancels what has not started, waits for what runs
    assert first.shape == (16, 2, 8, 10)
    np.testing.assert_array_equal(_host(s.sample([[0, 0, 0]]))[0], data[0:2, 0:8, 0:10])


def test_batches_keep_in_flight_calls_running(tmp_path, monkeypatch):
    """in_flight calls run at once, never more: the prefetch is real and bounded."""
    import threading
    import time

    data = make_data("float32", (8, 48, 60), seed=37)
    path = str(tmp_path / "c.zarr")
    _sharded(path, data)
    s = gz.WindowSampler(path, (2, 8, 10), device=dev())
    real, lock, inside, peak = s.sample, threading.Lock(), [0], [0]

    def slow_sample(starts):
        with lock:
            inside[0] += 1
            peak[0] = max(peak[0], inside[0])
        try:
            time.sleep(0.05)
            return real(starts)
        finally:
            with lock:
                inside[0] -= 1

    monkeypatch.setattr(s, "sample", slow_sample)
    out = list(s.batches((s.random_starts(4, rng=i) for i in range(12)), in_flight=3))
    assert len(out) == 12 and peak[0] == 3


def test_batches_reuse_the_samplers_threads_and_close_ends_them(tmp_path):
    """Later batches() reuse the sampler's threads (no new streams and codecs per epoch); close() ends them;
    a pickled sampler (a loader's worker process) reads the same windows."""
    import pickle
    import threading

    data = make_data("float32", (8, 48, 60), seed=38)
    path = str(tmp_path / "d.zarr")
    _sharded(path, data)
    z = zarr.open_array(path, mode="r")
    s = gz.WindowSampler(path, (2, 8, 10), device=dev())
    names = set()
    real = s.sample

    def record(starts):
        names.add(threading.current_thread().name)
        return real(starts)

    s.sample = record
    for epoch in range(3):
        list(s.batches((s.random_starts(4, rng=10 * epoch + i) for i in range(6)), in_flight=2))
    assert 1 <= len(names) <= 2 and all(n.startswith("gpuzarr-windows") for n in names)  # the same two threads
    s.close()
    del s.sample
    starts = s.random_starts(5, rng=1)
    again = pickle.loads(pickle.dumps(s))
    for got in (_host(again.sample(starts)), _host(next(again.batches([starts])))):
        for w, (t, y, x) in zip(got, starts):
            np.testing.assert_array_equal(w, z[t:t + 2, y:y + 8, x:x + 10])
    again.close()


def test_batches_of_one_sampler_side_by_side(tmp_path):
    """Two iterators of one sampler at once, the second asking more in flight: both finish, both right."""
    data = make_data("float32", (8, 48, 60), seed=39)
    path = str(tmp_path / "e.zarr")
    _sharded(path, data)
    z = zarr.open_array(path, mode="r")
    s = gz.WindowSampler(path, (2, 8, 10), device=dev())
    a_starts = [s.random_starts(3, rng=i) for i in range(6)]
    b_starts = [s.random_starts(3, rng=100 + i) for i in range(6)]
    a = s.batches(iter(a_starts), in_flight=1)
    first = next(a)  # a's pool is in use when b asks for a larger one
    b = list(s.batches(iter(b_starts), in_flight=3))
    rest = [first, *a]
    for asked, got in ((a_starts, rest), (b_starts, b)):
        assert len(got) == 6
        for starts, out in zip(asked, got):
            for w, (t, y, x) in zip(_host(out), starts):
                np.testing.assert_array_equal(w, z[t:t + 2, y:y + 8, x:x + 10])
    s.close()


def test_part_bounds_split_evenly_into_parts_of_at_least_the_setting():
    from gpuzarr_dist.array.windows import _part_bounds

    assert _part_bounds(0, 512) == [(0, 0)] and _part_bounds(1023, 512) == [(0, 1023)]
    assert _part_bounds(5000, 0) == [(0, 5000)]  # 0: one part
    for n, part in ((1024, 512), (3040, 512), (3041, 7), (100, 1)):
        bounds = _part_bounds(n, part)
        assert bounds[0][0] == 0 and bounds[-1][1] == n and len(bounds) == n // part
        assert all(a == b for (_, a), (b, _) in zip(bounds, bounds[1:]))  # contiguous
        sizes = [b - a for a, b in bounds]
        assert min(sizes) >= part and max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("damage", [False, True])
def test_a_large_call_reads_in_parts_on_several_threads(tmp_path, monkeypatch, damage):
    """On the GPU a call of many chunks reads and decodes them in parts on the sampler's part threads (through
    nvCOMP here): its windows equal zarr-python's; a damaged chunk in the last part is named, and the
    sampler reads again after it."""
    if dev() != "gpu":
        pytest.skip("parts are the GPU path's: the CPU path decodes a call's chunks on the decode threads")
    import threading

    import dask

    from gpuzarr_dist.cuda import windows as windows_gpu
    from gpuzarr_dist.errors import ChunkDecodeError

    data = make_data("float32", (8, 48, 60), seed=40)
    path = str(tmp_path / "p.zarr")
    _sharded(path, data)  # 288 inner chunks of (1, 8, 10) in shards of (4, 24, 30)
    z = zarr.open_array(path, mode="r")
    s = gz.WindowSampler(path, (3, 10, 11), device="gpu", index_cache=0)
    seen = []
    real = windows_gpu.decode_keys_gpu

    def record(reader, keys):
        seen.append((threading.current_thread().name, len(keys)))
        return real(reader, keys)

    monkeypatch.setattr(windows_gpu, "decode_keys_gpu", record)
    starts = np.concatenate([s.random_starts(60, rng=4), [[4, 24, 30], [0, 0, 0]]])
    settings = {"gpuzarr.windows.part-chunks": 20, "gpuzarr.gpu.min-batch": 0, "gpuzarr.gpu.min-batch-chunks": 1}
    with dask.config.set(settings):
        got = _host(s.sample(starts))
    assert len(seen) >= 3 and all(name.startswith("gpuzarr-windows-parts") and n >= 20 for name, n in seen)
    assert len({name for name, _ in seen}) > 1
    for w, (t, y, x) in zip(got, starts):
        np.testing.assert_array_equal(w, z[t:t + 3, y:y + 10, x:x + 11])
    if not damage:
        return
    shard = tmp_path / "p.zarr" / "c" / "1" / "1" / "1"  # the last shard: its chunks are in the last part
    raw = bytearray(shard.read_bytes())
    at = raw.index(b"\x28\xb5\x2f\xfd")  # the first inner chunk's zstd magic number
    raw[at : at + 4] = b"\0\0\0\0"
    shard.write_bytes(bytes(raw))
    with dask.config.set(settings), pytest.raises(ChunkDecodeError, match=r"p\.zarr: chunk 'c/1/1/1\[0,0,0\]'"):
        s.sample(starts)
    shard.write_bytes(bytes(raw[:at]) + b"\x28\xb5\x2f\xfd" + bytes(raw[at + 4:]))
    with dask.config.set(settings):
        again = _host(s.sample(starts))
    np.testing.assert_array_equal(again, got)
