"""Bad input fails with the documented error, naming what caused it."""

from __future__ import annotations

import json
import os
import pathlib

import numcodecs
import numpy as np
import pytest
import zarr
import zarr.codecs as zc
from conftest import assert_same, compute_checked, dev, make_data, reference, write_array

import gpuzarr_dist as gz

# --------------------------------------------------------------------------- missing stores

pytestmark = pytest.mark.usefixtures("device")


@pytest.mark.parametrize("kind", ["str", "pathlib", "file-url"])
def test_missing_path_raises_file_not_found_naming_it(tmp_path, kind):
    path = tmp_path / "does-not-exist.zarr"
    source = {"str": str(path), "pathlib": path, "file-url": path.as_uri()}[kind]
    with pytest.raises(FileNotFoundError) as info:
        gz.from_zarr_gpu(source, device=dev())
    assert str(path) in str(info.value)


@pytest.mark.parametrize("fmt", [2, 3])
def test_missing_component_raises_file_not_found_naming_it(tmp_path, fmt):
    path = str(tmp_path / "g.zarr")
    zarr.open_group(path, mode="w", zarr_format=fmt).create_array("x", shape=(3,), dtype="i4")
    with pytest.raises(FileNotFoundError) as info:
        gz.from_zarr_gpu(path, "nothere", device=dev())
    assert os.path.join(path, "nothere") in str(info.value)
    with pytest.raises(FileNotFoundError) as info:
        gz.from_zarr_gpu(zarr.open_group(path, mode="r"), "nothere", device=dev())
    assert "nothere" in str(info.value)


def test_empty_folder_raises_file_not_found(tmp_path):
    path = tmp_path / "empty.zarr"
    path.mkdir()
    with pytest.raises(FileNotFoundError) as info:
        gz.from_zarr_gpu(str(path), device=dev())
    assert str(path) in str(info.value)


# --------------------------------------------------------------------------- unreadable metadata


def _write_small(path: str, fmt: int, **kw) -> None:
    write_array(path, np.arange(12, dtype="int32").reshape(4, 3), (2, 3), zarr_format=fmt, **kw)


def _edit_json(path: str, edit) -> None:
    with open(path) as f:
        doc = json.load(f)
    edit(doc)
    with open(path, "w") as f:
        json.dump(doc, f)


