"""Fuzzing of metadata parsing: random and mutated ``zarr.json`` / ``.zarray`` / ``.zattrs`` documents.

Every generated store either opens (and then reads what zarr-python reads, for
small arrays) or fails with :class:`~gpuzarr_dist.MetadataError` (or its
subclass :class:`~gpuzarr_dist.UnsupportedCodecError`) naming the store and the
metadata document: never another exception, a crash or a hang.

Deterministic in CI: ``derandomize=True`` and no example database, so every run
draws the same cases. The example counts are explicit (docs/reliability.md
gives the totals).
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
import warnings

import numpy as np
import pytest
import zarr
from conftest import assert_same
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import gpuzarr_dist as gz

FUZZ = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

DTYPES_V3 = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
             "float16", "float32", "float64", "complex64", "complex128"]
DTYPES_V2 = ["|b1", "|i1", "<i2", ">i4", "<i8", "|u1", ">u2", "<u4", "<u8", "<f2", ">f4", "<f8", "<c8", ">c16"]

#: values a mutation may put anywhere: wrong types, edge numbers, odd strings
ODD_SCALARS = st.one_of(
    st.sampled_from([None, True, False, 0, -1, 1, 2**31, 2**63, 2**64, -(2**63) - 1, 10**30, 0.5, -0.0, 1e308,
                     "", "NaN", "Infinity", "-Infinity", "0x7fc00000", "abc", "..", "../..", "/etc/passwd",
                     "c", "/", ".", "\\", "\x00", "int32", "<f8", "|O", "object", "pickle", "zstd", "bytes",
                     "regular", "default", "v2", "C", "F", "little", "big"]),
    st.integers(-(2**65), 2**65),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)
ODD_VALUES = st.recursive(
    ODD_SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(["name", "id", "configuration", "x", "shape", "chunk_shape", "level", "endian", "order", "separator"]), inner, max_size=3)),
    max_leaves=6,
)


def _v3_codecs(draw, ndim: int) -> list:
    chain = []
    if ndim > 1 and draw(st.booleans()):
        chain.append({"name": "transpose", "configuration": {"order": list(draw(st.permutations(range(ndim))))}})
    chain.append({"name": "bytes", "configuration": {"endian": draw(st.sampled_from(["little", "big"]))}})
    comp = draw(st.sampled_from([None, "zstd", "gzip", "crc32c", "blosc", "numcodecs.zlib", "numcodecs.lz4"]))
    if comp == "zstd":
        chain.append({"name": "zstd", "configuration": {"level": 1, "checksum": draw(st.booleans())}})
    elif comp == "gzip":
        chain.append({"name": "gzip", "configuration": {"level": 1}})
    elif comp == "blosc":
        chain.append({"name": "blosc", "configuration": {"cname": "lz4", "clevel": 1, "shuffle": "noshuffle", "typesize": 4, "blocksize": 0}})
    elif comp is not None:
        chain.append({"name": comp, "configuration": {}} if comp != "crc32c" else {"name": "crc32c"})
    return chain


@st.composite
def valid_docs(draw):
    """``(format, {document name: JSON value})`` for a small valid array without chunks."""
    fmt = draw(st.sampled_from([2, 3]))
    ndim = draw(st.integers(0, 3))
    shape = [draw(st.integers(0, 5)) for _ in range(ndim)]
    chunks = [draw(st.integers(1, 4)) for _ in range(ndim)]
    if fmt == 3:
        dtype = draw(st.sampled_from(DTYPES_V3))
        fill = False if dtype == "bool" else [0.0, 0.0] if dtype.startswith("complex") else 0.0 if dtype.startswith("float") else 0
        if dtype.startswith("float") and draw(st.booleans()):
            fill = draw(st.sampled_from(["NaN", "Infinity", -1.5]))
        sep = draw(st.sampled_from(["/", "."]))
        enc = draw(st.sampled_from(["default", "v2"]))
        doc = {
            "zarr_format": 3,
            "node_type": "array",
            "shape": shape,
            "data_type": dtype,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
            "chunk_key_encoding": {"name": enc, "configuration": {"separator": sep}},
            "fill_value": fill,
            "codecs": _v3_codecs(draw, ndim),
            "attributes": {"units": "K"},
        }
        if ndim and draw(st.integers(0, 4)) == 0:  # sharded: the chunk is the shard, inner chunks divide it
            inner = [c if draw(st.booleans()) or c == 1 else 1 for c in chunks]
            doc["codecs"] = [{"name": "sharding_indexed", "configuration": {
                "chunk_shape": inner, "codecs": doc["codecs"],
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                "index_location": draw(st.sampled_from(["start", "end"]))}}]
        return 3, {"zarr.json": doc}
    dtype = draw(st.sampled_from(DTYPES_V2))
    doc = {
        "zarr_format": 2,
        "shape": shape,
        "chunks": chunks,
        "dtype": dtype,
        "fill_value": draw(st.sampled_from([None, False if dtype == "|b1" else [0.0, 0.0] if dtype[1] == "c" else 0.0 if dtype[1] == "f" else 0])),
        "order": draw(st.sampled_from(["C", "F"])),
        "filters": draw(st.sampled_from([None, [{"id": "delta", "dtype": dtype}]])) if dtype[1] in "iu" else None,
        "compressor": draw(st.sampled_from([None, {"id": "zstd", "level": 1}, {"id": "zlib", "level": 1},
                                            {"id": "lz4", "acceleration": 1}, {"id": "gzip", "level": 1}])),
        "dimension_separator": draw(st.sampled_from([".", "/"])),
    }
    return 2, {".zarray": doc, ".zattrs": {"long_name": "t"}}


def _paths(value, prefix=()):
    """Every path (tuple of keys/indexes) into a JSON value."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


