"""The vectorised host-side paths of sharded reads and GPU batch checks, against independent references.

Frames come from numcodecs (gzip, zlib, lz4) and zstd; keys and unique rows are
compared with the per-row definitions (``ArraySpec.chunk_key``, ``np.unique``);
sharded reads with zarr-python. These run on the CPU (no cupy needed).
"""

from __future__ import annotations

import zlib

import numcodecs
import numpy as np
import pytest
import zarr
import zarr.codecs as zc

from gpuzarr_dist.array.windows import _cut_windows, _unique_rows
from gpuzarr_dist.codecs import host_checks as hc
from gpuzarr_dist.errors import ChunkDecodeError
from gpuzarr_dist.stores.base import staging_layout
from gpuzarr_dist.stores.source import open_source

EXPECTED = 4096


def _batch(frames: list[bytes]):
    sizes = [len(f) for f in frames]
    offsets, total = staging_layout(sizes, 256)
    host = np.zeros(total + 8, dtype=np.uint8)
    for f, o in zip(frames, offsets):
        host[o : o + len(f)] = np.frombuffer(f, dtype=np.uint8)
    return host, offsets, sizes


def _bad_header(codec, host, o, n):
    """Stand-in reason giver: the real one lives in codecs/gpu.py (cupy); this mirrors zlib's own refusal."""
    data = bytes(host[o : o + n])
    try:
        (zlib.decompressobj(wbits=31 if codec == "gzip" else 15)).decompress(data[:2] + b"")  # header only
    except zlib.error as e:
        return str(e)
    if codec == "gzip" and (n < 18 or data[:2] != b"\x1f\x8b" or data[2] != 8 or data[3] & 0xE0):
        return "bad gzip header"
    return None


def _frames(codec: str, n: int) -> list[bytes]:
    rng = np.random.default_rng(3)
    raw = [rng.integers(0, 4, EXPECTED, dtype=np.uint8).tobytes() for _ in range(n)]
    enc = {"gzip": numcodecs.GZip(1), "zlib": numcodecs.Zlib(1), "lz4": numcodecs.LZ4()}[codec]
    return [bytes(enc.encode(r)) for r in raw]


@pytest.mark.parametrize("codec", ["gzip", "zlib", "lz4"])
def test_good_frames_pass_and_the_first_bad_one_is_named(codec):
    frames = _frames(codec, 300)
    keys = [f"c/{i}" for i in range(len(frames))]
    host, offsets, sizes = _batch(frames)
    hc.check_stated_sizes(codec, "arr", host, offsets, sizes, keys, EXPECTED, _bad_header)  # no error
    if codec == "zlib":  # states no size: only the header is checked
        frames[200] = b"\x78\x00" + frames[200][2:]  # FCHECK wrong
        frames[250] = b"\x00" + frames[250][1:]
        host, offsets, sizes = _batch(frames)
        with pytest.raises(ChunkDecodeError) as e:
            hc.check_stated_sizes(codec, "arr", host, offsets, sizes, keys, EXPECTED, _bad_header)
        assert e.value.key == "c/200"
        return
    # a frame stating another size, later a second one: the first is named, with the stated size
    for i in (123, 250):
        f = bytearray(frames[i])
        if codec == "gzip":
            f[-4:] = (EXPECTED + 1).to_bytes(4, "little")
        else:
            f[:4] = (EXPECTED * 2).to_bytes(4, "little")
        frames[i] = bytes(f)
    host, offsets, sizes = _batch(frames)
    with pytest.raises(ChunkDecodeError, match=f"states {EXPECTED + 1 if codec == 'gzip' else EXPECTED * 2} decoded") as e:
        hc.check_stated_sizes(codec, "arr", host, offsets, sizes, keys, EXPECTED, _bad_header)
    assert e.value.key == "c/123" and e.value.codec == codec
    if codec == "gzip":  # a bad header before them wins, with bad_header's reason
        frames[7] = b"\x1f\x8c" + frames[7][2:]
        host, offsets, sizes = _batch(frames)
        with pytest.raises(ChunkDecodeError, match="header") as e:
            hc.check_stated_sizes(codec, "arr", host, offsets, sizes, keys, EXPECTED, _bad_header)
        assert e.value.key == "c/7"


