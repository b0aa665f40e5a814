"""Normalised array metadata: what a task needs to find and decode chunks.

zarr-python parses and validates the metadata documents; this module turns the
result into a small, picklable :class:`ArraySpec` that describes both Zarr
formats the same way: a regular chunk grid, a chunk key encoding and one codec
chain in the Zarr v3 form (array->array codecs, one array->bytes codec,
bytes->bytes codecs). Zarr v2 maps onto it as ``[transpose (order F)],
filters..., bytes(endian of the dtype), compressor``.

Nothing here touches a store, a codec implementation or a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuzarr_dist.errors import MetadataError


@dataclass(frozen=True)
class CodecSpec:
    """One codec of the chain: its metadata name and configuration."""

    name: str
    configuration: dict = field(default_factory=dict, hash=False, compare=True)
    #: in a Zarr v2 chain: ``"filter"`` or ``"compressor"`` (decides the kind of a codec only numcodecs knows)
    role: str | None = None


@dataclass(frozen=True)
class ArraySpec:
    """Everything about one Zarr array that reading it needs, store aside."""

    name: str  # for messages: the array's path or URL
    shape: tuple[int, ...]
    chunk_shape: tuple[int, ...]
    dtype: np.dtype
    fill_value: Any
    zarr_format: int
    codecs: tuple[CodecSpec, ...]
    key_prefix: str  # "c" for the v3 default encoding, "" for v2-style keys
    key_separator: str
    metadata_key: str  # "zarr.json" or ".zarray"
    #: for sharded arrays: the shard shape (``chunk_shape`` is then the inner chunk shape),
    #: the codecs of the shard index and where the index is ("start" or "end")
    shard_shape: tuple[int, ...] | None = None
    shard_index_codecs: tuple[CodecSpec, ...] = ()
    shard_index_location: str = "end"
    #: for sharded arrays whose shard is transposed before ``sharding_indexed``: that order (the shard index
    #: lies in the transposed grid's C order; ``chunk_shape`` and chunk keys are in the array's own axes)
    shard_transpose: tuple[int, ...] | None = None

    @property
    def numeric(self) -> bool:
        """Whether the data type is a fixed-size number or bool (what the GPU device reads)."""
        return is_numeric(self.dtype)

    @property
    def read_unit(self) -> tuple[int, ...]:
        """The shape one stored object holds: the shard for sharded arrays, else the chunk."""
        return self.shard_shape or self.chunk_shape

    @property
    def chunks_per_shard(self) -> tuple[int, ...]:
        return tuple(s // c for s, c in zip(self.read_unit, self.chunk_shape))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def grid_shape(self) -> tuple[int, ...]:
        return tuple(math.ceil(s / c) if c else 0 for s, c in zip(self.shape, self.chunk_shape))

    @property
    def chunk_nbytes(self) -> int:
        return math.prod(self.chunk_shape) * self.dtype.itemsize

    def chunk_key(self, coords: tuple[int, ...]) -> str:
        """The key of the chunk at grid position ``coords``.

        For sharded arrays, the shard's store key followed by the chunk's
        position inside the shard, e.g. ``c/0/1[1,0]``. Built from integers
        only, so it cannot point outside the array's folder.
        """
        if self.shard_shape is not None:
            per = self.chunks_per_shard
            inner = ",".join(str(c % p) for c, p in zip(coords, per))
            return f"{self.store_key(tuple(c // p for c, p in zip(coords, per)))}[{inner}]"
        return self.store_key(coords)

    def chunk_keys(self, coords: Any) -> list[str]:
        """:meth:`chunk_key` of each row of ``coords`` (``(n, ndim)`` integers), vectorised.

        A sharded block or a batch of windows names a thousand or more inner
        chunks of a few shards: each shard's key and each distinct in-shard
        position is formatted once, then joined per chunk (about 10x faster
        than :meth:`chunk_key` per row).
        """
        if not self.ndim:  # a 0-d array has one chunk
            return [self.chunk_key(())] * len(coords)
        coords = np.asarray(coords, dtype=np.int64).reshape(-1, self.ndim)
        if not len(coords):
            return []
        if self.shard_shape is None:
            groups = [coords]
            per = None
        else:
            per = np.array(self.chunks_per_shard, dtype=np.int64)
            groups = [coords // per, coords % per]
        texts, shard_keys = [], None
        for g, part in enumerate(groups):
            dims = tuple(int(d) for d in part.max(axis=0) + 1)  # rows as single integers: a 1-d unique is fast
            ids, first, inv = np.unique(np.ravel_multi_index(tuple(part.T), dims), return_index=True, return_inverse=True)
            inv = inv.reshape(-1)
            uniq = np.stack(np.unravel_index(ids, dims), axis=1)
            if g == 0:
                names = [self.store_key(tuple(row)) for row in uniq.tolist()]
                if per is not None:  # the shards in first-seen order, and each key's shard number among them
                    order = np.argsort(first, kind="stable")
                    rank = np.empty(len(order), dtype=np.int64)
                    rank[order] = np.arange(len(order))
                    shard_keys, which = [names[i] for i in order.tolist()], rank[inv]
            else:
                names = [f"[{','.join(map(str, row))}]" for row in uniq.tolist()]
            texts.append([names[i] for i in inv.tolist()])
        if per is None:
            return texts[0]
        keys = ChunkKeys(a + b for a, b in zip(*texts))
        keys.shards, keys.which = shard_keys, which
        keys.inner = np.ravel_multi_index(tuple(groups[1].T), tuple(int(p) for p in per)).astype(np.int64)
        return keys

    def store_key(self, coords: tuple[int, ...]) -> str:
        """The store key of the object (chunk, or shard) at grid position ``coords`` of the stored grid."""
        if not self.key_prefix:  # Zarr v2 keys, or the v3 "v2" chunk key encoding
            return self.key_separator.join(map(str, coords)) if coords else "0"
        return self.key_separator.join((self.key_prefix, *map(str, coords)))


class ChunkKeys(list):
    """Inner-chunk keys of a sharded array (:meth:`ArraySpec.chunk_keys`) that also carry what the sharded
    store would parse back out of them: ``shards`` (the shard keys, in first-seen order), ``which`` (each
    key's shard number among them) and ``inner`` (each key's C-order position in its shard), int64 arrays.

    The keys are built from chunk coordinates, so the store need not split thousands of strings again per
    block (about 2 ms of Python for a block of 4000 inner chunks, with the GIL held). A slice
    or a copy is a plain list, which the store parses.
    """

    __slots__ = ("shards", "which", "inner")


def _v3_codecs(meta: dict, name: str) -> tuple[CodecSpec, ...]:
    out = []
    for i, c in enumerate(meta.get("codecs") or ()):
        if isinstance(c, str):
            c = {"name": c}
        if not isinstance(c, dict) or "name" not in c:
            raise MetadataError(f"{name}: zarr.json field codecs[{i}] is not a codec object: {c!r}")
        out.append(CodecSpec(str(c["name"]), dict(c.get("configuration") or {})))
    return tuple(out)


def _v2_codecs(meta: dict, dtype: np.dtype, ndim: int, name: str) -> tuple[CodecSpec, ...]:
    chain: list[CodecSpec] = []
    order = meta.get("order", "C")
    if order == "F" and ndim > 1:
        chain.append(CodecSpec("transpose", {"order": list(range(ndim))[::-1]}))
    elif order not in ("C", "F"):
        raise MetadataError(f"{name}: .zarray field 'order' must be 'C' or 'F', got {order!r}")
    for i, f in enumerate(meta.get("filters") or ()):
        if not isinstance(f, dict) or "id" not in f:
            raise MetadataError(f"{name}: .zarray field filters[{i}] is not a codec object: {f!r}")
        f = dict(f)
        chain.append(CodecSpec(str(f.pop("id")), f, "filter"))
    if dtype.hasobject:  # an object codec among the filters turns the array into bytes: no ``bytes`` codec
        if not any(c.name in _OBJECT_CODECS for c in chain):
            raise MetadataError(f"{name}: .zarray field 'filters': an object array needs an object codec "
                                f"({', '.join(sorted(_OBJECT_CODECS))}), got {[c.name for c in chain]}")
    else:
        endian = {">": "big", "<": "little"}.get(dtype.byteorder, "little")
        chain.append(CodecSpec("bytes", {"endian": endian}))
    comp = meta.get("compressor")
    if comp is not None:
        if not isinstance(comp, dict) or "id" not in comp:
            raise MetadataError(f"{name}: .zarray field 'compressor' is not a codec object: {comp!r}")
        comp = dict(comp)
        chain.append(CodecSpec(str(comp.pop("id")), comp, "compressor"))
    return tuple(chain)


#: numcodecs' object codecs (the array -> bytes codec of a Zarr v2 object array)
_OBJECT_CODECS = frozenset({"vlen-utf8", "vlen-bytes", "vlen-array", "json2", "msgpack2", "pickle"})


def is_numeric(dtype: np.dtype) -> bool:
    """A fixed-size number or bool: what the GPU device and its kernels read."""
    return dtype.kind in "biufc" and not dtype.hasobject


def _supported_dtype(dtype: np.dtype) -> bool:
    """Numbers and bools, fixed-length strings and bytes, structured types without objects, objects, and
    numpy's variable-length strings: what the CPU device reads."""
    if dtype.kind == "V":
        return not dtype.hasobject
    return dtype.kind in "biufcmMUSOT"


