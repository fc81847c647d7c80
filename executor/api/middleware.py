"""The job API's ASGI middleware, one layer (:class:`RequestGate`): request correlation, local means local, body
limits before any parsing, and the incoming trace context.

Split from :mod:`executor.api.app` to keep each module one concern.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from fastapi.responses import JSONResponse
from opentelemetry import context as otel_context
from prometheus_client import Histogram

from executor.api.bodies import error_body as _error_body
from executor.worker.tracing import CONTEXT_HEADERS
from toolrail import tracing
from toolrail.context import REQUEST_ID_HEADER, bind_request, sanitize_request_id
from toolrail.logging import get_logger

__all__ = ["LOOPBACK_NAMES", "LocalOnly", "RequestGate", "route_template"]

log = get_logger("toolrail.api")

# ----------------------------------------------------------------- middleware

#: Host names that can only mean this machine: a page elsewhere cannot make a browser send them for its own name.
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "[::1]"})


def _host_name(value: str) -> str:
    """``Host`` (or an origin's authority) without its port, lower-cased: ``[::1]:8000`` → ``[::1]``."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        rest = value[end + 1:] if end > 0 else ":x"
        return value[:end + 1] if rest == "" or rest[:1] == ":" and rest[1:].isdigit() else ""
    name, colon, port = value.rpartition(":")
    if colon:
        return name if port.isdigit() and name else ""
    return value


def _origin_parts(origin: str) -> tuple[str, str] | None:
    """``(scheme, authority)`` of an ``Origin`` header; None for ``null`` or anything that is not one."""
    scheme, sep, authority = origin.strip().lower().partition("://")
    if not sep or scheme not in ("http", "https") or not authority or "/" in authority or "@" in authority:
        return None
    return scheme, authority


class LocalOnly:
    """Local means local (DESIGN.md, "Trust boundaries"), as :class:`RequestGate` applies it to every route.

    Without API keys the API trusts whoever reaches it, so it must be someone on this machine: the
    ``Host`` must be a loopback name (or an operator's ``TOOLRAIL_ALLOWED_HOSTS``) and an ``Origin``,
    when a browser sends one, a loopback origin. A page that rebinds its own name to 127.0.0.1 makes
    the browser send *its* name as ``Host`` and its origin as ``Origin``: 403 ``host_not_allowed`` /
    ``origin_not_allowed`` before any route (or the body) is read. With keys set the key is the
    boundary and any ``Host`` is served, but a cross-origin browser request is still refused unless
    ``TOOLRAIL_ALLOWED_ORIGINS`` lists its origin: a page never gets to spend a key a browser holds.
    Requests without ``Origin`` (curl, SDKs, servers) are not browsers' cross-origin requests.
    """

    def __init__(self, *, keyed: bool, allowed_hosts: str = "", allowed_origins: str = "") -> None:
        self.keyed = keyed
        self.hosts = LOOPBACK_NAMES | {_host_name(h) for h in allowed_hosts.split(",") if _host_name(h)}
        self.origins = {o.strip().lower().rstrip("/") for o in allowed_origins.split(",") if o.strip()}

    def refusal(self, host: str | None, origin: str | None) -> tuple[str, str] | None:
        """``(type, message)`` of a request to refuse, or None to serve it."""
        if not self.keyed and (host is None or _host_name(host) not in self.hosts):
            return "host_not_allowed", ("this API has no API keys and serves this machine only: the Host header must "
                                        "name a loopback address (127.0.0.1, localhost, [::1]) or a TOOLRAIL_ALLOWED_HOSTS "
                                        "name")
        if origin is None or origin.strip().lower().rstrip("/") in self.origins:
            return None
        parts = _origin_parts(origin)
        if parts is not None:
            if not self.keyed and _host_name(parts[1]) in LOOPBACK_NAMES:
                return None
            if self.keyed and host is not None and parts[1] == host.strip().lower():
                return None  # the API's own origin (a page it serves)
        return "origin_not_allowed", ("cross-origin requests are refused: the Origin is not this API's own"
                                      + ("" if self.keyed else " nor a loopback origin")
                                      + " and TOOLRAIL_ALLOWED_ORIGINS does not list it")


def _json_depth_exceeds(body: bytes, limit: int) -> bool:
    if body.count(b"{") + body.count(b"[") <= limit:  # never deeper than it has openers: most bodies stop here
        return False
    depth, in_string, escape = 0, False, False
    for byte in body:
        if in_string:
            if escape:
                escape = False
            elif byte == 0x5C:
                escape = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x7B, 0x5B):
            depth += 1
            if depth > limit:
                return True
        elif byte in (0x7D, 0x5D):
            depth -= 1
    return False


