"""The executor's logic as plain functions: decide a job, run one call, finalize.

Celery tasks (``executor.tasks``) only call these; tests can call them directly against a
real Redis. Every function is safe to run twice for the same input: statuses only move
forward, terminal calls are recorded once (``finish_call``), side effects go through
idempotency records.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from decider.errors import DeciderPermanentError
from decider.checked import CheckedDecision, ClientOutput, decide_checked
from decider.protocol import DecideRequest
from executor.breaker import guarded_run
from executor.errors import SandboxError
from executor.idempotency import payload_hash
from executor.runtime import Runtime
from executor.sandbox import CallRun
from executor.store import TERMINAL_CALL, TERMINAL_JOB, CallRecord, JobRecord
from toolrail.logging import get_logger
from tools.calls import call_id
from tools.errors import UnknownToolError
from tools.spec import ToolSpec

__all__ = ["Dispatch", "decide_job", "finalize_job", "job_specs", "run_call"]

log = get_logger("toolrail.executor")

#: The idempotency lock outlives the tool's wall-clock limit by this much (bookkeeping after the kill).
LOCK_GRACE_S = 10.0

#: ``dispatch(job, call)`` enqueues one call on its tool queue.
Dispatch = Callable[[JobRecord, CallRecord], None]


def job_specs(rt: Runtime, job: JobRecord) -> dict[str, ToolSpec]:
    """The tools this job may call: registered names plus inline specs."""
    specs = {name: rt.registry.get(name) for name in job.tools}
    for raw in job.inline_tools:
        spec = ToolSpec.from_openai(raw)
        specs[spec.name] = spec
    return specs


def _set_status(rt: Runtime, job_id: str, status: str, **fields: Any) -> JobRecord:
    def mutate(job: JobRecord) -> None:
        if job.status in TERMINAL_JOB:
            return
        job.status = status  # type: ignore[assignment]
        for key, value in fields.items():
            setattr(job, key, value)

    return rt.store.update(job_id, mutate)


def _client_output(job: JobRecord) -> ClientOutput | None:
    output = job.client_output
    if output is None:
        return None
    if output.get("tool_calls") is not None:
        return list(output["tool_calls"])
    return output.get("raw_output", "")


def decide_job(rt: Runtime, job_id: str, dispatch: Dispatch) -> JobRecord:
    """Decide (or take the client's output), check and re-ask (``decide_checked``), then dispatch the calls."""
    job = rt.store.get(job_id)
    if job.status in TERMINAL_JOB:
        return job
    if job.status == "running":  # a redelivered decide: the calls exist, make sure they are queued
        for call in job.calls:
            if call.status not in TERMINAL_CALL:
                dispatch(job, call)
        return job
    specs = job_specs(rt, job)
    first = _client_output(job)
    decider = rt.decider if job.messages else None  # asked for only when a decision or re-ask is needed
    if first is None and (decider is None or decider() is None):
        return _set_status(rt, job_id, "failed", error={"type": "decider_unavailable", "message":
                           "no decider is configured and the job brought no tool calls", "details": {}})
    _set_status(rt, job_id, "validating" if first is not None else "deciding")
    request = DecideRequest(request_id=job.request_id, messages=job.messages, tools=list(specs.values()),
                            tool_choice=job.tool_choice, parallel_tool_calls=job.parallel_tool_calls)
    try:
        decision = decide_checked(decider, request, first_output=first, max_reasks=job.max_reasks)
    except DeciderPermanentError as exc:
        return _set_status(rt, job_id, "failed", error={"type": type(exc).__name__, "message": str(exc), "details": {}})
    attempts = [a.to_dict() for a in decision.attempts]
    if decision.status == "needs_review":
        error = dict(decision.error or {})
        if decider is None or decider() is None:
            error["message"] = f"{error.get('message')}; no decider is configured to re-ask"
        log.warning("job.needs_review", job_id=job_id, attempts=len(attempts), error_type=error.get("type"))
        return _set_status(rt, job_id, "needs_review", attempts=attempts, error=error)
    if decision.status == "failed":
        return _set_status(rt, job_id, "failed", attempts=attempts, error=decision.error)
    return _start_calls(rt, job, specs, decision, attempts, dispatch)


def _start_calls(rt: Runtime, job: JobRecord, specs: dict[str, ToolSpec], decision: CheckedDecision,
                 attempts: list[dict[str, Any]], dispatch: Dispatch) -> JobRecord:
    calls = []
    for checked in decision.calls:
        spec = specs[checked.name]
        runnable = spec.entrypoint is not None
        calls.append(CallRecord(id=call_id(job.request_id, checked.index, attempt=decision.attempt), index=checked.index,
                                name=checked.name, arguments=checked.arguments, repairs=list(checked.repairs),
                                status="pending" if runnable else "validated", queue=spec.queue_name if runnable else None))
    rt.store.set_calls(job.job_id, calls)
    to_run = [c for c in calls if c.status == "pending"]
    status = "running" if to_run else "succeeded"
    job = _set_status(rt, job.job_id, status, attempts=attempts, content=decision.content)
    job.calls = calls
    for call in to_run:
        dispatch(job, call)
    log.info("job.calls_dispatched", job_id=job.job_id, calls=len(calls), dispatched=len(to_run))
    return job


def run_call(rt: Runtime, job_id: str, call_id_: str) -> CallRecord:
    """Run one call in the sandbox (once, for side effects) and record its outcome."""
    job = rt.store.get(job_id)
    call = next((c for c in job.calls if c.id == call_id_), None)
    if call is None:
        raise UnknownToolError(f"call {call_id_} not in job {job_id}")
    if call.status in TERMINAL_CALL or job.status in TERMINAL_JOB:
        _maybe_finalize(rt, job_id)
        return call
    spec = job_specs(rt, job)[call.name]
    arguments = call.arguments or {}
    digest = payload_hash(call.name, arguments)
    outcome: dict[str, Any] | None = None
    if spec.side_effects:
        begin = rt.idempotency.begin(job_id, call.id, digest, lock_s=spec.timeout_s + LOCK_GRACE_S)  # may raise retryable
        if begin.replay is not None:
            outcome = {**begin.replay, "replayed": True}
            log.info("call.replayed", job_id=job_id, call_id=call.id)
    call.status, call.attempts, call.started_at = "running", call.attempts + 1, time.time()
    rt.store.put_call(job_id, call)
    if outcome is None:
        log.info("call.start", job_id=job_id, call_id=call.id, tool=call.name)
        try:
            result = guarded_run(rt, spec, CallRun(request_id=job.request_id, job_id=job_id, call_id=call.id,
                                                   idempotency_key=f"{job_id}:{call.id}", arguments=arguments,
                                                   env=rt.tool_env(spec)), tenant=job.tenant)
            for line in result.logs:
                log.info("tool.log", job_id=job_id, call_id=call.id, tool_event=line.get("event"),
                         tool_request_id=line.get("request_id"), tool_pid=line.get("pid"))
            outcome = {"ok": True, "result": result.result, "duration_s": result.duration_s}
        except SandboxError as exc:
            outcome = {"ok": False, "error": exc.to_dict()}
            log.warning("call.failed", job_id=job_id, call_id=call.id, error_type=exc.type, message=str(exc))
        if spec.side_effects:
            rt.idempotency.complete(job_id, call.id, digest, outcome)
    call.finished_at = time.time()
    call.duration_s = outcome.get("duration_s", round(call.finished_at - call.started_at, 6))
    if outcome["ok"]:
        call.status, call.result, call.error = "succeeded", outcome.get("result"), None
    else:
        call.status, call.error = "failed", outcome.get("error")
    remaining = rt.store.finish_call(job_id, call)
    log.info("call.end", job_id=job_id, call_id=call.id, status=call.status, remaining=remaining)
    if remaining == 0:
        finalize_job(rt, job_id)
    return call


def _maybe_finalize(rt: Runtime, job_id: str) -> None:
    """Finish a job whose last call completed but whose finalization was lost (worker death)."""
    job = rt.store.get(job_id)
    if job.status == "running" and job.calls and all(c.status in TERMINAL_CALL for c in job.calls):
        finalize_job(rt, job_id)


def finalize_job(rt: Runtime, job_id: str) -> JobRecord:
    """Set the terminal status from the calls' outcomes."""
    job = rt.store.get(job_id)
    failed = [c for c in job.calls if c.status == "failed"]
    if failed:
        error = {"type": "tool_failed", "message": f"{len(failed)} of {len(job.calls)} call(s) failed",
                 "details": {"calls": [{"id": c.id, "name": c.name, "error": c.error} for c in failed]}}
        job = _set_status(rt, job_id, "failed", error=error)
    else:
        job = _set_status(rt, job_id, "succeeded")
    log.info("job.finished", job_id=job_id, status=job.status)
    return job
