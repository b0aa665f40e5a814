"""The file-write ceiling rows of ``gpuzarr-dist bench write`` (runs on the CPU)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import zarr
import zarr.codecs as zc

from gpuzarr_dist.bench.write_ceiling import ceiling_rows, load_objects


def test_ceiling_rows_write_our_objects(tmp_path):
    data = np.random.default_rng(0).normal(size=(6, 50, 40)).astype("float32")
    path = str(tmp_path / "a.zarr")
    a = zarr.create_array(path, shape=data.shape, chunks=(1, 50, 40), dtype=data.dtype,
                          compressors=[zc.ZstdCodec(level=0)])
    a[...] = data
    objects = load_objects(path)
    sizes = {os.path.relpath(os.path.join(d, n), path).replace(os.sep, "/"): os.path.getsize(os.path.join(d, n))
             for d, _, names in os.walk(path) for n in names if n != "zarr.json"}
    assert {k: len(v) for k, v in objects} == sizes  # every chunk file, whole
    work = tmp_path / "work"
    work.mkdir()
    rows, lines = ceiling_rows(objects, data.nbytes, 2, str(work), repeat=1)
    assert len(rows) == 6 and len(lines) == 7
    ratio = data.nbytes / sum(sizes.values())
    for r in rows:
        assert r.nbytes == data.nbytes and r.seconds > 0
        assert r.extra["ratio"] == pytest.approx(ratio)
        stored_gbps = float(r.note.split()[0])
        assert stored_gbps == pytest.approx(r.gbps / ratio, rel=0.02, abs=0.01)
    assert os.listdir(work) == []  # its files are removed again