_REQUEST_ID_KEY = REQUEST_ID_HEADER.lower().encode()
_CONTEXT_KEYS = frozenset(name.encode() for name in CONTEXT_HEADERS)
#: Paths that probes and scrapers poll: their requests are logged at DEBUG only.
_PROBES = frozenset({"/healthz", "/readyz", "/metrics"})


class RequestGate:
    """ASGI middleware, every request's way in and out in one layer (four before, each reading the headers again):

    1. correlation: the request id (bound to the logs, on ``request.state``, echoed on the response), the latency
       histogram, the access log, and a JSON 500 as the last line of defence — around everything below;
    2. local means local (:class:`LocalOnly`): 403 before any route or byte of the body, websockets closed (1008);
    3. the body, before routing and auth: ``Content-Length`` beside ``Transfer-Encoding`` is a request smuggler's
       framing (RFC 9112 §6.3): 400 ``conflicting_framing``, the connection closed (h11 would read the chunked body
       that ``Content-Length: 0`` claimed was not there); a body is counted as it streams, chunked or not: 413
       ``body_too_large`` the moment it passes the limit, the rest never read (the connection is closed), so memory
       stays flat whatever a client sends, key or no key; nesting deeper than the limit: 400 ``too_deep``, before
       a JSON parser recurses into it;
    4. ``trace_context`` (an API that records no spans; one that does gets FastAPI's instrumentation): the request's
       W3C context (``traceparent``, ``tracestate``, ``baggage``) current while the route runs.

    Plain ASGI rather than ``@app.middleware("http")``: that wrapper runs every request through a task group
    and a memory stream (about a tenth of the API's CPU per job under load, by the profile in bench/results).
    """

    def __init__(self, app: Any, *, latency: Histogram, local: LocalOnly, max_bytes: int, max_depth: int,
                 trace_context: bool) -> None:
        self.app, self.latency, self.local = app, latency, local
        self.max_bytes, self.max_depth, self.trace_context = max_bytes, max_depth, trace_context
        self._observers: dict[tuple[str, str, str], Any] = {}  # the histogram's child per label values

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        raw_id = host = origin = None
        lengths, encodings, ctype, carrier = [], [], "", {}
        for key, value in scope.get("headers", ()):
            if key == b"host":
                host = value.decode("latin-1")
            elif key == b"origin":
                origin = value.decode("latin-1")
            elif key == b"content-length":
                lengths.append(value)
            elif key == b"transfer-encoding":
                encodings.append(value)
            elif key == b"content-type":
                ctype = value.decode("latin-1").split(";")[0].strip().lower()
            elif key == _REQUEST_ID_KEY:
                raw_id = value if raw_id is None else raw_id
            elif key in _CONTEXT_KEYS:
                carrier[key.decode()] = value.decode("latin-1")
        if kind == "websocket":
            refused = self.local.refusal(host, origin)
            if refused is not None:
                log.warning("http.refused", reason=refused[0], path=scope.get("path", "")[:200])
            await (self.app(scope, receive, send) if refused is None else send({"type": "websocket.close", "code": 1008}))
            return
        request_id = sanitize_request_id(raw_id.decode("latin-1") if raw_id is not None else None)
        bind_request(request_id)
        # when the request arrived: what a cancel is ordered by against a review that lands while it is handled
        scope.setdefault("state", {}).update(request_id=request_id)
        tracing.tag_request(request_id)
        started = time.perf_counter()
        status = 0
        own_id = request_id.encode()

        async def send_with_id(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != _REQUEST_ID_KEY]  # ours wins
                message = {**message, "headers": [*headers, (_REQUEST_ID_KEY, own_id)]}
            await send(message)

        try:
            refused = self.local.refusal(host, origin)
            if refused is not None:
                log.warning("http.refused", reason=refused[0], path=scope.get("path", "")[:200])
                await _send_json(send_with_id, 403, _error_body(*refused))
            else:
                await self._guarded(scope, receive, send_with_id, lengths, encodings, ctype, carrier)
        except Exception:  # noqa: BLE001 - last line of defence: no stack traces to clients
            log.exception("http.unhandled", path=scope.get("path"))
            if status:
                raise  # the response already began: nothing better to send
            await JSONResponse(_error_body("internal", "internal error; quote the request id", {"request_id": request_id}),
                               status_code=500)(scope, receive, send_with_id)
        elapsed = time.perf_counter() - started
        path = scope.get("path", "")
        labels = (scope["method"], route_template(scope), str(status))
        observer = self._observers.get(labels)
        if observer is None:
            observer = self._observers[labels] = self.latency.labels(*labels)
        observer.observe(elapsed)
        if path in _PROBES:  # polled every few hundred ms (serve's own start, orchestrators): not news at INFO
            log.debug("http.request", method=scope["method"], path=path, status=status)
        else:
            log.info("http.request", method=scope["method"], path=path, status=status, duration_ms=round(elapsed * 1000, 2))

    async def _guarded(self, scope: dict, receive: Callable, send: Callable, lengths: list[bytes],
                       encodings: list[bytes], ctype: str, carrier: dict[str, str]) -> None:
        """Step 3 and 4 of the class docstring: the body checked, then the route under the request's context."""
        if lengths and encodings:
            await _refuse(send, 400, "conflicting_framing", "a request may carry Content-Length or Transfer-Encoding, "
                          "not both (RFC 9112 section 6.3): the connection is closed")
            return
        if encodings or not all(length.strip() == b"0" for length in lengths):  # else no body (a GET, …/cancel)
            if scope["method"] not in {"POST", "PUT", "PATCH"}:
                receive = _replaying(b"", receive)  # no route here reads a body: an empty one, whatever streams
            elif ctype != "application/json":
                await _refuse(send, 415, "unsupported_media_type", "send the body as application/json",
                              {"content_type": ctype or None})
                return
            else:
                declared = lengths[0] if lengths else b""
                too_large = declared.isdigit() and int(declared) > self.max_bytes  # then not a byte of it is read
                body = None if too_large else await _read_at_most(receive, self.max_bytes)
                if too_large or body is not None and len(body) > self.max_bytes:
                    await _refuse(send, 413, "body_too_large", f"body exceeds {self.max_bytes} bytes",
                                  {"limit": self.max_bytes})
                    return
                if body is None:  # the client went away
                    return
                if _json_depth_exceeds(body, self.max_depth):
                    await _send_json(send, 400, _error_body("too_deep", f"JSON nested deeper than {self.max_depth} "
                                                            "levels", {"limit": self.max_depth}))
                    return
                receive = _replaying(body, receive)
        ctx = tracing.context_from(carrier) if carrier and self.trace_context else None
        token = otel_context.attach(ctx) if ctx is not None else None
        try:
            await self.app(scope, receive, send)
        finally:
            if token is not None:
                otel_context.detach(token)


