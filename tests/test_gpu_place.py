"""Blocks assembled on the GPU from a trimmed grid of chunks (edges, blocks that start inside a chunk, shards
at the array's edge) equal zarr-python's reading, through the one-kernel placement or its fallback."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import zarr.codecs as zc
from conftest import assert_same, make_data, reference, write_array

import gpuzarr_dist as gz

pytestmark = pytest.mark.gpu

SHAPE, CHUNKS = (19, 45, 29), (4, 8, 6)


def _counted_fallback(monkeypatch) -> list[int]:
    """Count the padded-block fallback's calls of ``_place_grid`` from the trimmed-grid placement."""
    import gpuzarr_dist.cuda.blocks as rg  # imports cupy: only where a GPU test runs

    calls = [0]
    real_trimmed, real_grid = rg._place_trimmed_grid, rg._place_grid

    def trimmed(*args, **kwargs):
        def grid(*a, **k):
            calls[0] += 1
            return real_grid(*a, **k)

        monkeypatch.setattr(rg, "_place_grid", grid)
        try:
            return real_trimmed(*args, **kwargs)
        finally:
            monkeypatch.setattr(rg, "_place_grid", real_grid)

    monkeypatch.setattr(rg, "_place_trimmed_grid", trimmed)
    return calls


@pytest.mark.parametrize("dtype", ["u1", "i2", "f4", "f8", "c8", "c16", "bool"])
def test_trimmed_grids_equal_zarr_python(tmp_path, monkeypatch, dtype):
    path = str(tmp_path / "a.zarr")
    data = make_data(dtype, SHAPE, seed=3)
    write_array(path, data, CHUNKS, compressors=[zc.ZstdCodec(level=1)])
    expected = reference(path)
    fallback = _counted_fallback(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # blocks that are not multiples of the chunks: warned, read twice at edges
        x = gz.from_zarr_gpu(path, device="gpu", chunks=(7, 19, 13))
    assert_same(x.compute().get(), expected)
    for sel in (np.s_[3:17, 5:44, 2:27], np.s_[1:2, 9:10, :], np.s_[18:, 40:, 25:]):
        assert_same(x[sel].compute().get(), expected[sel])
    # 16-byte items have no kernel type: the padded block; every other width goes through the kernel
    assert (fallback[0] > 0) == (np.dtype(dtype).itemsize == 16)


def test_transposed_and_big_endian_chunks(tmp_path, monkeypatch):
    """A transpose codec leaves the chunks as transposed views (the fallback); big-endian bytes are swapped
    before placement (the kernel)."""
    data = make_data("f4", SHAPE, seed=4)
    for name, codecs, kernel in (("t.zarr", dict(filters=[zc.TransposeCodec(order=(2, 0, 1))]), False),
                                 ("be.zarr", dict(serializer=zc.BytesCodec(endian="big")), True)):
        path = str(tmp_path / name)
        write_array(path, data, CHUNKS, compressors=[zc.ZstdCodec(level=1)], **codecs)
        fallback = _counted_fallback(monkeypatch)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            x = gz.from_zarr_gpu(path, device="gpu", chunks=(7, 19, 13))
        assert_same(x.compute().get(), reference(path))
        assert (fallback[0] == 0) == kernel, name


def test_shards_at_the_array_edge(tmp_path, monkeypatch):
    """The layout of ``bench shards``: shards padded past the array, inner chunks trimmed at its edge."""
    import zarr

    path = str(tmp_path / "s.zarr")
    data = make_data("f4", (9, 21, 33), seed=5, specials=False)
    z = zarr.create_array(path, shape=data.shape, dtype="f4", chunks=(4, 24, 36), compressors=None,
                          serializer=zc.ShardingCodec(chunk_shape=(1, 8, 12), codecs=[zc.BytesCodec(), zc.ZstdCodec()]))
    z[...] = data
    fallback = _counted_fallback(monkeypatch)
    x = gz.from_zarr_gpu(path, device="gpu")
    assert_same(x.compute().get(), reference(path))
    assert_same(x[2:7, 3:20, 5:31].compute().get(), data[2:7, 3:20, 5:31])
    assert fallback[0] == 0


@pytest.mark.parametrize("sel, shards, which", [
    (np.s_[:, :, :], None, "all"),  # aligned whole grid: slabs of whole chunks
    (np.s_[3:19, 5:44, 2:27], None, "all"),  # starts inside chunks, ends at the edges: trimmed slabs
    (np.s_[:, :, :], (8, 16, 12), "all"),  # sharded: slabs of inner chunks
    (np.s_[:, :, :], None, "some"),  # missing chunks: one call, the fill value placed
])
def test_reads_decoded_in_slabs_equal_zarr_python(tmp_path, monkeypatch, sel, shards, which):
    """``BlockReader.decode_bytes`` (the Cubed variant's bound on one nvCOMP call): a block decoded slab by
    slab, each whole rows of its chunk grid, equals zarr-python's reading; one call where it cannot be cut."""
    import gpuzarr_dist.cuda.blocks as rg
    from gpuzarr_dist.array.reader import BlockReader
    from gpuzarr_dist.stores.source import open_source

    path = str(tmp_path / "a.zarr")
    data = make_data("f4", SHAPE, seed=11, specials=False)
    write_array(path, data, CHUNKS, compressors=[zc.ZstdCodec(level=1)], which=which, fill_value=-3.0,
                **({"shards": shards} if shards else {}))
    expected = reference(path)
    calls = []
    real = rg.decode_batch_gpu

    def counted(pipeline, host, offsets, sizes, keys, stream):
        calls.append(len(keys))
        return real(pipeline, host, offsets, sizes, keys, stream)

    monkeypatch.setattr(rg, "decode_batch_gpu", counted)
    store, spec = open_source(path)
    chunk_bytes = 4 * 8 * 6 * 4
    limit = 3 * 30 * chunk_bytes  # 3 rows of the 5 x 6 x 5 grid of (4, 8, 6) float32 chunks
    reader = BlockReader(store, spec, "gpu", decode_bytes=limit)
    assert_same(reader[sel].get(), expected[sel])
    if which == "some":
        assert len(calls) == 1
    else:
        assert len(calls) == 2 and all(n * chunk_bytes <= limit for n in calls)  # 5 rows: 3 and 2
    calls.clear()
    assert_same(BlockReader(store, spec, "gpu")[sel].get(), expected[sel])
    assert len(calls) == 1  # no limit: one call


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("shape,chunk,start", [((37,), (8,), (3,)), ((5, 33), (2, 7), (1, 6)), ((7, 45, 29), (4, 8, 6), (3, 0, 5)),
                                               ((3, 4, 9, 70), (2, 3, 4, 32), (1, 2, 3, 31)), ((2, 721, 1440), (1, 256, 256), (0, 0, 0))])
def test_place_tiles_equals_numpy_slicing(monkeypatch, shape, chunk, start, wide):
    """The placement kernel against numpy: tiles of a C-ordered grid, at a stride larger than a tile, the block
    starting inside its first tile; ``wide`` forces the 64-bit arithmetic of blocks with a last axis of 2**32."""
    import cupy

    import gpuzarr_dist.cuda.blocks as rg

    if wide:
        monkeypatch.setattr(rg, "_PLACE_NARROW", 1)
    grid = tuple(-(-(n + s) // c) for n, s, c in zip(shape, start, chunk))
    tile = int(np.prod(chunk))
    stride = tile + 5  # slots apart, as decoded chunks sit in their batch's output
    rng = np.random.default_rng(sum(shape))
    flat = rng.integers(0, 2**31, size=int(np.prod(grid)) * stride, dtype=np.uint32)
    tiles = np.lib.stride_tricks.as_strided(flat, shape=(int(np.prod(grid)), *chunk),
                                            strides=(stride * 4, *np.cumprod((1, *chunk[::-1]))[:-1][::-1] * 4))
    # the reference: the tiles laid out as the padded grid, then cut at the block's start
    padded = tiles.reshape(*grid, *chunk).transpose(*[a for d in range(len(grid)) for a in (d, len(grid) + d)])
    padded = padded.reshape([g * c for g, c in zip(grid, chunk)])
    expected = padded[tuple(slice(s, s + n) for s, n in zip(start, shape))]
    dev_flat = cupy.asarray(flat)
    dev_tiles = cupy.lib.stride_tricks.as_strided(dev_flat, shape=tiles.shape, strides=tiles.strides)
    out = cupy.full(shape, 7, dtype=cupy.uint32)
    rg.place_tiles(out, dev_tiles, chunk, grid, start)
    np.testing.assert_array_equal(out.get(), expected)
