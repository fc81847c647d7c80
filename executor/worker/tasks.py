"""Celery tasks: thin wrappers that bind context, call ``executor.runs`` and own retries; the queues they are
published on (:data:`QUEUES`, the ``executor.ports.Queues`` of a deployment); this worker process's runtime.
"""

from __future__ import annotations

import json
import os
import threading
import time
from functools import cached_property
from typing import Any

import redis
from celery.signals import worker_process_init

from decider.errors import DeciderRetryableError
from decider.protocol import DecideRequest
from executor.errors import RetryableError
from executor.runs import loop as jobs
from executor.worker import tracing as worker_tracing
from executor.runs.submit import end_call, end_stranded
from executor.runs.webhooks import attempt_delivery
from executor.runtime import Runtime
from executor.store.records import CallRecord, JobRecord
from executor.worker.celery import PREWARM_ENV, WARM_DECIDER_ENV, BoundaryTask, app
from executor.worker import liveness
from executor.worker.config import DECIDER_WARM_KEY, WEBHOOK_QUEUE
from toolrail.context import CELERY_REQUEST_ID_HEADER, request_scope
from toolrail.logging import get_logger
from toolrail.settings import get_settings

__all__ = ["QUEUES", "CeleryQueues", "decide", "deliver_webhook", "dispatch_call", "enqueue_decide", "run_call",
           "runtime"]

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


_runtime: Runtime | None = None


def runtime() -> Runtime:
    """This worker process's runtime, built on first use from the environment's settings (publishing on
    :data:`QUEUES`)."""
    global _runtime
    if _runtime is None:
        _runtime = Runtime.from_settings(get_settings(), queues=QUEUES)
    return _runtime


def dispatch_call(job: JobRecord, call: CallRecord) -> None:
    """Queue one call on its tool's queue, carrying the request id header."""
    with request_scope(job.request_id):
        run_call.apply_async(args=[job.job_id, call.id], queue=call.queue,
                             headers={CELERY_REQUEST_ID_HEADER: job.request_id})


@app.task(name="toolrail.decide", bind=True, **_RETRY)
def decide(self, job_id: str) -> str:
    """Decide/validate the current step of one job and queue its calls (each step is its own task)."""
    with worker_tracing.step(runtime, job_id) as step:
        job = jobs.decide_job(runtime(), job_id, dispatch_call, next_step=enqueue_decide)
        step.done(job)
    return job.status


@app.task(name="toolrail.run_call", bind=True, **_RETRY)
def run_call(self, job_id: str, call_id: str) -> str:
    """Run one call (``executor.runs.loop.run_call``: its pipeline); a retryable error comes back when it asks."""
    try:
        call = jobs.run_call(runtime(), job_id, call_id, next_step=enqueue_decide)
    except RetryableError as exc:
        if exc.max_retries is not None and self.request.retries >= exc.max_retries:
            end_call(runtime(), job_id, call_id, exc, next_step=enqueue_decide)  # its own typed error, not a retry more
            return "failed"
        retry_in = exc.details.get("retry_in_s")
        if retry_in is not None:
            raise self.retry(exc=exc, countdown=min(60.0, float(retry_in) + 0.5)) from exc
        raise
    return call.status


@worker_tracing.in_job_trace  # every step's decision hangs off the job span
def enqueue_decide(job: JobRecord) -> None:
    """Queue the decision of a job's current step (the API for a new job; the run loop for each later step)."""
    with request_scope(job.request_id):
        decide.apply_async(args=[job.job_id], queue="decide", headers={CELERY_REQUEST_ID_HEADER: job.request_id})


@app.task(name="toolrail.deliver_webhook", bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=None,
          ignore_result=True)
def deliver_webhook(self, job_id: str, slug: str) -> str:
    """One attempt of one webhook delivery; retried with backoff on the ``webhooks`` queue until it ends."""
    result = attempt_delivery(runtime(), job_id, slug)
    if result.retry_in_s is not None:
        raise self.retry(countdown=result.retry_in_s, max_retries=None, queue=WEBHOOK_QUEUE)
    return result.outcome


