"""Resolve what a user passes as ``source`` into a chunk store and array metadata.

Accepted: a local path or ``file://`` URL, an object-store URL (``s3://``,
``gs://``, ``az://``, ``http(s)://``: :class:`.remote.ObjectChunkStore`), another
remote URL (through zarr-python's fsspec store), a ``zarr.Array``, a ``zarr.Group`` or a zarr store (with
``component`` naming the array inside a group).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

import zarr
from zarr.abc.store import Store

from gpuzarr_dist.codecs.registry import known_codecs
from gpuzarr_dist.core.metadata import ArraySpec, spec_from_zarr_metadata
from gpuzarr_dist.core.redact import install_log_filter, option_secrets, redact_url, scrub_error, url_secrets
from gpuzarr_dist.errors import (
    ArrayNotFoundError,
    ChunkReadError,
    ComponentNotFoundError,
    MetadataError,
    NotAnArrayError,
    UnsupportedCodecError,
)
from gpuzarr_dist.stores.base import ChunkStore
from gpuzarr_dist.stores.local import LocalChunkStore
from gpuzarr_dist.stores.remote import REMOTE_SCHEMES, ObjectChunkStore, safe_url, store_error_text, unreachable
from gpuzarr_dist.stores.sharded import ShardedChunkStore
from gpuzarr_dist.stores.zarrstore import ZarrChunkStore

_METADATA_FILES = ("zarr.json", ".zarray", ".zgroup")


def _join(root: str, *parts: str | None) -> str:
    """``root`` followed by the non-empty ``parts``, one slash between each."""
    return "/".join([root.rstrip("/") or "/", *(p.strip("/") for p in parts if p and p.strip("/"))])


def _metadata_file(root: str, component: str | None) -> str:
    folder = os.path.join(root, *(component or "").split("/"))
    for name in _METADATA_FILES:
        if os.path.exists(os.path.join(folder, name)):
            return os.path.join(folder, name)
    return os.path.join(folder, "zarr.json")


def _quoted(message: str) -> str:
    """The first quoted word of an error message (zarr names an unknown codec that way)."""
    m = re.search(r"'+([^']+)'+", message)
    return m.group(1) if m else message


def _check_component(component: str | None) -> None:
    if component and any(p in ("..", ".") for p in component.split("/")):
        raise ValueError(f"component {component!r} may not contain '.' or '..' parts")


def _field_hint(where: str) -> str:
    """``"<document>: field 'x' ...; "`` for the first malformed field of a local metadata file (and its .zattrs)."""
    import json

    from gpuzarr_dist.core.metadata import bad_metadata_field

    base = os.path.basename(where)
    if base not in _METADATA_FILES or not os.path.isfile(where):
        return ""
    folder = os.path.dirname(where)
    for name in (base, ".zattrs") if base == ".zarray" else (base,):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        try:
            with open(path, "rb") as f:
                doc = json.loads(f.read())
        except (OSError, ValueError) as e:
            return f"not valid JSON ({e}); " if path == where else f"{path} is not valid JSON ({e}); "
        except RecursionError:
            return "JSON nested too deeply; " if path == where else f"{path}: JSON nested too deeply; "
        why = bad_metadata_field(doc, name)
        if why:
            return f"{why}; " if path == where else f"{path}: {why}; "
    return ""


#: metadata documents of a store (v3, v2 and consolidated) that :func:`bad_document_error` checks
_ALL_DOCUMENTS = ("zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata")


def bad_document_error(store: Any, error: BaseException, limit: int = 100_000) -> MetadataError | None:
    """A :class:`MetadataError` naming the first metadata document of the local store ``store`` (a path or
    ``file://`` URL) that is not valid JSON, for an ``error`` a JSON parser raised while the store was opened
    (zarr-python and xarray let ``json.JSONDecodeError`` through without naming the file); ``None`` where
    ``store`` is not local or no damaged document is found among its first ``limit`` entries."""
    if isinstance(store, os.PathLike):
        store = os.fspath(store)
    if not isinstance(store, str) or not isinstance(error, ValueError) or isinstance(error, MetadataError):
        return None
    url = urlparse(store)
    if url.scheme not in ("", "file"):
        return None
    root = os.path.abspath(os.path.expanduser(url.path if url.scheme == "file" else store))
    seen = 0
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        seen += len(dirs) + len(files)
        for name in sorted(f for f in files if f in _ALL_DOCUMENTS):
            path = os.path.join(folder, name)
            try:
                with open(path, "rb") as f:
                    json.loads(f.read())
            except (OSError, ValueError, RecursionError) as e:
                return MetadataError(f"{root}: the metadata document {path} is not valid JSON: {type(e).__name__}: {e}")
        if seen > limit:
            break
    return None


def _raise_if_document_exists(name: str, where: str, error: Exception) -> None:
    """A metadata file that is there but not recognised (e.g. ``zarr_format`` damaged) is bad metadata, not a missing array."""
    if os.path.basename(where) in _METADATA_FILES and os.path.isfile(where):
        raise MetadataError(
            f"{name}: {where} is not a Zarr array document zarr-python recognises "
            f"(check its zarr_format and node_type fields): {type(error).__name__}: {error}"
        ) from error


def array_paths(group: Any) -> list[str]:
    """The paths (relative to ``group``) of every array in the zarr.Group ``group``, at any depth."""
    return sorted(p for p, node in group.members(max_depth=None) if isinstance(node, zarr.Array))


def _group_lister(open_root: Callable[[], Any]) -> Callable[[], list[str] | None]:
    """A function listing the arrays of the group ``open_root()`` opens (``None`` where that fails or is no group)."""

    def arrays() -> list[str] | None:
        try:
            root = open_root()
            return array_paths(root) if isinstance(root, zarr.Group) else None
        except Exception:  # a store that cannot list (plain HTTP servers), or no group there: no listing
            return None

    return arrays


def _not_found(name: str, component: str | None, arrays: Callable[[], list[str] | None] | None,
               root: str | None) -> ArrayNotFoundError:
    """The error for no array at ``name``: a :class:`ComponentNotFoundError` listing the arrays of the group at
    ``root`` where ``component`` was asked for and the group can be listed, else :class:`ArrayNotFoundError`."""
    listing = arrays() if component and arrays is not None else None
    if listing is not None:
        return ComponentNotFoundError(name, component, listing, root)
    return ArrayNotFoundError(name)


def _open_array(opener: Any, name: str, where: str, not_found: tuple[type, ...] = (FileNotFoundError,),
                component: str | None = None, arrays: Callable[[], list[str] | None] | None = None,
                root: str | None = None) -> zarr.Array:
    """The zarr.Array ``opener()`` opens; ``component``, ``arrays`` and ``root`` name what a not-found error lists."""
    try:
        node = opener()
    except not_found as e:
        _raise_if_document_exists(name, where, e)
        raise _not_found(name, component, arrays, root) from e
    except Exception as e:  # zarr-python raises many kinds of error for bad documents
        kind = type(e).__name__
        if "NotFound" in kind:
            _raise_if_document_exists(name, where, e)
            raise _not_found(name, component, arrays, root) from e
        if kind == "UnknownCodecError":
            hint = _field_hint(where)
            if hint:  # not an unknown codec but a malformed codec object (e.g. without an id)
                raise MetadataError(f"{name}: could not read the Zarr metadata in {where}: {hint}{kind}: {e}") from e
            codec = getattr(e, "codec_id", None) or _quoted(str(e))
            raise UnsupportedCodecError(codec, name, known_codecs()) from e
        if isinstance(e, OSError):
            raise
        hint = _field_hint(where)
        raise MetadataError(f"{name}: could not read the Zarr metadata in {where}: {hint}{kind}: {e}") from e
    if isinstance(node, zarr.Group):
        _raise_if_not_a_group_document(name, where)
        try:
            listing = str(array_paths(node))
        except Exception:  # a store that cannot list (plain HTTP servers): say so rather than the listing's error
            listing = "(this store cannot list them)"
        raise NotAnArrayError(name, f"{name} is a Zarr group; pass component= naming one of its arrays: {listing}")
    return node


def _raise_if_not_a_group_document(name: str, where: str) -> None:
    """zarr-python opens some damaged array documents (``{}``) as groups: call those bad metadata."""
    base = os.path.basename(where)
    if base == ".zarray" and os.path.isfile(where):
        raise MetadataError(f"{name}: {where} is not a Zarr array document zarr-python recognises")
    if base == "zarr.json" and os.path.isfile(where):
        import json

        try:
            with open(where, "rb") as f:
                doc = json.loads(f.read())
        except (OSError, ValueError, RecursionError):
            doc = None
        if not isinstance(doc, dict) or doc.get("node_type") != "group":
            raise MetadataError(f"{name}: {where} is neither a Zarr array nor a group document (field node_type)")


def _from_local(path: str, component: str | None, name: str) -> tuple[ChunkStore, zarr.Array]:
    if not os.path.exists(path):
        raise ArrayNotFoundError(path, f"No such Zarr store: {path!r}")
    where = _metadata_file(path, component)
    store = zarr.storage.LocalStore(path, read_only=True)
    arr = _open_array(lambda: zarr.open(store=store, path=component or "", mode="r"), name, where,
                      component=component, arrays=_group_lister(lambda: zarr.open_group(store=store, mode="r")),
                      root=path)
    return LocalChunkStore(os.path.join(path, *(arr.path or "").split("/")), name), arr


def _v3_array_metadata(root: ObjectChunkStore, component: str | None) -> Any:
    """The array's ``zarr.json`` through one GET on the chunk client, parsed by zarr-python, or ``None`` where
    that is not a readable v3 array document (zarr-python's own opening then says why, or finds a v2 array).

    ``zarr.open`` asks for ``zarr.json``, ``.zarray`` and ``.zattrs`` on zarr-python's own event loop: three
    round trips to a real store instead of one.
    """
    from zarr.core.array import parse_array_metadata

    key = f"{component.strip('/')}/zarr.json" if component else "zarr.json"
    try:
        [data] = root.read_many([key])
        if data is None:
            return None
        doc = json.loads(bytes(data))
        if not isinstance(doc, dict) or doc.get("zarr_format") != 3 or doc.get("node_type") != "array":
            return None
        return parse_array_metadata(doc)
    except Exception:  # anything unusual: zarr-python opens it, with its errors (named and scrubbed below)
        return None


def _from_remote(url: str, component: str | None, storage_options: dict | None) -> tuple[ChunkStore, Any]:
    """An object-store URL: metadata through zarr-python over the same obstore client, chunks by
    :class:`ObjectChunkStore`; the array's metadata and the store of its chunks."""
    root = ObjectChunkStore(url, storage_options=storage_options)
    name = f"{safe_url(root.url)}/{component}" if component else safe_url(root.url)
    def chunks_under(path: str) -> ObjectChunkStore:  # the store of the array's chunks, at ``path`` under the URL
        path = path.strip("/")
        return ObjectChunkStore(f"{root.url}/{path}" if path else root.url, name, storage_options)

    meta = _v3_array_metadata(root, component)
    if meta is not None:
        return chunks_under(component or ""), meta
    zstore = root.zarr_store()

    def opener() -> zarr.Array:
        try:
            return zarr.open(store=zstore, path=component or "", mode="r")
        except (FileNotFoundError, KeyError):
            raise
        except Exception as e:  # say what failed without credentials or the client's debug dump
            kind = type(e).__name__
            if "NotFound" in kind:
                raise ArrayNotFoundError(name) from None
            if unreachable(e):  # not the metadata's fault: say that the store did not answer
                raise ChunkReadError(name, "zarr.json", store_error_text(e, root.scrub)) from None
            raise MetadataError(f"{name}: could not read the Zarr metadata: {root.scrub(str(e).splitlines()[0] if str(e) else kind)}") from None

    arr = _open_array(opener, name, name, not_found=(FileNotFoundError, KeyError), component=component,
                      arrays=_group_lister(lambda: zarr.open_group(store=zstore, mode="r")), root=safe_url(root.url))
    return chunks_under(arr.path or ""), arr.metadata


def _from_zarr_array(arr: zarr.Array) -> tuple[ChunkStore, zarr.Array]:
    store = arr.store
    name = f"{store}/{arr.path}" if arr.path else str(store)
    if isinstance(store, zarr.storage.LocalStore):
        root = os.path.join(str(store.root), *(arr.path or "").split("/"))
        return LocalChunkStore(root, name), arr
    return ZarrChunkStore(store, arr.path or "", name), arr


def open_source(
    source: Any, component: str | None = None, storage_options: dict | None = None
) -> tuple[ChunkStore, ArraySpec]:
    """The :class:`ChunkStore` and :class:`ArraySpec` of the array ``source`` names.

    Raises :class:`~gpuzarr_dist.errors.ArrayNotFoundError` (a
    ``FileNotFoundError``) for a path that does not exist or holds no array,
    :class:`~gpuzarr_dist.errors.ComponentNotFoundError` (also a ``KeyError``)
    for a ``component`` the group does not hold, listing the arrays it holds,
    :class:`~gpuzarr_dist.errors.NotAnArrayError` (a ``ValueError``) for a
    group without ``component``, and :class:`~gpuzarr_dist.errors.MetadataError`
    naming the metadata document for metadata that cannot be read.
    """
    _check_component(component)
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    meta = None  # the array's metadata, where no zarr.Array was opened for it (object stores)
    if isinstance(source, str):
        url = urlparse(source)
        if url.scheme in ("", "file") or (len(url.scheme) == 1 and os.name == "nt"):
            path = url.path if url.scheme == "file" else source
            path = os.path.abspath(os.path.expanduser(path))
            cstore, arr = _from_local(path, component, _join(path, component) if component else path)
        elif url.scheme in REMOTE_SCHEMES:
            secrets = url_secrets(source) + option_secrets(storage_options)
            install_log_filter(secrets)
            try:
                cstore, meta = _from_remote(source, component, storage_options)
            except Exception as e:  # the client's messages and their causes may quote the URL it was given
                raise scrub_error(e, secrets)  # noqa: B904 (the same exception, its message scrubbed)
        else:
            shown = redact_url(source)  # names reach messages, reprs and task names: no password or signature
            name = f"{shown.rstrip('/')}/{component}" if component else shown
            secrets = url_secrets(source) + option_secrets(storage_options)
            install_log_filter(secrets)  # fsspec and friends log full URLs at DEBUG level
            opener = lambda: zarr.open(source, path=component or "", mode="r", storage_options=storage_options)  # noqa: E731
            lister = _group_lister(lambda: zarr.open_group(source, mode="r", storage_options=storage_options))
            try:
                arr = _open_array(opener, name, name, component=component, arrays=lister, root=shown)
            except Exception as e:
                raise scrub_error(e, secrets)  # noqa: B904 (the same exception, its message scrubbed)
            cstore, arr = _from_zarr_array(arr)
            cstore.array = name
    elif isinstance(source, zarr.Array):
        if component:
            raise ValueError("component= is only for groups and stores, not for a zarr.Array")
        cstore, arr = _from_zarr_array(source)
    elif isinstance(source, zarr.Group):
        if not component:
            raise NotAnArrayError(str(source), f"{source} is a Zarr group; pass component= naming one of its "
                                  f"arrays: {array_paths(source)}")
        arr = _open_array(
            lambda: source[component], _join(str(source.store), source.path, component), "the group",
            not_found=(KeyError, FileNotFoundError), component=component, arrays=lambda: array_paths(source),
            root=str(source),
        )
        cstore, arr = _from_zarr_array(arr)
    elif isinstance(source, Store):
        name = f"{source}/{component}" if component else str(source)
        arr = _open_array(lambda: zarr.open(store=source, path=component or "", mode="r"), name, name,
                          component=component, arrays=_group_lister(lambda: zarr.open_group(store=source, mode="r")),
                          root=str(source))
        cstore, arr = _from_zarr_array(arr)
    else:
        raise TypeError(
            f"source must be a path, URL, zarr.Array, zarr.Group or zarr store, not {type(source).__name__}"
        )
    spec = spec_from_zarr_metadata(meta if meta is not None else arr.metadata, cstore.array)
    if spec.shard_shape is not None:
        cstore = ShardedChunkStore(cstore, spec)
    return cstore, spec
