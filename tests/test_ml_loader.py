"""The training loader (``gpuzarr_dist.ml.ZarrLoader``): windows on the stride grid inside the array, epochs
as permutations of (seed, epoch), rank shares as torch's DistributedSampler with drop_last, values equal to
zarr-python's slices stacked in variables order, sharded and unsharded arrays, local and object stores,
bounded prefetch; on the GPU, cupy and torch batches on the device, ready on the consumer's stream, no copy."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import zarr
import zarr.codecs as zc

from gpuzarr_dist.ml import ZarrLoader

VARS = ("t2m", "u10", "v10")
SHAPE = (11, 19, 26)


def _group(path, sharded=False, dtype="float32"):
    """A group of three (time, lat, lon) variables; returns {name: the values written}."""
    g = zarr.open_group(path, mode="w", zarr_format=3)
    out = {}
    for i, v in enumerate(VARS):
        x = np.random.default_rng(i).standard_normal(SHAPE).astype(dtype) + 10 * i
        kw = dict(shape=SHAPE, dtype=dtype, dimension_names=("time", "lat", "lon"), fill_value=0)
        if sharded:
            a = g.create_array(v, chunks=(4, 10, 13), compressors=None,
                               serializer=zc.ShardingCodec(chunk_shape=(2, 5, 13), codecs=[zc.BytesCodec(), zc.ZstdCodec()]), **kw)
        else:
            a = g.create_array(v, chunks=(3, 8, 9), **kw)
        a[...] = x
        out[v] = x
    return out


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ml") / "g.zarr")
    _group(path)
    return path


def _zarr_window(path, variables, start, window):
    """The reference: zarr-python's slices of every variable at ``start``, stacked in ``variables`` order."""
    sl = tuple(slice(s, s + w) for s, w in zip(start, window))
    return np.stack([zarr.open_array(path, path=v, mode="r")[sl] for v in variables])


def test_windows_on_the_stride_grid_inside_the_array(group):
    loader = ZarrLoader(group, variables=["t2m"], window={"time": 3, "lat": 7, "lon": 5}, stride={"lat": 4, "lon": 6},
                        batch_size=1, device="cpu", output="numpy", shuffle=False, drop_last=False)
    assert loader.window == (3, 7, 5) and loader.stride == (3, 4, 6)
    starts = loader.epoch_starts()
    # every grid point where the window fits, by brute force
    expected = {(t, y, x) for t in range(0, 11, 3) for y in range(0, 19, 4) for x in range(0, 26, 6)
                if t + 3 <= 11 and y + 7 <= 19 and x + 5 <= 26}
    assert {tuple(s) for s in starts.tolist()} == expected and len(starts) == len(expected) == loader.num_windows
    assert (starts + np.array(loader.window) <= np.array(SHAPE)).all()