def _set(doc, path, value, delete=False):
    node = doc
    for p in path[:-1]:
        node = node[p]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value


@st.composite
def mutated_docs(draw):
    """A valid document set with 1-3 mutations: a field replaced, removed or added, or the text damaged."""
    fmt, docs = draw(valid_docs())
    docs = copy.deepcopy(docs)
    texts: dict[str, bytes] = {}
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(sorted(docs)))
        doc = docs[name]
        kind = draw(st.sampled_from(["replace", "replace", "replace", "delete", "add", "text", "whole"]))
        paths = [p for p in _paths(doc) if p]
        if kind == "whole":
            docs[name] = draw(ODD_VALUES)
        elif kind == "text":
            raw = json.dumps(doc).encode()
            how = draw(st.sampled_from(["truncate", "flip", "binary", "empty"]))
            if how == "truncate":
                raw = raw[: draw(st.integers(0, max(0, len(raw) - 1)))]
            elif how == "flip" and raw:
                i = draw(st.integers(0, len(raw) - 1))
                raw = raw[:i] + bytes([raw[i] ^ (1 << draw(st.integers(0, 7)))]) + raw[i + 1 :]
            elif how == "binary":
                raw = draw(st.binary(max_size=32))
            else:
                raw = b""
            texts[name] = raw
        elif kind == "add" and isinstance(doc, dict):
            doc[draw(st.sampled_from(["storage_transformers", "extra", "dimension_names", "must_understand"]))] = draw(ODD_VALUES)
        elif paths and isinstance(doc, (dict, list)):
            path = draw(st.sampled_from(paths))
            _set(doc, path, draw(ODD_VALUES), delete=(kind == "delete" and isinstance(path[-1], str)))
    out = {name: texts.get(name, json.dumps(doc, allow_nan=True).encode()) for name, doc in docs.items()}
    return fmt, out


def _write_docs(folder: str, docs: dict[str, bytes]) -> None:
    for name in ("zarr.json", ".zarray", ".zattrs"):
        p = os.path.join(folder, name)
        if os.path.exists(p):
            os.remove(p)
    for name, raw in docs.items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(raw)


def _check_opens_or_metadata_error(folder: str, docs: dict[str, bytes]) -> None:
    _write_docs(folder, docs)
    doc_name = "zarr.json" if "zarr.json" in docs else ".zarray"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            x = gz.from_zarr_gpu(folder, device="cpu")
    except gz.MetadataError as e:  # UnsupportedCodecError is a MetadataError too
        msg = str(e)
        event(f"{type(e).__name__}")
        assert folder in msg, msg
        assert isinstance(e, gz.UnsupportedCodecError) or doc_name in msg or ".zattrs" in msg or "zarr.json" in msg, msg
        return
    except ValueError as e:  # valid metadata, but more blocks than dask can list: said so, naming the array
        assert "too many dask blocks" in str(e) and folder in str(e), str(e)
        event("too many blocks")
        return
    event("opened")
    # it opened: zarr-python must agree that it is an array, and read the same values
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = zarr.open_array(folder, mode="r")
    assert x.shape == ref.shape
    assert x.dtype.newbyteorder("=") == ref.dtype.newbyteorder("=") if hasattr(ref.dtype, "newbyteorder") else True
    if x.size <= 512:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = np.asarray(ref[...])
        assert_same(x.compute(), expected)


