"""Slicing a ``from_zarr_gpu`` array gives numpy's answer, and reads only the chunks it needs."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import (
    assert_same,
    compute_checked,
    dev,
    make_data,
    record_chunk_reads,
    reference,
    touched_chunk_keys,
    write_array,
)

import gpuzarr_dist as gz
from gpuzarr_dist.array.reader import BlockReader
from gpuzarr_dist.stores.source import open_source

SHAPE = (20, 17, 9)
CHUNKS = (4, 5, 3)

_mask0 = np.zeros(SHAPE[0], dtype=bool)
_mask0[[1, 2, 7, 19]] = True
_mask1 = np.arange(SHAPE[1]) % 3 == 1

SELECTIONS = [
    np.s_[3:17, ::2],
    np.s_[5],
    np.s_[-1],
    np.s_[5, 3, 2],
    np.s_[-3, -2, -1],
    np.s_[::-1],
    np.s_[15:2:-4, ::-2, 1],
    np.s_[:, 16:3:-5, ::-3],
    np.s_[..., 4],
    np.s_[2, ...],
    np.s_[..., ::-1],
    np.s_[1:19:5, 2:15:4, ::4],
    np.s_[:, :, 8:],
    np.s_[18:100],
    np.s_[4:4],
    np.s_[7:3],
    np.s_[:, [0, 16, 3, 3]],
    np.s_[[5, 1, 19], 2:9],
    np.s_[[-1, 0], 4, ::2],
    np.s_[_mask0],
    np.s_[:, _mask1, 1],
    np.s_[None, 3:7],
    np.s_[3:7, None, 0],
]

pytestmark = pytest.mark.usefixtures("device")


def _ids(sel):
    return repr(sel).replace(" ", "")[:60]


@pytest.fixture(scope="module", params=["v3", "v2-F"])
def sliced_array(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("slicing") / "a.zarr")
    fmt = 3 if request.param == "v3" else 2
    kw = {"order": "F"} if fmt == 2 else {}
    data = make_data("float64", SHAPE, seed=21, specials=False)
    write_array(path, data, CHUNKS, zarr_format=fmt, which="some", fill_value=np.nan, **kw)
    return path, fmt, reference(path)


@pytest.mark.parametrize("chunks", ["auto", CHUNKS, (8, 10, 9), (20, 17, 3)], ids=str)
@pytest.mark.parametrize("sel", SELECTIONS, ids=_ids)
def test_selection_matches_numpy(sliced_array, sel, chunks):
    path, _, expected = sliced_array
    x = gz.from_zarr_gpu(path, chunks=chunks, device=dev())
    assert_same(compute_checked(x[sel]), expected[sel])


def test_chained_selections(sliced_array):
    path, _, expected = sliced_array
    x = gz.from_zarr_gpu(path, chunks=(8, 5, 3), device=dev())
    got = x[3:17][::2][1:, 5][::-1, 2:]
    assert_same(compute_checked(got), expected[3:17][::2][1:, 5][::-1, 2:])
    got = x[..., 1:8][2:19:3, -4:]
    assert_same(compute_checked(got), expected[..., 1:8][2:19:3, -4:])


# --------------------------------------------------------------------------- chunks read


@pytest.fixture
def record_reads(monkeypatch):
    """The list of chunk keys the reads ask for (see ``conftest.record_chunk_reads``)."""
    return record_chunk_reads(monkeypatch)


BASIC_SELECTIONS = [
    np.s_[3:17, ::2],
    np.s_[3:17, ::5],  # a step over whole chunks skips some
    np.s_[5],
    np.s_[-1],
    np.s_[5, 3, 2],
    np.s_[-3, -2, -1],
    np.s_[..., 4],
    np.s_[2, ...],
    np.s_[1:19:5, 2:15:4, ::4],
    np.s_[::8, ::6, ::3],
    np.s_[:, :, 8:],
    np.s_[4:8, 5:10, 3:6],  # exactly one chunk
    np.s_[3:5, 4:6, 2:4],  # a corner of 8 chunks
    np.s_[:],
]


@pytest.mark.parametrize("chunks", ["auto", CHUNKS, (8, 10, 6), (20, 5, 9)], ids=str)
@pytest.mark.parametrize("sel", BASIC_SELECTIONS, ids=_ids)
def test_slicing_reads_only_touched_chunks(sliced_array, record_reads, sel, chunks):
    path, fmt, expected = sliced_array
    x = gz.from_zarr_gpu(path, chunks=chunks, device=dev())
    record_reads.clear()
    assert_same(compute_checked(x[sel]), expected[sel])
    assert sorted(record_reads) == touched_chunk_keys(SHAPE, CHUNKS, sel, fmt)


def _blocks_box(x, sel) -> tuple:
    """The union of the dask blocks of ``x`` that ``sel`` touches, as a tuple of slices."""
    pos = np.indices(SHAPE)[(slice(None),) + (sel if isinstance(sel, tuple) else (sel,))]
    box = []
    for ax, bounds in enumerate(x.chunks):
        edges = np.cumsum((0,) + bounds)
        lo, hi = int(pos[ax].min()), int(pos[ax].max())
        b0 = int(np.searchsorted(edges, lo, side="right")) - 1
        b1 = int(np.searchsorted(edges, hi, side="right")) - 1
        box.append(slice(int(edges[b0]), int(edges[b1 + 1])))
    return tuple(box)


# dask's slice fusion refuses negative steps and resolves fancy indices itself
# (``take``), so for these the reader is asked for the whole blocks the
# selection touches: never more, and always every chunk the selection needs.
@pytest.mark.parametrize(
    "sel",
    [
        np.s_[::-1], np.s_[::-5, 3], np.s_[15:2:-4, ::-2, 1], np.s_[2, 16:3:-6],
        np.s_[[5, 9, 6], 0:3], np.s_[:, [11, 13], 4], np.s_[np.isin(np.arange(SHAPE[0]), [5, 6, 9]), 0],
    ],
    ids=_ids,
)
def test_negative_steps_and_fancy_indices_read_within_touched_blocks(sliced_array, record_reads, sel):
    path, fmt, expected = sliced_array
    x = gz.from_zarr_gpu(path, chunks=(8, 10, 6), device=dev())
    record_reads.clear()
    assert_same(compute_checked(x[sel]), expected[sel])
    assert set(record_reads) <= set(touched_chunk_keys(SHAPE, CHUNKS, _blocks_box(x, sel), fmt))
    assert set(record_reads) >= set(touched_chunk_keys(SHAPE, CHUNKS, sel, fmt))


@pytest.mark.parametrize(
    "sel", [np.s_[[5, 9, 6], 0:3], np.s_[3, [11, 13], ::-2], np.s_[np.arange(SHAPE[0]) % 3 == 0, 1:4]], ids=_ids
)
def test_reader_fancy_index_matches_numpy(sliced_array, record_reads, sel):
    """The block reader itself takes fancy indices (reading their bounding box)."""
    path, fmt, expected = sliced_array
    store, spec = open_source(path)
    record_reads.clear()
    got = BlockReader(store, spec, dev())[sel]
    assert_same(got if isinstance(got, np.ndarray) else got.get(), expected[sel])
    box = np.indices(SHAPE)[(slice(None),) + sel]
    lo = [int(b.min()) for b in box]
    hi = [int(b.max()) + 1 for b in box]
    assert set(record_reads) <= set(touched_chunk_keys(SHAPE, CHUNKS, tuple(map(slice, lo, hi)), fmt))
