"""The job API's ASGI middleware: body limits before any parsing, and request correlation.

Split from :mod:`executor.api.app` to keep each module one concern.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from prometheus_client import Histogram

from executor.api.bodies import error_body as _error_body
from toolrail import tracing
from toolrail.context import REQUEST_ID_HEADER, bind_request, sanitize_request_id
from toolrail.logging import get_logger

__all__ = ["BodyGuard", "Correlate", "route_template"]

log = get_logger("toolrail.api")

# ----------------------------------------------------------------- middleware


def _json_depth_exceeds(body: bytes, limit: int) -> bool:
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


class BodyGuard:
    """ASGI middleware: JSON content type, size and nesting limits before any parsing."""

    def __init__(self, app: Any, *, max_bytes: int, max_depth: int) -> None:
        self.app, self.max_bytes, self.max_depth = app, max_bytes, max_depth

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["method"] not in {"POST", "PUT", "PATCH"}:
            await self.app(scope, receive, send)
            return
        headers = {k.decode().lower(): v.decode(errors="replace") for k, v in scope.get("headers", [])}
        if headers.get("content-length", "0" if "transfer-encoding" not in headers else "") == "0":
            await self.app(scope, receive, send)  # no body (e.g. POST …/cancel): nothing to check
            return
        ctype = headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/json":
            await _send_json(send, 415, _error_body("unsupported_media_type", "send the body as application/json",
                                                    {"content_type": ctype or None}))
            return
        declared = headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.max_bytes:
            await _send_json(send, 413, _error_body("body_too_large", f"body exceeds {self.max_bytes} bytes"))
            return
        chunks, size = [], 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await _send_json(send, 413, _error_body("body_too_large", f"body exceeds {self.max_bytes} bytes"))
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if _json_depth_exceeds(body, self.max_depth):
            await _send_json(send, 400, _error_body("too_deep", f"JSON nested deeper than {self.max_depth} levels"))
            return
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


_REQUEST_ID_KEY = REQUEST_ID_HEADER.lower().encode()


class Correlate:
    """ASGI middleware: the request id (bound to the logs, on ``request.state``, echoed on the response), the
    latency histogram, the access log, and a JSON 500 as the last line of defence.

    Plain ASGI rather than ``@app.middleware("http")``: that wrapper runs every request through a task group
    and a memory stream (about a tenth of the API's CPU per job under load, by the profile in bench/results).
    """

    def __init__(self, app: Any, *, latency: Histogram) -> None:
        self.app, self.latency = app, latency

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = next((v for k, v in scope.get("headers", []) if k == _REQUEST_ID_KEY), None)
        request_id = sanitize_request_id(raw.decode("latin-1") if raw is not None else None)
        bind_request(request_id)
        scope.setdefault("state", {})["request_id"] = request_id
        tracing.tag_request(request_id)
        started = time.perf_counter()
        status = [0]

        async def send_with_id(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != _REQUEST_ID_KEY]  # ours wins
                message = {**message, "headers": [*headers, (_REQUEST_ID_KEY, request_id.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:  # noqa: BLE001 - last line of defence: no stack traces to clients
            log.exception("http.unhandled", path=scope.get("path"))
            if status[0]:
                raise  # the response already began: nothing better to send
            await JSONResponse(_error_body("internal", "internal error; quote the request id", {"request_id": request_id}),
                               status_code=500)(scope, receive, send_with_id)
        elapsed = time.perf_counter() - started
        path = scope.get("path", "")
        self.latency.labels(scope["method"], route_template(Request(scope)), str(status[0])).observe(elapsed)
        if path not in {"/healthz", "/metrics"}:
            log.info("http.request", method=scope["method"], path=path, status=status[0], duration_ms=round(elapsed * 1000, 2))


async def _send_json(send: Callable, status: int, body: dict[str, Any]) -> None:
    payload = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})

def route_template(request: Request) -> str:
    """The matched route's template (``/v1/jobs/{job_id}``), never the raw path: bounded label values.

    A route of an included router knows only its own path (``/chat/completions``); the prefix it
    was included under (``/v1``) is what its pattern leaves unmatched at the front of the path.
    """
    route = request.scope.get("route")
    template = getattr(route, "path_format", None)
    pattern = getattr(route, "path_regex", None)
    if not isinstance(template, str):
        return "unmatched"
    path = request.scope.get("path", "")
    if pattern is not None and not pattern.match(path):
        for cut in range(1, len(path)):
            if path[cut] == "/" and pattern.match(path[cut:]):
                return path[:cut] + template
    return template
