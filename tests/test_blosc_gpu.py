"""Blosc decoded on the GPU, bit for bit as numcodecs (c-blosc) decodes it.

The same matrix as ``test_blosc_frames.py`` (every inner codec, shuffle mode,
type size, level, block size and chunk size, incompressible data included)
through the GPU executor, then whole arrays written by zarr-python (format 2
and 3) read through ``from_zarr_gpu(device="gpu")``, without the CPU fallback.
"""

from __future__ import annotations

import os
import warnings

import numcodecs
import numpy as np
import pytest
import zarr
import zarr.codecs as zc
from conftest import make_data, write_array
from test_blosc_frames import CNAMES, SHUFFLES, _batch, _cases, _check

import gpuzarr_dist as gz
from gpuzarr_dist.codecs import blosc_frames as bf
from gpuzarr_dist.errors import ChunkDecodeError

pytestmark = pytest.mark.gpu


class _Pipeline:
    """What the executor needs of a pipeline: the array name, and a CPU decode to name a failed chunk."""

    array = "t2m"

    def decode_chunk(self, data, key):
        from gpuzarr_dist.codecs.compressors import Blosc

        try:
            return Blosc().decode(data)
        except Exception as e:
            raise ChunkDecodeError(self.array, key, str(e), "blosc") from e


def _decode_gpu(host, offsets, sizes, nbytes):
    from gpuzarr_dist.cuda.blosc import decode_blosc_batch
    from gpuzarr_dist.cuda.streams import align, thread_stream

    stride = align(max(nbytes, 1))
    keys = [str(i) for i in range(len(offsets))]
    out = decode_blosc_batch(_Pipeline(), host, offsets, sizes, sizes, keys, nbytes, stride, thread_stream())
    assert out is not None, "fell back to the CPU"
    return out.get(), stride


@pytest.mark.parametrize("shuffle", SHUFFLES, ids=["noshuffle", "shuffle", "bitshuffle"])
@pytest.mark.parametrize("cname", CNAMES)
def test_gpu_decodes_matrix_like_numcodecs(cname, shuffle):
    for nbytes, items in _cases(cname, shuffle):
        host, offsets, sizes = _batch([f for _, _, f in items])
        out, stride = _decode_gpu(host, offsets, sizes, nbytes)
        plan = bf.plan_frames("t2m", host, offsets, sizes, [str(i) for i in range(len(items))], nbytes, stride)
        _check(out, plan, items)


def test_big_batch_of_4mb_chunks_every_codec():
    """Hundreds of 4 MB chunks in one call (tens of thousands of streams), as a dask block holds them."""
    rng = np.random.default_rng(0)
    field = (280 + 10 * np.sin(np.arange(721 * 1440) / 300.0)).astype("f4")
    for cname in CNAMES:
        raws = [(field + rng.normal(0, 0.5, field.size).astype("f4")) for _ in range(64)]
        frames = [np.frombuffer(numcodecs.Blosc(cname=cname, clevel=5, shuffle=1).encode(r), np.uint8) for r in raws]
        host, offsets, sizes = _batch(frames)
        out, stride = _decode_gpu(host, offsets, sizes, field.nbytes)
        for i, r in enumerate(raws):
            assert np.array_equal(out[i * stride : i * stride + field.nbytes], r.view(np.uint8)), (cname, i)


@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize("cname", CNAMES)
@pytest.mark.parametrize("dtype", ["float32", "int16", "uint8", "float64", "complex64"])
def test_arrays_written_by_zarr_python_read_on_the_gpu(tmp_path, fmt, cname, dtype):
    data = make_data(dtype, (37, 50, 29), seed=4)
    path = str(tmp_path / "a.zarr")
    shuffle = {"float32": 1, "int16": 2, "uint8": 0, "float64": 1, "complex64": 2}[dtype]
    if fmt == 2:
        comp = numcodecs.Blosc(cname=cname, clevel=5, shuffle=shuffle)
    else:
        comp = [zc.BloscCodec(cname=cname, clevel=5, shuffle=["noshuffle", "shuffle", "bitshuffle"][shuffle],
                              typesize=np.dtype(dtype).itemsize)]
    write_array(path, data, (8, 50, 29), zarr_format=fmt, compressors=comp)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no CPU fallback
        got = gz.from_zarr_gpu(path, device="gpu", chunks=(16, 50, 29)).compute()
    expected = zarr.open_array(path, mode="r")[...]
    np.testing.assert_array_equal(got.get().view(np.uint8), expected.view(np.uint8))


