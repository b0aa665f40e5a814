"""Where an array is written: the target store, its ``zarr.json`` and the codecs recorded there.

:func:`open_target` turns what a user passes (a path, a URL, a store, a
group) into a :class:`Target`; :func:`create_metadata` writes the array's
metadata through zarr-python before any data (or, to resume, checks that
the array there is the one to write); :func:`codec_objects` is the codec list
a ``codec=`` name stands for.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import numpy as np
import zarr

from gpuzarr_dist.core.redact import shows_secret
from gpuzarr_dist.errors import ArrayExistsError, ChunkWriteError, GpuZarrError, MetadataError
from gpuzarr_dist.stores.remote import REMOTE_SCHEMES, safe_url, store_error_text
from gpuzarr_dist.stores.writer import LocalObjectWriter, ObjectWriter, ZarrStoreWriter

#: URL schemes written through obstore (as they are read); other URLs (http, memory, ...) go through fsspec
OBJECT_WRITE_SCHEMES = tuple(s for s in REMOTE_SCHEMES if s not in ("http", "https"))

CODECS = ("zstd", "gzip", "none")
DEFAULT_LEVELS = {"zstd": 0, "gzip": 5}  # zstd level 0 means zstd's default (3); gzip 5 as zarr-python


@dataclass
class Target:
    """A place to write one array (or group): the zarr store, the path in it and how objects reach it."""

    store: Any  # a zarr-python store (for the metadata)
    path: str  # the array's path inside it
    name: str  # for messages (no credentials)
    local_root: str | None  # the store's folder on a local disk, or None
    scrub: Any = None  # credentials out of the store's error texts (remote stores), or None

    def writer(self, array: str) -> ObjectWriter:
        """The object writer for the data of the array at :attr:`path` (``array`` names it in errors)."""
        if self.local_root is not None:
            return LocalObjectWriter(os.path.join(self.local_root, *[p for p in self.path.split("/") if p]), array)
        return ZarrStoreWriter(self.store, self.path, array, self.scrub)


def join_path(*parts: str | None) -> str:
    """Path parts joined by ``/``, each stripped of its own slashes; empty and ``None`` parts left out."""
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


def open_target(target: Any, component: str | None, storage_options: dict | None) -> Target:
    """The :class:`Target` for ``to_zarr_gpu``'s ``target`` and ``component`` (see its parameters).

    Raises ``ValueError`` for a component with ``.`` or ``..`` parts, or a
    ``zarr.Group`` without a component; ``TypeError`` for any other kind of target.
    """
    from zarr.abc.store import Store

    if component and any(p in ("..", ".") for p in component.split("/")):
        raise ValueError(f"component {component!r} may not contain '.' or '..' parts")
    if isinstance(target, os.PathLike):
        target = os.fspath(target)
    if isinstance(target, str):
        url = urlparse(target)
        if url.scheme in ("", "file"):
            root = os.path.abspath(os.path.expanduser(url.path if url.scheme == "file" else target))
            store = zarr.storage.LocalStore(root)
            return Target(store, join_path(component), os.path.join(root, join_path(component)) if component else root,
                          root)
        shown = safe_url(target)  # no credentials or query from the URL
        name = f"{shown.rstrip('/')}/{component}" if component else shown
        if url.scheme in OBJECT_WRITE_SCHEMES:  # the reads' obstore client: same options, environment and messages
            from gpuzarr_dist.stores.remote import ObjectChunkStore

            root = ObjectChunkStore(target, name, storage_options)
            return Target(zarr.storage.ObjectStore(root.store, read_only=False), join_path(component), name, None,
                          root.scrub)
        store = zarr.storage.FsspecStore.from_url(target, storage_options=storage_options, read_only=False)
        return Target(store, join_path(component), name, None, _scrubber(target, storage_options))
    if isinstance(target, zarr.Group):
        if not component:
            raise ValueError("to_zarr_gpu into a zarr.Group needs component= naming the new array")
        target, component = target.store, join_path(target.path, component)
    if isinstance(target, Store):
        root = str(target.root) if isinstance(target, zarr.storage.LocalStore) else None
        name = f"{target}/{component}" if component else str(target)
        return Target(target, join_path(component), name, root)
    raise TypeError(f"target must be a path, URL, zarr.Group or zarr store, not {type(target).__name__}")


def _scrubber(url: str, storage_options: dict | None) -> Any:
    """A function taking the credentials of ``url`` and ``storage_options`` (and any URL password) out of a text."""
    from gpuzarr_dist.core.redact import option_secrets, redact_text, scrub, url_secrets

    secrets = url_secrets(url) + option_secrets(storage_options)
    return lambda text: redact_text(scrub(text, secrets))


def codec_objects(codec: str, level: int | None, crc32c: bool) -> list[Any]:
    """zarr-python's codec objects for ``codec`` (one of :data:`CODECS`) at ``level``, then crc32c if asked."""
    import zarr.codecs as zc

    if codec not in CODECS:
        raise ValueError(f"codec must be one of {CODECS}, got {codec!r}")
    level = DEFAULT_LEVELS.get(codec) if level is None else int(level)
    out: list[Any] = []
    if codec == "zstd":
        out.append(zc.ZstdCodec(level=level))
    elif codec == "gzip":
        out.append(zc.GzipCodec(level=level))
    if crc32c:
        out.append(zc.Crc32cCodec())
    return out


