"""Keeping credentials out of names, messages, reprs and logs.

Array names (used in every error message, repr and dask task name) come from
the URL a user passed; URLs may carry a password (``https://user:pw@host/``)
or a signed query (``?X-Amz-Signature=...``, ``?sig=...``), and
``storage_options`` may carry keys, tokens and ``Authorization`` headers.
:func:`redact_url` removes the first two from a URL; :func:`scrub` removes
known secret strings from any text (a message from a library we called).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"
#: words in a storage option's or query parameter's name that mark its value as a secret
SECRET_WORDS = ("key", "secret", "token", "password", "passwd", "auth", "credential", "session", "signature",
                "sig", "sas", "cookie", "private", "bearer")


def _secret_name(name: str) -> bool:
    low = str(name).lower()
    return any(w in low for w in SECRET_WORDS)


def redact_url(url: str) -> str:
    """``url`` without a password in its user part and without the values of secret-looking query parameters."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if not parts.scheme or parts.scheme == "file":
        return url
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        netloc = f"{userinfo.split(':', 1)[0]}:{MASK}@{host}" if ":" in userinfo else f"{MASK}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, MASK if _secret_name(k) else v) for k, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def url_secrets(url: str) -> list[str]:
    """The secret strings :func:`redact_url` removes from ``url`` (to scrub them from other text)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    out = []
    if "@" in parts.netloc:
        userinfo = parts.netloc.rsplit("@", 1)[0]
        out.append(userinfo.split(":", 1)[1] if ":" in userinfo else userinfo)
    out += [v for k, v in parse_qsl(parts.query, keep_blank_values=True) if _secret_name(k)]
    return [s for s in out if s]


def option_secrets(options: Any, _name: str = "") -> list[str]:
    """String values in (nested) ``storage_options`` whose key names a secret (key, token, Authorization ...)."""
    out: list[str] = []
    if isinstance(options, dict):
        for k, v in options.items():
            out += option_secrets(v, str(k))
    elif isinstance(options, (list, tuple)):
        for v in options:
            out += option_secrets(v, _name)
    elif isinstance(options, (str, bytes)) and _secret_name(_name):
        text = options.decode(errors="replace") if isinstance(options, bytes) else options
        out.append(text)
        if " " in text:  # "Bearer abc": the token alone may be echoed too
            out.append(text.split(" ", 1)[1])
    return out


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret (4 characters or longer) replaced by ``***``."""
    for s in sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True):
        text = text.replace(s, MASK)
    return text


def error_chain(error: BaseException | None, limit: int = 32) -> list[BaseException]:
    """``error`` and every error chained below it (``__cause__`` and ``__context__``, shown or suppressed)."""
    out: list[BaseException] = []
    todo = [error]
    while todo and len(out) < limit:
        e = todo.pop()
        if e is None or any(e is seen for seen in out):
            continue
        out.append(e)
        todo += [e.__context__, e.__cause__]
    return out


def error_text(error: BaseException) -> str:
    """Everything an error shows of itself: its message, its arguments and (for ``OSError``) its file names."""
    parts = [str(error), repr(error.args)]
    if isinstance(error, OSError):
        parts += [str(error.filename), str(error.filename2), str(error.strerror)]
    note = getattr(error, "__notes__", None)
    if note:
        parts += [str(n) for n in note]
    return "\n".join(parts)


def shows_secret(error: BaseException | None, secrets: Iterable[str] = (), clean: Any = None) -> bool:
    """Whether ``error`` or an error chained below it (shown or suppressed) shows a credential: one of
    ``secrets``, a URL password, a secret-looking query value, or text that ``clean`` (a scrub function) changes."""
    secrets = [s for s in secrets if s and len(s) >= 4]
    for e in error_chain(error):
        text = error_text(e)
        if any(s in text for s in secrets) or redact_text(text) != text or (clean is not None and clean(text) != text):
            return True
    return False


def scrub_exception(error: BaseException, secrets: Iterable[str], clean: Any = None) -> BaseException:
    """``error`` with every chained error that shows a credential cut off (``__cause__`` and ``__context__``,
    suppressed ones included: a debugger or ``traceback.TracebackException`` still reaches those)."""
    secrets = [s for s in secrets if s and len(s) >= 4]
    for e in error_chain(error):
        for attr in ("__cause__", "__context__"):
            below = getattr(e, attr)
            if below is not None and shows_secret(below, secrets, clean):
                setattr(e, attr, None)
                e.__suppress_context__ = True
    return error


def scrub_error(error: BaseException, secrets: Iterable[str]) -> BaseException:
    """``error`` with the secrets scrubbed from its message (in place) and from its displayed chain."""
    secrets = [s for s in secrets if s and len(s) >= 4]

    def clean(text: str) -> str:
        return redact_text(scrub(text, secrets))

    error.args = tuple(clean(a) if isinstance(a, str) else a for a in error.args)
    if isinstance(error, OSError):
        for attr in ("strerror", "filename", "filename2"):
            if isinstance(getattr(error, attr), str):
                setattr(error, attr, clean(getattr(error, attr)))
    return scrub_exception(error, secrets)


# --------------------------------------------------------------------------- logs

_URL_PASSWORD = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://[^/@:\s]*):([^/@\s]+)@")
_QUERY_SECRET = re.compile(r"([?&][^=&\s#]*(?:" + "|".join(SECRET_WORDS) + r")[^=&\s#]*=)[^&\s#'\"]+", re.IGNORECASE)
#: loggers of the libraries that read remote stores for us, which log full URLs at DEBUG level
LIBRARY_LOGGERS = ("fsspec", "fsspec.http", "fsspec.asyn", "fsspec.cached", "s3fs", "gcsfs", "adlfs", "zarr",
                   "zarr.storage", "aiohttp.client", "botocore", "urllib3.connectionpool", "obstore", "gpuzarr_dist")
_known: set[str] = set()
_installed = threading.Lock()
_filter: RedactingFilter | None = None


def redact_text(text: str) -> str:
    """``text`` with URL passwords and secret-looking query values masked, and known secrets scrubbed."""
    text = _URL_PASSWORD.sub(lambda m: f"{m.group(1)}:{MASK}@", text)
    text = _QUERY_SECRET.sub(lambda m: m.group(1) + MASK, text)
    return scrub(text, _known)


class RedactingFilter(logging.Filter):
    """Rewrites log records of the store libraries so that no URL password, signature or known secret is logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # a record that cannot format itself is left to logging's own error handling
            return True
        clean = redact_text(msg)
        if clean != msg:
            record.msg, record.args = clean, ()
        return True


def install_log_filter(secrets: Iterable[str] = ()) -> None:
    """Add :class:`RedactingFilter` to the store libraries' loggers (once) and remember ``secrets`` to scrub."""
    global _filter
    _known.update(s for s in secrets if s and len(s) >= 4)
    with _installed:
        if _filter is None:
            _filter = RedactingFilter()
            for name in LIBRARY_LOGGERS:
                logging.getLogger(name).addFilter(_filter)
