"""The deflate walk and the adler32 kernels on the GPU: the same answers as their host build, and as zlib.

The host build of the same sources is tested against zlib in
``test_deflate_walk.py``; here the device compile (NVRTC) must give the
same result for every stream and every launch geometry, and the readers
must name damaged gzip / zlib / Blosc-zlib chunks without handing them to
nvCOMP (whose Deflate decoder hangs on some), and read valid ones exactly as
zarr-python reads them.
"""

from __future__ import annotations

import pathlib
import zlib

import numcodecs
import numpy as np
import pytest
import zarr.codecs as zc
from conftest import assert_same, make_data, reference, write_array
from test_deflate_walk import _blosc_corpus, _gzip_corpus, _gzip_member, _mutate, _zlib_corpus

import gpuzarr_dist as gz
from gpuzarr_dist.cuda.deflate_walk import DEFLATE_GZIP, DEFLATE_ZLIB
from tests.helpers.deflate_walk_host import HostKernels

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    k = HostKernels.build(str(tmp_path_factory.mktemp("deflate_walk_gpu")), sanitize=False)
    if k is None:
        pytest.skip("no C++ compiler to build the kernel sources for the host")
    yield k
    k.close()


def _device_walk(streams: list[bytes], wrap: int, limits: list[int], threads: int | None):
    import cupy

    from gpuzarr_dist.cuda.deflate import deflate_walk
    from gpuzarr_dist.cuda.streams import thread_stream

    offs, at = [], 0
    for s in streams:
        offs.append(at)
        at += len(s) + 13  # odd starts: the walk reads bytes, never words
    buf = np.zeros(max(at, 1), np.uint8)
    for o, s in zip(offs, streams):
        buf[o : o + len(s)] = np.frombuffer(s, np.uint8)
    lengths, ends = deflate_walk(cupy.asarray(buf), offs, [len(s) for s in streams], limits, wrap, thread_stream(), threads)
    return list(zip(lengths.tolist(), ends.tolist()))


@pytest.mark.parametrize("threads", [1, 8, 32, 64, None])
def test_device_walk_equals_the_host_build_on_good_and_damaged_streams(host, threads):
    rng = np.random.default_rng(11)
    for wrap, corpus in ((DEFLATE_ZLIB, [c for c in _zlib_corpus() if c[1] <= 70_000]), (DEFLATE_GZIP, _gzip_corpus()),
                         (DEFLATE_ZLIB, _blosc_corpus())):
        damaged = [(_mutate(rng, s), n) for s, n in (corpus[i] for i in rng.integers(len(corpus), size=600))]
        cases = corpus + [(s, n) for s, n in damaged if s]
        streams, limits = [s for s, _ in cases], [n for _, n in cases]
        assert _device_walk(streams, wrap, limits, threads) == host.walk(streams, wrap, limits)