def test_zarr_v2_default_compressor(tmp_path):
    """zarr-python's format 2 default (Blosc lz4, byte shuffle) decodes on the GPU."""
    data = make_data("float32", (100, 64, 48), seed=7)
    path = str(tmp_path / "d.zarr")
    zarr.create_array(path, shape=data.shape, chunks=(10, 64, 48), dtype=data.dtype, zarr_format=2,
                      compressors=numcodecs.Blosc())[...] = data
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        got = gz.from_zarr_gpu(path, device="gpu").mean(axis=0).compute()
    # a float32 mean on the device against a float64 one: absolute slack for means near zero
    np.testing.assert_allclose(got.get(), data.astype("f8").mean(axis=0), rtol=1e-5, atol=1e-4)


def test_blosclz_frames_fall_back_with_one_warning(tmp_path):
    data = make_data("int32", (40, 30), seed=3)
    path = str(tmp_path / "b.zarr")
    write_array(path, data, (10, 30), zarr_format=2, compressors=numcodecs.Blosc(cname="blosclz", shuffle=1))
    from gpuzarr_dist.cuda import blocks as reader_gpu

    reader_gpu._warned.discard("blosc (blosclz)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = gz.from_zarr_gpu(path, device="gpu", chunks=(20, 30)).compute()
    msgs = [str(w.message) for w in caught if "no GPU decoder" in str(w.message)]
    assert len(msgs) == 1 and "blosclz" in msgs[0]
    np.testing.assert_array_equal(got.get(), data)


def test_frames_of_another_compressor_than_the_metadata_says(tmp_path):
    """Metadata says lz4, one chunk was written with blosclz: decoded on the CPU, right values, one warning."""
    # compressible: random floats may be stored whole (memcpyed), which the GPU copies without blosclz
    data = (np.arange(40 * 30) % 7).astype("float32").reshape(40, 30)
    path = str(tmp_path / "m.zarr")
    write_array(path, data, (10, 30), zarr_format=2, compressors=numcodecs.Blosc(cname="lz4", shuffle=1))
    with open(os.path.join(path, "1.0"), "wb") as f:
        f.write(numcodecs.Blosc(cname="blosclz", shuffle=1).encode(data[10:20]))
    from gpuzarr_dist.cuda import blosc as gpu_blosc

    gpu_blosc._warned.discard("blosclz")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = gz.from_zarr_gpu(path, device="gpu", chunks=(40, 30)).compute()
    assert sum("blosclz" in str(w.message) for w in caught) == 1
    np.testing.assert_array_equal(got.get(), data)


@pytest.mark.parametrize("damage", ["bstart", "truncate", "lz4-stream"])
def test_damaged_chunk_is_named(tmp_path, damage):
    data = np.tile((np.arange(64 * 64) % 97).astype("f4").reshape(64, 64), (40, 1, 1))  # compressible
    path = str(tmp_path / "e.zarr")
    write_array(path, data, (10, 64, 64), zarr_format=2, compressors=numcodecs.Blosc(cname="lz4", shuffle=0))
    key = os.path.join(path, "2.0.0")
    frame = bytearray(open(key, "rb").read())
    if damage == "bstart":
        frame[16:20] = (3).to_bytes(4, "little")
    elif damage == "truncate":
        frame = frame[:-100]
    else:  # a stream's first token asks for a match before any output: malformed LZ4
        start = int.from_bytes(frame[16:20], "little") + 4
        frame[start : start + 3] = bytes([0x0F, 0x10, 0x00])
    with open(key, "wb") as f:
        f.write(bytes(frame))
    if damage == "lz4-stream":  # the stream was compressed (else the damage would only change values)
        cs = int.from_bytes(frame[start - 4 : start], "little")
        assert cs < int.from_bytes(frame[8:12], "little")
    with pytest.raises(ChunkDecodeError) as e:
        gz.from_zarr_gpu(path, device="gpu", chunks=(40, 64, 64)).compute()
    assert e.value.key == "2.0.0" and e.value.codec == "blosc"