def _native_dtype(zdtype: Any) -> np.dtype:
    to_native = getattr(zdtype, "to_native_dtype", None)
    return np.dtype(to_native() if to_native else zdtype)


def _native_order(dtype: np.dtype) -> np.dtype:
    """``dtype`` in the machine's byte order (types without one, such as numpy's variable-length strings, as they are)."""
    return dtype.newbyteorder("=") if dtype.byteorder in "<>" else dtype


def _fill_value(raw: Any, dtype: np.dtype) -> Any:
    if raw is None:  # Zarr v2 without a fill value: zarr-python reads zeros
        return np.zeros((), dtype=dtype)[()]
    return np.asarray(raw, dtype=dtype)[()]


def spec_from_zarr_metadata(metadata: Any, name: str) -> ArraySpec:
    """Build an :class:`ArraySpec` from a zarr-python ``ArrayV2Metadata``/``ArrayV3Metadata``.

    Raises :class:`MetadataError` naming the document for anything it cannot
    describe, including metadata zarr-python opened but cannot itself serialise
    (seen with fuzzed fill values such as ``[]`` for a bool array).
    """
    try:
        return _spec_from_zarr_metadata(metadata, name)
    except MetadataError:
        raise
    except Exception as e:  # zarr-python's metadata objects raise many kinds of error
        doc = ".zarray" if getattr(metadata, "zarr_format", 3) == 2 else "zarr.json"
        raise MetadataError(f"{name}: {doc} could not be read: {type(e).__name__}: {e}") from e