def test_trailers_compared_with_zlib_checksums():
    """gzip's CRC-32 and zlib's adler32 trailers, read for all chunks at once, match zlib's own values."""
    rng = np.random.default_rng(5)
    raw = [rng.integers(0, 255, 1000 + 13 * i, dtype=np.uint8).tobytes() for i in range(200)]
    gz = [bytes(numcodecs.GZip(1).encode(r)) for r in raw]
    host, offsets, sizes = _batch(gz)
    crc = np.array([zlib.crc32(r) for r in raw], dtype=np.uint32)
    assert hc.trailer_mismatches(crc, host, np.add(offsets, sizes) - 8) == []
    crc[[3, 150]] ^= 1
    assert hc.trailer_mismatches(crc, host, np.add(offsets, sizes) - 8) == [3, 150]
    zl = [zlib.compress(r) for r in raw]
    host, offsets, sizes = _batch(zl)
    adler = np.array([zlib.adler32(r) for r in raw], dtype=np.uint32)
    assert hc.trailer_mismatches(adler, host, np.add(offsets, sizes) - 4, big=True) == []
    adler[42] += 1
    wanted = np.ones(len(raw), dtype=np.uint8)
    assert hc.trailer_mismatches(adler, host, np.add(offsets, sizes) - 4, big=True, wanted=wanted) == [42]
    wanted[42] = 0  # frames without a checksum are not compared
    assert hc.trailer_mismatches(adler, host, np.add(offsets, sizes) - 4, big=True, wanted=wanted) == []


def _zstd_loop(fcs, length, deep, sizes, expected):
    """The per-frame decision of the device walk's outputs before vectorising, as the reference."""
    suspects = []
    for i in range(len(fcs)):
        if fcs[i] == -2:
            return ("error", i, hc.ZSTD_NOT_FRAME)
        if fcs[i] == -3:
            return ("error", i, hc.ZSTD_HEADER_CUT)
        if length[i] == -4:
            return ("error", i, hc.ZSTD_RESERVED_BLOCK)
        if fcs[i] == -1 or length[i] < sizes[i]:
            return ("nosize", i, hc.ZSTD_NO_SIZE)
        if fcs[i] != expected:
            return ("error", i, hc.ZSTD_WRONG_SIZE)
        if length[i] > sizes[i]:
            return ("error", i, hc.ZSTD_TRUNCATED)
        if deep[i]:
            suspects.append(i)
    return ("ok", suspects, None)


def test_zstd_verdicts_agree_with_the_per_frame_rules():
    rng = np.random.default_rng(9)
    for trial in range(300):
        n = int(rng.integers(1, 40))
        sizes = rng.integers(10, 100, n)
        fcs = np.full(n, EXPECTED, dtype=np.int64)
        length = sizes.copy()
        deep = np.zeros(n, dtype=np.int32)
        for _ in range(int(rng.integers(0, 4))):  # a few damaged frames of random kinds
            i = int(rng.integers(n))
            kind = int(rng.integers(7))
            if kind < 3:
                fcs[i] = (-2, -3, -1)[kind]
            elif kind == 3:
                length[i] = -4
            elif kind == 4:
                fcs[i] = EXPECTED + 7
            elif kind == 5:
                length[i] = sizes[i] + int(rng.integers(-5, 6))
            else:
                deep[i] = int(rng.integers(1, 13))
        ref = _zstd_loop(fcs, length, deep, sizes, EXPECTED)
        v = hc.zstd_verdicts(fcs, length, deep, sizes, EXPECTED)
        i = hc.zstd_first_error(v)
        if ref[0] == "ok":
            assert i == -1 and np.flatnonzero(v == hc.ZSTD_DEEP).tolist() == ref[1]
        else:
            assert (i, int(v[i])) == (ref[1], ref[2])
            if ref[2] != hc.ZSTD_NO_SIZE:
                assert hc.zstd_reason(int(v[i]), int(fcs[i]), int(length[i]), int(sizes[i]), EXPECTED)


def _sharded(tmp_path, shape=(6, 50, 70), shards=(4, 32, 48), inner=(1, 8, 16)):
    data = np.arange(np.prod(shape), dtype="int32").reshape(shape)
    path = str(tmp_path / "s.zarr")
    a = zarr.create_array(path, shape=shape, dtype="int32", chunks=shards, compressors=None,
                          serializer=zc.ShardingCodec(chunk_shape=inner, codecs=[zc.BytesCodec(), zc.ZstdCodec()]))
    a[...] = data
    return path, data


def test_chunk_keys_match_chunk_key(tmp_path):
    path, _ = _sharded(tmp_path)
    for p in (path,):
        _, spec = open_source(p, None, None)
        grid = np.stack(np.meshgrid(*[np.arange(g) for g in spec.grid_shape], indexing="ij"), -1).reshape(-1, spec.ndim)
        rng = np.random.default_rng(0)
        coords = np.concatenate([grid, grid[rng.integers(0, len(grid), 50)]])  # repeats too
        assert spec.chunk_keys(coords) == [spec.chunk_key(tuple(c)) for c in coords.tolist()]
        assert spec.chunk_keys(np.empty((0, spec.ndim), dtype=int)) == []
    unsharded = str(tmp_path / "u.zarr")
    zarr.create_array(unsharded, shape=(5, 7), chunks=(2, 3), dtype="f4")
    _, spec = open_source(unsharded, None, None)
    coords = np.array([[0, 0], [2, 2], [1, 0], [0, 0]])
    assert spec.chunk_keys(coords) == [spec.chunk_key(tuple(c)) for c in coords.tolist()]


