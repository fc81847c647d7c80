"""Waiting for a job without polling: ``GET /v1/jobs/{id}?wait=S`` and ``POST /v1/jobs`` with ``Prefer: wait=S``.

    GET  /v1/jobs/{id}?wait=S     the record the moment the job settles (ends, or waits for a person), or after S
    POST /v1/jobs  Prefer: wait=S   200 with the settled job's record, else 202 {job_id, request_id, status} after S;
                                    ``Preference-Applied: wait=S`` whenever it waited (RFC 7240 §4.3)

"Settled" is what a client waits for: a terminal status (``succeeded``, ``failed``, ``needs_review``, ...) or
``awaiting_approval``. A waiter is one coroutine blocking in ``XREAD`` on the job's status stream (written in the
same script as each status event of the stream SSE reads, and holding nothing else, so a call's or a progress event
does not wake it): no thread is held while it waits, and it wakes the moment the status lands — Celery's
``.get()`` for the job API, without a poll interval's latency or its requests. The stream is read from its start
and the *latest* status decides, so a job that waited for approval and then resumed does not wake a later waiter.

Each tenant may hold ``limit`` waiters per API process (like SSE streams); past it ``GET ?wait`` is 429 and
``POST``'s preference is not applied (202 at once, no ``Preference-Applied``): the job was created either way.
A wait is bounded by :data:`MAX_WAIT_S`; a longer one asked for is cut to it (the header says what applied).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis
import redis.asyncio as aredis
from fastapi.responses import JSONResponse
from pydantic_core import to_json
from starlette.concurrency import run_in_threadpool

from executor.api.bodies import ApiError
from executor.api.sse import AsyncRedisFactory, StreamSlots
from executor.store.records import TERMINAL_JOB, JobRecord
from toolrail.logging import get_logger

__all__ = ["MAX_WAIT_S", "SETTLED", "JobWaiter", "RecordResponse", "preferred_wait", "settled"]

log = get_logger("toolrail.api.waiting")

#: The longest one request waits, in seconds (``?wait=`` and ``Prefer: wait=`` above it are cut to it).
MAX_WAIT_S = 60.0
#: Statuses a waiter wakes at: the job ended, or it waits for a person.
SETTLED = TERMINAL_JOB | {"awaiting_approval"}

_WAIT_PREFERENCE = re.compile(r'^\s*wait\s*=\s*"?(\d+(?:\.\d+)?)"?\s*$', re.IGNORECASE)


def preferred_wait(prefer: str | None) -> float | None:
    """The ``wait`` preference of a ``Prefer`` header in seconds (RFC 7240: comma-separated preferences, each
    ``token[=value]`` with ``;`` parameters); None when it names none or its value is not a number."""
    if not prefer:
        return None
    for preference in prefer.split(","):
        match = _WAIT_PREFERENCE.match(preference.split(";", 1)[0])
        if match:
            return float(match.group(1))
    return None


async def settled(client: aredis.Redis, key: str, *, wait_s: float, block_s: float = MAX_WAIT_S,
                  on_event: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
                  statuses: str | None = None) -> str | None:
    """The settled status the job's event stream ``key`` reaches within ``wait_s`` seconds, or None.

    One ``XREAD`` per batch of events (each blocking at most ``block_s``): the backlog returns at once, then it
    blocks until the next event. ``on_event``: awaited with every other event (a call's progress, say). Without it,
    ``statuses`` (the job's status-only stream, ``RedisJobStore.statuses_key``) is read instead, so that no call or
    progress event wakes the waiter; a job stored before that stream existed has none, and ``key`` is read.
    """
    deadline = time.monotonic() + wait_s
    last, latest, field, chunk = "0", None, b"data", None
    if statuses is not None and on_event is None:
        chunk = await client.xread({statuses: "0"}, count=100)  # its backlog at once; none: read the events
        if chunk:
            key, field = statuses, b"status"
    while True:
        for _stream, entries in chunk or []:
            for entry_id, fields in entries:
                last = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                if field == b"status":
                    latest = fields[field].decode()
                    continue
                event = json.loads(fields[field])
                if event.get("type") == "status":
                    latest = event.get("status")
                elif on_event is not None:
                    await on_event(event)
        if latest in SETTLED:
            return latest
        if (left := deadline - time.monotonic()) <= 0:
            return None
        chunk = await client.xread({key: last}, count=100, block=max(1, int(min(left, block_s) * 1000)))


class RecordResponse(JSONResponse):
    """A job record as JSON, written by pydantic-core (Rust) rather than ``json.dumps``: the record is the largest
    body the API sends, and ``json.dumps`` of it was 3.2 % of the API's CPU at 16 clients (py-spy, GIL samples)."""

    def render(self, content: Any) -> bytes:
        return to_json(content, inf_nan_mode="null", serialize_unknown=True)


class JobWaiter:
    """The API's waits over the job store: a tenant's waiters bounded, each one coroutine on the event stream."""

    def __init__(self, store: Any, sync_redis: redis.Redis, *, limit: int) -> None:
        self._store = store
        self._events = AsyncRedisFactory(sync_redis, block_s=MAX_WAIT_S)
        self.slots = StreamSlots(limit)

    async def job(self, job_id: str, *, tenant: str, wait_s: float) -> JobRecord:
        """The job as ``GET /v1/jobs/{id}?wait=`` answers it: at once when settled (or ``wait_s`` is 0), else when it
        settles or ``wait_s`` (at most :data:`MAX_WAIT_S`) has passed. 404 for another tenant's job first."""
        job = await run_in_threadpool(self._store.get, job_id, tenant=tenant)
        if wait_s <= 0 or job.status in SETTLED:
            return job
        if not self.slots.acquire(tenant):
            raise ApiError(429, "too_many_waiters", f"at most {self.slots.limit} waiting requests per tenant; wait "
                           "for one to answer first", limit=self.slots.limit)
        try:
            reached = await self._wait(job_id, min(wait_s, MAX_WAIT_S))
        finally:
            self.slots.release(tenant)
        return await run_in_threadpool(self._store.get, job_id, tenant=tenant) if reached else job

    async def submitted(self, job: JobRecord, *, created: bool, prefer: str | None) -> JSONResponse:
        """``POST /v1/jobs``'s answer for a stored job: 202 (200 for an idempotent repeat) with its id at once, or,
        with ``Prefer: wait=S``, 200 with the record once it settles within S, else 202 with its id."""
        headers = {"Location": f"/v1/jobs/{job.job_id}"}
        short = {"job_id": job.job_id, "request_id": job.request_id, "status": job.status}
        wait_s = preferred_wait(prefer)
        if wait_s is None:
            return JSONResponse(short, status_code=202 if created else 200, headers=headers)
        wait_s = min(wait_s, MAX_WAIT_S)
        if job.status in SETTLED and created:  # stored settled in the create script itself: this is the record
            return RecordResponse(job.public(), status_code=200, headers={**headers, **_applied(wait_s)})
        if job.status not in SETTLED:
            if not self.slots.acquire(job.tenant):
                return JSONResponse(short, status_code=202, headers=headers)  # a preference, not a demand
            try:
                reached = await self._wait(job.job_id, wait_s)
            finally:
                self.slots.release(job.tenant)
            if not reached:
                return JSONResponse(short, status_code=202, headers={**headers, **_applied(wait_s)})
        record = await run_in_threadpool(self._store.get, job.job_id)
        return RecordResponse(record.public(), status_code=200, headers={**headers, **_applied(wait_s)})

    async def _wait(self, job_id: str, wait_s: float) -> bool:
        try:
            return await settled(self._events.client(), self._store.events_key(job_id), wait_s=wait_s,
                                 statuses=self._store.statuses_key(job_id)) is not None
        except redis.RedisError as exc:  # the record is still readable or the caller says 503: not this wait's call
            log.warning("job.wait_failed", job_id=job_id, error=f"{type(exc).__name__}: {exc}")
            return False


def _applied(wait_s: float) -> dict[str, str]:
    return {"Preference-Applied": f"wait={wait_s:g}"}
