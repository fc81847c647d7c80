"""What the run loop and an extension may use of the executor: typed ports, nothing concrete.

The executor's own orchestration (``executor.runs``) and an extension (``mcpbridge``) see the process's runtime
through :class:`Runtime` and publish work through :class:`Queues`. An extension adds tools through a
:class:`ToolSource` (``toolrail.tool_sources`` entry points), routes through ``mount(app, api)`` given an
:class:`ApiContext` (``toolrail.api``), submits and follows jobs through :class:`Jobs`, and starts a long-lived
third-party command in the tool sandbox through the :class:`SandboxLauncher` :data:`LAUNCHER`. The records and the call
boundary it handles are re-exported here (``JobRecord``, ``CallRun``, ``SandboxResult``, the limiter of calls in
flight), so an extension imports ``executor.ports`` and ``executor.errors``, nothing else of the executor. The
concrete parts — ``executor.runtime.Runtime``, the Celery queues of ``executor.worker.tasks``, the API of
``executor.api`` — are wired by the assembly (``executor.cli``, ``executor.stack``), the one place that knows both.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import redis

from decider.protocol import Decider
from executor.calls.breaker import CircuitBreaker
from executor.calls.concurrency import ConcurrencyLimitedError, ConcurrencyLimiter
from executor.calls.pipeline import Pipeline
from executor.sandbox.boundary import CallRun, Sandbox, SandboxResult
from executor.sandbox.answer import MAX_RESULT_BYTES
from executor.sandbox.launcher import LAUNCHER as _LAUNCHER
from executor.store.idempotency import IdempotencyStore
from executor.store.records import CallRecord, JobRecord, RedisJobStore
from toolrail.settings import Settings
from tools.registry import Registry
from tools.spec import ToolSpec

__all__ = ["LAUNCHER", "MAX_RESULT_BYTES", "ApiContext", "CallRun", "ConcurrencyLimitedError", "ConcurrencyLimiter",
           "JobRecord", "Jobs", "Queues", "Runtime", "SandboxLauncher", "SandboxResult", "ToolSource"]


class Queues(Protocol):
    """Where work is published: each method queues one task and returns (the broker's refusal raises)."""

    def decide(self, job: JobRecord) -> None:
        """The decision of the job's current step."""

    def dispatch(self, job: JobRecord, call: CallRecord) -> None:
        """One call, on its tool's queue."""

    def webhook(self, job: JobRecord, slug: str) -> None:
        """One attempt of the job's webhook delivery ``slug`` (``executor.runs.webhooks``)."""

    def subscribe(self, queue: str) -> int:
        """Ask the running workers to consume ``queue`` too; how many answered."""


class Runtime(Protocol):
    """One process's dependencies, built once by the assembly (``executor.runtime.Runtime`` is the one there is)."""

    settings: Settings
    redis: redis.Redis
    store: RedisJobStore
    idempotency: IdempotencyStore
    registry: Registry
    #: Where this process publishes work (None: a runtime that only reads, such as a test's or a CLI's).
    queues: Queues | None

    @property
    def calls(self) -> Pipeline: ...

    @property
    def breaker(self) -> CircuitBreaker: ...

    @property
    def concurrency(self) -> ConcurrencyLimiter: ...

    @property
    def sandbox(self) -> Sandbox: ...

    def decider(self) -> Decider | None: ...

    def tenant_specs(self, tenant: str, names: list[str] | None = None) -> dict[str, ToolSpec]: ...

    def tool_env(self, spec: ToolSpec) -> dict[str, str]: ...


class ToolSource(Protocol):
    """Tools beyond the registry (``toolrail.tool_sources``), each run by the source's own runner."""

    def specs(self, rt: Runtime, tenant: str, names: list[str] | None = None) -> Mapping[str, ToolSpec]:
        """The tenant's tools of this source (all, or those of ``names`` it provides)."""

    def owns(self, spec: ToolSpec) -> bool:
        """Whether ``spec`` is one of this source's tools."""

    def admit(self, rt: Runtime, spec: ToolSpec) -> AbstractContextManager[None]:
        """What a call of ``spec`` holds around its run, before its idempotency lock (none free: a retryable error)."""

    def run(self, rt: Runtime, spec: ToolSpec, call: CallRun) -> SandboxResult:
        """Run one call: the sandbox's contract (``SandboxResult``, or a ``SandboxError`` subclass)."""

    def queues(self, client: redis.Redis) -> list[str]:
        """The queues this source's tools run on, as stored in ``client`` (what a worker started now consumes)."""


class Jobs(Protocol):
    """How an extension submits a job and follows it, by the paths ``POST /v1/jobs`` and ``GET /v1/jobs/{id}?wait``
    take (``executor.api.context.JobDesk``)."""

    runtime: Runtime

    def submit(self, job: JobRecord) -> None:
        """Store the job and queue its first work; a queueing failure ends it ``failed`` and raises."""

    def cancel(self, job_id: str, message: str) -> tuple[JobRecord, bool]:
        """Cancel the job (its running calls are stopped); ``(job, cancelled)``, False when it had ended."""

    def async_redis(self) -> Any:
        """This event loop's client of the deployment's Redis (``redis.asyncio``)."""

    async def settled(self, job_id: str, *, wait_s: float,
                      on_event: Callable[[dict[str, Any]], Awaitable[None]] | None = None) -> str | None:
        """The status the job settles at (ended, or waiting on a person) within ``wait_s``, else None; ``on_event`` is
        awaited with its other events (a call's progress)."""


class ApiContext(Protocol):
    """What an extension's routes may use of the job API (``toolrail.api`` mounts get one)."""

    settings: Settings
    jobs: Jobs
    #: The FastAPI dependency of a route's tenant: authenticated, then charged to its rate limit bucket.
    tenant: Any
    #: The API's per-tenant rate limiter (None: no limit), for an endpoint that charges requests itself.
    rate_limiter: Any
    #: Host names that name this machine (a deployment without API keys serves these only).
    loopback_names: tuple[str, ...]

    def error(self, status: int, type_: str, message: str, **details: Any) -> Exception:
        """The API's typed error, to raise: ``{"error": {type, message, details}}`` with ``status``."""


class SandboxLauncher(Protocol):
    """How an extension starts a long-lived third-party command (a stdio server) in the tool sandbox: its own
    namespaces, uid, limits and Landlock, an environment from nothing, a relay bounding its stdout
    (``executor.sandbox.launch``). The relay's last stderr line starts with ``exit_line``; a stdout line over the
    limit, with ``line_too_long``."""

    exit_line: str
    line_too_long: str

    def scratch_dir(self, prefix: str) -> str:
        """A fresh scratch directory under the sandbox's scratch root (the caller removes it)."""

    def command(self, argv: Sequence[str], *, scratch: str, memory_mb: int, cpu_s: int, network: bool,
                max_line_bytes: int, env: Mapping[str, str],
                read_paths: Sequence[str] = ()) -> tuple[str, list[str], dict[str, str]]:
        """``(executable, arguments, environment)`` of the process that runs ``argv`` confined, with ``env`` declared
        and ``read_paths`` (the registration's, checked against the operator's allow-list) readable."""


#: The tool sandbox's launcher.
LAUNCHER: SandboxLauncher = _LAUNCHER