def test_device_adler32_matches_zlib_for_any_length_including_past_2_to_27():
    import cupy

    from gpuzarr_dist.cuda.deflate import adler32_streams
    from gpuzarr_dist.cuda.streams import thread_stream

    stream = thread_stream()  # first: the buffer below is written on it, so the kernels see every byte
    rng = np.random.default_rng(12)
    lens = [0, 1, 4095, 4096, 4097, 5552, 65521, 1 << 20] + rng.integers(0, 1 << 20, 40).tolist() + [(1 << 27) + 12345]
    bufs = [rng.bytes(int(n)) if n < (1 << 27) else b"\xff" * int(n) for n in lens]
    offs = np.concatenate([[0], np.cumsum([(len(b) + 255) // 256 * 256 for b in bufs])[:-1]]).astype(np.int64)
    dev = cupy.zeros(int(offs[-1]) + len(bufs[-1]) + 1, dtype=cupy.uint8)
    for o, b in zip(offs, bufs):
        if b:
            dev[int(o) : int(o) + len(b)] = cupy.asarray(np.frombuffer(b, np.uint8))
    got = adler32_streams(dev, offs.tolist(), [len(b) for b in bufs], stream)
    assert got.tolist() == [zlib.adler32(b) for b in bufs]


SHAPE, CHUNKS = (24, 64, 64), (1, 64, 64)


def _zlib_v2(tmp_path, level=1):
    path = str(tmp_path / "zl.zarr")
    data = np.cumsum(make_data("float32", SHAPE, seed=13, specials=False), axis=2).astype("f4")
    write_array(path, data, CHUNKS, zarr_format=2, compressors=numcodecs.Zlib(level=level))
    return path, reference(path)


def test_truncated_and_overwritten_deflate_is_named_and_never_reaches_nvcomp(tmp_path, monkeypatch):
    """The damage that hung nvCOMP's Deflate in the fuzz run (truncations, overwritten runs) is named by the walk."""
    from gpuzarr_dist.cuda import nvcomp_calls as gpu

    path, expected = _zlib_v2(tmp_path)
    rng = np.random.default_rng(14)
    raw = {i: pathlib.Path(path, f"{i}.0.0").read_bytes() for i in range(SHAPE[0])}
    damage = {2: raw[2][: len(raw[2]) * 2 // 3], 7: raw[7][:40] + rng.bytes(200) + raw[7][240:],
              15: raw[15][:-9], 21: raw[21][:10] + bytes(30) + raw[21][40:]}
    for i, b in damage.items():
        pathlib.Path(path, f"{i}.0.0").write_bytes(b)
    calls = []
    real = gpu.decode_ptrs  # every nvCOMP decode call, through either interface
    monkeypatch.setattr(gpu, "decode_ptrs", lambda *a: calls.append(a) or real(*a))
    with pytest.raises(gz.ChunkDecodeError) as info:
        gz.from_zarr_gpu(path, device="gpu", chunks=SHAPE).compute()
    assert info.value.key in {f"{i}.0.0" for i in damage}
    assert "CPU decoder agrees" in str(info.value)
    assert calls == []  # the batch never reached nvCOMP
    y = gz.from_zarr_gpu(path, device="gpu", chunks=CHUNKS)
    for i in range(SHAPE[0]):
        if i not in damage:
            assert_same(y[i].compute().get(), expected[i])


def test_zlib_chunk_with_bytes_after_its_checksum_reads_as_zarr_python_reads_it(tmp_path):
    """zlib ignores bytes after the stream; the walk defers such a chunk to the CPU, which decodes the batch."""
    path, _ = _zlib_v2(tmp_path)
    p = pathlib.Path(path, "4.0.0")
    p.write_bytes(p.read_bytes() + b"\x00\x01trailing")
    with pytest.warns(RuntimeWarning, match="decode on the CPU"):
        got = gz.from_zarr_gpu(path, device="gpu", chunks=SHAPE).compute().get()
    assert_same(got, reference(path))


def test_gzip_members_with_optional_header_fields_read_as_zarr_python_reads_them(tmp_path):
    path = str(tmp_path / "gz.zarr")
    data = make_data("int32", SHAPE, seed=15)
    write_array(path, data, CHUNKS, compressors=[zc.GzipCodec(level=1)])
    for i, fields in enumerate([dict(name=b"t2m.nc"), dict(comment=b"era5", extra=b"AB\x02\x00hi"), dict(hcrc=True),
                                dict(name=b"", comment=b"", extra=b"", hcrc=True)]):
        raw = data[i].tobytes()
        pathlib.Path(path, "c", str(i), "0", "0").write_bytes(_gzip_member(raw, level=1, **fields))
    expected = reference(path)
    assert_same(expected, data)  # zarr-python reads the hand-built members
    assert_same(gz.from_zarr_gpu(path, device="gpu", chunks=SHAPE).compute().get(), expected)


def _blosc_v2(tmp_path):
    path = str(tmp_path / "bz.zarr")
    rng = np.random.default_rng(16)  # small steps: compressible, so c-blosc stores zlib streams, not a raw copy
    data = (np.cumsum(rng.integers(0, 4, SHAPE), axis=2) + np.arange(SHAPE[0])[:, None, None] * 7).astype("<u2")
    write_array(path, data, CHUNKS, zarr_format=2,
                compressors=numcodecs.Blosc(cname="zlib", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE, blocksize=2048))
    return path, reference(path)


def _blosc_streams(frame: bytes, nbytes: int) -> list[tuple[int, int]]:
    """(start, size) of every compressed stream of a Blosc frame (within the frame)."""
    from gpuzarr_dist.codecs import blosc_frames as bf

    host = np.frombuffer(frame, np.uint8)
    plan = bf.plan_frames("t", host, [0], [len(frame)], ["0"], nbytes)
    zl = np.flatnonzero(plan.piece_codec == 3)
    return [(int(plan.piece_src[k]), int(plan.piece_csize[k])) for k in zl]


def test_blosc_zlib_adler32_is_checked_on_the_device(tmp_path):
    """Damage that only the adler32 inside a Blosc frame shows (nvCOMP never sees it) is named."""
    path, expected = _blosc_v2(tmp_path)
    nbytes = 64 * 64 * 2
    p = pathlib.Path(path, "9.0.0")
    raw = p.read_bytes()
    streams = _blosc_streams(raw, nbytes)
    assert len(streams) >= 2  # c-blosc wrote zlib streams (random data would be stored as a plain copy)
    start, size = streams[1]
    b = bytearray(raw)
    b[start + size - 1] ^= 0x10  # the stored adler32 of the second stream
    p.write_bytes(bytes(b))
    with pytest.raises(gz.ChunkDecodeError) as info:
        gz.from_zarr_gpu(path, device="gpu", chunks=SHAPE).compute()
    assert info.value.key == "9.0.0" and "adler32" in info.value.reason
    start, size = streams[0]
    b = bytearray(raw)
    b[start + 2 : start + size - 4] = bytes(size - 6)  # zeros: a stored block whose lengths do not match
    p.write_bytes(bytes(b))
    with pytest.raises(gz.ChunkDecodeError) as info:
        gz.from_zarr_gpu(path, device="gpu", chunks=SHAPE).compute()
    assert info.value.key == "9.0.0"
    p.write_bytes(raw)
    assert_same(gz.from_zarr_gpu(path, device="gpu", chunks=SHAPE).compute().get(), expected)


def test_zlib_chunk_over_2_to_27_bytes_is_adler32_checked(tmp_path):
    """The earlier device adler32 skipped chunks over 128 MiB; the segmented kernel checks them."""
    path = str(tmp_path / "big.zarr")
    shape = (1, 8192, 4200)  # 137.6 MB of float32 in one chunk
    data = np.broadcast_to(np.linspace(0, 1, 4200, dtype="f4"), shape).copy()
    write_array(path, data, shape, zarr_format=2, compressors=numcodecs.Zlib(level=1))
    p = pathlib.Path(path, "0.0.0")
    raw = p.read_bytes()
    p.write_bytes(raw[:-1] + bytes([raw[-1] ^ 0x01]))  # the stored adler32: the data inflates as before
    with pytest.raises(gz.ChunkDecodeError) as info:
        gz.from_zarr_gpu(path, device="gpu", chunks=shape).compute()
    assert info.value.key == "0.0.0"
    p.write_bytes(raw)
    assert_same(gz.from_zarr_gpu(path, device="gpu", chunks=shape).compute().get(), data)


def test_gzip_member_with_reserved_flags_reads_as_the_cpu_decoder_reads_it(tmp_path):
    """Python's gzip ignores reserved flag bits: the walk defers such a member to it instead of naming it bad."""
    path = str(tmp_path / "gzr.zarr")
    data = make_data("int32", SHAPE, seed=17)
    write_array(path, data, CHUNKS, compressors=[zc.GzipCodec(level=1)])
    p = pathlib.Path(path, "c", "3", "0", "0")
    b = bytearray(p.read_bytes())
    b[3] |= 0x80
    p.write_bytes(bytes(b))
    assert len(numcodecs.GZip().decode(bytes(b))) == data[3].nbytes
    with pytest.warns(RuntimeWarning, match="reserved flag"):
        got = gz.from_zarr_gpu(path, device="gpu", chunks=SHAPE).compute().get()
    assert_same(got, data)


@pytest.mark.parametrize("codec", ["zlib", "gzip", "blosc-zlib"])
def test_deflate_check_off_decodes_through_nvcomp_without_the_walk(tmp_path, monkeypatch, codec):
    """``gpuzarr.gpu.deflate-check: off`` (trusted data) skips the walk; the data still equals zarr-python's."""
    import dask

    from gpuzarr_dist.cuda import deflate as gpu_deflate

    if codec == "zlib":
        path, expected = _zlib_v2(tmp_path)
    elif codec == "gzip":
        path = str(tmp_path / "gz.zarr")
        write_array(path, make_data("int32", SHAPE, seed=15), CHUNKS, compressors=[zc.GzipCodec(level=1)])
        expected = reference(path)
    else:
        path, expected = _blosc_v2(tmp_path)
    walked = []
    real = gpu_deflate.deflate_suspects
    from gpuzarr_dist.cuda import blosc as gpu_blosc

    def counted(*a, **k):
        walked.append(1)
        return real(*a, **k)

    monkeypatch.setattr(gpu_deflate, "deflate_suspects", counted)
    monkeypatch.setattr(gpu_blosc, "deflate_suspects", counted)
    with dask.config.set({"gpuzarr.gpu.deflate-check": "off"}):
        assert_same(gz.from_zarr_gpu(path, device="gpu", chunks=SHAPE).compute(scheduler="threads").get(), expected)
    assert not walked
    assert_same(gz.from_zarr_gpu(path, device="gpu", chunks=SHAPE).compute(scheduler="threads").get(), expected)
    assert walked  # the default walks