async def _read_at_most(receive: Callable, limit: int) -> bytes | None:
    """The body as it streams, up to ``limit`` bytes and one chunk past it (then the rest is never read); None when
    the client disconnected."""
    chunks, size, more = [], 0, True
    while more and size <= limit:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)


def _replaying(body: bytes, receive: Callable) -> Callable:
    """``receive`` that hands on ``body`` (already read) first, then whatever the client sends next."""
    sent = False

    async def replay() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _refuse(send: Callable, status: int, kind: str, message: str, details: dict[str, Any] | None = None) -> None:
    """A refusal before the body was read: the error, and ``Connection: close`` (the unread body is never read)."""
    log.warning("http.refused", reason=kind, status=status)
    await _send_json(send, status, _error_body(kind, message, details), close=True)


async def _send_json(send: Callable, status: int, body: dict[str, Any], *, close: bool = False) -> None:
    payload = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"connection", b"close")] if close else headers})
    await send({"type": "http.response.body", "body": payload})


def route_template(scope: dict) -> str:
    """The matched route's template (``/v1/jobs/{job_id}``), never the raw path: bounded label values.

    A route of an included router knows only its own path (``/chat/completions``); the prefix it
    was included under (``/v1``) is what its pattern leaves unmatched at the front of the path.
    """
    route = scope.get("route")
    template = getattr(route, "path_format", None)
    pattern = getattr(route, "path_regex", None)
    if not isinstance(template, str):
        return "unmatched"
    path = scope.get("path", "")
    if pattern is not None and not pattern.match(path):
        for cut in range(1, len(path)):
            if path[cut] == "/" and pattern.match(path[cut:]):
                return path[:cut] + template
    return template