def _spec_from_zarr_metadata(metadata: Any, name: str) -> ArraySpec:
    meta = metadata.to_dict()
    fmt = int(meta.get("zarr_format", 3))
    shape = tuple(int(s) for s in meta["shape"])
    if fmt == 3:
        mkey = "zarr.json"
        grid = meta.get("chunk_grid") or {}
        if grid.get("name") != "regular":
            raise MetadataError(f"{name}: zarr.json field chunk_grid {grid.get('name')!r} is not supported by gpuzarr-dist (only 'regular' grids are)")
        chunk_shape = tuple(int(c) for c in grid["configuration"]["chunk_shape"])
        dtype = _native_dtype(metadata.data_type)
        enc = meta.get("chunk_key_encoding") or {}
        sep = (enc.get("configuration") or {}).get("separator", "/" if enc.get("name") != "v2" else ".")
        if enc.get("name") == "default":
            prefix = "c"
        elif enc.get("name") == "v2":
            prefix = ""
        else:
            raise MetadataError(f"{name}: zarr.json field chunk_key_encoding: unknown encoding {enc.get('name')!r}")
        codecs = _v3_codecs(meta, name)
        shard_shape, index_codecs, index_location, shard_transpose = None, (), "end", None
        if any(c.name == "sharding_indexed" for c in codecs):
            codecs, chunk_shape, shard_shape, index_codecs, index_location, shard_transpose = _sharding(
                codecs, chunk_shape, name)
        if meta.get("storage_transformers"):
            raise MetadataError(f"{name}: zarr.json field storage_transformers is not supported by gpuzarr-dist")
    elif fmt == 2:
        shard_shape, index_codecs, index_location, shard_transpose = None, (), "end", None
        mkey = ".zarray"
        chunk_shape = tuple(int(c) for c in meta["chunks"])
        dtype = _native_dtype(metadata.dtype)
        sep = meta.get("dimension_separator") or "."
        prefix = ""
        codecs = _v2_codecs(meta, dtype, len(shape), name)
    else:
        raise MetadataError(f"{name}: unsupported zarr_format {fmt!r}")
    if sep not in (".", "/"):  # zarr-python checks this too; keys become paths, so check again here
        raise MetadataError(f"{name}: {mkey} chunk key separator must be '.' or '/', got {sep!r}")
    if not _supported_dtype(dtype):
        raise MetadataError(f"{name}: {mkey} field data type {dtype} is not supported by gpuzarr-dist")
    if len(chunk_shape) != len(shape) or any(c <= 0 for c in chunk_shape):
        field_name = "chunks" if fmt == 2 else "chunk_grid.configuration.chunk_shape"
        raise MetadataError(f"{name}: {mkey} field {field_name!r}: chunk shape {chunk_shape} does not fit array shape {shape}")
    if any(not 0 <= s < 2**63 for s in (*shape, *chunk_shape, *(shard_shape or ()))):  # numpy and dask index with int64
        raise MetadataError(f"{name}: {mkey} shape {shape} / chunk shape {shard_shape or chunk_shape} has a dimension outside 0 .. 2**63-1")
    for what, dims in (("chunk shape", chunk_shape), ("shard shape", shard_shape or ())):
        if math.prod(dims) * dtype.itemsize >= 2**63:  # no buffer that size can be allocated or indexed
            raise MetadataError(f"{name}: {mkey} {what} {dims} of {dtype} needs more than 2**63 bytes per chunk")
    return ArraySpec(
        name=name,
        shape=shape,
        chunk_shape=chunk_shape,
        dtype=_native_order(dtype),
        fill_value=_fill_value(metadata.fill_value, _native_order(dtype)),
        zarr_format=fmt,
        codecs=codecs,
        key_prefix=prefix,
        key_separator=sep,
        metadata_key=mkey,
        shard_shape=shard_shape,
        shard_index_codecs=index_codecs,
        shard_index_location=index_location,
        shard_transpose=shard_transpose,
    )


