"""Readiness of the API process: Redis answers, and workers have been seen recently.

Why it flapped: ``/readyz`` asked the workers with a 0.5 s broadcast ping on every request,
from FastAPI's thread pool, through one shared Celery app. Pings that overlap (two health
checkers, a poller) share the app's reply queue and connection: measured with one live worker,
7 of 40 pings from 4 threads at once came back with no reply, 0 of 23 sequential ones did. So
a ready service answered 503 right after 200.

Now one probe runs at a time, at most every ``probe_interval_s``; the result is cached; and
once workers have answered, a missed ping does not make the service unready until no worker
has answered for ``workers_grace_s``. Redis is checked live: without it no job can be taken.
While not ready the body says what it is waiting for.

A supervised worker pool (``toolrail serve``) that died is known at once, without waiting out the grace: its
supervisor sets ``WORKER_DOWN_KEY`` until the restarted pool answers (and, when it decides, has its decider warm),
and ``/readyz`` answers 503 with ``reason: worker_down`` meanwhile (``decider_warming`` while a pool that just
started loads its model) — in every API process of that serve: the mark is in Redis.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

__all__ = ["DEFAULT_PROBE_INTERVAL_S", "DEFAULT_WORKERS_GRACE_S", "WORKER_DOWN_KEY", "Readiness", "mark_worker_down"]

DEFAULT_PROBE_INTERVAL_S = 2.0
DEFAULT_WORKERS_GRACE_S = 30.0
#: Set by a worker supervisor while its pool is down (expires on its own if the supervisor dies too).
WORKER_DOWN_KEY = "tr:readiness:worker_down"


def mark_worker_down(client: redis.Redis, info: dict[str, Any] | None, ttl_s: int = 120) -> None:
    """Mark the supervised worker pool down (``info``: what the supervisor knows), or up again (None)."""
    if info is None:
        client.delete(WORKER_DOWN_KEY)
    else:
        client.set(WORKER_DOWN_KEY, json.dumps(info), ex=ttl_s)


@dataclass
class Readiness:
    """``check()`` → ``(ready, body)`` for ``/readyz``.

    ``ping_workers`` returns how many workers answered, or ``(count, queues they consume)``; with
    ``expected_queues`` (``executor.worker.config.worker_queues``) the body names each expected queue no live
    worker consumes (``queues_without_workers``: reported, not waited for — a tool's workers may be scaled to 0)."""

    redis_client: redis.Redis
    ping_workers: Callable[[], int | tuple[int, set[str]]]
    expected_queues: Callable[[], list[str]] | None = None
    probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S
    workers_grace_s: float = DEFAULT_WORKERS_GRACE_S
    clock: Callable[[], float] = time.monotonic
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _probed_at: float | None = field(default=None, init=False)
    _workers: int = field(default=0, init=False)
    _consumed: set[str] | None = field(default=None, init=False)
    _workers_seen_at: float | None = field(default=None, init=False)
    _probe_error: str | None = field(default=None, init=False)
    _was_ready: bool = field(default=False, init=False)

    def _probe_workers(self) -> None:
        now = self.clock()
        if not self._lock.acquire(blocking=False):
            return  # another request is probing: use what it finds next time
        try:
            if self._probed_at is not None and now - self._probed_at < self.probe_interval_s:
                return
            try:
                answer = self.ping_workers()
                count, self._consumed = answer if isinstance(answer, tuple) else (answer, None)
                self._workers, self._probe_error = int(count), None
            except Exception as exc:  # noqa: BLE001 - readiness reports, never raises
                self._workers, self._probe_error, self._consumed = 0, type(exc).__name__, None
            self._probed_at = self.clock()
            if self._workers > 0:
                self._workers_seen_at = self._probed_at
        finally:
            self._lock.release()

    def check(self) -> tuple[bool, dict[str, Any]]:
        checks: dict[str, Any] = {}
        try:
            self.redis_client.ping()
            checks["redis"] = "ok"
        except redis.RedisError as exc:
            checks["redis"] = f"down: {type(exc).__name__}"
        down = None
        if checks["redis"] == "ok":
            self._probe_workers()
            try:
                down = self.redis_client.get(WORKER_DOWN_KEY)
            except redis.RedisError:
                down = None
            if down is not None:
                checks["worker_pool"] = json.loads(down)
        checks["workers"] = self._workers
        if self._consumed is not None and self._workers and self.expected_queues is not None:
            unconsumed = [name for name in self.expected_queues() if name not in self._consumed]
            if unconsumed:
                checks["queues_without_workers"] = unconsumed
        if self._probe_error:
            checks["workers_error"] = self._probe_error
        seen_at = self._workers_seen_at
        workers_ok = seen_at is not None and self.clock() - seen_at <= self.workers_grace_s
        if seen_at is not None:
            checks["workers_seen_s_ago"] = round(self.clock() - seen_at, 1)
        workers_ok = workers_ok and down is None
        waiting = [name for name, ok in (("redis", checks["redis"] == "ok"), ("workers", workers_ok)) if not ok]
        ready = not waiting
        body: dict[str, Any] = {"status": "ready" if ready else ("not_ready" if self._was_ready else "starting"),
                                "checks": checks}
        if waiting:
            body["waiting_for"] = waiting
        if down is not None:
            body["reason"] = checks["worker_pool"].get("reason", "worker_down")
        self._was_ready = self._was_ready or ready
        return ready, body
