"""``gpuzarr.local-reads``: every way of reading local chunk files gives zarr-python's values."""

from __future__ import annotations

import dask
import pytest
from conftest import assert_same, compute_checked, make_data, reference, write_array

import gpuzarr_dist

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


def test_kvikio_files_are_opened_before_the_staging_call(tmp_path, monkeypatch):
    """The staging call may take the block's read turn (GPU path): every file is open before it, and read after it.

    A stand-in for kvikio (runs on the CPU) records the order of opens, the staging call and reads; the bytes
    must still be each file's, against the files on disk.
    """
    import numpy as np

    from gpuzarr_dist.cuda import files as cufiles
    from gpuzarr_dist.stores import local

    events: list[str] = []

    class Future:
        def __init__(self, n: int):
            self.n = n

        def get(self) -> int:
            return self.n

    class CuFile:
        def __init__(self, p: str, mode: str):
            events.append("open")
            self._f = open(p, "rb")

        def pread(self, buf, n: int, offset: int) -> Future:
            events.append("read")
            buf[:n] = np.frombuffer(self._f.read(n), dtype=np.uint8)
            return Future(n)

        def close(self) -> None:
            self._f.close()

    class FakeKvikio:
        pass

    FakeKvikio.CuFile = CuFile
    monkeypatch.setattr(cufiles, "cufile", lambda: FakeKvikio)
    path = str(tmp_path / "a.zarr")
    write_array(path, make_data("float64", (6, 6), seed=2), (2, 3), which="some")
    keys = [f"c/{i}/{j}" for i in range(3) for j in range(2)]

    def staging(n: int):
        events.append("staging")
        return np.zeros(n, dtype=np.uint8)

    with dask.config.set({"gpuzarr.local-reads": "kvikio"}):
        buf, offsets, sizes = local.LocalChunkStore(path).read_into(keys, staging, 256, 0)
    present = [k for k in keys if (tmp_path / "a.zarr" / k).exists()]
    assert events == ["open"] * len(present) + ["staging"] + ["read"] * len(present)
    for key, off, n in zip(keys, offsets, sizes):
        f = tmp_path / "a.zarr" / key
        assert n == (f.stat().st_size if f.exists() else -1)
        if n > 0:
            assert bytes(buf[off : off + n]) == f.read_bytes()
