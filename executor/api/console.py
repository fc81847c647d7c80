"""The console: a web page for the people in the loop, at ``/console``, and the read-only endpoints it needs.

    GET /console/                 the page (static HTML, JS modules, CSS shipped in ``console_static/``; no build step)
    GET /v1/console/jobs          the tenant's recent jobs as one-line summaries (status, tools, age, waiting calls)
    GET /v1/console/events        Server-Sent Events: a ``snapshot`` of those summaries, then a ``job`` summary
                                  each time one of them changes or a new job appears
    GET /v1/console/ops           workers alive and their queues, queue depths, the tenant's breakers, the
                                  reconciler's last sweep

Everything else the page does goes through the job API itself (``/v1/jobs/…``, ``…/trace``, ``…/approve``,
``…/reject``, ``…/review``), with the key the person typed, in the ``Authorization`` header.

The page's responses carry a strict Content-Security-Policy (scripts only from this origin, no inline script or
style, ``frame-ancestors 'none'``); the page renders every value as text. The Host/Origin rules of the API
(``LocalOnly``) apply to these routes as to every other.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import typing
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import redis
from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from executor.api.bodies import ApiError
from executor.api.sse import AsyncRedisFactory, SlotStreamingResponse
from executor.errors import ExecutorError, JobNotFoundError
from executor.runs.reconcile import LAST_SWEEP_KEY
from executor.worker.tracing import message_age_s
from executor.store.records import JobRecord
from executor.worker.config import celery_config, worker_queues
from toolrail.redis_embed import redis_url

__all__ = ["CSP", "STATIC_DIR", "console_router", "job_summary"]

STATIC_DIR = Path(__file__).with_name("console_static")
#: Scripts, styles and requests to this origin only; nothing inline, nothing framed, no forms posted anywhere.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
PAGE_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY",
                "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
          ".svg": "image/svg+xml"}


def _static_files() -> dict[str, tuple[bytes, str]]:
    """Every file the page is made of, read once: name → (bytes, content type). Nothing else is served."""
    files = {}
    for path in sorted(STATIC_DIR.iterdir()):
        if path.is_file() and path.suffix in _TYPES:
            files[path.name] = (path.read_bytes(), _TYPES[path.suffix])
    return files


def job_summary(job: JobRecord) -> dict[str, Any]:
    """One line of the jobs list: what a person scans for."""
    waiting = [c.name for c in job.calls if c.approval_state() == "pending"]
    return {"job_id": job.job_id, "request_id": job.request_id, "tenant": job.tenant, "status": job.status,
            "tools": [*job.tools, *(t["function"]["name"] for t in job.inline_tools if "function" in t)],
            "created_at": job.created_at, "updated_at": job.updated_at, "step": job.step,
            "calls": len(job.calls), "awaiting": waiting, "error": job.error and job.error.type}


def console_router(runtime: Any, settings: Any, tenant: Any, *, stream_slots: Any) -> APIRouter:
    """The page's routes and the console's read-only endpoints. ``tenant``: the API's ``Annotated`` dependency
    (authentication and rate limit), as :func:`executor.api.tracing.trace_router` takes it."""
    router = APIRouter()
    depends = typing.get_args(tenant)[1]
    files = _static_files()
    events_redis = AsyncRedisFactory(runtime.redis, block_s=settings.sse_heartbeat_s)
    workers = _WorkerProbe(settings)

    @router.get("/console", include_in_schema=False)
    def console_root() -> Response:
        return RedirectResponse("/console/", status_code=308, headers=PAGE_HEADERS)

    @router.get("/console/", include_in_schema=False)
    def console_page() -> Response:
        body, media_type = files["index.html"]
        return Response(body, media_type=media_type, headers=PAGE_HEADERS)

    @router.get("/console/{name}", include_in_schema=False)
    def console_file(name: str) -> Response:
        if name not in files:  # a fixed set of names: no path is ever joined from the request
            return Response(json.dumps({"error": {"type": "not_found", "message": "no such console file"}}),
                            status_code=404, media_type="application/json", headers=PAGE_HEADERS)
        body, media_type = files[name]
        return Response(body, media_type=media_type, headers=PAGE_HEADERS)

    def summaries(tenant_name: str, limit: int) -> list[dict[str, Any]]:
        out = []
        for job_id in runtime.store.list_jobs(tenant_name, limit=limit):
            try:
                out.append(job_summary(runtime.store.get(job_id, tenant=tenant_name)))
            except JobNotFoundError:  # expired between the index and the record
                continue
        return out

    @router.get("/v1/console/jobs", tags=["console"])
    def console_jobs(tenant_name: str = depends, limit: int = 50) -> dict[str, Any]:
        """The tenant's most recent jobs (newest first) as summaries: id, request id, status, tools, age, the calls
        waiting for a person."""
        return {"jobs": summaries(tenant_name, max(1, min(limit, 200)))}

    @router.get("/v1/console/events", tags=["console"],
                responses={200: {"description": "Server-Sent Events: `snapshot` ({jobs: [summary]}), then `job` (a summary)",
                                 "content": {"text/event-stream": {"itemSchema": {"type": "object", "properties": {
                                     "event": {"enum": ["snapshot", "job", "error"]}, "data": {"type": "string"}}}}}}})
    async def console_events(tenant_name: str = depends, limit: int = 50, timeout_s: float = 300.0) -> Response:
        """SSE: ``snapshot`` (the summaries of ``GET /v1/console/jobs``), then ``job`` (one summary) whenever one of
        those jobs changes state or a new job appears, until ``timeout_s``; ``: heartbeat`` while idle. Counts
        against the tenant's open event streams (``TOOLRAIL_SSE_MAX_STREAMS_PER_TENANT``)."""
        limit = max(1, min(limit, 200))
        if not stream_slots.acquire(tenant_name):
            raise ApiError(429, "too_many_streams", f"at most {stream_slots.limit} open event streams per tenant; close "
                           "one first", limit=stream_slots.limit)
        stream = _tenant_stream(runtime, events_redis.client(), tenant_name, limit=limit, summaries=summaries,
                                duration_s=max(1.0, min(timeout_s, 900.0)), heartbeat_s=settings.sse_heartbeat_s)
        return SlotStreamingResponse(stream, slots=stream_slots, tenant=tenant_name, media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @router.get("/v1/console/ops", tags=["console"])
    def console_ops(tenant_name: str = depends) -> dict[str, Any]:
        """Workers that answered a ping and the queues each consumes; every queue's depth and oldest message's age;
        this tenant's circuit breakers that are not closed; the reconciler's last sweep."""
        queues = worker_queues(runtime.registry)
        pipe = runtime.redis.pipeline()
        for queue in queues:
            pipe.llen(queue)
            pipe.lindex(queue, -1)  # kombu pushes left, pops right: the oldest message is last
        pipe.get(LAST_SWEEP_KEY)
        replies, now = pipe.execute(), time.time()
        depths = [{"queue": q, "depth": d, "oldest_age_s": round(message_age_s(o, now=now), 3)}
                  for q, d, o in zip(queues, replies[:-1:2], replies[1:-1:2], strict=True)]
        last = replies[-1]
        breakers = []
        for tool in runtime.registry.names():
            state = runtime.breaker.state(tool, tenant_name)
            if state["state"] != "closed" or state["failures"]:
                breakers.append({"tool": tool, **state})
        return {"workers": workers.read(), "queues": depths, "breakers": breakers,
                "reconciler": {"interval_s": settings.reconcile_interval_s,
                               "last_sweep": json.loads(last) if last else None}}

    return router


async def _tenant_stream(runtime: Any, client: Any, tenant: str, *, limit: int, summaries: Any, duration_s: float,
                         heartbeat_s: float) -> AsyncIterator[bytes]:
    """The tenant's recent jobs, then each change: one ``XREAD`` over the event streams of every listed job (the
    streams ``GET /v1/jobs/{id}/events`` reads), woken every second to pick up new jobs from the tenant's index."""
    deadline = time.monotonic() + duration_s
    yield b": stream open\n\n"
    try:
        jobs = await asyncio.to_thread(summaries, tenant, limit)
        server_ms = int((await client.time())[0]) * 1000
    except (redis.RedisError, ExecutorError):
        yield b"event: error\ndata: {\"type\": \"unavailable\"}\n\n"
        return
    cursors = {runtime.store.events_key(j["job_id"]): f"{server_ms - 1}-0" for j in jobs}
    known = {j["job_id"] for j in jobs}
    yield _event("snapshot", {"jobs": jobs})
    quiet_since = time.monotonic()
    while (left := deadline - time.monotonic()) > 0:
        try:
            chunk = await client.xread(cursors, count=200, block=max(1, int(min(1.0, left) * 1000))) if cursors else None
            if not cursors:
                await asyncio.sleep(min(1.0, left))
            changed = set()
            for stream, entries in chunk or []:
                key = stream.decode()
                cursors[key] = entries[-1][0].decode()
                changed.add(key.rsplit(":", 2)[-2])  # tr:job:<id>:events
            ids = await asyncio.to_thread(runtime.store.list_jobs, tenant, limit=limit)
            server_ms = int((await client.time())[0]) * 1000
        except (redis.RedisError, ExecutorError):  # the store guards its own calls (StoreUnavailableError)
            yield b"event: error\ndata: {\"type\": \"unavailable\"}\n\n"
            return
        for job_id in ids:
            if job_id not in known:
                known.add(job_id)
                cursors[runtime.store.events_key(job_id)] = f"{server_ms - 1}-0"
                changed.add(job_id)
        known = set(ids)  # jobs past the window are no longer watched
        cursors = {key: cursor for key, cursor in cursors.items() if key.rsplit(":", 2)[-2] in known}
        for job_id in [j for j in ids if j in changed]:
            try:
                job = await asyncio.to_thread(runtime.store.get, job_id, tenant=tenant)
            except ExecutorError:  # expired, or the store gone (the next read says so)
                continue
            yield _event("job", job_summary(job))
            quiet_since = time.monotonic()
        if time.monotonic() - quiet_since >= heartbeat_s:
            yield b": heartbeat\n\n"
            quiet_since = time.monotonic()


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False, default=str)}\n\n".encode()