def _sharding(codecs: tuple[CodecSpec, ...], shard_shape: tuple[int, ...], name: str) -> tuple:
    """The sharded layout of a ``zarr.json`` codec chain holding ``sharding_indexed``: ``(inner codecs, inner
    chunk shape, shard shape, index codecs, index location, transpose order or None)``.

    Transposes before ``sharding_indexed`` are supported (the inner chunks then
    lie in the transposed shard's grid: their shape and keys are turned back to
    the array's axes here, the inner codecs start with that transpose, and the
    index is read in the transposed grid's order). Anything else around it
    raises :class:`MetadataError` saying it is not supported by gpuzarr-dist.
    """
    where = [i for i, c in enumerate(codecs) if c.name == "sharding_indexed"]
    pos = where[0]
    before, after = codecs[:pos], codecs[pos + 1 :]
    if len(where) > 1 or after or any(c.name != "transpose" for c in before):
        raise MetadataError(
            f"{name}: zarr.json codecs {[c.name for c in codecs]}: codecs other than transpose around "
            f"sharding_indexed are not supported by gpuzarr-dist (nested sharding goes inside its 'codecs')"
        )
    order: tuple[int, ...] = tuple(range(len(shard_shape)))
    for t in before:  # each transpose reorders what the previous one produced
        try:
            step = tuple(int(o) for o in t.configuration["order"])
        except (KeyError, TypeError, ValueError) as e:
            raise MetadataError(f"{name}: zarr.json transpose codec configuration is invalid: {e}") from e
        if sorted(step) != list(range(len(shard_shape))):
            raise MetadataError(f"{name}: zarr.json transpose order {list(step)} is not a permutation of "
                                f"{len(shard_shape)} axes")
        order = tuple(order[o] for o in step)
    cfg = codecs[pos].configuration
    try:
        inner_t = tuple(int(c) for c in cfg["chunk_shape"])
        inner_codecs = _v3_codecs({"codecs": cfg["codecs"]}, name)
        index_codecs = _v3_codecs({"codecs": cfg.get("index_codecs") or [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]}, name)
        index_location = cfg.get("index_location", "end")
    except (KeyError, TypeError, ValueError) as e:
        raise MetadataError(f"{name}: zarr.json field codecs[{pos}] (sharding_indexed) configuration is invalid: {e}") from e
    if index_location not in ("start", "end"):
        raise MetadataError(f"{name}: zarr.json sharding index_location must be 'start' or 'end', got {index_location!r}")
    shard_t = tuple(shard_shape[o] for o in order)
    if len(inner_t) != len(shard_t) or any(i <= 0 or s % i for s, i in zip(shard_t, inner_t)):
        raise MetadataError(f"{name}: zarr.json: inner chunk shape {inner_t} does not divide the shard shape {shard_t}")
    transposed = order != tuple(range(len(order)))
    inner = list(inner_t)
    for k, o in enumerate(order):  # axis k of the transposed shard is axis order[k] of the array
        inner[o] = inner_t[k]
    if transposed:
        inner_codecs = (CodecSpec("transpose", {"order": list(order)}), *inner_codecs)
    return inner_codecs, tuple(inner), shard_shape, index_codecs, index_location, (order if transposed else None)


