"""Server-Sent Events of a job's state changes, on the event loop: no thread held per stream.

A stream is one coroutine blocking in ``XREAD`` on an asyncio Redis connection. It ends when
the job reaches a terminal status, when its time is up, or when the client goes away: Starlette
cancels the stream on ``http.disconnect`` (ASGI < 2.4 servers such as uvicorn), and an idle
stream sends a comment line (``: heartbeat``) every ``heartbeat_s``, so a write to a closed
socket ends it on any server (proxies also keep it open). Not ``request.is_disconnected()`` at
every wake-up: behind ``BaseHTTPMiddleware`` each call spawns a task group, and at 100 streams
those dominated the loop (healthz p95 190 ms with a 1 s heartbeat; 23 ms without).

Each tenant may hold ``limit`` open streams per API process (:class:`StreamSlots`); the slot is
given back when the response ends however it ends (:class:`SlotStreamingResponse`).
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import redis
import redis.asyncio as aredis
from prometheus_client.core import GaugeMetricFamily
from starlette.responses import StreamingResponse

from executor.store.records import TERMINAL_JOB

__all__ = ["AsyncRedisFactory", "SlotStreamingResponse", "StreamSlots", "job_event_stream"]

#: Sync connection classes and their asyncio counterparts.
_ASYNC_CONNECTIONS = {
    redis.connection.Connection: aredis.connection.Connection,
    redis.connection.SSLConnection: aredis.connection.SSLConnection,
    redis.connection.UnixDomainSocketConnection: aredis.connection.UnixDomainSocketConnection,
}


class StreamSlots:
    """Open streams per tenant in this process, at most ``limit`` each."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: Counter[str] = Counter()
        self._lock = threading.Lock()  # acquired from the thread pool (sync dependencies), released on the loop

    def acquire(self, tenant: str) -> bool:
        """Take a slot for ``tenant``; False when it already holds ``limit`` streams."""
        with self._lock:
            if self._open[tenant] >= self.limit:
                return False
            self._open[tenant] += 1
            return True

    def release(self, tenant: str) -> None:
        with self._lock:
            self._open[tenant] -= 1
            if self._open[tenant] <= 0:
                del self._open[tenant]

    def open(self, tenant: str) -> int:
        with self._lock:
            return self._open[tenant]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """Prometheus collector protocol: open streams per tenant (the public scrape sums the tenants away)."""
        gauge = GaugeMetricFamily("toolrail_sse_open_streams", "Open job event streams in this API process",
                                  labels=["tenant"])
        with self._lock:
            for tenant, count in sorted(self._open.items()):
                gauge.add_metric([tenant], count)
        yield gauge


class SlotStreamingResponse(StreamingResponse):
    """A streaming response that gives its tenant's slot back when it ends, however it ends."""

    def __init__(self, content: AsyncIterator[bytes], *, slots: StreamSlots, tenant: str, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._slots, self._tenant = slots, tenant

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._slots.release(self._tenant)


class AsyncRedisFactory:
    """An asyncio Redis client on the same server as a sync one, one per event loop.

    Its socket timeout exceeds the longest ``XREAD`` block, so a quiet stream is not a timeout.
    """

    def __init__(self, sync_client: redis.Redis, *, block_s: float) -> None:
        pool = sync_client.connection_pool
        self._kwargs = {**pool.connection_kwargs, "socket_timeout": block_s + 10}
        self._connection_class = _ASYNC_CONNECTIONS.get(pool.connection_class, aredis.connection.Connection)
        self._clients: dict[int, aredis.Redis] = {}

    def client(self) -> aredis.Redis:
        loop = id(asyncio.get_running_loop())
        client = self._clients.get(loop)
        if client is None:
            pool = aredis.ConnectionPool(connection_class=self._connection_class, **self._kwargs)
            client = self._clients[loop] = aredis.Redis(connection_pool=pool)
        return client


def _event(event_id: str, data: dict[str, Any]) -> bytes:
    return (f"id: {event_id}\nevent: {data.get('type', 'message')}\n"
            f"data: {json.dumps(data, ensure_ascii=False, default=str)}\n\n").encode()


async def job_event_stream(client: aredis.Redis, key: str, *, last_id: str, duration_s: float,
                           heartbeat_s: float) -> AsyncIterator[bytes]:
    """The events of stream ``key`` after ``last_id`` as SSE bytes, for at most ``duration_s``."""
    deadline = time.monotonic() + duration_s
    wait_s = heartbeat_s * random.uniform(0.5, 1.0)  # streams opened together do not wake together
    yield b": stream open\n\n"
    while (left := deadline - time.monotonic()) > 0:
        try:
            chunk = await client.xread({key: last_id}, count=100, block=max(1, int(min(wait_s, left) * 1000)))
        except (redis.ConnectionError, redis.TimeoutError):
            yield b"event: error\ndata: {\"type\": \"unavailable\"}\n\n"
            return
        wait_s = heartbeat_s
        if not chunk:
            yield b": heartbeat\n\n"
            continue
        for _stream, entries in chunk:
            for entry_id, fields in entries:
                last_id = entry_id.decode()
                data = json.loads(fields[b"data"])
                yield _event(last_id, data)
                if data.get("type") == "status" and data.get("status") in TERMINAL_JOB:
                    return
