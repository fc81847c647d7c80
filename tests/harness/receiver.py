"""One HTTP receiver on loopback for every test that needs a real one (webhooks, OTLP export, …), and one poll."""

from __future__ import annotations

import ssl
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

__all__ = ["Receiver", "wait_for"]

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout_s: float = 30.0, *, every_s: float = 0.05) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that; AssertionError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        time.sleep(every_s)


class Receiver:
    """An HTTP server on 127.0.0.1 (a free port; TLS with ``tls``) that records every POST and answers each path
    with its scripted statuses (then ``status``, 200 by default); a context manager, or ``close()`` it."""

    def __init__(self, tls: ssl.SSLContext | None = None, *, status: int = 200,
                 content_type: str | None = None) -> None:
        self.requests: list[dict[str, Any]] = []
        self.scripts: dict[str, list[int]] = {}
        self.delays: dict[str, float] = {}
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with receiver._lock:
                    receiver.requests.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                                              "body": body, "at": time.time()})
                    script = receiver.scripts.get(self.path) or []
                    answer = script.pop(0) if script else status
                time.sleep(receiver.delays.get(self.path, 0))
                self.send_response(answer)
                if answer in (301, 302):
                    self.send_header("Location", "http://127.0.0.1:1/elsewhere")
                if answer in (429, 503):
                    self.send_header("Retry-After", "7")
                if content_type:
                    self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def path(self, statuses: list[int] | None = None, delay_s: float = 0.0) -> str:
        """A fresh path of this receiver, answered with ``statuses`` first."""
        path = f"/hook/{uuid.uuid4().hex}"
        self.scripts[path], self.delays[path] = list(statuses or []), delay_s
        return path

    def url(self, path: str = "/", host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def seen(self, path: str | None = None) -> list[dict[str, Any]]:
        """The requests received (on ``path`` only, when given)."""
        with self._lock:
            return [r for r in self.requests if path is None or r["path"] == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