def _existing(target: Target) -> Any:
    """The array or group at the target, or None."""

    def look() -> Any:
        for attempt in range(_TORN_READ_TRIES):
            try:
                return zarr.open(store=target.store, path=target.path, mode="r")
            except (FileNotFoundError, KeyError):
                return None
            except Exception as e:  # zarr-python's own "not found" errors
                if "NotFound" in type(e).__name__:
                    return None
                # another writer's zarr.json half written (zarr-python writes it in place): read it again
                torn = _contains_node(e) or isinstance(e, ValueError)
                if not torn or attempt + 1 == _TORN_READ_TRIES:
                    raise
            time.sleep(0.01 * (attempt + 1))

    return _through_store(target, look, "looking for an array or group there")


#: reads of a node's metadata while another writer may be writing it (zarr-python writes zarr.json in place)
_TORN_READ_TRIES = 8


def _metadata_key(target: Target) -> str:
    return join_path(target.path, "zarr.json")


def _through_store(target: Target, call: Any, doing: str) -> Any:
    """``call()``; an object store's own error (unreachable endpoint, refused credentials ...) becomes a
    :class:`ChunkWriteError` of one paragraph naming the target and its ``zarr.json``, chained to the store's
    error only where that shows no credential (obstore's messages quote the request, 40 lines of it)."""
    if target.scrub is None:
        return call()
    try:
        return call()
    except (GpuZarrError, FileNotFoundError, KeyError):
        raise
    except Exception as e:
        if _contains_node(e):
            raise
        error = ChunkWriteError(target.name, _metadata_key(target),
                                f"{store_error_text(e, target.scrub)} (while {doing})")
        error.__cause__ = None if shows_secret(e, clean=target.scrub) else e
    raise error  # outside the except: no __context__ to carry what __cause__ leaves out


def _contains_node(e: BaseException) -> bool:
    """Whether ``e`` is zarr-python's refusal to create a node where one exists (ContainsArrayError ...)."""
    return type(e).__name__ in ("ContainsArrayError", "ContainsGroupError", "ContainsArrayAndGroupError")


def _exists_error(target: Target, kind: str) -> ArrayExistsError:
    hint = "overwrite=True replaces it" + (", resume=True completes an interrupted write of the same array"
                                           if kind == "array" else "")
    return ArrayExistsError(f"{target.name}: a Zarr {kind} exists there already ({hint})")