def test_epoch_order_is_a_permutation_of_seed_and_epoch_only(group):
    def order(seed, epoch, **kw):
        loader = ZarrLoader(group, variables=["u10"], window={"lat": 4, "lon": 4}, batch_size=2, seed=seed,
                            device="cpu", output="numpy", **kw)
        loader.set_epoch(epoch)
        return loader.epoch_indices()

    a = order(3, 1)
    assert sorted(a.tolist()) == list(range(len(a)))  # a permutation of the whole grid (one rank)
    assert np.array_equal(a, order(3, 1, prefetch=0, stride=None))  # same (seed, epoch): same order
    assert not np.array_equal(a, order(3, 2)) and not np.array_equal(a, order(4, 1))
    b = ZarrLoader(group, variables=["u10", "t2m"], window={"lat": 4, "lon": 4}, batch_size=5, seed=3, device="cpu", output="numpy")
    b.set_epoch(1)
    assert np.array_equal(a, b.epoch_indices())  # batch size and variables do not change it
    unshuffled = ZarrLoader(group, variables=["u10"], window={"lat": 4, "lon": 4}, shuffle=False, device="cpu", output="numpy")
    assert np.array_equal(unshuffled.epoch_indices(), np.arange(unshuffled.num_windows))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ranks_disjoint_equal_covering(group, world):
    loaders = [ZarrLoader(group, variables=["v10"], window={"lat": 3, "lon": 3}, batch_size=4, seed=5, rank=r,
                          world_size=world, device="cpu", output="numpy") for r in range(world)]
    for ld in loaders:
        ld.set_epoch(7)
    shares = [ld.epoch_indices() for ld in loaders]
    n = loaders[0].num_windows
    assert len({len(s) for s in shares}) == 1 and len(shares[0]) == n // world  # equal, drop_last
    every = np.concatenate(shares)
    assert len(set(every.tolist())) == len(every)  # disjoint
    assert len(every) == n - n % world  # together they cover the epoch, less the remainder
    # the same split torch's DistributedSampler makes of the same order (drop_last=True)
    order = np.random.default_rng([5, 7]).permutation(n)[: n - n % world]
    for r, s in enumerate(shares):
        assert np.array_equal(s, order[r::world])
    for ld in loaders:
        assert len(ld) == (n // world) // 4 == sum(1 for _ in ld)


def test_ranks_padded_without_drop_last(group):
    loaders = [ZarrLoader(group, variables=["v10"], window={"lat": 3, "lon": 3}, batch_size=4, rank=r, world_size=4,
                          drop_last=False, device="cpu", output="numpy") for r in range(4)]
    n = loaders[0].num_windows
    shares = [ld.epoch_indices() for ld in loaders]
    assert {len(s) for s in shares} == {-(-n // 4)}
    assert set(np.concatenate(shares).tolist()) == set(range(n))
    sizes = [len(b) for b in loaders[0]]
    assert len(sizes) == len(loaders[0]) and sum(sizes) == len(shares[0])


def test_rank_defaults_and_bad_ranks(group, monkeypatch):
    import sys
    import types

    ld = ZarrLoader(group, variables=["t2m"], window={"lat": 3}, device="cpu", output="numpy")
    assert (ld.rank, ld.world_size) == (0, 1)
    # an initialised torch.distributed gives the defaults (a stand-in module: torch is optional)
    fake = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True, get_rank=lambda: 2,
                                 get_world_size=lambda: 3)
    monkeypatch.setitem(sys.modules, "torch.distributed", fake)
    ld = ZarrLoader(group, variables=["t2m"], window={"lat": 3}, device="cpu", output="numpy")
    assert (ld.rank, ld.world_size) == (2, 3)
    assert ZarrLoader(group, variables=["t2m"], window={"lat": 3}, rank=0, world_size=1, device="cpu",
                      output="numpy").world_size == 1  # given ones win
    fake.is_initialized = lambda: False
    assert ZarrLoader(group, variables=["t2m"], window={"lat": 3}, device="cpu", output="numpy").world_size == 1
    with pytest.raises(ValueError, match="rank"):
        ZarrLoader(group, variables=["t2m"], window={"lat": 3}, rank=2, world_size=2, device="cpu", output="numpy")


@pytest.mark.parametrize("sharded", [False, True])
def test_values_equal_zarr_python_in_variables_order(tmp_path, sharded):
    path = str(tmp_path / "g.zarr")
    _group(path, sharded=sharded)
    variables = ["v10", "t2m", "u10"]
    window = (2, 7, 6)
    loader = ZarrLoader(path, variables=variables, window={"time": 2, "lat": 7, "lon": 6}, stride={"lat": 3, "lon": 5},
                        batch_size=5, seed=1, device="cpu", output="numpy", prefetch=3)
    starts = loader.epoch_starts()
    seen = 0
    for i, batch in enumerate(loader):
        assert isinstance(batch, np.ndarray) and batch.shape == (5, 3, *window) and batch.dtype == np.float32
        for j, w in enumerate(batch):
            np.testing.assert_array_equal(w, _zarr_window(path, variables, starts[i * 5 + j], window))
        seen += len(batch)
    assert seen == len(loader) * 5 > 0


def test_bare_array_with_a_tuple_window(tmp_path):
    data = np.arange(7 * 30 * 20, dtype="int32").reshape(7, 30, 20)
    path = str(tmp_path / "a.zarr")
    zarr.create_array(path, data=data, chunks=(2, 9, 7))  # no dimension names
    loader = ZarrLoader(path, window=(3, 10, 10), stride=(1, 5, 5), batch_size=4, device="cpu", output="numpy")
    starts = loader.epoch_starts()
    z = zarr.open_array(path, mode="r")
    for i, batch in enumerate(loader):
        assert batch.shape == (4, 3, 10, 10)
        for j, w in enumerate(batch):
            t, y, x = starts[i * 4 + j]
            np.testing.assert_array_equal(w, z[t:t + 3, y:y + 10, x:x + 10])
    with pytest.raises(ValueError, match="no dimension names"):
        ZarrLoader(path, window={"time": 2}, device="cpu", output="numpy")


def test_bad_windows_are_named(group):
    with pytest.raises(ValueError, match="level"):
        ZarrLoader(group, variables=["t2m"], window={"level": 2}, device="cpu", output="numpy")
    with pytest.raises(ValueError, match="does not fit"):
        ZarrLoader(group, variables=["t2m"], window={"lat": 40}, device="cpu", output="numpy")
    with pytest.raises(ValueError, match="group"):
        ZarrLoader(group, window=(1, 1, 1), device="cpu", output="numpy")
    with pytest.raises(ValueError, match="output"):
        ZarrLoader(group, variables=["t2m"], window={"lat": 2}, device="cpu", output="jax")


def test_variables_of_other_shapes_are_refused(tmp_path):
    path = str(tmp_path / "g.zarr")
    g = zarr.open_group(path, mode="w", zarr_format=3)
    g.create_array("a", shape=(4, 5), dtype="f4", dimension_names=("y", "x"))
    g.create_array("b", shape=(4, 6), dtype="f4", dimension_names=("y", "x"))
    with pytest.raises(ValueError, match="b"):
        ZarrLoader(path, variables=["a", "b"], window={"y": 2}, device="cpu", output="numpy")


def test_prefetch_is_bounded(group):
    prefetch = 2
    loader = ZarrLoader(group, variables=list(VARS), window={"lat": 3, "lon": 3}, batch_size=2, device="cpu",
                        output="numpy", prefetch=prefetch)
    lock = threading.Lock()
    state = {"started": 0, "yielded": 0, "most": 0, "running": 0, "most_running": 0}
    read = loader._read

    def counted(starts, dev):
        with lock:
            state["started"] += 1
            state["running"] += 1
            state["most"] = max(state["most"], state["started"] - state["yielded"])
            state["most_running"] = max(state["most_running"], state["running"])
        try:
            return read(starts, dev)
        finally:
            with lock:
                state["running"] -= 1

    loader._read = counted
    for _ in loader:
        with lock:
            state["yielded"] += 1
        threading.Event().wait(0.002)  # the "training step": reads run ahead meanwhile
    assert state["yielded"] == len(loader) > 2 * prefetch
    assert state["most"] <= prefetch + 1  # read ahead + the batch the caller holds
    assert state["most_running"] <= prefetch
    # an early break leaves no read running
    it = iter(loader)
    next(it)
    it.close()
    assert state["running"] == 0


@pytest.mark.parametrize("drop_last", [True, False])
def test_batches_read_in_groups_equal_zarr_python_and_bound_the_reads_ahead(group, monkeypatch, drop_last):
    """Batches read together (as on the GPU, here forced on the CPU path) come out one by one, in order, equal to
    zarr-python's windows, the last group and (without drop_last) the last batch short; prefetch is rounded up
    to whole groups, and no more groups are read ahead than that."""
    monkeypatch.setattr(ZarrLoader, "_read_batches", lambda self: 3)
    variables = ["u10", "t2m"]
    window = (2, 6, 7)
    loader = ZarrLoader(group, variables=variables, window={"time": 2, "lat": 6, "lon": 7}, stride={"lat": 2, "lon": 3},
                        batch_size=4, seed=5, device="cpu", output="numpy", prefetch=4, drop_last=drop_last)
    assert loader.read_batches == 3 and loader.reads_ahead == 2
    assert len(loader) % 3 != 0  # a short last group
    lock = threading.Lock()
    state = {"started": 0, "done": 0, "yielded": 0, "most_ahead": 0, "sizes": []}
    read = loader._read

    def counted(groups, dev):
        with lock:
            state["started"] += 1
            state["sizes"].append(len(groups))
            # groups started beyond the one being yielded
            state["most_ahead"] = max(state["most_ahead"], state["started"] - 1 - state["yielded"] // 3)
        return read(groups, dev)

    loader._read = counted
    starts = loader.epoch_starts()
    seen = 0
    for i, batch in enumerate(loader):
        with lock:
            state["yielded"] += 1
        assert batch.shape[1:] == (2, *window)
        for j, w in enumerate(batch):
            np.testing.assert_array_equal(w, _zarr_window(group, variables, starts[i * 4 + j], window))
        seen += len(batch)
        threading.Event().wait(0.002)
    assert state["yielded"] == len(loader)
    assert seen == (len(starts) if not drop_last else len(loader) * 4)
    assert state["sizes"] == [3] * (len(loader) // 3) + [len(loader) % 3]
    assert state["most_ahead"] <= loader.reads_ahead
    with pytest.MonkeyPatch.context() as m:  # the same batches read one at a time
        m.setattr(ZarrLoader, "_read_batches", lambda self: 1)
        single = ZarrLoader(group, variables=variables, window={"time": 2, "lat": 6, "lon": 7},
                            stride={"lat": 2, "lon": 3}, batch_size=4, seed=5, device="cpu", output="numpy",
                            prefetch=4, drop_last=drop_last)
        assert single.reads_ahead == 4
        for a, b in zip(loader, single, strict=True):
            np.testing.assert_array_equal(a, b)


def test_grouped_reads_keep_two_reads_ahead_however_small_prefetch(group, monkeypatch):
    """Reading in groups, a prefetch under one group still reads two groups ahead (one's file reads overlap
    the other's decode); batch by batch (the CPU), prefetch is the number of batches ahead."""
    from gpuzarr_dist.ml.loader import MIN_READS_AHEAD

    kw = dict(variables=["t2m"], window={"time": 2, "lat": 6, "lon": 7}, batch_size=4, device="cpu", output="numpy")
    assert MIN_READS_AHEAD == 2
    assert ZarrLoader(group, prefetch=1, **kw).reads_ahead == 1
    monkeypatch.setattr(ZarrLoader, "_read_batches", lambda self: 3)
    assert [ZarrLoader(group, prefetch=p, **kw).reads_ahead for p in (1, 3, 6, 7)] == [2, 2, 2, 3]
    loader = ZarrLoader(group, prefetch=1, **kw)
    starts = loader.epoch_starts()
    got = np.concatenate(list(loader))
    assert len(got) == len(loader) * 4
    for w, s in zip(got, starts):
        np.testing.assert_array_equal(w[0], _zarr_window(group, ["t2m"], s, (2, 6, 7))[0])


def test_read_batches_follow_the_read_size_on_the_gpu_only(group):
    import dask

    kw = dict(variables=["t2m"], window={"time": 2, "lat": 6, "lon": 7}, batch_size=4, output="numpy")
    per_batch = 4 * 2 * 6 * 7 * 4
    assert ZarrLoader(group, device="cpu", **kw).read_batches == 1
    with dask.config.set({"gpuzarr.loader.read-size": 3 * per_batch - 1}):
        loader = ZarrLoader(group, device="cpu", **kw)
        loader.device = "gpu"  # the size rule alone, without a device
        assert loader._read_batches() == 3
    with dask.config.set({"gpuzarr.loader.read-size": 0}):
        loader.device = "gpu"
        assert loader._read_batches() == 1
    loader.prefetch = 0
    assert loader._read_batches() == 1  # read when asked: one batch


def test_an_error_in_a_read_is_raised_where_its_batch_would_be(tmp_path):
    import os
    import shutil

    path = str(tmp_path / "g.zarr")
    _group(path)
    loader = ZarrLoader(path, variables=["u10"], window={"lat": 4}, batch_size=2, shuffle=False, device="cpu", output="numpy")
    chunk = os.path.join(path, "u10", "c", "0", "0", "0")
    with open(chunk, "wb") as f:
        f.write(b"not zstd")
    with pytest.raises(Exception, match="u10"):
        for _ in loader:
            pass
    shutil.rmtree(path)


def test_numpy_and_torch_outputs_on_the_cpu(group):
    ld = ZarrLoader(group, variables=["t2m", "u10"], window={"time": 1, "lat": 5, "lon": 5}, batch_size=3, device="cpu",
                    output="numpy")
    first = next(iter(ld))
    torch = pytest.importorskip("torch")
    tl = ZarrLoader(group, variables=["t2m", "u10"], window={"time": 1, "lat": 5, "lon": 5}, batch_size=3, device="cpu",
                    output="torch")
    t = next(iter(tl))
    assert isinstance(t, torch.Tensor) and t.device.type == "cpu"
    np.testing.assert_array_equal(t.numpy(), first)


def test_object_store(tmp_path):
    pytest.importorskip("moto.server")
    pytest.importorskip("boto3")
    from tests.helpers.servers import TEST_KEY, TEST_SECRET, moto_s3_server, upload_tree

    root = tmp_path / "tree"
    path = str(root / "g.zarr")
    _group(path, sharded=True)
    with moto_s3_server() as endpoint:
        upload_tree(endpoint, "train", str(root), "data")
        opts = {"endpoint_url": endpoint, "key": TEST_KEY, "secret": TEST_SECRET, "region": "us-east-1"}
        loader = ZarrLoader("s3://train/data/g.zarr", variables=["u10", "t2m"], window={"time": 2, "lat": 6, "lon": 6},
                            batch_size=4, storage_options=opts, device="cpu", output="numpy")
        assert loader.dims == ("time", "lat", "lon")
        starts = loader.epoch_starts()
        batches = list(loader)
    assert len(batches) == len(loader) > 0
    for i, batch in enumerate(batches):
        for j, w in enumerate(batch):
            np.testing.assert_array_equal(w, _zarr_window(path, ["u10", "t2m"], starts[i * 4 + j], (2, 6, 6)))


def _timed_samplers(loader, variables, delay, record):
    """Wrap each sampler's ``sample`` to wait ``delay`` seconds and record (variable, batch key, thread, start, end)."""
    lock = threading.Lock()
    for v, s in zip(variables, loader.samplers):
        def timed(starts, v=v, orig=s.sample):
            t0 = time.perf_counter()
            threading.Event().wait(delay)
            out = orig(starts)
            t1 = time.perf_counter()
            with lock:
                record.append((v, np.asarray(starts).tobytes(), threading.current_thread().name, t0, t1))
            return out

        s.sample = timed


@pytest.mark.parametrize("prefetch", [0, 2])
def test_variables_of_a_batch_are_read_at_the_same_time(tmp_path, prefetch):
    path = str(tmp_path / "g.zarr")
    _group(path)
    variables = ["u10", "v10", "t2m"]
    window = (3, 9, 13)
    loader = ZarrLoader(path, variables=variables, window={"time": 3, "lat": 9, "lon": 13}, batch_size=3, seed=4,
                        device="cpu", output="numpy", prefetch=prefetch)
    for rnd in range(2):  # the second after close(): the loader makes its threads again
        record = []
        _timed_samplers(loader, variables, 0.1, record)
        starts = loader.epoch_starts()
        n = 0
        for i, batch in enumerate(loader):
            assert batch.shape == (3, 3, *window)
            for j, w in enumerate(batch):
                np.testing.assert_array_equal(w, _zarr_window(path, variables, starts[i * 3 + j], window))
            calls = [r for r in record if r[1] == starts[i * 3 : i * 3 + 3].tobytes()]
            assert sorted(r[0] for r in calls) == sorted(variables)  # each variable read once for this batch
            threads = {r[2] for r in calls}
            assert len(threads) == 3 and all(t.startswith("gpuzarr-loader-parts") for t in threads)
            assert max(r[3] for r in calls) < min(r[4] for r in calls)  # all three were running at one moment
            n += 1
        assert n == len(loader) == 4
        loader.close()
        assert loader._part_pool is None and loader._pool is None
        for s in loader.samplers:
            del s.sample  # the samplers' own method again


@pytest.mark.parametrize("prefetch", [0, 2])
def test_an_error_in_one_variable_is_raised_at_its_batch_after_the_other_parts_end(tmp_path, prefetch):
    path = str(tmp_path / "g.zarr")
    _group(path)
    variables = ["u10", "v10", "t2m"]
    window = (2, 5, 6)
    loader = ZarrLoader(path, variables=variables, window={"time": 2, "lat": 5, "lon": 6}, batch_size=2, shuffle=False,
                        device="cpu", output="numpy", prefetch=prefetch)
    starts = loader.epoch_starts()
    k = 3
    bad = starts[k * 2 : k * 2 + 2]
    lock = threading.Lock()
    state = {"running": 0}
    last_started = threading.Event()  # the third variable's part of batch k is running

    for i, s in enumerate(loader.samplers):
        def part(st, i=i, orig=s.sample):
            with lock:
                state["running"] += 1
            try:
                ours = np.array_equal(st, bad)
                if i == 2 and ours:
                    last_started.set()
                if i == 1 and ours:
                    assert last_started.wait(5)
                    raise OSError("v10: a damaged chunk")  # while the third variable's part still runs
                threading.Event().wait(0.6 if i == 2 and ours else 0.05)  # batch k's part outlasts the batches after
                return orig(st)
            finally:
                with lock:
                    state["running"] -= 1

        s.sample = part
    got = []
    with pytest.raises(OSError, match="v10: a damaged chunk"):
        for batch in loader:
            got.append(batch)
    with lock:
        assert state["running"] == 0  # no part of batch k (or of any batch) left running behind the error
    assert len(got) == k  # raised where batch k would have been yielded
    for i, batch in enumerate(got):
        for j, w in enumerate(batch):
            np.testing.assert_array_equal(w, _zarr_window(path, variables, starts[i * 2 + j], window))
    loader.close()


def test_parts_held_for_their_copies_are_bounded_and_freed_once_copied(group):
    """The GPU path's bookkeeping, with stand-in events: parts are kept until their copy's event is done, and
    beyond ``prefetch + 2`` batches the oldest copies are waited for."""
    import weakref

    class Event:
        def __init__(self):
            self.done, self.waited = False, False

        def synchronize(self):
            self.waited = self.done = True

    class Part:  # stands for a device array: weakly referable, so its freeing can be seen
        pass

    loader = ZarrLoader(group, variables=["t2m", "u10"], window={"lat": 3}, device="cpu", output="numpy", prefetch=1)
    events, refs = [], []
    for _ in range(3):  # up to prefetch + 2 held: nothing waited for
        ev, part = Event(), Part()
        events.append(ev)
        refs.append(weakref.ref(part))
        loader._hold_until_copied(ev, [part])
        del part
    assert all(r() is not None for r in refs) and not any(e.waited for e in events)
    events[1].done = True  # its copy ran: freed at the next batch
    ev, part = Event(), Part()
    events.append(ev)
    refs.append(weakref.ref(part))
    loader._hold_until_copied(ev, [part])
    del part
    assert refs[1]() is None and [r() is not None for r in refs] == [True, False, True, True]
    assert not any(e.waited for e in events)
    ev, part = Event(), Part()  # four copies pending: the oldest is waited for
    events.append(ev)
    refs.append(weakref.ref(part))
    loader._hold_until_copied(ev, [part])
    del part
    assert events[0].waited and refs[0]() is None and not any(e.waited for e in events[2:])
    assert [r() is not None for r in refs] == [False, False, True, True, True]
    loader.close()  # waits for the rest and frees them
    assert all(e.waited for e in events[2:]) and all(r() is None for r in refs) and not loader._held


# --------------------------------------------------------------------------- GPU


def _gpu_loader(path, output, **kw):
    return ZarrLoader(path, variables=["v10", "t2m"], window={"time": 2, "lat": 6, "lon": 7}, batch_size=4, seed=2,
                      device="gpu", output=output, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("sharded", [False, True])
def test_gpu_cupy_batches_equal_zarr_python_and_are_ready_on_the_current_stream(tmp_path, sharded):
    import cupy

    path = str(tmp_path / "g.zarr")
    _group(path, sharded=sharded)
    loader = _gpu_loader(path, "cupy", prefetch=3)
    starts = loader.epoch_starts()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        for i, batch in enumerate(loader):
            assert isinstance(batch, cupy.ndarray) and batch.device.id == cupy.cuda.Device().id
            # read on the consumer's stream with no host synchronisation: ordered behind the batch's writes
            host = cupy.asnumpy(batch * 1, stream=stream)
            stream.synchronize()
            for j, w in enumerate(host):
                np.testing.assert_array_equal(w, _zarr_window(path, ["v10", "t2m"], starts[i * 4 + j], (2, 6, 7)))
    loader.close()


@pytest.mark.gpu
def test_gpu_batch_outlives_the_stream_it_was_handed_to(group):
    """A caller that drops its stream before the batch it took on it: the loader keeps the stream until the batch
    is dropped (its release is recorded there), then lets it go; later batches, in reused memory, stay right."""
    import gc
    import weakref

    import cupy

    loader = _gpu_loader(group, "cupy", prefetch=2)
    starts = loader.epoch_starts()
    batches = iter(loader)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        batch = next(batches)
    stream_ref = weakref.ref(stream)
    del stream
    gc.collect()
    assert stream_ref() is not None  # held for the batch's release
    cupy.cuda.Device().synchronize()
    host = cupy.asnumpy(batch)
    for j, w in enumerate(host):
        np.testing.assert_array_equal(w, _zarr_window(group, ["v10", "t2m"], starts[j], (2, 6, 7)))
    del batch
    gc.collect()
    assert stream_ref() is None  # released with the batch
    rest = [cupy.asnumpy(b) for b in batches]  # on the null stream, which waits for the batches' writes
    assert len(rest) == len(loader) - 1
    for i, b in enumerate(rest, start=1):
        for j, w in enumerate(b):
            np.testing.assert_array_equal(w, _zarr_window(group, ["v10", "t2m"], starts[i * 4 + j], (2, 6, 7)))
    loader.close()


@pytest.mark.gpu
def test_gpu_batch_memory_reused_only_after_the_consumer_is_done(group):
    """A slow consumer kernel still reads batch k when the loader writes later batches: values stay right."""
    import cupy
    import dask

    with dask.config.set({"gpuzarr.loader.read-size": 2 * 4 * 2 * 6 * 7 * 4}):  # two batches of 4 per read
        loader = _gpu_loader(group, "cupy", prefetch=2)
    assert loader.read_batches == 2 and loader.reads_ahead == 2  # prefetch 2 is one read: two are the least
    starts = loader.epoch_starts()
    stream = cupy.cuda.Stream(non_blocking=True)
    sums = []
    with stream:
        busy = cupy.ones((2048, 2048), dtype=cupy.float32)
        for batch in loader:
            for _ in range(10):  # slow work queued ahead of the batch's read: it runs after the host dropped the batch
                busy = (busy @ busy) * (1.0 / 2048)
            sums.append(batch.astype(cupy.float64).sum(axis=(1, 2, 3, 4)))
            del batch
        got = cupy.asnumpy(cupy.concatenate(sums), stream=stream)
        stream.synchronize()
    expected = [_zarr_window(group, ["v10", "t2m"], s, (2, 6, 7)).astype(np.float64).sum() for s in starts[: len(got)]]
    np.testing.assert_allclose(got, expected, rtol=1e-10)
    assert len(got) == 4 * len(loader) and len(loader) > (loader.reads_ahead + 1) * loader.read_batches + 2
    # bounded by the batches in flight: the groups read ahead, the group being yielded, the caller's, one pending
    assert max(s.count for s in loader._slots.values()) <= (loader.reads_ahead + 1) * loader.read_batches + 2


@pytest.mark.gpu
def test_gpu_torch_batches_without_a_copy_on_torchs_stream(group):
    torch = pytest.importorskip("torch")

    loader = _gpu_loader(group, "torch")
    starts = loader.epoch_starts()
    stream = torch.cuda.Stream()
    seen_ptrs = []
    orig = loader._deliver

    def deliver(got):
        out = orig(got)
        seen_ptrs.append((got[0].data.ptr, out.data_ptr()))
        return out

    loader._deliver = deliver
    with torch.cuda.stream(stream):
        for i, t in enumerate(loader):
            assert isinstance(t, torch.Tensor) and t.device == torch.device("cuda", torch.cuda.current_device())
            assert t.shape == (4, 2, 2, 6, 7) and t.dtype == torch.float32
            host = (t * 1).cpu()  # on torch's current stream, which the loader made wait for the batch
            for j, w in enumerate(host.numpy()):
                np.testing.assert_array_equal(w, _zarr_window(group, ["v10", "t2m"], starts[i * 4 + j], (2, 6, 7)))
    assert seen_ptrs and all(a == b for a, b in seen_ptrs)  # the tensor is the cupy array's memory: no copy


@pytest.mark.gpu
@pytest.mark.parametrize("variables", [["t2m"], ["v10", "t2m"]])
def test_gpu_prefetch_0_keeps_the_callers_current_stream(group, variables):
    """Read on the caller's thread (prefetch=0), a batch leaves CuPy's current stream the caller's, and is ready
    on it."""
    import cupy

    loader = ZarrLoader(group, variables=variables, window={"time": 2, "lat": 6, "lon": 7}, batch_size=4, seed=2,
                        device="gpu", output="cupy", prefetch=0)
    starts = loader.epoch_starts()
    stream = cupy.cuda.Stream(non_blocking=True)
    n = 0
    with stream:
        for i, batch in enumerate(loader):
            assert cupy.cuda.get_current_stream().ptr == stream.ptr
            host = cupy.asnumpy(batch * 1, stream=stream)  # on the caller's stream, without a host wait
            stream.synchronize()
            for j, w in enumerate(host):
                np.testing.assert_array_equal(w, _zarr_window(group, variables, starts[i * 4 + j], (2, 6, 7)))
            n += 1
    assert n == len(loader) > 0
    loader.close()


@pytest.mark.gpu
def test_gpu_numpy_output_and_cpu_device_cupy_output(group):
    import cupy

    a = list(_gpu_loader(group, "numpy"))
    b = list(ZarrLoader(group, variables=["v10", "t2m"], window={"time": 2, "lat": 6, "lon": 7}, batch_size=4, seed=2,
                        device="cpu", output="cupy"))
    assert all(isinstance(x, np.ndarray) for x in a) and all(isinstance(x, cupy.ndarray) for x in b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, cupy.asnumpy(y))


@pytest.mark.gpu
def test_gpu_bare_array_cupy(tmp_path):
    import cupy

    data = np.arange(6 * 30 * 20, dtype="int16").reshape(6, 30, 20)
    path = str(tmp_path / "a.zarr")
    zarr.create_array(path, data=data, chunks=(2, 9, 7))
    loader = ZarrLoader(path, window=(2, 10, 10), stride=(1, 4, 4), batch_size=3, device="gpu", output="cupy")
    starts = loader.epoch_starts()
    z = zarr.open_array(path, mode="r")
    for i, batch in enumerate(loader):
        assert isinstance(batch, cupy.ndarray) and batch.shape == (3, 2, 10, 10) and batch.dtype == np.int16
        host = cupy.asnumpy(batch)  # on CuPy's current stream, which waited for the batch
        for j, w in enumerate(host):
            t, y, x = starts[i * 3 + j]
            np.testing.assert_array_equal(w, z[t:t + 2, y:y + 10, x:x + 10])
    loader.close()


@pytest.mark.gpu
@pytest.mark.parametrize("prefetch", [2, 0])
def test_gpu_three_variables_read_at_the_same_time_equal_zarr_python(tmp_path, prefetch):
    import cupy

    path = str(tmp_path / "g.zarr")
    _group(path, sharded=True)
    variables = ["u10", "t2m", "v10"]
    loader = ZarrLoader(path, variables=variables, window={"time": 2, "lat": 6, "lon": 7}, batch_size=4, seed=3,
                        device="gpu", output="cupy", prefetch=prefetch)
    threads = set()
    lock = threading.Lock()
    for s in loader.samplers:
        def named(starts, orig=s.sample):
            with lock:
                threads.add(threading.current_thread().name)
            return orig(starts)

        s.sample = named
    starts = loader.epoch_starts()
    n = 0
    for i, batch in enumerate(loader):
        assert isinstance(batch, cupy.ndarray) and batch.device.id == cupy.cuda.Device().id
        assert batch.shape == (4, 3, 2, 6, 7) and batch.dtype == np.float32
        # copied down on the stream the batch was handed to (this thread's current one), then waited for
        consumer = cupy.cuda.get_current_stream()
        host = cupy.asnumpy(batch, stream=consumer)
        consumer.synchronize()
        for j, w in enumerate(host):
            np.testing.assert_array_equal(w, _zarr_window(path, variables, starts[i * 4 + j], (2, 6, 7)))
        n += 1
    assert n == len(loader) > 0
    assert len(threads) > 1 and all(t.startswith("gpuzarr-loader-parts") for t in threads)  # not the caller's thread
    loader.close()
    assert not loader._held  # the parts held for their copies are freed by close()


@pytest.mark.parametrize("drop_last", [True, False])
def test_shares_equal_torch_distributed_sampler(group, drop_last):
    """Unshuffled, each rank's share is the one torch's DistributedSampler gives (the reference)."""
    torch_data = pytest.importorskip("torch.utils.data")
    for world in (2, 3, 5):
        for rank in range(world):
            ld = ZarrLoader(group, variables=["t2m"], window={"lat": 3, "lon": 3}, shuffle=False, drop_last=drop_last,
                            rank=rank, world_size=world, device="cpu", output="numpy")
            ref = torch_data.DistributedSampler(range(ld.num_windows), num_replicas=world, rank=rank, shuffle=False,
                                                drop_last=drop_last)
            assert ld.epoch_indices().tolist() == list(ref)