class CeleryQueues:
    """``executor.ports.Queues`` on this Celery app: what the API, the run loop and extensions publish through."""

    def decide(self, job: JobRecord) -> None:
        enqueue_decide(job)

    def dispatch(self, job: JobRecord, call: CallRecord) -> None:
        dispatch_call(job, call)

    def webhook(self, job: JobRecord, slug: str) -> None:
        with request_scope(job.request_id):
            deliver_webhook.apply_async(args=[job.job_id, slug], queue=WEBHOOK_QUEUE,
                                        headers={CELERY_REQUEST_ID_HEADER: job.request_id}, retry=True,
                                        retry_policy={"max_retries": 2, "interval_start": 0, "interval_step": 0.2,
                                                      "interval_max": 0.5})

    def subscribe(self, queue: str) -> int:
        """Ask every running worker to consume ``queue`` (Celery's ``add_consumer`` broadcast); replies counted."""
        return len(app.control.add_consumer(queue, reply=True, timeout=1.0) or [])

    def restore_dead_workers(self) -> float | None:
        """The unacked messages of every worker that stopped beating, back in their queues (``worker.liveness``);
        when the latest death past its grace was found (:func:`liveness.deaths_due`), None if none."""
        liveness.restore_dead_workers(app.connection_for_write, self._broker_redis)
        return liveness.deaths_due(self._broker_redis)

    @cached_property
    def _broker_redis(self) -> redis.Redis:
        return redis.Redis.from_url(app.conf.broker_url, socket_timeout=5, socket_connect_timeout=5)


QUEUES = CeleryQueues()


def _given_up(task: str, args: list, exc: BaseException) -> None:
    """A task failed for good: end its job, call or delivery (``internal_error`` with the request id)."""
    end_stranded(runtime(), task, args, exc, next_step=enqueue_decide)


BoundaryTask.given_up = _given_up


def _warm_decider() -> None:
    """Load this pool process's decider and compile the base grammars (every registered tool, and each alone)
    before the first job, then say so in Redis (``DECIDER_WARM_KEY``: ``toolrail serve``'s readiness waits for it).

    The first decision of a fresh worker paid the model load inside its task: 5.9 s, then 1.0 s for each of the
    next three (four cities, one run, a busy 2-core machine). Warmed (6.5 s at pool start), the first took 1.6 s
    beside 1.6-2.2 s for the next three. A decide task that arrives during the warm-up waits on the runtime's lock
    for this load instead of starting another.
    """
    started = time.monotonic()
    try:
        rt = runtime()
        decider = rt.decider()
        plan = getattr(decider, "plan", None)  # the backend decider's cheap step: its compile fills the grammar cache
        specs = rt.registry.specs() if plan is not None else []
        for tools in ([specs, *([spec] for spec in specs)] if specs else []):  # every tool, and each alone: ~0.2 s
            plan(DecideRequest(request_id="warmup", messages=[{"role": "user", "content": "warm up"}], tools=tools))
        state: dict[str, Any] = {"available": decider is not None}
    except Exception as exc:  # noqa: BLE001 - the first decide task loads it again and reports a typed error
        log.warning("decider.warm_failed", error=f"{type(exc).__name__}: {exc}")
        state = {"available": False, "error": type(exc).__name__}
    seconds = round(time.monotonic() - started, 3)
    log.info("decider.warm", seconds=seconds, **state)
    try:  # done either way: a decider that cannot load is the decide step's typed error, not a readiness that hangs
        runtime().redis.set(DECIDER_WARM_KEY, json.dumps({"pid": os.getpid(), "seconds": seconds, **state}))
    except Exception as exc:  # noqa: BLE001 - readiness keeps waiting; the log says why
        log.warning("decider.warm_unrecorded", error=type(exc).__name__)


def _prewarm_sandbox() -> None:
    """Start this pool process's sandbox (its fork server imports the tool modules) before the first task.

    Otherwise the first call of each pool process pays those imports inside its task's time limit.
    """
    try:
        runtime().sandbox  # noqa: B018 - built on first access
    except Exception as exc:  # noqa: BLE001 - the first call builds it again and reports a typed error
        log.warning("sandbox.prewarm_failed", error=f"{type(exc).__name__}: {exc}")


@worker_process_init.connect
def _warm(**_: object) -> None:
    """A pool process's sandbox and decider, started before its first task when its worker said so (``worker_init``)."""
    if os.environ.get(PREWARM_ENV) == "1":
        _prewarm_sandbox()
    if os.environ.get(WARM_DECIDER_ENV) == "1":  # a thread: Celery gives a pool process 4 s to say it is up
        threading.Thread(target=_warm_decider, name="toolrail-decider-warmup", daemon=True).start()


@app.task(name="toolrail.noop", acks_late=True)
def noop(token: str) -> str:
    """Do nothing but signal completion: the bare-Celery baseline of ``bench/executor.py``."""
    runtime().redis.lpush(f"bench:done:{token}", 1)
    return token


@app.task(name="toolrail.fork_noop", acks_late=True)
def fork_noop(token: str) -> str:
    """Fork a no-op child, wait for it, signal completion: the physical floor of a process per call."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    runtime().redis.lpush(f"bench:done:{token}", 1)
    return token
