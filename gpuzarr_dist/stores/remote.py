"""Chunks in object stores (``s3://``, ``gs://``, ``az://``, ``http(s)://``) through obstore.

Why obstore: against moto's S3 server on loopback (2 shared cores), obstore moved 2.5-3x the bytes per second of
s3fs/aiobotocore for whole 1 MiB objects and 1.5x for 256 KiB ranges at the
same concurrency; it is a Rust client (object_store) that releases the GIL,
and speaks S3, GCS, Azure and plain HTTP with one API, including suffix ranges.

How a task reads: all of its requests go to the process's event loop
(:mod:`gpuzarr_dist.runtime.aio`) at once, bounded by
``gpuzarr.remote.concurrency``; each request is retried on transient errors
(5xx, 429, connection resets, timeouts) up to ``gpuzarr.remote.retries`` times
with exponential backoff and full jitter (obstore's own retries are turned off
so the count and the final message are ours). A 404 on an object is a missing
chunk (fill value), as in zarr; 401/403 and other client errors raise
:class:`~gpuzarr_dist.errors.ChunkReadError` at once, naming the array, the
chunk and the URL.

Credentials: ``storage_options`` (``key``, ``secret``, ``token``, ...) and the
standard environment variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_ENDPOINT_URL``, ``AWS_REGION``, ...) reach the client; they are kept in
:class:`Secret` wrappers whose repr is ``'***'``, are left out of the store's
repr and dask token, and are scrubbed from every message this module raises.
The obstore client itself is made lazily in the process that reads (never pickled),
and kept for the process: every store of the same URL, options and environment
shares one client and its pool of open connections (:func:`_client`), as
fsspec shares its filesystem instances. A fresh client per ``from_zarr_gpu``
cost 3.5 ms to make and then opened its connections inside the user's reads,
where a warm client had them open already.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlparse, urlunparse

from gpuzarr_dist import config as gz_config
from gpuzarr_dist.errors import ChunkReadError
from gpuzarr_dist.runtime import aio, malloc
from gpuzarr_dist.stores.base import ChunkStore
from gpuzarr_dist.stores.ranges import ByteRange

REMOTE_SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "azure", "http", "https")

#: storage_options keys (fsspec spelling) -> obstore config keys, per scheme family
_S3_KEYS = {"key": "access_key_id", "secret": "secret_access_key", "token": "session_token",
            "endpoint_url": "endpoint", "region": "region", "region_name": "region"}
_GCS_KEYS = {"token": "service_account_path", "service_account_key": "service_account_key"}
_AZ_KEYS = {"account_name": "account_name", "account_key": "account_key", "sas_token": "sas_key",
            "connection_string": "connection_string", "client_id": "client_id", "client_secret": "client_secret",
            "tenant_id": "tenant_id"}
_SECRET_WORDS = ("secret", "key", "token", "password", "sas", "credential", "connection_string")


class Secret:
    """A credential value that never prints itself."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        return "'***'"

    __str__ = __repr__

    def __reduce__(self):  # pickled for the workers; still never printed
        return (Secret, (self.value,))


def safe_url(url: str) -> str:
    """``url`` without user, password or query string (where signed URLs keep their signatures)."""
    p = urlparse(url)
    host = p.hostname or ""
    if p.port:
        host = f"{host}:{p.port}"
    return urlunparse((p.scheme, host, p.path, "", "", ""))


