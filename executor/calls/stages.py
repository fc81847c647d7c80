"""The stages of the call pipeline (``executor.calls.pipeline``), in the order it runs them.

Each is a small class: what it needs is given to it once (``executor.runtime.Runtime.calls`` builds the list),
``__call__(invocation, next)`` runs one call through it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

import redis

from executor.calls.breaker import CircuitBreaker, CircuitOpenError, is_health_failure
from executor.calls.concurrency import ConcurrencyLimiter
from executor.calls.pipeline import Invocation, Next, Outcome
from executor.errors import CallCancelledError
from executor.store.idempotency import IdempotencyStore, payload_hash
from executor.store.records import RedisJobStore
from toolrail import tracing
from toolrail.logging import get_logger
from tools.spec import ToolSpec

__all__ = ["LEASE_MARGIN_S", "LOCK_GRACE_S", "Admission", "Breaker", "Cancellation", "Idempotency", "Running", "Slot",
           "Span"]

log = get_logger("toolrail.executor")

#: The idempotency lock outlives the tool's wall-clock limit by this much (bookkeeping after the kill).
LOCK_GRACE_S = 10.0
#: A concurrency slot's lease outlives the call's wall-clock limit by this much (a killed worker's slot frees then).
LEASE_MARGIN_S = 60.0


class Slot:
    """One of the queue's adaptive concurrency slots, taken first (waiting holds no lock); the call's time in the
    rest of the pipeline is the limiter's latency sample. None free in ``wait_s``: ``ConcurrencyLimitedError``
    (retryable: the call goes back to its queue)."""

    def __init__(self, limiter: ConcurrencyLimiter, *, wait_s: float) -> None:
        self.limiter, self.wait_s = limiter, wait_s

    def __call__(self, invocation: Invocation, next: Next) -> Outcome:  # noqa: A002
        held = self.limiter.acquire(invocation.queue, lease_s=invocation.spec.timeout_s + LEASE_MARGIN_S,
                                    wait_s=self.wait_s)
        outcome = None
        try:
            outcome = next(invocation)
            return outcome
        finally:
            try:
                self.limiter.release(held, rtt_s=time.monotonic() - held.started if outcome is not None else None)
            except redis.RedisError:
                pass  # the lease expires on its own


class Admission:
    """What the spec's tool source holds around a call (an MCP tenant's call slot), before the idempotency lock:
    a call sent back for want of it holds nothing another delivery would wait for."""

    def __init__(self, admit: Callable[[ToolSpec], AbstractContextManager[None]]) -> None:
        self.admit = admit

    def __call__(self, invocation: Invocation, next: Next) -> Outcome:  # noqa: A002
        with self.admit(invocation.spec):
            return next(invocation)


class Idempotency:
    """A side-effecting call runs once per (job, call): the lock before, the outcome stored after; a redelivery
    replays the stored outcome (``executor.store.idempotency``). Read-only calls pass straight through."""

    def __init__(self, store: IdempotencyStore) -> None:
        self.store = store

    def __call__(self, invocation: Invocation, next: Next) -> Outcome:  # noqa: A002
        spec, call = invocation.spec, invocation.call
        if not spec.side_effects:
            return next(invocation)
        digest = payload_hash(call.name, call.arguments or {})
        begin = self.store.begin(invocation.job_id, call.id, digest, lock_s=spec.timeout_s + LOCK_GRACE_S)
        if begin.replay is not None:
            log.info("call.replayed", job_id=invocation.job_id, call_id=call.id)
            return Outcome.from_record(begin.replay)
        outcome = next(invocation)
        self.store.complete(invocation.job_id, call.id, digest, outcome.record())
        return outcome


class Running:
    """The call's record says ``running`` (one more attempt) before it runs."""

    def __init__(self, store: RedisJobStore) -> None:
        self.store = store

    def __call__(self, invocation: Invocation, next: Next) -> Outcome:  # noqa: A002
        call = invocation.call
        call.status, call.attempts, call.started_at = "running", call.attempts + 1, time.time()
        self.store.put_call(invocation.job_id, call)
        log.info("call.start", job_id=invocation.job_id, call_id=call.id, tool=call.name)
        return next(invocation)


class Cancellation:
    """A call of a cancelled job does not start, and one running is stopped: the runner polls the job's cancel mark
    (``RedisJobStore.cancelled``) and kills the tool process (``CallCancelledError``)."""

    def __init__(self, store: RedisJobStore) -> None:
        self.store = store

    def __call__(self, invocation: Invocation, next: Next) -> Outcome:  # noqa: A002
        job_id = invocation.job_id
        if self.store.cancelled(job_id):
            return Outcome.failed(CallCancelledError("the job was cancelled before the call started; it did not run",
                                                     stopped_after_s=0.0))

        def cancelled() -> bool:
            try:
                return self.store.cancelled(job_id)
            except redis.RedisError:
                return False  # the call goes on; a cancel it missed ends the job anyway

        invocation.run = dataclasses.replace(invocation.run, cancelled=cancelled)
        return next(invocation)


class Span:
    """The ``execute_tool {name}`` span around the run; the sandbox child records its own span under it."""

    def __call__(self, invocation: Invocation, next: Next) -> Outcome:  # noqa: A002
        if not tracing.recording():
            return next(invocation)
        spec, run = invocation.spec, invocation.run
        with tracing.execute_tool_span(spec.name, run.call_id, arguments=run.arguments, **{
                "toolrail.job.id": run.job_id, "toolrail.tool.queue": spec.queue_name,
                "toolrail.tool.side_effects": bool(spec.side_effects)}) as span:
            invocation.run = dataclasses.replace(run, trace_context=tracing.current_context())
            try:
                outcome = next(invocation)
            except Exception as exc:
                tracing.record_tool(span, status="failed", error={"type": type(exc).__name__, "message": str(exc)})
                raise
            if outcome.ok:
                tracing.record_tool(span, status="succeeded", result=outcome.result)
                span.set_attribute("toolrail.tool.duration_s", round(float(outcome.duration_s or 0.0), 6))
            else:
                tracing.record_tool(span, status="failed", error=outcome.error.model_dump() if outcome.error else None)
            return outcome


class Breaker:
    """The (tenant, tool) circuit breaker: open, the call fails fast without running; a run's outcome is recorded
    when it says something of the tool's health (a cancellation never does)."""

    def __init__(self, breaker: CircuitBreaker) -> None:
        self.breaker = breaker

    def __call__(self, invocation: Invocation, next: Next) -> Outcome:  # noqa: A002
        spec, tenant, breaker = invocation.spec, invocation.tenant, self.breaker
        key = spec.breaker_name
        admission = breaker.admit(key, tenant=tenant, probe_ttl_s=spec.timeout_s + 5)
        if admission.state == "open":
            return Outcome.failed(CircuitOpenError(
                f"{key} failed {breaker.failures} times in a row for this tenant; its circuit is open, retry in "
                f"{admission.retry_in_s:.1f} s", tool=spec.name, retry_in_s=round(admission.retry_in_s, 2)))
        outcome = next(invocation)
        if isinstance(outcome.failure, CallCancelledError):
            return outcome  # the job's owner stopped it: nothing said of the tool (a probe's slot lapses on its own)
        healthy = outcome.ok or (outcome.failure is not None and not is_health_failure(outcome.failure))
        breaker.record(key, tenant=tenant, ok=healthy)
        return outcome
