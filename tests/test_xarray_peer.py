"""xarray's own Zarr backend tests, with gpuzarr's reader in place of xarray's.

xarray ships its test suite; its ``ZarrBase`` class opens every store it wrote
through one ``open`` method. A small pytest plugin replaces that method, then
``TestZarrDirectoryStore`` (Zarr formats 2 and 3) runs three times in a fresh
interpreter: with xarray's own engine (the reference, so that failures of the
environment, such as a missing pytest-asyncio, count for nothing), with
``engine="gpuzarr"``, and through ``gz.open_dataset``. The engine must fail
exactly the tests xarray's engine fails; ``gz.open_dataset`` may differ
besides only in the tests of its documented differences (docs/xarray.md):
its variables are dask arrays even without ``chunks=``, its ``chunks=`` are
gpuzarr blocks that leave times and timedeltas unchunked, and it warns of
blocks that cut through Zarr chunks.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]

#: ``gz.open_dataset``'s documented differences from ``xr.open_dataset(engine="zarr")``, by xarray test name
GZ_DIFFERENCES = {
    "test_auto_chunk",  # dask arrays without chunks=
    "test_manual_chunk",
    "test_dataset_caching",
    "test_chunked_datetime64_or_timedelta64",  # times and timedeltas stay with xarray, unchunked
    "test_no_warning_from_open_emptydim_with_chunks",  # blocks that cut through Zarr chunks are warned of
}

PLUGIN = '''
import contextlib, os

def pytest_configure(config):
    mode = os.environ["GZPEER"]
    if mode == "zarr":
        return
    import xarray as xr
    from xarray.tests import test_backends as tb
    import gpuzarr_dist as gz

    @contextlib.contextmanager
    def open_engine(self, path, **kwargs):
        with xr.open_dataset(path, engine="gpuzarr", device="cpu", **kwargs, **self.version_kwargs) as ds:
            yield ds

    @contextlib.contextmanager
    def open_gz(self, path, **kwargs):
        kw = dict(kwargs)
        kw.update(kw.pop("backend_kwargs", None) or {})
        kw.update(self.version_kwargs)
        if "chunks" in kw and kw["chunks"] is None:
            del kw["chunks"]
        with gz.open_dataset(path, device="cpu", **kw) as ds:
            yield ds

    tb.ZarrBase.open = open_engine if mode == "engine" else open_gz
'''


def _failures(mode: str, tmp_path: Path) -> tuple[set[str], int]:
    """The names of the failing tests (parameters cut off) and the number of tests that ran."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "gzpeer_plugin.py").write_text(PLUGIN)
    (tmp_path / "pytest.ini").write_text("[pytest]\nfilterwarnings =\n    ignore::DeprecationWarning\n")
    env = dict(os.environ, GZPEER=mode,
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), str(tmp_path), os.environ.get("PYTHONPATH")) if p))
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path), "-q",
         "-p", "no:cacheprovider", "-p", "gzpeer_plugin", "-rf", "--pyargs", "xarray.tests.test_backends",
         "-k", "TestZarrDirectoryStore"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
    )
    tail = res.stdout[-3000:] + res.stderr[-3000:]
    summary = re.search(r"(\d+) passed", res.stdout)
    assert summary, f"xarray's tests did not run ({mode}):\n{tail}"
    failed = {m.group(1) for m in re.finditer(r"^FAILED \S*::(test_\w+)", res.stdout, re.MULTILINE)}
    return failed, int(summary.group(1))


def test_xarray_zarr_backend_suite_with_gpuzarr(tmp_path):
    import xarray  # its tests are looked for, not imported: they run in their own interpreter

    if not (Path(xarray.__file__).parent / "tests" / "test_backends.py").is_file():
        pytest.skip("this xarray install has no test suite")
    reference, n_ref = _failures("zarr", tmp_path / "zarr")
    engine, n_engine = _failures("engine", tmp_path / "engine")
    through_gz, _ = _failures("gz", tmp_path / "gz")
    assert n_ref > 100 and n_engine == n_ref
    assert engine == reference, f"engine='gpuzarr' differs from engine='zarr': {sorted(engine ^ reference)}"
    extra = through_gz - reference
    assert extra <= GZ_DIFFERENCES, f"gz.open_dataset fails beyond its documented differences: {sorted(extra)}"
