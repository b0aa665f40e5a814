"""Real servers on loopback for the remote-store tests: an S3-compatible server (moto's server
mode) and an HTTP file server that answers ``Range`` requests as object stores do.

Python's ``http.server`` ignores ``Range`` (see NOTES.md), so :class:`RangeHandler` adds
RFC 9110 single ranges: ``bytes=a-b``, ``bytes=a-`` and suffix ``bytes=-N`` with ``206``,
``416`` for a range that starts past the end, and fault injection (a number of ``503``
answers per path, or a fixed status for a path) so the retry and error paths meet a
real HTTP exchange.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Faults:
    """What the HTTP server should do wrong, and what it was asked.

    ``set(path, status, times, after)``: answer ``status`` to ``times`` requests
    for ``path`` (times < 0: all), once ``after`` requests for it were answered
    normally. ``delay`` seconds are spent on each request (to see requests in flight).
    """

    def __init__(self) -> None:
        self.fail: dict[str, list[int]] = {}
        self.requests: list[tuple[str, str | None]] = []  # (path, Range header)
        self.delay = 0.0
        self.inflight = 0
        self.max_inflight = 0
        self.lock = threading.Lock()

    def set(self, path: str, status: int, times: int = -1, after: int = 0) -> None:
        with self.lock:
            self.fail["/" + path.lstrip("/")] = [status, times, after]

    def clear(self) -> None:
        with self.lock:
            self.fail.clear()
            self.requests.clear()
            self.delay = 0.0
            self.max_inflight = 0

    def take(self, path: str, range_header: str | None = None) -> int | None:
        with self.lock:
            self.requests.append((path, range_header))
            entry = self.fail.get(path)
            if entry is None or entry[1] == 0:
                return None
            if entry[2] > 0:
                entry[2] -= 1
                return None
            if entry[1] > 0:
                entry[1] -= 1
            return entry[0]


_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


class RangeHandler(SimpleHTTPRequestHandler):
    """Serves files under ``directory`` with single byte ranges and injected faults."""

    faults: Faults
    protocol_version = "HTTP/1.1"  # keep-alive, as object stores
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall

    def log_message(self, *args: Any) -> None:  # quiet tests
        pass

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        with self.faults.lock:
            self.faults.inflight += 1
            self.faults.max_inflight = max(self.faults.max_inflight, self.faults.inflight)
        try:
            if self.faults.delay:
                time.sleep(self.faults.delay)
            self._get()
        finally:
            with self.faults.lock:
                self.faults.inflight -= 1

    def _get(self) -> None:
        path = self.path.split("?", 1)[0]
        header = self.headers.get("Range")
        status = self.faults.take(path, header)
        if status is not None:
            self._send(status, f"injected {status}".encode())
            return
        fs_path = self.translate_path(path)
        if not os.path.isfile(fs_path):
            self._send(404, b"not found")
            return
        with open(fs_path, "rb") as f:
            data = f.read()
        size = len(data)
        if not header:
            self._send(200, data, {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"})
            return
        m = _RANGE.match(header.strip())
        if not m or (not m.group(1) and not m.group(2)):
            self._send(416, b"", {"Content-Range": f"bytes */{size}"})
            return
        if not m.group(1):  # suffix: the last N bytes (all of a shorter object)
            n = int(m.group(2))
            if n == 0:
                self._send(416, b"", {"Content-Range": f"bytes */{size}"})
                return
            start, end = max(0, size - n), size - 1
        else:
            start = int(m.group(1))
            end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            if start >= size or end < start:
                self._send(416, b"", {"Content-Range": f"bytes */{size}"})
                return
        self._send(206, data[start : end + 1], {"Content-Range": f"bytes {start}-{end}/{size}",
                                                 "Accept-Ranges": "bytes",
                                                 "Content-Type": "application/octet-stream"})


def _quiet_disconnects(self, request, client_address) -> None:
    """socketserver's ``handle_error``, without a traceback for a client that closed its connection mid-response
    (a read cancelled after another failed, by design): the tests judge what the client saw."""
    import sys

    if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
        return
    ThreadingHTTPServer.handle_error(self, request, client_address)


@contextmanager
def range_http_server(directory: str) -> Iterator[tuple[str, Faults]]:
    """An HTTP server for ``directory`` on loopback; yields ``(base_url, faults)``."""
    faults = Faults()
    handler = type("Handler", (RangeHandler,), {"faults": faults})
    server_class = type("Server", (ThreadingHTTPServer,), {"request_queue_size": 128,  # many connections at once
                                                           "handle_error": _quiet_disconnects})
    server = server_class(("127.0.0.1", 0), partial(handler, directory=directory))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", faults
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@contextmanager
def moto_s3_server() -> Iterator[str]:
    """moto's S3 server on a free loopback port; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


#: credentials moto accepts (any); the tests check they never leak into reprs or messages
TEST_KEY, TEST_SECRET = "AKIATESTKEYLEAKCHECK", "s3cr3t/TEST+secret+value+that+must+not+leak"


def upload_tree(endpoint: str, bucket: str, root: str, prefix: str = "") -> None:
    """Create ``bucket`` on the S3 server and upload every file under ``root`` to ``prefix``."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=TEST_KEY, aws_secret_access_key=TEST_SECRET,
                      region_name="us-east-1")
    try:
        s3.create_bucket(Bucket=bucket)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    for d, _, names in os.walk(root):
        for n in names:
            full = os.path.join(d, n)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            s3.upload_file(full, bucket, f"{prefix.strip('/')}/{rel}" if prefix.strip("/") else rel)