# --------------------------------------------------------------------------- reading a document

#: the deepest nesting of arrays and objects a metadata document may have
MAX_JSON_DEPTH = 256


def json_depth(text: str | bytes) -> int:
    """The deepest nesting of ``[``/``{`` in a JSON text, brackets inside strings aside; no recursion."""
    data = text.encode() if isinstance(text, str) else bytes(text)
    depth = deepest = 0
    i, n = 0, len(data)
    while i < n:
        c = data[i]
        if c == 0x22:  # '"': skip the string, escapes included
            i += 1
            while i < n and data[i] != 0x22:
                i += 2 if data[i] == 0x5C else 1
        elif c in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif c in (0x5D, 0x7D):
            depth -= 1
        i += 1
    return deepest


def load_document(data: str | bytes, document: str) -> Any:
    """Parse one metadata document (``zarr.json``, ``.zarray``, ``.zattrs``, ``.zmetadata``).

    Raises :class:`MetadataError` naming ``document`` for text that is not
    JSON and for nesting deeper than :data:`MAX_JSON_DEPTH` (which would
    otherwise end in Python's ``RecursionError``).
    """
    import json

    try:
        return json.loads(data)
    except RecursionError:
        pass
    except ValueError as e:
        raise MetadataError(f"{document}: not valid JSON: {e}") from None
    raise MetadataError(f"{document}: JSON nested {json_depth(data)} levels deep, deeper than {MAX_JSON_DEPTH} "
                        "levels a metadata document may have")


# --------------------------------------------------------------------------- naming the bad field


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _dims(v: Any, positive: bool) -> bool:
    return isinstance(v, list) and all(_is_int(d) and (d > 0 if positive else d >= 0) for d in v)


def _codec_list(v: Any, key: str) -> str | None:
    if not isinstance(v, list):
        return "must be a list of codec objects"
    for i, c in enumerate(v):
        if isinstance(c, str) and key == "name":
            continue
        if not isinstance(c, dict) or not isinstance(c.get(key), str):
            return f"item {i} must be an object with a string {key!r}, got {c!r:.80}"
        if key == "name" and "configuration" in c and not isinstance(c["configuration"], dict):
            return f"item {i} ({c[key]!r}) has a configuration that is not an object"
    return None