class ObjectChunkStore(ChunkStore):
    """The objects under ``url`` (the array's folder), read with obstore.

    ``storage_options`` take fsspec's names (``endpoint_url``, ``key``,
    ``secret``, ``token``, ``anon``, ``region``, ``client_kwargs``) or obstore's
    config keys; anything not given comes from the environment as obstore reads it.
    """

    merge_gap_default = 1024 * 1024  # a request costs a round trip; 1 MiB of gap costs less
    whole_shards = True  # a shard needed whole: one GET, index included (see ShardedChunkStore.read_into)
    object_store = True

    def __init__(self, url: str, array: str | None = None, storage_options: dict | None = None):
        p = urlparse(url)
        if p.scheme not in REMOTE_SCHEMES:
            raise ValueError(f"not an object store URL: {safe_url(url)!r}")
        self.url = url.rstrip("/")
        self.scheme = p.scheme
        self.array = array or safe_url(self.url)
        self.options = {k: Secret(v) if _is_secret(k) else v for k, v in (storage_options or {}).items()}
        self._store: Any = None

    # -- pickling, printing, tokens: never the credentials --------------------------
    def __getstate__(self) -> dict:
        return {**self.__dict__, "_store": None}

    def __repr__(self) -> str:
        return f"ObjectChunkStore({safe_url(self.url)!r})"

    def token(self) -> str:
        return safe_url(self.url)

    def _secrets(self) -> list[str]:
        out = [str(v.value) for v in self.options.values() if isinstance(v, Secret) and v.value]
        for k in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AZURE_STORAGE_ACCOUNT_KEY", "AWS_ACCESS_KEY_ID"):
            if os.environ.get(k):
                out.append(os.environ[k])
        return out

    def scrub(self, text: str) -> str:
        """``text`` with every credential this store knows replaced by ``***`` and URLs stripped of user info."""
        for s in sorted(self._secrets(), key=len, reverse=True):
            if len(s) >= 4:
                text = text.replace(s, "***")
        return re.sub(r"(\w+://)[^/@\s]+@", r"\1", text)

    # -- the client -----------------------------------------------------------------
    @property
    def store(self) -> Any:
        if self._store is None:
            self._store = _client(self._client_key(), self._make_store)
        return self._store

    def _client_key(self) -> str:
        """What makes a client: the URL, the options, the settings and the environment obstore reads, hashed
        (the cache holds no credential in a key of its own)."""
        opts = sorted((k, repr(v.value if isinstance(v, Secret) else v)) for k, v in self.options.items())
        env = sorted((k, v) for k, v in os.environ.items() if k.startswith(_CLIENT_ENV))
        setting = gz_config.remote_timeout()
        return hashlib.sha256(repr((self.url, opts, env, setting)).encode()).hexdigest()

    def _make_store(self) -> Any:
        from obstore.store import AzureStore, GCSStore, HTTPStore, S3Store

        opts = {k: v.value if isinstance(v, Secret) else v for k, v in self.options.items()}
        timeout = f"{gz_config.remote_timeout()}s"
        client = {"timeout": timeout, "connect_timeout": "10s"}
        client.update(opts.pop("client_options", {}) or {})
        retry = {"max_retries": 0}  # retried here, with our count and our messages
        anon = bool(opts.pop("anon", False))
        p = urlparse(self.url)
        prefix = p.path.strip("/")
        try:
            if self.scheme in ("http", "https"):
                if self.scheme == "http":
                    client["allow_http"] = True
                return HTTPStore.from_url(safe_url(self.url) if not p.username else self.url,
                                          client_options=client, retry_config=retry)
            config = _translate(opts, {"s3": _S3_KEYS, "s3a": _S3_KEYS, "gs": _GCS_KEYS, "gcs": _GCS_KEYS}.get(self.scheme, _AZ_KEYS))
            if anon:
                config["skip_signature"] = True
            if self.scheme in ("s3", "s3a"):
                endpoint = config.get("endpoint") or os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT") or ""
                if endpoint.startswith("http://"):
                    client["allow_http"] = True
                if "region" not in config and not (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")) and endpoint:
                    config["region"] = "us-east-1"  # S3-compatible servers accept any; obstore needs one
                return S3Store(p.netloc, prefix=prefix or None, config=config, client_options=client, retry_config=retry)
            if self.scheme in ("gs", "gcs"):
                return GCSStore(p.netloc, prefix=prefix or None, config=config, client_options=client, retry_config=retry)
            return AzureStore(p.netloc, prefix=prefix or None, config=config, client_options=client, retry_config=retry)
        except Exception as e:  # bad configuration keys or values: say which, without values
            error = ValueError(f"{self.array}: cannot set up the {self.scheme}:// client: {self.scrub(_first_line(e))}")
        raise error  # outside the except: the client's error (which may quote credentials) is not chained

    def zarr_store(self) -> Any:
        """A read-only zarr-python store over the same client, to open the metadata with."""
        from zarr.storage import ObjectStore

        return ObjectStore(self.store, read_only=True)

    # -- reads ----------------------------------------------------------------------
    def read_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return aio.run(self._gather([(k, None) for k in keys]))

    def read_ranges(self, requests: Sequence[ByteRange]) -> list[Any]:
        return aio.run(self._gather([(r.key, (r.offset, r.length)) for r in requests]))

    async def _gather(self, items: list[tuple[str, tuple[int, int] | None]]) -> list[Any]:
        sem = aio.limit()

        async def one(key: str, rng: tuple[int, int] | None) -> Any:
            async with sem:
                return await self._get(key, rng)

        return await aio.gather_all(one(k, r) for k, r in items)

    def _size_refusal(self, result: Any) -> str | None:
        """Why a whole chunk object must not be read, from its size in the response's metadata (see
        :attr:`~gpuzarr_dist.stores.base.ChunkStore.object_limit`), before its body is."""
        size = (getattr(result, "meta", None) or {}).get("size")
        limit = self.object_limit
        if limit is None or size is None or int(size) <= limit:
            return None
        return (f"the chunk object holds {int(size)} bytes, more than a chunk of this array can take stored "
                f"({limit} bytes: its decoded size, what its codecs may add, and a margin); refusing to read it")

    async def _get(self, key: str, rng: tuple[int, int] | None) -> Any:
        """One object or range, retried on transient errors; ``None`` for a missing object."""
        import obstore

        retries, backoff = gz_config.remote_retries(), gz_config.remote_backoff()
        options: dict = {}
        if rng is not None:
            off, n = rng
            if off >= 0 and n <= 0:
                return b""
            options["range"] = {"suffix": -off} if off < 0 else (off, off + n)
        last = ""
        for attempt in range(retries + 1):
            error = None
            try:
                result = await obstore.get_async(self.store, key, options=options or None)
                refusal = None if rng is not None else self._size_refusal(result)
                if refusal is None:
                    return await result.bytes_async()
                error = ChunkReadError(self.array, key, refusal)  # its body is never read
            except FileNotFoundError:
                return None
            except Exception as e:  # obstore raises its own classes; sort them by status
                status = _status(e)
                if status == 416:  # a range that starts at or past the end: no bytes there
                    return b""
                last = f"HTTP {status}" if status else _first_line(e)
                if not _transient(e, status) or attempt == retries:
                    what = f"{safe_url(self.url)}/{key}"
                    tries = f" after {attempt + 1} attempts" if attempt else ""
                    error = ChunkReadError(self.array, key, self.scrub(f"GET {what}{_range_text(rng)}{tries}: {last}"))
            if error is not None:
                raise error  # outside the except: obstore's error quotes the URL it was given, credentials included
            await asyncio.sleep(backoff * (2**attempt) * random.random())
        raise AssertionError("unreachable")


#: environment variables that change a client (credentials, endpoints, regions): part of its cache key
_CLIENT_ENV = ("AWS_", "GOOGLE_", "AZURE_", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
#: clients kept per process, least recently used dropped first
_CLIENTS_MAX = 16
_clients: OrderedDict[str, Any] = OrderedDict()
_clients_pid = [os.getpid()]
_clients_lock = threading.Lock()


def _client(key: str, make: Callable[[], Any]) -> Any:
    """The process's client for ``key``, made by ``make`` the first time (a forked child makes its own)."""
    with _clients_lock:
        if _clients_pid[0] != os.getpid():  # a forked child: the parent's clients hold the parent's runtime
            _clients.clear()
            _clients_pid[0] = os.getpid()
        client = _clients.get(key)
        if client is not None:
            _clients.move_to_end(key)
            return client
    client = make()  # outside the lock: a bad configuration raises here, naming the array
    malloc.raise_thresholds()  # a process that reads object stores keeps large responses' memory mapped
    with _clients_lock:
        client = _clients.setdefault(key, client)
        _clients.move_to_end(key)
        while len(_clients) > _CLIENTS_MAX:
            _clients.popitem(last=False)
    return client


def _range_text(rng: tuple[int, int] | None) -> str:
    if rng is None:
        return ""
    off, n = rng
    return f" (bytes={off})" if off < 0 else f" (bytes={off}-{off + n - 1})"


def _is_secret(key: str) -> bool:
    k = key.lower()
    return k != "key_prefix" and any(w in k for w in _SECRET_WORDS) or k in ("client_kwargs",)


def _translate(opts: dict, names: dict[str, str]) -> dict:
    config = {}
    for k, v in opts.items():
        if k == "client_kwargs" and isinstance(v, dict):  # s3fs style: client_kwargs={"endpoint_url": ..., "region_name": ...}
            config.update(_translate(v, names))
        elif k in names:
            config[names[k]] = v
        else:
            config[k] = v  # obstore's own key names
    return config


def unreachable(e: BaseException) -> bool:
    """Whether a store client's error says that the store did not answer (no connection, DNS, timeout)."""
    text = str(e).lower()
    return any(w in text for w in ("error sending request", "connection refused", "connect call failed", "dns error",
                                   "timed out", "timeout", "failed to lookup", "name or service not known",
                                   "cannot connect"))


def store_error_text(e: BaseException, scrub: Callable[[str], str] | None = None) -> str:
    """One line for a store client's error: its type and the first line of its message (obstore's errors run to
    40 lines of debug output), credentials scrubbed, and what to check where the store did not answer."""
    text = _first_line(e)
    if scrub is not None:
        text = scrub(text)
    if unreachable(e):
        text += ("; the store did not answer: check the URL, the endpoint (storage_options endpoint_url, or "
                 "AWS_ENDPOINT_URL) and the network")
    return text


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def _status(e: BaseException) -> int | None:
    m = re.search(r"status code: (\d{3})", str(e))
    if m:
        return int(m.group(1))
    name = type(e).__name__
    return {"PermissionDeniedError": 403, "UnauthenticatedError": 401}.get(name)


def _transient(e: BaseException, status: int | None) -> bool:
    if status is not None:
        return status >= 500 or status in (408, 429)
    text = str(e).lower()
    return any(w in text for w in ("timed out", "timeout", "connection", "reset", "broken pipe", "error sending request",
                                   "incomplete", "unexpected eof"))
