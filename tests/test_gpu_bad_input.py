"""Bad chunks inside large GPU batches: each bad chunk is named, good chunks are untouched, nothing crashes."""

from __future__ import annotations

import os
import pathlib

import numcodecs
import numpy as np
import pytest
import zarr.codecs as zc
from conftest import assert_same, make_data, reference, write_array

import gpuzarr_dist as gz

pytestmark = pytest.mark.gpu

SHAPE, CHUNKS = (32, 64, 64), (1, 64, 64)  # 32 chunks, one block: one batch


def _zstd_array(tmp_path, level=19):
    path = str(tmp_path / "z.zarr")
    data = np.cumsum(make_data("float32", SHAPE, seed=7, specials=False), axis=2).astype("f4")
    write_array(path, data, CHUNKS, compressors=[zc.ZstdCodec(level=level)])
    return path, reference(path)


def _chunk(path, i):
    return pathlib.Path(path, "c", str(i), "0", "0")


def _structurally_impossible(frame: bytes, n: int) -> list[bytes]:
    """Single-byte edits of ``frame`` that the device walk flags and libzstd rejects (found with the device walk)."""
    from test_zstd_walk import _device_walk

    edits = []
    for i in range(6, min(len(frame), 200)):
        for v in (0x00, 0xFF, frame[i] ^ 0x03, frame[i] ^ 0xC0):
            b = bytearray(frame)
            b[i] = v
            edits.append(bytes(b))
    found = []
    for e, (fcs, length, deep) in zip(edits, _device_walk(edits)):
        if deep and fcs == n and length == len(e):
            try:
                numcodecs.Zstd().decode(e)
            except Exception:
                found.append(e)
    return found


def test_structurally_impossible_zstd_frames_never_reach_nvcomp_and_are_named(tmp_path):
    path, expected = _zstd_array(tmp_path)
    frame = _chunk(path, 5).read_bytes()
    bad = _structurally_impossible(frame, 64 * 64 * 4)
    assert bad, "no single-byte edit of a level-19 frame was flagged: the walk checks too little"
    _chunk(path, 5).write_bytes(bad[0])
    _chunk(path, 17).write_bytes(bad[-1] if len(bad) > 1 else bad[0])
    x = gz.from_zarr_gpu(path, device="gpu", chunks=SHAPE)
    with pytest.raises(gz.ChunkDecodeError) as info:
        x.compute()
    assert info.value.key == "c/5/0/0"
    assert "CPU decoder agrees" in str(info.value) and "c/17/0/0" in str(info.value)
    good = gz.from_zarr_gpu(path, device="gpu", chunks=(4, 64, 64))[:4].compute().get()
    assert_same(good, expected[:4])


