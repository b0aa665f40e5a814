"""Bounded reads: a chunk that expands far past its decoded size, a chunk file that is not a regular file or
is far larger than its chunk can be, and a block larger than memory all fail fast with a clear error, without
the allocation they ask for.

Bombs are built by hand (zstd frames of RLE blocks, a streamed gzip member) and checked against numcodecs
and Python's zlib, the independent decoders: small versions of them decode there to the zeros they stand for.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
import time
import zlib

import dask
import numcodecs
import numpy as np
import pytest
import zarr
import zarr.codecs as zc

import gpuzarr_dist as gz
from gpuzarr_dist.codecs.compressors import (
    LZ4,
    Blosc,
    DecodeLimit,
    GZip,
    Zlib,
    Zstd,
    chain_limits,
    compressed_bound,
    zstd_sizes,
)
from gpuzarr_dist.errors import ChunkDecodeError, ChunkReadError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GiB = 1 << 30
RLE_BLOCK = 128 << 10  # the largest zstd block


# -- bombs ---------------------------------------------------------------------------------------


def zstd_bomb(nbytes: int, stated: bool = True, checksum: bool = False) -> bytes:
    """A zstd frame of ``nbytes`` zeros made of RLE blocks (4 bytes per 128 KiB), stating its size or not."""
    assert nbytes % RLE_BLOCK == 0 and nbytes
    fhd = (3 << 6 if stated else 0) | (4 if checksum else 0)  # FCS in 8 bytes (or none); window descriptor follows
    head = (0xFD2FB528).to_bytes(4, "little") + bytes([fhd, 7 << 3])  # window 2**17 (128 KiB)
    if stated:
        head += nbytes.to_bytes(8, "little")
    count = nbytes // RLE_BLOCK
    block = ((RLE_BLOCK << 3) | (1 << 1)).to_bytes(3, "little") + b"\0"
    last = ((RLE_BLOCK << 3) | (1 << 1) | 1).to_bytes(3, "little") + b"\0"
    return head + block * (count - 1) + last


def deflate_bomb(nbytes: int, wbits: int) -> bytes:
    """``nbytes`` zeros compressed as a stream (gzip: ``wbits`` 31, zlib: 15), a MiB at a time."""
    c = zlib.compressobj(9, zlib.DEFLATED, wbits)
    zeros = bytes(1 << 20)
    parts = [c.compress(zeros) for _ in range(nbytes >> 20)]
    return b"".join(parts) + c.flush()


def test_the_handmade_zstd_frames_are_what_numcodecs_decodes():
    for stated in (True, False):
        frame = zstd_bomb(4 * RLE_BLOCK, stated)
        out = numcodecs.Zstd().decode(frame)
        assert bytes(out) == bytes(4 * RLE_BLOCK)
    assert zstd_sizes(memoryview(zstd_bomb(4 * RLE_BLOCK, True)), 1 << 40) == (True, 4 * RLE_BLOCK)
    assert zstd_sizes(memoryview(zstd_bomb(4 * RLE_BLOCK, False)), 1 << 40) == (False, 4 * RLE_BLOCK)


# -- each decoder within its limit ---------------------------------------------------------------


EXACT = DecodeLimit(48, True)


@pytest.mark.parametrize("stated", [True, False])
def test_zstd_bomb_refused_within_the_limit(stated):
    with pytest.raises((ValueError, RuntimeError)) as e:
        Zstd().decode_within(zstd_bomb(64 * RLE_BLOCK, stated), EXACT)
    assert "48" in str(e.value)


def test_zstd_bound_limit_refuses_unstated_frames_that_could_pass_it():
    with pytest.raises(ValueError, match="may decode to more than"):
        Zstd().decode_within(zstd_bomb(64 * RLE_BLOCK, False), DecodeLimit(RLE_BLOCK, False))
    out = Zstd().decode_within(zstd_bomb(2 * RLE_BLOCK, False), DecodeLimit(2 * RLE_BLOCK + 5, False))
    assert bytes(out) == bytes(2 * RLE_BLOCK)


def test_zstd_stated_size_other_than_the_chunk_is_refused():
    data = numcodecs.Zstd().encode(bytes(40))
    with pytest.raises(ValueError, match="state 40 decoded bytes, expected 48"):
        Zstd().decode_within(data, EXACT)


@pytest.mark.parametrize("codec,wbits", [(GZip, 31), (Zlib, 15)])
def test_deflate_bomb_stops_at_the_limit(codec, wbits):
    with pytest.raises(ValueError, match="decoded to more than 48 bytes"):
        codec().decode_within(deflate_bomb(8 << 20, wbits), EXACT)


def test_lz4_and_blosc_stated_sizes_are_refused_before_decoding():
    lz4 = numcodecs.LZ4().encode(bytes(48))
    bomb = GiB.to_bytes(4, "little") + lz4[4:]
    with pytest.raises(ValueError, match=f"lz4 prefix states {GiB} decoded bytes, expected 48"):
        LZ4().decode_within(bomb, EXACT)
    frame = bytearray(numcodecs.Blosc(cname="lz4").encode(np.zeros(12, np.float32)))
    frame[4:8] = GiB.to_bytes(4, "little")
    with pytest.raises(ValueError, match=f"blosc header states {GiB} decoded bytes, expected 48"):
        Blosc().decode_within(bytes(frame), EXACT)


@pytest.mark.parametrize("codec,cls", [(numcodecs.Zstd(), Zstd), (numcodecs.GZip(), GZip), (numcodecs.Zlib(), Zlib),
                                       (numcodecs.LZ4(), LZ4), (numcodecs.Blosc(cname="zstd", shuffle=2), Blosc)])
def test_valid_chunks_decode_as_numcodecs_decodes_them(codec, cls):
    raw = np.arange(3000, dtype="<f8").tobytes()
    enc = codec.encode(raw)
    exact = cls().decode_within(enc, DecodeLimit(len(raw), True))
    bound = cls().decode_within(enc, DecodeLimit(compressed_bound(len(raw)), False))
    assert bytes(exact) == bytes(bound) == bytes(codec.decode(enc)) == raw
    with pytest.raises(ValueError):
        cls().decode_within(enc, DecodeLimit(len(raw) + 1, True))


def test_gzip_with_two_members_and_padding_decodes_as_pythons_gzip():
    raw = bytes(range(256)) * 10
    data = gzip.compress(raw[:1000]) + gzip.compress(raw[1000:]) + bytes(7)
    assert bytes(GZip().decode_within(data, DecodeLimit(len(raw), True))) == gzip.decompress(data) == raw


def test_truncated_zlib_is_still_an_error():
    data = zlib.compress(bytes(range(256)) * 10)[:-9]
    with pytest.raises(zlib.error, match="incomplete or truncated"):
        Zlib().decode_within(data, DecodeLimit(2560, True))


def test_chain_limits_exact_next_to_bytes_bounds_further_out():
    crc, z, g = zc.Crc32cCodec(), Zstd(), GZip()
    from gpuzarr_dist.codecs.compressors import Crc32c

    limits, stored = chain_limits(DecodeLimit(1000, True), [z, Crc32c()])
    assert limits == [DecodeLimit(1000, True), DecodeLimit(compressed_bound(1000), False)]
    assert stored == DecodeLimit(compressed_bound(1000) + 4, False)
    limits, stored = chain_limits(DecodeLimit(1000, True), [Crc32c(), z, g])
    assert limits[:2] == [DecodeLimit(1000, True), DecodeLimit(1004, True)]
    assert stored.size == compressed_bound(compressed_bound(1004))
    del crc


def test_the_pipeline_reports_a_bomb_against_its_chunk_and_codec(tmp_path):
    from gpuzarr_dist.codecs.compressors import crc32c_value
    from gpuzarr_dist.codecs.pipeline import CodecPipeline
    from gpuzarr_dist.stores.source import open_source

    path = str(tmp_path / "a.zarr")
    _small_array(path, [zc.ZstdCodec(), zc.Crc32cCodec()])
    _, spec = open_source(path)
    pipeline = CodecPipeline(spec)
    assert pipeline.decode_limits == [DecodeLimit(48, True), DecodeLimit(compressed_bound(48), False)]
    assert pipeline.stored_limit == compressed_bound(compressed_bound(48) + 4)
    bomb = zstd_bomb(GiB)
    stored = bomb + crc32c_value(bomb).to_bytes(4, "little")
    with pytest.raises(ChunkDecodeError, match=r"chunk 'c/9' failed to decode with codec 'zstd': ValueError: zstd "
                                               r"frames state at least 1073741824 decoded bytes, expected 48") as e:
        pipeline.decode_chunk(stored, "c/9")
    assert e.value.codec == "zstd" and e.value.key == "c/9"


# -- a bomb chunk through the whole read, in a fresh process that measures its memory -------------------


def _small_array(path: str, compressors, zarr_format: int = 3, chunks: int = 1, items: int = 12) -> str:
    """An array of ``chunks`` float32 chunks of ``items`` elements at ``path`` written by zarr-python; the file
    of its chunk 0 (or of chunk 5 where there are more than five)."""
    zarr.create_array(path, shape=(items * chunks,), chunks=(items,), dtype="float32", compressors=compressors,
                      fill_value=0, zarr_format=zarr_format)[:] = 1
    key = "5" if chunks > 5 else "0"
    return os.path.join(path, "c", key) if zarr_format == 3 else os.path.join(path, key)


#: reads each ``(good, bomb)`` pair's good array first (the device's context, kernels and pools warm: not
#: counted), then each bomb, and prints the error and the growth of the process's peak RSS since the warm-up
BOMB_SCRIPT = textwrap.dedent("""
    import json, resource, sys, time
    import dask
    import gpuzarr_dist as gz
    from gpuzarr_dist.errors import ChunkDecodeError
    pairs, device, settings = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    out = {}
    with dask.config.set(settings):
        for good, _ in pairs.values():
            gz.from_zarr_gpu(good, device=device).compute(scheduler="synchronous")
        arrays = {name: gz.from_zarr_gpu(bomb, device=device) for name, (_, bomb) in pairs.items()}
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # one baseline: the peak only grows
        for name, x in arrays.items():
            t = time.perf_counter()
            try:
                x.compute(scheduler="synchronous")
                err = None
            except ChunkDecodeError as e:
                err = str(e)
            except Exception as e:
                err = "OTHER " + type(e).__name__ + ": " + str(e)
            out[name] = {"error": err, "grew_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before,
                         "seconds": time.perf_counter() - t}
    print(json.dumps(out))
