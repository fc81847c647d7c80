"""Celery tasks: thin wrappers that bind context, call ``executor.runs.loop`` and own retries."""

from __future__ import annotations

import redis

from decider.errors import DeciderRetryableError
from executor.runs import loop as jobs
from executor.runs import tracing_hooks
from executor.worker.celery import BoundaryTask, app
from executor.errors import RetryableError
from executor.runs.runtime import get_runtime
from executor.runs.submit import end_stranded
from executor.store.records import CallRecord, JobRecord
from toolrail.context import CELERY_REQUEST_ID_HEADER, request_scope
from toolrail.logging import get_logger

__all__ = ["decide", "dispatch_call", "run_call"]

log = get_logger("toolrail.tasks")

_RETRY = {
    "autoretry_for": (RetryableError, DeciderRetryableError, redis.ConnectionError, redis.TimeoutError),
    "retry_backoff": 1,
    "retry_backoff_max": 30,
    "retry_jitter": True,
    "max_retries": 20,
    "acks_late": True,
    "reject_on_worker_lost": True,
}


def dispatch_call(job: JobRecord, call: CallRecord) -> None:
    """Queue one call on its tool's queue, carrying the request id header."""
    with request_scope(job.request_id):
        run_call.apply_async(args=[job.job_id, call.id], queue=call.queue,
                             headers={CELERY_REQUEST_ID_HEADER: job.request_id})


@app.task(name="toolrail.decide", bind=True, **_RETRY)
def decide(self, job_id: str) -> str:
    """Decide/validate the current step of one job and queue its calls (each step is its own task)."""
    with tracing_hooks.step(get_runtime, job_id) as step:
        job = jobs.decide_job(get_runtime(), job_id, dispatch_call, next_step=enqueue_decide)
        step.done(job)
    return job.status


@app.task(name="toolrail.run_call", bind=True, **_RETRY)
def run_call(self, job_id: str, call_id: str) -> str:
    """Run one call (``executor.runs.loop.run_call``: its pipeline); a retryable error comes back when it asks."""
    try:
        call = jobs.run_call(get_runtime(), job_id, call_id, next_step=enqueue_decide)
    except RetryableError as exc:
        retry_in = exc.details.get("retry_in_s")
        if retry_in is not None:
            raise self.retry(exc=exc, countdown=min(60.0, float(retry_in) + 0.5)) from exc
        raise
    return call.status


@tracing_hooks.in_job_trace  # every step's decision hangs off the job span
def enqueue_decide(job: JobRecord) -> None:
    """Queue the decision of a job's current step (the API for a new job; the run loop for each later step)."""
    with request_scope(job.request_id):
        decide.apply_async(args=[job.job_id], queue="decide", headers={CELERY_REQUEST_ID_HEADER: job.request_id})


def _given_up(task: str, args: list, exc: BaseException) -> None:
    """A task failed for good: end its job, call or delivery (``internal_error`` with the request id)."""
    end_stranded(get_runtime(), task, args, exc, next_step=enqueue_decide)


BoundaryTask.given_up = _given_up


@app.task(name="toolrail.noop", acks_late=True)
def noop(token: str) -> str:
    """Do nothing but signal completion: the bare-Celery baseline of ``bench/executor.py``."""
    get_runtime().redis.lpush(f"bench:done:{token}", 1)
    return token


@app.task(name="toolrail.fork_noop", acks_late=True)
def fork_noop(token: str) -> str:
    """Fork a no-op child, wait for it, signal completion: the physical floor of a process per call."""
    import os  # noqa: PLC0415 - bench-only task

    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    get_runtime().redis.lpush(f"bench:done:{token}", 1)
    return token
