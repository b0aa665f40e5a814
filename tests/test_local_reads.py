"""``gpuzarr.local-reads``: every way of reading local chunk files gives zarr-python's values."""

from __future__ import annotations

import dask
import pytest

import gpuzarr_dist
from conftest import assert_same, compute_checked, make_data, reference, write_array

pytestmark = pytest.mark.usefixtures("device")


@pytest.mark.parametrize("mode", ["auto", "kvikio", "threads", "inline"])
def test_modes_match_zarr_python(tmp_path, device, mode):
    path = str(tmp_path / "a.zarr")
    data = make_data("float32", (9, 10, 7), seed=3)
    write_array(path, data, (2, 4, 7), which="some", compressors=[{"name": "zstd", "configuration": {"level": 1}}])
    with dask.config.set({"gpuzarr.local-reads": mode}):
        got = compute_checked(gpuzarr_dist.from_zarr_gpu(path, device=device, chunks=(4, 8, 7)))
    assert_same(got, reference(path))


def _read_into(path: str, keys: list[str], mode: str):
    import numpy as np

    from gpuzarr_dist.stores.local import LocalChunkStore

    store = LocalChunkStore(path)
    with dask.config.set({"gpuzarr.local-reads": mode}):
        return store.read_into(keys, lambda n: np.zeros(n, dtype=np.uint8), 256, 0)


@pytest.mark.parametrize("mode", ["auto", "kvikio", "threads", "inline"])
def test_read_into_gives_the_file_bytes(tmp_path, mode):
    """The staging path the GPU reads through (runs on the CPU): each file's bytes at its slot, -1 if missing."""
    path = str(tmp_path / "a.zarr")
    write_array(path, make_data("float64", (6, 6), seed=1), (2, 3), which="some")
    keys = [f"c/{i}/{j}" for i in range(3) for j in range(2)]
    buf, offsets, sizes = _read_into(path, keys, mode)
    for key, off, n in zip(keys, offsets, sizes):
        f = tmp_path / "a.zarr" / key
        if not f.exists():
            assert n == -1
            continue
        assert off % 256 == 0
        assert bytes(buf[off : off + n]) == f.read_bytes()


def test_unknown_mode_is_a_clear_error(tmp_path):
    path = str(tmp_path / "a.zarr")
    write_array(path, make_data("int16", (4, 4)), (2, 2))
    with pytest.raises(ValueError, match="gpuzarr.local-reads must be one of"):
        _read_into(path, ["c/0/0"], "mmap")


class _FakeFuture:
    def __init__(self, got: int):
        self.got = got

    def get(self) -> int:
        return self.got


class _FakeKvikio:
    """kvikio's CuFile API over plain ``preadv`` (runs without a GPU); ``short`` keys read 1 byte short."""

    def __init__(self, short: set[str]):
        self.short = short
        outer = self

        class CuFile:
            def __init__(self, path: str, mode: str):
                import os

                self.fd = os.open(path, os.O_RDONLY)
                self.path = path

            def pread(self, buf, n, offset):
                import os

                want = n - 1 if any(self.path.endswith(k) for k in outer.short) else n
                return _FakeFuture(os.preadv(self.fd, [memoryview(buf)[:want]], offset))

            def close(self):
                import os

                os.close(self.fd)

        self.CuFile = CuFile


def _store_with_files(tmp_path):
    path = str(tmp_path / "a.zarr")
    write_array(path, make_data("float64", (12, 6), seed=5), (2, 3), which="some")
    keys = [f"c/{i}/{j}" for i in range(6) for j in range(2)]
    return path, keys


