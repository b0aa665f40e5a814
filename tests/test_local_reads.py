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