class _WorkerProbe:
    """The workers that answer a broadcast (``active_queues``) on the API's broker: their names and queues, asked at
    most every 2 s, one probe at a time (overlapping broadcasts share a reply queue and lose replies:
    ``executor.api.readiness``)."""

    def __init__(self, settings: Any, interval_s: float = 2.0) -> None:
        self._settings, self._interval, self._lock = settings, interval_s, threading.Lock()
        self._app: Any = None
        self._at, self._last = 0.0, {"alive": [], "error": None}

    def _probe_app(self) -> Any:
        if self._app is None:  # the broker of this API's settings (the job store's Redis), configured as the workers'
            from celery import Celery  # noqa: PLC0415

            self._app = Celery("toolrail-console-probe")
            self._app.conf.update(celery_config(redis_url(self._settings),
                                                visibility_timeout_s=self._settings.visibility_timeout_s))
        return self._app

    def read(self) -> dict[str, Any]:
        if time.monotonic() - self._at >= self._interval and self._lock.acquire(blocking=False):
            try:
                replies = self._probe_app().control.inspect(timeout=0.5).active_queues() or {}
                alive = [{"name": name, "queues": sorted(q["name"] for q in queues or [])}
                         for name, queues in sorted(replies.items())]
                self._last = {"alive": alive, "error": None}
            except Exception as exc:  # noqa: BLE001 - a view: report, never raise
                self._last = {"alive": [], "error": type(exc).__name__}
            finally:
                self._at = time.monotonic()
                self._lock.release()
        return {**self._last, "checked_s_ago": round(time.monotonic() - self._at, 1)}