def _check_ready_calls(path, keys, mode, monkeypatch, short=()):
    """Read with a ``ready`` callback that checks, at each call, that every chunk below ``end`` has landed."""
    import os

    import numpy as np

    from gpuzarr_dist.stores import local
    from gpuzarr_dist.stores.local import LocalChunkStore

    if mode == "fake-kvikio":
        monkeypatch.setattr(local, "_kvikio_state", [_FakeKvikio(set(short))])
    files = {k: (open(os.path.join(path, *k.split("/")), "rb").read() if os.path.exists(os.path.join(path, *k.split("/"))) else None)
             for k in keys}
    state: dict = {}
    ends: list[int] = []

    def staging(n):
        state["buf"] = np.zeros(n, dtype=np.uint8)
        return state["buf"]

    def ready(end):
        ends.append(end)
        buf = state["buf"]
        for key, off, n in zip(keys, state["offsets"], state["sizes"]):
            if n > 0 and off + n <= end:
                assert bytes(buf[off : off + n]) == files[key], (key, end)

    from gpuzarr_dist.stores.base import staging_layout

    sizes = [-1 if files[k] is None else len(files[k]) for k in keys]
    state["offsets"], _ = staging_layout(sizes, 256, 0)
    state["sizes"] = sizes
    with dask.config.set({"gpuzarr.local-reads": "kvikio" if mode == "fake-kvikio" else mode}):
        buf, offsets, got_sizes = LocalChunkStore(path).read_into(keys, staging, 256, 0, ready=ready)
    assert offsets == state["offsets"] and got_sizes == sizes
    for key, off, n in zip(keys, offsets, sizes):
        if n > 0:
            assert bytes(buf[off : off + n]) == files[key], key
    assert ends == sorted(ends) and len(set(ends)) == len(ends)
    return ends, offsets, sizes


@pytest.mark.parametrize("mode", ["threads", "inline", "fake-kvikio"])
def test_ready_reports_only_landed_prefixes(tmp_path, monkeypatch, mode):
    """``read_into(ready=...)``: the GPU reader copies ``[0, end)`` up while the rest is read, so ``end`` may never
    pass a chunk that has not landed; by the last call every present chunk has."""
    path, keys = _store_with_files(tmp_path)
    ends, offsets, sizes = _check_ready_calls(path, keys, mode, monkeypatch)
    assert ends and ends[-1] == max(o + n for o, n in zip(offsets, sizes) if n > 0)


def test_ready_is_held_below_a_chunk_read_again(tmp_path, monkeypatch):
    """A short kvikio read is read again after the others; ``ready`` never reaches past it before then."""
    path, keys = _store_with_files(tmp_path)
    import os

    present = [k for k in keys if os.path.exists(os.path.join(path, *k.split("/")))]
    bad = present[len(present) // 2]
    ends, offsets, sizes = _check_ready_calls(path, keys, "fake-kvikio", monkeypatch, short={bad})
    held = offsets[keys.index(bad)]
    assert ends and all(e <= held for e in ends)


_CHAINS = {
    "zstd": dict(compressors=[{"name": "zstd", "configuration": {"level": 1}}]),
    "none": dict(compressors=None),
    "blosc": dict(zarr_format=2, compressors=None),  # numcodecs Blosc set below
}


@pytest.mark.parametrize("grain", ["off", "1", "1 KiB", "32 MiB"])
@pytest.mark.parametrize("chain", sorted(_CHAINS))
@pytest.mark.parametrize("mode", ["kvikio", "threads"])
def test_upload_grain_matches_zarr_python(tmp_path, device, grain, chain, mode):
    """``gpuzarr.gpu.upload-grain``: copying a block up in pieces while it is read gives zarr-python's values
    (every piece size down to one chunk per copy; missing chunks in between; the CPU device ignores it)."""
    import numcodecs

    path = str(tmp_path / "a.zarr")
    kwargs = dict(_CHAINS[chain])
    if chain == "blosc":
        kwargs["compressors"] = numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)
    data = make_data("float32", (24, 40, 30), seed=11)
    write_array(path, data, (2, 40, 30), which="some", **kwargs)
    with dask.config.set({"gpuzarr.gpu.upload-grain": grain, "gpuzarr.local-reads": mode}):
        got = compute_checked(gpuzarr_dist.from_zarr_gpu(path, device=device, chunks=(12, 40, 30)))
    assert_same(got, reference(path))


def test_upload_grain_setting_is_checked():
    from gpuzarr_dist.config import upload_grain

    with dask.config.set({"gpuzarr.gpu.upload-grain": "off"}):
        assert upload_grain() == 0
    with dask.config.set({"gpuzarr.gpu.upload-grain": "4 MiB"}):
        assert upload_grain() == 4 << 20
    with dask.config.set({"gpuzarr.gpu.upload-grain": -5}):
        with pytest.raises(ValueError, match="upload-grain"):
            upload_grain()