CORRUPTIONS = {
    "not-json": lambda p: pathlib.Path(p).write_text("{not json"),
    "empty": lambda p: pathlib.Path(p).write_text(""),
    "binary": lambda p: pathlib.Path(p).write_bytes(b"\xff\xfe\x00garbage\x80"),
    "not-an-object": lambda p: pathlib.Path(p).write_text("[1, 2, 3]"),
    "shape-missing": lambda p: _edit_json(p, lambda d: d.pop("shape")),
    "shape-not-a-list": lambda p: _edit_json(p, lambda d: d.update(shape="abc")),
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
@pytest.mark.parametrize("fmt,doc", [(3, "zarr.json"), (2, ".zarray")])
def test_unreadable_metadata_raises_metadata_error_naming_the_document(tmp_path, fmt, doc, corruption):
    path = str(tmp_path / "bad.zarr")
    _write_small(path, fmt)
    CORRUPTIONS[corruption](os.path.join(path, doc))
    with pytest.raises(gz.MetadataError) as info:
        gz.from_zarr_gpu(path, device=dev())
    assert doc in str(info.value)
    assert path in str(info.value)


@pytest.mark.parametrize("where", ["end", "start"])
def test_unknown_v3_codec_raises_unsupported_codec_error(tmp_path, where):
    path = str(tmp_path / "u.zarr")
    _write_small(path, 3)

    def add(doc):
        if where == "end":
            doc["codecs"].append({"name": "nonexistent_codec"})
        else:
            doc["codecs"].insert(0, {"name": "nonexistent_codec", "configuration": {}})

    _edit_json(os.path.join(path, "zarr.json"), add)
    with pytest.raises(gz.UnsupportedCodecError) as info:
        gz.from_zarr_gpu(path, device=dev())
    assert "nonexistent_codec" in str(info.value)


@pytest.mark.parametrize("field", ["compressor", "filters"])
def test_unknown_v2_codec_raises_unsupported_codec_error(tmp_path, field):
    path = str(tmp_path / "u2.zarr")
    _write_small(path, 2)
    codec = {"id": "nonexistent_codec"}
    _edit_json(os.path.join(path, ".zarray"), lambda d: d.update({field: codec if field == "compressor" else [codec]}))
    with pytest.raises(gz.UnsupportedCodecError) as info:
        gz.from_zarr_gpu(path, device=dev())
    assert "nonexistent_codec" in str(info.value)


# --------------------------------------------------------------------------- chunks that fail to decode

SHAPE, CHUNKS = (8, 6), (4, 3)


def _zstd_wrong_size(raw: bytes, nbytes: int) -> bytes:
    return numcodecs.Zstd().encode(b"\x01" * (nbytes - 8))


def _flip_body_byte(raw: bytes, nbytes: int) -> bytes:
    b = bytearray(raw)
    b[0] ^= 0xFF  # the data, not the 4 checksum bytes at the end
    return bytes(b)


DAMAGE = {
    "garbage": lambda raw, n: bytes(range(7, 57)),
    "truncated": lambda raw, n: raw[: len(raw) // 2],
    "empty": lambda raw, n: b"",
    "too-long": lambda raw, n: raw + b"\x00" * 16,
    "wrong-size": _zstd_wrong_size,
    "crc-mismatch": _flip_body_byte,
}

CASES = [
    # (format, codecs, damage, chunk key)
    (3, {"compressors": [zc.ZstdCodec()]}, "garbage", "c/0/1"),
    (3, {"compressors": [zc.ZstdCodec()]}, "truncated", "c/0/1"),
    (3, {"compressors": [zc.ZstdCodec()]}, "empty", "c/0/1"),
    (3, {"compressors": [zc.ZstdCodec()]}, "wrong-size", "c/1/0"),
    (3, {"compressors": [zc.GzipCodec()]}, "garbage", "c/1/1"),
    (3, {"compressors": [zc.GzipCodec()]}, "truncated", "c/0/1"),
    (3, {"compressors": [zc.BloscCodec(cname="lz4")]}, "truncated", "c/0/1"),
    (3, {"compressors": [zc.BloscCodec(cname="zstd")]}, "garbage", "c/0/1"),
    (3, {"compressors": None}, "truncated", "c/0/1"),
    (3, {"compressors": None}, "empty", "c/1/1"),
    (3, {"compressors": None}, "too-long", "c/0/1"),
    (3, {"compressors": [zc.Crc32cCodec()]}, "crc-mismatch", "c/0/1"),
    (3, {"compressors": [zc.Crc32cCodec()]}, "truncated", "c/0/1"),
    (3, {"compressors": [zc.ZstdCodec(), zc.Crc32cCodec()]}, "crc-mismatch", "c/1/0"),
    (2, {"compressors": numcodecs.Zlib()}, "garbage", "0.1"),
    (2, {"compressors": numcodecs.Zstd()}, "wrong-size", "1.0"),
    (2, {"compressors": numcodecs.LZ4()}, "truncated", "0.1"),
    (2, {"compressors": numcodecs.Blosc()}, "truncated", "1.1"),
    (2, {"compressors": None}, "truncated", "0.1"),
    (2, {"compressors": None, "chunk_key_encoding": {"name": "v2", "separator": "/"}}, "empty", "0/1"),
]


def _case_id(case):
    fmt, kw, damage, key = case
    comp = kw["compressors"]
    comp = type(comp[-1] if isinstance(comp, list) else comp).__name__ if comp is not None else "raw"
    return f"v{fmt}-{comp}-{damage}-{key}"


@pytest.mark.parametrize("component", [None, "grp/arr"], ids=["root", "component"])
@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_chunk_that_fails_to_decode_raises_chunk_decode_error(tmp_path, case, component):
    fmt, kw, damage, key = case
    root = str(tmp_path / "store.zarr")
    if component:
        zarr.open_group(root, mode="w", zarr_format=fmt).require_group("grp")
    data = make_data("int32", SHAPE, seed=31)
    write_array(root, data, CHUNKS, name=component, zarr_format=fmt, **kw)
    path = os.path.join(root, component) if component else root
    expected = reference(root, component)
    chunk_file = os.path.join(path, *key.split("/"))
    raw = pathlib.Path(chunk_file).read_bytes()
    pathlib.Path(chunk_file).write_bytes(DAMAGE[damage](raw, int(np.prod(CHUNKS)) * 4))

    x = gz.from_zarr_gpu(root, component, device=dev())  # building the graph reads no chunk
    with pytest.raises(gz.ChunkDecodeError) as info:
        x.compute()
    msg = str(info.value)
    assert repr(key) in msg or key in msg
    assert path in msg
    assert info.value.key == key
    # chunks that are intact still read (the error is about that one chunk)
    good = np.s_[:4, :3] if key not in ("c/0/0", "0.0", "0/0") else np.s_[4:, 3:]
    assert_same(compute_checked(x[good]), expected[good])


def test_chunk_path_that_cannot_be_read_raises_chunk_read_error(tmp_path):
    path = str(tmp_path / "r.zarr")
    write_array(path, make_data("int16", SHAPE, seed=32), CHUNKS)
    chunk = os.path.join(path, "c", "1", "0")
    os.remove(chunk)
    os.mkdir(chunk)  # a folder where the chunk file should be
    x = gz.from_zarr_gpu(path, device=dev())
    with pytest.raises(gz.ChunkReadError) as info:
        x.compute()
    assert "c/1/0" in str(info.value)
    assert path in str(info.value)


# --------------------------------------------------------------------------- groups and components


@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize("as_object", [False, True], ids=["path", "zarr.Group"])
def test_group_without_component_lists_its_arrays(tmp_path, fmt, as_object):
    path = str(tmp_path / "g.zarr")
    g = zarr.open_group(path, mode="w", zarr_format=fmt)
    g.create_array("temperature", shape=(3,), dtype="f4")
    g.create_array("pressure", shape=(3,), dtype="f4")
    source = zarr.open_group(path, mode="r") if as_object else path
    with pytest.raises(ValueError) as info:
        gz.from_zarr_gpu(source, device=dev())
    assert "temperature" in str(info.value)
    assert "pressure" in str(info.value)


@pytest.mark.parametrize("component", ["..", "../other", "grp/../x", "./x", "grp/./x"])
@pytest.mark.parametrize("source_kind", ["path", "group", "store"])
def test_component_with_dot_parts_is_rejected(tmp_path, component, source_kind):
    path = str(tmp_path / "g.zarr")
    g = zarr.open_group(path, mode="w")
    g.require_group("grp").create_array("x", shape=(3,), dtype="f4")
    g.create_array("x", shape=(3,), dtype="f4")
    source = {
        "path": path,
        "group": zarr.open_group(path, mode="r"),
        "store": zarr.storage.LocalStore(path, read_only=True),
    }[source_kind]
    with pytest.raises(ValueError, match=r"\.\."  if ".." in component else r"'\.'"):
        gz.from_zarr_gpu(source, component, device=dev())


def test_unsupported_source_type_raises_type_error():
    with pytest.raises(TypeError):
        gz.from_zarr_gpu(12345, device=dev())
