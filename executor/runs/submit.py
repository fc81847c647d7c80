"""A job's edges outside the loop: how it enters (``submit``), how its owner stops it (``cancel``), and how a task
that failed for good ends its work (``end_stranded``) — one path each, whatever the entry point.

``POST /v1/jobs`` and MCP ``tools/call`` both submit through :func:`submit`: the deadline set, the record
created, the first step queued (or the client's own calls checked and queued straight to their tool queues), and
a queueing failure ends the job ``failed`` (``enqueue_failed``) before the caller hears of it. Every end goes
through ``set_status``: the webhook, the event stream and the job's span see each one.

Nothing stranded: a task whose exception no retry will answer (a bug, or retries exhausted) ends what it was
doing — the decide step's job ``failed``, a call ``failed`` (the run goes on as after any failed call), a
webhook delivery ``failed`` — with ``internal_error`` carrying the request id, never a stack trace.
"""

from __future__ import annotations

import time
from typing import Any

from executor.errors import RetryableError, StoreUnavailableError
from executor.runs import policy
from executor.runs.webhooks import finish_delivery
from executor.runs.loop import Dispatch, NextStep, advance, check_client_output, set_status, start_checked
from executor.ports import Runtime
from executor.store.models import TERMINAL_CALL, TERMINAL_JOB, JobRecord, RecordedError
from toolrail.logging import get_logger
from tools.spec import ToolSpec

__all__ = ["cancel", "end_call", "end_stranded", "enqueue_failed", "submit"]

log = get_logger("toolrail.submit")


def submit(rt: Runtime, job: JobRecord, *, enqueue: NextStep, dispatch: Dispatch | None,
           idempotency_key: str | None = None, body_hash: str | None = None,
           specs: dict[str, ToolSpec] | None = None) -> tuple[JobRecord, bool]:
    """Store a new job and queue its first step; ``(job, created)`` (an idempotent repeat is not queued again).

    ``dispatch`` None: the client's own calls go through the decide task too (an API built with a no-op
    ``enqueue``). ``specs``: the job's tools, when the caller built them (``executor.runs.loop.job_specs``).
    Raises ``StoreUnavailableError`` when the broker refused, after ending the job ``failed``."""
    if job.deadline_at is None:
        job = job.model_copy(update={"deadline_at": time.time() + rt.settings.run_deadline_s})
    checked = check_client_output(rt, job, specs=specs) if job.client_output is not None and dispatch is not None else None
    job, created = rt.store.create(checked or job, idempotency_key=idempotency_key, body_hash=body_hash)
    if not created:
        return job, False
    dispatched = 0
    try:
        if checked is None:
            enqueue(job)
        else:
            dispatched = start_checked(rt, job, dispatch)  # type: ignore[arg-type] - checked implies dispatch
    except Exception as exc:  # noqa: BLE001 - the broker is down: the job must not stay queued silently
        raise enqueue_failed(rt, job, exc) from exc
    log.info("job.created", job_id=job.job_id, tenant=job.tenant, tools=len(job.tools) + len(job.inline_tools),
             status=job.status, calls=len(job.calls), dispatched=dispatched,
             decided_in="the decide task" if checked is None else "the submit (the client's own calls)")
    return job, True


def enqueue_failed(rt: Runtime, job: JobRecord, exc: BaseException) -> StoreUnavailableError:
    """End a job whose next work could not be queued (``failed``, ``enqueue_failed``) and return the 503 to raise:
    a job the broker refused never stays queued or running with nothing to run it."""
    log.error("job.enqueue_failed", job_id=job.job_id, request_id=job.request_id, error=type(exc).__name__)
    set_status(rt, job.job_id, "failed", mutate=lambda j: policy.close_step(j, status="failed"),
               error=RecordedError(type="enqueue_failed", message=f"could not queue the job: {type(exc).__name__}",
                                   details={"request_id": job.request_id}))
    return StoreUnavailableError(f"could not queue the job: {exc}", job_id=job.job_id)