def bad_metadata_field(doc: Any, metadata_key: str) -> str | None:
    """The first field of a parsed ``zarr.json`` / ``.zarray`` / ``.zattrs`` document that is malformed, described.

    A structural check of the JSON (types, ranges, consistent lengths), run
    when zarr-python rejects a document, so the error can name the field;
    ``None`` when nothing is found here (zarr-python's own message then stands).
    """
    if not isinstance(doc, dict):
        return f"the document must be a JSON object, got {type(doc).__name__}"
    if metadata_key == ".zattrs":
        return None
    checks: list[tuple[str, bool, str]]
    if metadata_key == "zarr.json":
        grid = doc.get("chunk_grid")
        cfg = grid.get("configuration") if isinstance(grid, dict) else None
        chunk_shape = cfg.get("chunk_shape") if isinstance(cfg, dict) else None
        enc = doc.get("chunk_key_encoding")
        enc_cfg = enc.get("configuration", {}) if isinstance(enc, dict) else None
        checks = [
            ("zarr_format", doc.get("zarr_format") == 3, "must be 3"),
            ("node_type", doc.get("node_type") in ("array", "group"), "must be 'array' or 'group'"),
        ]
        if doc.get("node_type") == "group":
            return None
        checks += [
            ("shape", _dims(doc.get("shape"), False), "must be a list of non-negative integers"),
            ("data_type", isinstance(doc.get("data_type"), (str, dict)), "must be a data type name or object"),
            ("chunk_grid", isinstance(grid, dict) and isinstance(grid.get("name"), str), "must be an object with a 'name'"),
            ("chunk_grid.configuration.chunk_shape",
             grid is None or not isinstance(grid, dict) or grid.get("name") != "regular"
             or (_dims(chunk_shape, True) and isinstance(doc.get("shape"), list) and len(chunk_shape) == len(doc["shape"])),
             "must be a list of positive integers, one per dimension of shape"),
            ("chunk_key_encoding", isinstance(enc, dict) and enc.get("name") in ("default", "v2"),
             "must be an object named 'default' or 'v2'"),
            ("chunk_key_encoding.configuration.separator",
             not isinstance(enc_cfg, dict) or enc_cfg.get("separator", "/") in ("/", "."), "must be '/' or '.'"),
            ("fill_value", "fill_value" in doc, "is required"),
            ("codecs", isinstance(doc.get("codecs"), list) and len(doc["codecs"]) > 0, "must be a non-empty list"),
        ]
        checks.append(("attributes", isinstance(doc.get("attributes", {}), dict), "must be an object"))
        for field_name, ok, why in checks:
            if not ok:
                return f"field {field_name!r} {why}, got {_shown(doc, field_name)}"
        why = _codec_list(doc["codecs"], "name")
        return f"field 'codecs' {why}" if why else None
    checks = [
        ("zarr_format", doc.get("zarr_format") == 2, "must be 2"),
        ("shape", _dims(doc.get("shape"), False), "must be a list of non-negative integers"),
        ("chunks", _dims(doc.get("chunks"), True) and isinstance(doc.get("shape"), list)
         and len(doc["chunks"]) == len(doc["shape"]), "must be a list of positive integers, one per dimension of shape"),
        ("dtype", isinstance(doc.get("dtype"), (str, list)), "must be a NumPy type string"),
        ("order", doc.get("order", "C") in ("C", "F"), "must be 'C' or 'F'"),
        ("compressor", doc.get("compressor") is None or (isinstance(doc["compressor"], dict)
                                                         and isinstance(doc["compressor"].get("id"), str)),
         "must be null or an object with a string 'id'"),
        ("filters", doc.get("filters") is None or _codec_list(doc["filters"], "id") is None,
         "must be null or a list of objects with a string 'id'"),
        ("dimension_separator", doc.get("dimension_separator", ".") in (".", "/"), "must be '.' or '/'"),
        ("fill_value", "fill_value" in doc, "is required"),
    ]
    for field_name, ok, why in checks:
        if not ok:
            return f"field {field_name!r} {why}, got {_shown(doc, field_name)}"
    return None


def _shown(doc: dict, dotted: str) -> str:
    node: Any = doc
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return "nothing (missing)"
        node = node[part]
    return f"{node!r:.80}"