@pytest.mark.parametrize("codec", ["zstd", "gzip", "zlib", "lz4"])
def test_several_bad_chunks_in_one_batch_name_a_bad_one_and_spare_the_rest(tmp_path, codec):
    path = str(tmp_path / f"{codec}.zarr")
    data = make_data("float32", SHAPE, seed=8)
    comp = {"zstd": zc.ZstdCodec(level=3), "gzip": zc.GzipCodec(level=1)}.get(codec)
    if comp is None:
        write_array(path, data, CHUNKS, zarr_format=2, compressors={"zlib": numcodecs.Zlib(level=1), "lz4": numcodecs.LZ4()}[codec])
        key = lambda i: f"{i}.0.0"  # noqa: E731
    else:
        write_array(path, data, CHUNKS, compressors=[comp])
        key = lambda i: f"c/{i}/0/0"  # noqa: E731
    expected = reference(path)
    file = lambda i: os.path.join(path, *key(i).split("/"))  # noqa: E731
    damaged = {3: lambda b: b[: len(b) // 2], 11: lambda b: bytes(len(b)), 20: lambda b: b + b, 29: lambda b: b[:-7]}
    for i, damage in damaged.items():
        raw = pathlib.Path(file(i)).read_bytes()
        pathlib.Path(file(i)).write_bytes(damage(raw))
    x = gz.from_zarr_gpu(path, device="gpu", chunks=SHAPE)
    with pytest.raises(gz.ChunkDecodeError) as info:
        x.compute()
    assert info.value.key in {key(i) for i in damaged}
    # blocks without a damaged chunk read exactly as zarr-python reads them
    y = gz.from_zarr_gpu(path, device="gpu", chunks=(1, 64, 64))
    for i in range(SHAPE[0]):
        if i not in damaged:
            assert_same(y[i].compute().get(), expected[i])


def _adler_only_damage(raw: bytes) -> list[bytes]:
    """zlib streams that still inflate to the right size but fail their adler32 check (libz says so)."""
    import zlib

    out = [raw[:-1] + bytes([raw[-1] ^ 0x01])]  # the checksum itself
    n = len(zlib.decompress(raw))
    for i in range(2, len(raw) - 4):
        for bit in range(8):
            b = bytearray(raw)
            b[i] ^= 1 << bit
            try:
                zlib.decompress(bytes(b))
            except zlib.error as e:
                if "incorrect data check" in str(e):
                    if len(zlib.decompress(bytes(b[2:-4]), -15)) == n:  # raw inflate: no adler32 check
                        out.append(bytes(b))
                        if len(out) >= 3:
                            return out
    return out


def test_zlib_chunks_are_checked_against_their_adler32(tmp_path):
    """nvCOMP inflates without the adler32 check; the device computes it, so a silent wrong value is an error."""
    path = str(tmp_path / "zl.zarr")
    data = make_data("int16", SHAPE, seed=9)
    write_array(path, data, CHUNKS, zarr_format=2, compressors=numcodecs.Zlib(level=1))
    expected = reference(path)
    for j, damaged in enumerate(_adler_only_damage(pathlib.Path(path, "6.0.0").read_bytes())):
        pathlib.Path(path, "6.0.0").write_bytes(damaged)
        with pytest.raises(gz.ChunkDecodeError) as info:
            gz.from_zarr_gpu(path, device="gpu", chunks=SHAPE).compute()
        assert info.value.key == "6.0.0", j
    pathlib.Path(path, "6.0.0").unlink()  # missing: fill value; the rest, adler32 checked, reads as zarr-python reads it
    got = gz.from_zarr_gpu(path, device="gpu", chunks=SHAPE).compute().get()
    assert_same(np.delete(got, 6, axis=0), np.delete(expected, 6, axis=0))


def test_gzip_chunks_are_checked_against_their_crc32(tmp_path):
    """nvCOMP inflates without the CRC-32 check; the device computes it, so damage that inflates is an error."""
    path = str(tmp_path / "gz.zarr")
    data = make_data("int16", SHAPE, seed=10)
    write_array(path, data, CHUNKS, compressors=[zc.GzipCodec(level=1)])
    expected = reference(path)
    chunk = _chunk(path, 9)
    raw = chunk.read_bytes()
    damaged = bytearray(raw)
    damaged[-8] ^= 0x01  # the stored CRC-32: the data inflates as before
    chunk.write_bytes(bytes(damaged))
    with pytest.raises(gz.ChunkDecodeError) as info:
        gz.from_zarr_gpu(path, device="gpu", chunks=SHAPE).compute()
    assert info.value.key == "c/9/0/0"
    chunk.write_bytes(raw)
    assert_same(gz.from_zarr_gpu(path, device="gpu", chunks=SHAPE).compute().get(), expected)


def test_zstd_content_checksums_are_verified(tmp_path):
    """nvCOMP ignores the content checksum of frames written with checksum=True; the device checks it."""
    path = str(tmp_path / "zc.zarr")
    data = make_data("float32", SHAPE, seed=11)
    write_array(path, data, CHUNKS, compressors=[zc.ZstdCodec(level=3, checksum=True)])
    expected = reference(path)
    chunk = _chunk(path, 13)
    raw = chunk.read_bytes()
    damaged = bytearray(raw)
    damaged[-1] ^= 0x10  # the checksum: the frame decodes as before, libzstd rejects it
    chunk.write_bytes(bytes(damaged))
    with pytest.raises(gz.ChunkDecodeError) as info:
        gz.from_zarr_gpu(path, device="gpu", chunks=SHAPE).compute()
    assert info.value.key == "c/13/0/0"
    chunk.write_bytes(raw)
    assert_same(gz.from_zarr_gpu(path, device="gpu", chunks=SHAPE).compute().get(), expected)