def cancel(rt: Runtime, job_id: str, message: str) -> tuple[JobRecord, bool]:
    """Cancel a job through ``set_status``: its calls not started end ``failed`` (``call_cancelled``) and never
    run; one running is stopped by the call pipeline's cancellation watch.

    A job in ``needs_review`` can be cancelled too (its owner drops it instead of reviewing it). A review and a
    cancel are each one compare-and-set of the job, so they are ordered: a review refuses a job no longer in review
    (409 ``job_not_in_review``); a cancel that lands after a review stops the run that review started, and its
    calls not yet started end ``call_cancelled`` — a cancelled job never holds a ``pending`` call, whichever write
    came last. Returns ``(job, cancelled)``: False when it had already ended (``job.status`` says how)."""
    before: list[str] = []
    job = set_status(rt, job_id, "cancelled", mutate=lambda j: before.append(j.status),
                     leaving=frozenset({"needs_review"}), error=RecordedError(type="cancelled", message=message))
    cancelled = bool(before) and job.status == "cancelled"
    if cancelled:
        rt.store.end_unstarted(job_id)
    return job, cancelled


def end_stranded(rt: Runtime, task: str, args: list[Any], exc: BaseException, *,
                 next_step: NextStep | None = None) -> None:
    """End the work of a task that failed for good (its ``on_failure``): never raises."""
    try:
        if task == "toolrail.decide" and args:
            _end_job(rt, str(args[0]), exc)
        elif task == "toolrail.run_call" and len(args) >= 2:
            _end_call(rt, str(args[0]), str(args[1]), exc, next_step)
        elif task == "toolrail.deliver_webhook" and len(args) >= 2:
            finish_delivery(rt, str(args[0]), str(args[1]), state="failed", outcome="error", reason=type(exc).__name__)
    except Exception as error:  # noqa: BLE001 - the reconciler is the next line of defence
        log.error("task.end_stranded_failed", task=task, error=f"{type(error).__name__}: {error}")


def _end_job(rt: Runtime, job_id: str, exc: BaseException) -> None:
    job = rt.store.get(job_id)
    if job.status in TERMINAL_JOB:
        return
    log.error("job.internal_error", job_id=job_id, request_id=job.request_id, error=f"{type(exc).__name__}: {exc}")
    set_status(rt, job_id, "failed", mutate=lambda j: policy.close_step(j, status="failed"),
               error=RecordedError.of(exc, request_id=job.request_id, where="the decide step"))


def end_call(rt: Runtime, job_id: str, call_id: str, exc: RetryableError, *, next_step: NextStep | None = None) -> None:
    """End a call with ``exc``, its own typed error (a wait its class bounds, ``max_retries``, ran out), and advance
    the run when it was its step's last."""
    _end_call(rt, job_id, call_id, exc, next_step)


def _end_call(rt: Runtime, job_id: str, call_id: str, exc: BaseException, next_step: NextStep | None) -> None:
    job = rt.store.get(job_id)
    call = next((c for c in job.calls if c.id == call_id), None)
    if job.status in TERMINAL_JOB or call is None or call.status in TERMINAL_CALL:
        return
    call.status, call.finished_at = "failed", time.time()
    call.error = RecordedError.of(exc, request_id=job.request_id, where=f"call {call.name}")
    if call.error.type == "internal_error":
        log.error("call.internal_error", job_id=job_id, call_id=call_id, request_id=job.request_id,
                  error=f"{type(exc).__name__}: {exc}")
    else:  # typed: its own class ended it (a bounded wait that ran out, a permanent error)
        log.warning("call.gave_up", job_id=job_id, call_id=call_id, error_type=call.error.type)
    remaining, read = rt.store.finish_call_and_read(job_id, call)
    if remaining == 0:
        advance(rt, job_id, next_step, read=read)