@pytest.fixture(scope="module")
def fuzz_folder():
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "fuzz.zarr")
        os.mkdir(folder)
        yield folder


@settings(max_examples=300, **FUZZ)
@given(case=valid_docs())
def test_valid_documents_open_and_read_like_zarr(fuzz_folder, case):
    fmt, docs = case
    _check_opens_or_metadata_error(fuzz_folder, {k: json.dumps(v).encode() for k, v in docs.items()})
    # unmutated documents must open
    gz.from_zarr_gpu(fuzz_folder, device="cpu")


@settings(max_examples=1200, **FUZZ)
@given(case=mutated_docs())
def test_mutated_documents_open_or_raise_metadata_error(fuzz_folder, case):
    fmt, docs = case
    _check_opens_or_metadata_error(fuzz_folder, docs)


@settings(max_examples=200, **FUZZ)
@given(raw=st.one_of(st.binary(max_size=64), ODD_VALUES.map(lambda v: json.dumps(v, allow_nan=True).encode())),
       name=st.sampled_from(["zarr.json", ".zarray"]))
def test_random_documents_raise_metadata_error(fuzz_folder, raw, name):
    _write_docs(fuzz_folder, {name: raw})
    with pytest.raises((gz.MetadataError, FileNotFoundError)) as info:
        gz.from_zarr_gpu(fuzz_folder, device="cpu")
    assert fuzz_folder in str(info.value)


@pytest.mark.parametrize("shape,chunks", [(2**64, [1]), ([2**63], [1]), ([4], [2**64]), ([2**62, 2**62], [2**61, 2**61])])
def test_dimensions_beyond_int64_raise_metadata_error(fuzz_folder, shape, chunks):
    """Found by the fuzzer: zarr-python accepts them, numpy and dask cannot index them."""
    doc = {"zarr_format": 3, "node_type": "array", "shape": shape, "data_type": "bool",
           "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
           "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}}, "fill_value": False,
           "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}
    _write_docs(fuzz_folder, {"zarr.json": json.dumps(doc).encode()})
    try:
        gz.from_zarr_gpu(fuzz_folder, device="cpu")
    except gz.MetadataError as e:
        assert "zarr.json" in str(e) and fuzz_folder in str(e)
    else:
        pytest.fail("opened an array numpy cannot index")


@pytest.mark.parametrize("fmt,edit,field", [
    (3, {"shape": "abc"}, "'shape'"),
    (3, {"shape": [4, 4]}, "'chunk_grid.configuration.chunk_shape'"),
    (3, {"chunk_key_encoding": {"name": "default", "configuration": {"separator": "x"}}}, "'chunk_key_encoding.configuration.separator'"),
    (3, {"codecs": [{"name": "bytes", "configuration": 5}]}, "'codecs'"),
    (2, {"chunks": [0]}, "'chunks'"),
    (2, {"order": "K"}, "'order'"),
    (2, {"filters": [{"x": 1}]}, "'filters'"),
    (2, {"dimension_separator": "\\\\"}, "'dimension_separator'"),
])
def test_metadata_errors_name_the_field(tmp_path, fmt, edit, field):
    path = str(tmp_path / "f.zarr")
    zarr.create_array(path, shape=(4,), chunks=(2,), dtype="i4", zarr_format=fmt)
    doc = os.path.join(path, "zarr.json" if fmt == 3 else ".zarray")
    with open(doc) as f:
        meta = json.load(f)
    meta.update(edit)
    with open(doc, "w") as f:
        json.dump(meta, f)
    with pytest.raises(gz.MetadataError) as info:
        gz.from_zarr_gpu(path, device="cpu")
    assert f"field {field}" in str(info.value) and os.path.basename(doc) in str(info.value) and path in str(info.value)


def test_bad_metadata_field_accepts_what_zarr_python_writes(tmp_path):
    from gpuzarr_dist.core.metadata import bad_metadata_field

    for fmt in (2, 3):
        for i, kw in enumerate([{}, {"shards": (4,)}, {"compressors": None}, {"filters": None}, {"fill_value": 3}]):
            if fmt == 2 and "shards" in kw:
                continue
            path = str(tmp_path / f"ok{fmt}{i}.zarr")
            zarr.create_array(path, shape=(8,), chunks=(2,), dtype="f4", zarr_format=fmt, attributes={"a": 1}, **kw)
            for name in ("zarr.json", ".zarray", ".zattrs"):
                if os.path.exists(os.path.join(path, name)):
                    with open(os.path.join(path, name)) as f:
                        assert bad_metadata_field(json.load(f), name) is None, (fmt, kw, name)