""")


#: elements of the bombs' chunks: 1 MiB, so that the bombs are no larger than such a chunk may be stored
#: (a larger chunk file is refused unread: see the local-read tests below)
BOMB_ITEMS = 1 << 18


def _bombs(extra: bool = False) -> dict:
    """name -> (compressors, zarr format, bomb): each bomb decodes to far more than its 1 MiB chunk."""
    bombs = {
        "zstd": ([zc.ZstdCodec()], 3, zstd_bomb(GiB, stated=True)),
        "zstd-unstated": ([zc.ZstdCodec()], 3, zstd_bomb(GiB, stated=False)),
        "gzip": ([zc.GzipCodec()], 3, deflate_bomb(512 << 20, 31)),
        "zlib-v2": (numcodecs.Zlib(), 2, deflate_bomb(256 << 20, 15)),
    }
    if extra:  # frames that state a huge size: refused on the host before anything is allocated
        lz4 = numcodecs.LZ4().encode(bytes(4 * BOMB_ITEMS))
        blosc = bytearray(numcodecs.Blosc(cname="lz4").encode(np.zeros(BOMB_ITEMS, np.float32)))
        blosc[4:8] = GiB.to_bytes(4, "little")
        bombs["lz4-v2"] = (numcodecs.LZ4(), 2, GiB.to_bytes(4, "little") + lz4[4:])
        bombs["blosc"] = ([zc.BloscCodec(cname="lz4")], 3, bytes(blosc))
    return bombs


def _run_bombs(tmp_path, device: str, settings: dict, chunks: int = 1, extra: bool = False) -> None:
    """Every bomb of :func:`_bombs` as one chunk of an array of ``chunks`` chunks, read on ``device`` in a fresh
    process: ChunkDecodeError naming the array and the chunk, and peak RSS growth under 300 MB over them all."""
    pairs, keys = {}, {}
    for name, (compressors, zarr_format, bomb) in _bombs(extra).items():
        good = str(tmp_path / f"{name}-good.zarr")
        path = str(tmp_path / f"{name}.zarr")
        _small_array(good, compressors, zarr_format, chunks, BOMB_ITEMS)
        chunk = _small_array(path, compressors, zarr_format, chunks, BOMB_ITEMS)
        with open(chunk, "wb") as f:
            f.write(bomb)
        pairs[name] = (good, path)
        keys[name] = os.path.relpath(chunk, path).replace(os.sep, "/")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    run = subprocess.run([sys.executable, "-c", BOMB_SCRIPT, json.dumps(pairs), device, json.dumps(settings)],
                         capture_output=True, text=True, env=env, timeout=600, cwd=str(tmp_path))
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert set(result) == set(pairs)
    for name, r in result.items():
        assert r["error"] is not None and not r["error"].startswith("OTHER"), (name, r)
        assert pairs[name][1] in r["error"] and f"chunk {keys[name]!r}" in r["error"], (name, r)
        assert r["grew_kib"] < 300 * 1024, (name, r)


def test_bomb_chunks_raise_chunk_decode_error_with_little_memory(tmp_path):
    """A 1 GiB zstd bomb (stated size, and none), a 512 MiB gzip bomb and a 256 MiB zlib bomb (Zarr v2), each
    the stored chunk of a 1 MiB chunk: ChunkDecodeError naming the array and chunk, and the process's peak RSS
    grows by less than 300 MB over them all (each alone grew it by its decoded size and more before)."""
    _run_bombs(tmp_path, "cpu", {}, extra=True)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", ["nvcomp", "small-batch-on-cpu"])
def test_bomb_chunks_on_the_gpu_device(tmp_path, batch):
    """The same bombs (and lz4 and Blosc frames stating 1 GiB) as chunk 5 of 64 on the GPU device: through
    nvCOMP's path (checks on the host and device walks, suspects judged by the bounded CPU decoders) and as a
    small batch the CPU decodes; ChunkDecodeError naming the array and chunk, host RSS growth under 300 MB."""
    settings = ({"gpuzarr.gpu.min-batch": 0, "gpuzarr.gpu.min-batch-chunks": 0} if batch == "nvcomp"
                else {"gpuzarr.gpu.min-batch-chunks": 1000})
    _run_bombs(tmp_path, "gpu", settings, chunks=64, extra=True)


# -- local reads: regular files of a sensible size only ---------------------------------------------


def _read_cpu(path: str):
    return gz.from_zarr_gpu(path, device="cpu").compute(scheduler="synchronous")


def _chunk_store(path: str):
    from gpuzarr_dist.array.reader import BlockReader
    from gpuzarr_dist.stores.source import open_source

    store, spec = open_source(path)
    BlockReader(store, spec, "cpu")  # sets the store's limit from the codec chain
    return store


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_a_chunk_linked_to_dev_zero_is_refused_at_once(tmp_path):
    path = str(tmp_path / "a.zarr")
    chunk = _small_array(path, [zc.ZstdCodec()])
    os.remove(chunk)
    os.symlink("/dev/zero", chunk)
    t = time.perf_counter()
    with pytest.raises(ChunkReadError, match=r"'c/0'.*character device, not a regular file") as e:
        _read_cpu(path)
    assert path in str(e.value) and time.perf_counter() - t < 10
    store = _chunk_store(path)  # the whole-file read of the GPU path (read_into) and kvikio's sizing refuse it too
    with pytest.raises(ChunkReadError, match="character device"):
        store.read_into(["c/0"], lambda n: np.empty(n, np.uint8))
    with pytest.raises(ChunkReadError, match="character device"):
        store.size_or_missing("c/0")


def test_a_pipe_as_chunk_is_refused_without_waiting_for_a_writer(tmp_path):
    path = str(tmp_path / "a.zarr")
    chunk = _small_array(path, [zc.ZstdCodec()])
    os.remove(chunk)
    os.mkfifo(chunk)
    with pytest.raises(ChunkReadError, match="a pipe, not a regular file"):
        _read_cpu(path)


@pytest.mark.parametrize("compressors", [[zc.ZstdCodec()], None])
def test_a_huge_sparse_chunk_file_is_refused_before_any_allocation(tmp_path, compressors):
    """A 20 GiB sparse file where a 48-byte chunk belongs: ChunkReadError naming it, read by neither path."""
    path = str(tmp_path / "a.zarr")
    chunk = _small_array(path, compressors)
    with open(chunk, "r+b") as f:
        f.truncate(20 * GiB)
    with pytest.raises(ChunkReadError, match=rf"'c/0'.*holds {20 * GiB} bytes, more than a chunk of this array") as e:
        _read_cpu(path)
    assert path in str(e.value)
    store = _chunk_store(path)
    asked = []
    with pytest.raises(ChunkReadError, match="more than a chunk"):
        store.read_into(["c/0"], lambda n: asked.append(n) or np.empty(n, np.uint8))
    assert not asked  # refused before the staging buffer was asked for


@pytest.mark.gpu
@pytest.mark.parametrize("local_reads", ["auto", "threads"])
def test_local_read_refusals_on_the_gpu_device(tmp_path, local_reads):
    """/dev/zero and a 20 GiB sparse file as chunk files, read on the GPU device (through kvikio where it is
    installed, else preadv): ChunkReadError naming the array and chunk, before the pinned staging buffer."""
    zero, sparse = str(tmp_path / "zero.zarr"), str(tmp_path / "sparse.zarr")
    chunk = _small_array(zero, [zc.ZstdCodec()])
    os.remove(chunk)
    os.symlink("/dev/zero", chunk)
    with open(_small_array(sparse, [zc.ZstdCodec()]), "r+b") as f:
        f.truncate(20 * GiB)
    with dask.config.set({"gpuzarr.local-reads": local_reads}):
        for path, why in ((zero, "character device, not a regular file"), (sparse, "more than a chunk of this array")):
            t = time.perf_counter()
            with pytest.raises(ChunkReadError, match=why) as e:
                gz.from_zarr_gpu(path, device="gpu").compute(scheduler="synchronous")
            assert path in str(e.value) and "'c/0'" in str(e.value) and time.perf_counter() - t < 30


def test_the_stored_limit_lets_every_real_chunk_through(tmp_path):
    """Incompressible data, compressed and checksummed, reads back as zarr-python reads it."""
    data = np.random.default_rng(5).integers(0, 2**63, size=(64, 33), dtype=np.int64)
    for compressors in ([zc.ZstdCodec(level=1), zc.Crc32cCodec()], [zc.GzipCodec()], [zc.BloscCodec(cname="lz4")], None):
        path = str(tmp_path / f"r{len(os.listdir(tmp_path))}.zarr")
        zarr.create_array(path, shape=data.shape, chunks=(16, 33), dtype=data.dtype, compressors=compressors)[:] = data
        np.testing.assert_array_equal(_read_cpu(path), zarr.open_array(path)[:])


# -- a block that cannot fit fails fast --------------------------------------------------------------


def test_a_block_larger_than_memory_fails_fast_naming_it(tmp_path):
    """A one-block read of 8 TB in 10**12 one-element chunks: planned chunk by chunk, it ran for minutes."""
    from gpuzarr_dist.core.layout import host_memory_available
    from gpuzarr_dist.errors import BlockTooLargeError

    path = str(tmp_path / "big.zarr")
    zarr.create_array(path, shape=(10**6, 10**6), chunks=(1, 1), dtype="float64", fill_value=0)
    x = gz.from_zarr_gpu(path, device="cpu", chunks=(10**6, 10**6))
    assert host_memory_available() < 8 * 10**12
    t = time.perf_counter()
    with pytest.raises(BlockTooLargeError, match=r"big.zarr: a block of shape \(1000000, 1000000\) \(7\.28 TiB of "
                                                 r"float64\) cannot fit in the host's available memory") as e:
        x.compute(scheduler="synchronous")
    assert time.perf_counter() - t < 10
    assert isinstance(e.value, MemoryError) and "chunks=" in str(e.value)


def test_plan_selection_checks_only_where_asked():
    from gpuzarr_dist.core.metadata import ArraySpec
    from gpuzarr_dist.core.selection import plan_selection
    from gpuzarr_dist.errors import BlockTooLargeError

    spec = ArraySpec(name="a", shape=(100, 10), chunk_shape=(10, 10), dtype=np.dtype("float32"), fill_value=0,
                     zarr_format=3, codecs=(), key_prefix="c", key_separator="/", metadata_key="zarr.json")
    assert plan_selection(spec, (slice(None), slice(None)), (4000, "x")).n_parts == 10  # exactly fits
    with pytest.raises(BlockTooLargeError, match="cannot fit in x"):
        plan_selection(spec, (slice(None), slice(None)), (3999, "x"))
    assert plan_selection(spec, (slice(None), slice(None))).n_parts == 10


@pytest.mark.gpu
def test_a_block_larger_than_the_gpu_fails_fast(tmp_path):
    from gpuzarr_dist.errors import BlockTooLargeError

    path = str(tmp_path / "big.zarr")
    zarr.create_array(path, shape=(10**6, 10**6), chunks=(1, 1), dtype="float64", fill_value=0)
    t = time.perf_counter()
    with pytest.raises(BlockTooLargeError, match=r"\(7\.28 TiB of float64\) cannot fit in the GPU's memory"):
        gz.from_zarr_gpu(path, device="gpu", chunks=(10**6, 10**6)).compute(scheduler="synchronous")
    assert time.perf_counter() - t < 10
