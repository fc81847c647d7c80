"""The job API as an extension sees it: ``executor.ports.Jobs`` and ``executor.ports.ApiContext``, built once.

``create_app`` hands an :class:`ApiSurface` to every ``toolrail.api`` mount (mcpbridge's ``/mcp`` and
``/v1/mcp-servers``); ``toolrail mcp stdio`` builds a :class:`JobDesk` of its own (``executor.cli``). Either way
a job an extension submits takes ``POST /v1/jobs``'s one path (``executor.runs.submit``) and is waited on as
``GET /v1/jobs/{id}?wait`` waits (``executor.api.waiting``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from executor.api.bodies import ApiError
from executor.api.middleware import LOOPBACK_NAMES
from executor.api.sse import AsyncRedisFactory
from executor.api.waiting import settled
from executor.ports import Jobs, Runtime
from executor.runs.loop import Dispatch, NextStep
from executor.runs.submit import cancel, submit
from executor.store.records import JobRecord
from toolrail.settings import Settings

__all__ = ["ApiSurface", "JobDesk"]


class JobDesk:
    """``executor.ports.Jobs`` over a runtime and the queues it publishes on."""

    def __init__(self, runtime: Runtime, enqueue: NextStep, dispatch: Dispatch | None) -> None:
        self.runtime, self._enqueue, self._dispatch = runtime, enqueue, dispatch
        self._events = AsyncRedisFactory(runtime.redis, block_s=1.0)

    def submit(self, job: JobRecord) -> None:
        submit(self.runtime, job, enqueue=self._enqueue, dispatch=self._dispatch)

    def cancel(self, job_id: str, message: str) -> tuple[JobRecord, bool]:
        return cancel(self.runtime, job_id, message)

    def async_redis(self) -> Any:
        return self._events.client()

    async def settled(self, job_id: str, *, wait_s: float,
                      on_event: Callable[[dict[str, Any]], Awaitable[None]] | None = None) -> str | None:
        return await settled(self.async_redis(), self.runtime.store.events_key(job_id), wait_s=wait_s, block_s=1.0,
                             on_event=on_event, statuses=self.runtime.store.statuses_key(job_id))


@dataclass
class ApiSurface:
    """``executor.ports.ApiContext`` of one app."""

    settings: Settings
    jobs: Jobs
    tenant: Any
    rate_limiter: Any = None
    loopback_names: tuple[str, ...] = tuple(sorted(LOOPBACK_NAMES))

    def error(self, status: int, type_: str, message: str, **details: Any) -> Exception:
        return ApiError(status, type_, message, **details)