def _create_local_exclusive(target: Target, kwargs: dict) -> zarr.Array | None:
    """Create the array on a local disk so that of two writers creating it at once exactly one succeeds: its
    ``zarr.json`` (made by zarr-python in memory) appears whole, by a hard link that fails where the file
    exists, and the other writer gets zarr-python's ``ContainsArrayError``. Missing parent groups are written
    the same way (a parent that exists is kept). ``None`` where the filesystem has no hard links (then
    zarr-python creates it, without that guarantee)."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync
    from zarr.errors import ContainsArrayError

    from gpuzarr_dist.stores.writer import _temp_tag

    memory = zarr.storage.MemoryStore()
    zarr.create_array(memory, name=target.path or None, **kwargs)
    parts = [p for p in target.path.split("/") if p]
    parents = ["/".join(parts[:i]) for i in range(len(parts))]
    proto = default_buffer_prototype()
    docs = []
    for node in [*parents, target.path]:
        key = join_path(node, "zarr.json")
        buf = sync(memory.get(key, prototype=proto))
        if buf is not None:
            docs.append((key, buf.to_bytes(), node == target.path))
    for key, data, is_array in docs:
        path = os.path.join(target.local_root, *key.split("/"))
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        if is_array and any(os.path.exists(os.path.join(folder, n)) for n in (".zarray", ".zgroup")):
            raise ContainsArrayError(f"a Zarr v2 node exists at {target.name}")
        tmp = os.path.join(folder, f".zarr.json.{_temp_tag()}.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            if is_array:
                raise ContainsArrayError(f"an array or group exists at {target.name}") from None
        except OSError:  # no hard links here (some network and FUSE filesystems)
            return None
        finally:
            os.unlink(tmp)
    return zarr.open_array(store=target.store, path=target.path, mode="r+")


def _comparable(meta: Any) -> dict:
    d = dict(meta.to_dict())
    d.pop("attributes", None)
    return d


def create_metadata(
    target: Target,
    *,
    shape: tuple[int, ...],
    dtype: np.dtype,
    chunk: tuple[int, ...],
    shard: tuple[int, ...] | None,
    compressors: list[Any],
    fill_value: Any,
    attributes: dict | None,
    dimension_names: Any,
    overwrite: bool,
    resume: bool,
) -> zarr.Array:
    """Write (or, with ``resume``, check) the array's ``zarr.json`` through zarr-python; return the array.

    Raises :class:`ArrayExistsError` where an array or group is there (or
    appears there while this call creates it: of two writers creating the same
    array at once, the one zarr-python refuses gets this error), unless
    ``overwrite`` (or ``resume``, for an array); :class:`ChunkWriteError`
    naming the target where an object store cannot be reached.
    """
    kwargs = dict(
        shape=shape,
        dtype=dtype,
        chunks=chunk,
        shards=shard,
        filters=None,
        compressors=compressors or None,
        serializer="auto",
        zarr_format=3,
        attributes=attributes,
        dimension_names=dimension_names,
        **({} if fill_value is None else {"fill_value": fill_value}),
    )
    existing = None if overwrite else _existing(target)
    if existing is None and not overwrite:
        def create() -> zarr.Array:
            if target.local_root is not None:
                made = _create_local_exclusive(target, kwargs)
                if made is not None:
                    return made
            return zarr.create_array(target.store, name=target.path or None, overwrite=False, **kwargs)

        try:
            return _through_store(target, create, "writing it")
        except Exception as e:  # another writer created a node there since _existing looked
            if not _contains_node(e):
                raise
            kind = "group" if "Group" in type(e).__name__ and "Array" not in type(e).__name__ else "array"
            existing = _existing(target) if resume else None
            if existing is None:
                raise _exists_error(target, kind) from e
    if existing is not None:
        if not resume or not isinstance(existing, zarr.Array):
            raise _exists_error(target, "array" if isinstance(existing, zarr.Array) else "group")
        wanted = zarr.create_array(zarr.storage.MemoryStore(), **kwargs)
        a, b = _comparable(existing.metadata), _comparable(wanted.metadata)
        if a != b:
            diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            raise MetadataError(
                f"{target.name}: resume=True, but the array there differs from the one to write in zarr.json "
                f"field(s) {diff}: existing {[a.get(k) for k in diff]}, wanted {[b.get(k) for k in diff]}"
            )
        return existing
    return _through_store(target, lambda: zarr.create_array(target.store, name=target.path or None, overwrite=True,
                                                            **kwargs), "writing it")
