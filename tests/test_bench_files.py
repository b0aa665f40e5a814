"""``data_folder``, the folder a benchmark writes its data in: a given path is made and kept with what it holds;
without one, a temporary folder that is removed when the block ends, also when it raises; and the benchmark
commands that use it leave no temporary data behind when they fail."""

from __future__ import annotations

import os
import tempfile
from types import SimpleNamespace

import pytest

from gpuzarr_dist.bench.files import data_folder


class Boom(Exception):
    pass


def test_given_path_is_made_and_kept(tmp_path):
    where = tmp_path / "new" / "dir"
    with data_folder(str(where), "gpuzarr-test-") as root:
        assert root == str(where) and where.is_dir()
        (where / "data.bin").write_bytes(b"abc")
    assert (where / "data.bin").read_bytes() == b"abc"
    # the next run finds what the last one wrote
    with data_folder(str(where), "gpuzarr-test-") as root:
        assert os.listdir(root) == ["data.bin"]
    assert (where / "data.bin").read_bytes() == b"abc"


def test_given_path_is_kept_when_the_block_raises(tmp_path):
    where = tmp_path / "keep"
    with pytest.raises(Boom), data_folder(str(where), "gpuzarr-test-") as root:
        (where / "data.bin").write_bytes(b"abc")
        raise Boom(root)
    assert (where / "data.bin").read_bytes() == b"abc"


@pytest.fixture
def tmpdir_base(tmp_path, monkeypatch):
    """The system's temporary directory, pointed at an empty folder of this test's own."""
    base = tmp_path / "systmp"
    base.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    return base


def test_temporary_folder_is_removed_after_the_block(tmpdir_base):
    with data_folder(None, "gpuzarr-test-") as root:
        assert os.path.isdir(root)
        assert os.path.dirname(root) == str(tmpdir_base)
        assert os.path.basename(root).startswith("gpuzarr-test-")
        os.makedirs(os.path.join(root, "a.zarr", "c"))
        with open(os.path.join(root, "a.zarr", "c", "0"), "wb") as f:
            f.write(b"x" * 1000)
    assert not os.path.exists(root)
    assert os.listdir(tmpdir_base) == []


def test_temporary_folder_is_removed_when_the_block_raises(tmpdir_base):
    seen = []
    with pytest.raises(Boom, match="the run failed") as error, data_folder(None, "gpuzarr-test-") as root:
        seen.append(root)
        with open(os.path.join(root, "data.bin"), "wb") as f:
            f.write(b"abc")
        raise Boom("the run failed")
    assert seen and not os.path.exists(seen[0])
    assert os.listdir(tmpdir_base) == [] and error.value is not None


def test_each_temporary_folder_is_new():
    with data_folder(None, "gpuzarr-test-") as a, data_folder(None, "gpuzarr-test-") as b:
        assert a != b and os.listdir(a) == [] and os.listdir(b) == []
    assert not os.path.exists(a) and not os.path.exists(b)


# the benchmark commands: the first call on the data folder fails; (module, name) of that call,
# the prefix of the command's temporary folder, and whether --path names the store rather than the folder
FAILING = {
    "climate": ("gpuzarr_dist.synthetic", "_existing_dataset", "gpuzarr-climate-", False),
    "read": ("gpuzarr_dist.synthetic", "make_era5_like", "gpuzarr-bench-", True),
    "remote": ("gpuzarr_dist.bench.remote", "write_variants", "gpuzarr-bench-remote-", False),
    "scale": ("gpuzarr_dist.synthetic", "make_era5_like", "gpuzarr-scale-", False),
    "shards": ("gpuzarr_dist.bench.shards", "write_variants", "gpuzarr-bench-shards-", False),
    "train": ("gpuzarr_dist.bench.train", "make_group", "gpuzarr-train-", False),
}


def _failing_run(name, monkeypatch, tmp_path, path):
    """Run ``bench <name>`` on the CPU with its first call on the data folder replaced by one file written and an
    error; return the folder or store that call got, and the error caught (kept alive: it holds the run's frames)."""
    import importlib

    module, attr, _, _ = FAILING[name]
    written = []

    def fail(where, *args, **kwargs):
        os.makedirs(where, exist_ok=True)
        with open(os.path.join(where, "data.bin"), "wb") as f:
            f.write(b"abc")
        written.append(where)
        raise Boom(f"bench {name} failed")

    monkeypatch.setattr(importlib.import_module(module), attr, fail)
    bench = importlib.import_module(f"gpuzarr_dist.bench.{name}")
    args = SimpleNamespace(device="cpu", quick=True, path=path, out=str(tmp_path / "res"))
    with pytest.raises(Boom, match=f"bench {name} failed") as info:
        bench.run(args)
    assert len(written) == 1
    return written[0], info


@pytest.mark.parametrize("name", sorted(FAILING))
def test_failing_bench_removes_its_temporary_folder(name, tmpdir_base, tmp_path, monkeypatch):
    where, error = _failing_run(name, monkeypatch, tmp_path, None)
    prefix = FAILING[name][2]
    folder = os.path.relpath(where, tmpdir_base).split(os.sep)[0]
    assert folder.startswith(prefix)  # it wrote inside its own temporary folder
    # and that folder is gone when the command ends, while its error is still held (not when it is collected)
    assert os.listdir(tmpdir_base) == [] and error.value is not None


@pytest.mark.parametrize("name", sorted(FAILING))
def test_failing_bench_keeps_its_path(name, tmpdir_base, tmp_path, monkeypatch):
    keep = tmp_path / "keep"
    store_path = FAILING[name][3]
    where, _ = _failing_run(name, monkeypatch, tmp_path, str(keep / "era5.zarr") if store_path else str(keep))
    assert os.path.commonpath([where, str(keep)]) == str(keep)
    with open(os.path.join(where, "data.bin"), "rb") as f:
        assert f.read() == b"abc"
    assert os.listdir(tmpdir_base) == []  # no temporary folder was made