def test_parse_and_read_into_match_zarr_python(tmp_path):
    """Keys parsed in bulk: every inner chunk of the array read into slots, each decodes to zarr-python's values."""
    path, data = _sharded(tmp_path)
    store, spec = open_source(path, None, None)
    grid = np.stack(np.meshgrid(*[np.arange(g) for g in spec.grid_shape], indexing="ij"), -1).reshape(-1, spec.ndim)
    order = np.random.default_rng(1).permutation(len(grid))  # shards interleaved: first-seen order must hold
    coords = grid[order]
    keys = spec.chunk_keys(coords)
    shards, which, inner = store._parse(keys)
    from gpuzarr_dist.core.metadata import ChunkKeys

    assert isinstance(keys, ChunkKeys)  # parsed from the coordinates, not the strings
    plain = store._parse(list(keys))  # the strings split and parsed: the same shards, numbers and positions
    assert plain[0] == shards and np.array_equal(plain[1], which) and np.array_equal(plain[2], inner)
    per = spec.chunks_per_shard
    for k, c, w, i in zip(keys, coords.tolist(), which.tolist(), inner.tolist()):
        assert shards[w] == spec.store_key(tuple(x // p for x, p in zip(c, per)))
        assert i == np.ravel_multi_index(tuple(x % p for x, p in zip(c, per)), per)
    buf, offs, sizes = store.read_into(keys, lambda n: np.empty(n, dtype=np.uint8), 256)
    import numcodecs

    z = numcodecs.Zstd()
    for c, o, n in zip(coords.tolist(), offs, sizes):
        box = tuple(slice(x * s, min((x + 1) * s, dim)) for x, s, dim in zip(c, spec.chunk_shape, spec.shape))
        got = np.frombuffer(z.decode(bytes(buf[o : o + n])), dtype="int32").reshape(spec.chunk_shape)
        want = data[box]
        np.testing.assert_array_equal(got[tuple(slice(0, w) for w in want.shape)], want)
    for bad in (["c/0/0/0"], ["c/0/0/0[0,0]"], ["c/0/0/0[0,0,99]"]):
        with pytest.raises(ValueError, match="s.zarr"):
            store._parse(bad)


def test_unique_rows_matches_numpy():
    rng = np.random.default_rng(2)
    grid = (7, 3, 11)
    rows = np.stack([rng.integers(0, g, 500) for g in grid], axis=1)
    u, inv = _unique_rows(rows, grid)
    ru, rinv = np.unique(rows, axis=0, return_inverse=True)
    np.testing.assert_array_equal(u, ru)
    np.testing.assert_array_equal(inv, rinv.reshape(-1))


def test_host_cut_matches_numpy_slicing():
    """The host cut (slices per overlapping chunk) against plain slicing of the whole array."""
    rng = np.random.default_rng(4)
    cshape, grid_n = (2, 5, 7), (3, 4, 4)
    whole = rng.standard_normal(tuple(g * c for g, c in zip(grid_n, cshape))).astype("f4")
    chunks = whole.reshape(grid_n[0], 2, grid_n[1], 5, grid_n[2], 7).transpose(0, 2, 4, 1, 3, 5).reshape(-1, *cshape)
    window = (3, 6, 9)
    g = tuple((w + c - 2) // c + 1 for w, c in zip(window, cshape))
    starts = np.stack([rng.integers(0, s - w + 1, 40) for s, w in zip(whole.shape, window)], axis=1)
    first = starts // np.array(cshape)
    offs = np.stack(np.meshgrid(*[np.arange(x) for x in g], indexing="ij"), -1).reshape(-1, 3)
    coords = np.minimum(first[:, None, :] + offs[None], np.array(grid_n) - 1)
    idx = np.ravel_multi_index(tuple(np.moveaxis(coords, -1, 0)), grid_n).reshape(40, *g)
    idx[5] = len(chunks)  # one window reads only the fill chunk
    rel = starts - first * np.array(cshape)
    host = _cut_windows(chunks, idx, rel, window, -1.0)
    for w, s in enumerate(starts):
        if w != 5:
            np.testing.assert_array_equal(host[w], whole[tuple(slice(a, a + n) for a, n in zip(s, window))])
    assert (host[5] == -1).all()
