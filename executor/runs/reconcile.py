"""The reconciler: the job store, not the broker, decides what still has to happen.

A message can be lost between the broker and a worker that dies at the wrong moment
(kombu's Redis transport pops a message before it records it as unacked), and then
nothing would ever move its job again. Every non-terminal job sits in an index scored by
its last status change; a job that has not moved for longer than any message could take
to be redelivered (visibility timeout + task time limit) gets its work queued again. Every
task is idempotent — statuses only move forward, calls finish once, side effects go
through idempotency records — so a needless re-queue costs one no-op task.

Work that vanishes again and again (a message that kills its worker each time is redelivered for
ever) is not re-queued for ever: after ``MAX_REQUEUES`` re-queues at the same step and status the
job ends ``failed`` with ``internal_error`` (the request id in it), so its client learns it died.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import redis

from executor.errors import ExecutorError
from executor.ports import Runtime
from executor.store.models import TERMINAL_CALL, TERMINAL_JOB, CallRecord, JobRecord, RecordedError
from toolrail.logging import get_logger
from executor.runs.approvals import expire_due
from executor.runs.loop import advance, set_status
from executor.runs.policy import close_step

__all__ = ["LAST_SWEEP_KEY", "MAX_REQUEUES", "Reconciler", "reconcile_once"]

log = get_logger("toolrail.reconcile")

#: The last sweep of any API process: ``{at, requeued}`` (``GET /v1/console/ops`` shows it).
LAST_SWEEP_KEY = "tr:reconcile:last"
#: Re-queues of one job at one step and status before it is ended as lost.
MAX_REQUEUES = 3


def reconcile_once(rt: Runtime, *, stale_after_s: float, redecide: Callable[[JobRecord], None],
                   rerun: Callable[[JobRecord, CallRecord], None], limit: int = 100, pending_only: bool = False) -> int:
    """Re-queue the work of every job stuck longer than ``stale_after_s``. Returns how many.

    ``pending_only``: after a worker's death, only work not started (a decision not begun, calls ``pending``) whose
    message may have died with it; what runs or ran was noted as unacked, and its redelivery is kombu's."""
    expire_due(rt)  # approvals past their deadline end as expired, whatever their staleness
    requeued = 0
    for job_id in rt.store.stale_jobs(older_than_s=stale_after_s, limit=limit):
        try:
            job = rt.store.get(job_id)
        except ExecutorError:
            rt.store.forget_active(job_id)
            continue
        if job.status in TERMINAL_JOB:
            rt.store.forget_active(job_id)
            continue
        if job.status == "awaiting_approval":  # waits for a person, not for a message: nothing to re-queue
            rt.store.touch_active(job_id)
            continue
        if pending_only and not _unstarted(job):
            continue  # what began was noted as unacked (a running call, a decision, a last call's advance): kombu's
        if not pending_only and _requeues(rt, job) > MAX_REQUEUES:
            _end_lost(rt, job)
            continue
        if job.status == "running":
            pending = [c for c in job.step_calls()
                       if (c.status == "pending" if pending_only else c.status not in TERMINAL_CALL)]
            if not pending:
                advance(rt, job_id, redecide)
                continue
            for call in pending:
                rerun(job, call)
        else:
            redecide(job)
        rt.store.touch_active(job_id)
        requeued += 1
        log.warning("job.reconciled", job_id=job_id, request_id=job.request_id, status=job.status)
    return requeued


def _unstarted(job: JobRecord) -> bool:
    """Whether the job waits on work no worker began: a call ``pending``, or a decision whose step is not open."""
    if job.status == "running":
        return any(c.status == "pending" for c in job.step_calls())
    return job.journal(job.step) is None


def _requeues(rt: Runtime, job: JobRecord) -> int:
    """Count one more re-queue of ``job`` at its step and status; the count so far."""
    key = f"tr:reconciled:{job.job_id}:{job.step}:{job.status}"
    pipe = rt.redis.pipeline()
    pipe.incr(key)
    pipe.expire(key, rt.settings.job_ttl_s)
    return int(pipe.execute()[0])


def _end_lost(rt: Runtime, job: JobRecord) -> None:
    log.error("job.lost", job_id=job.job_id, request_id=job.request_id, status=job.status, step=job.step,
              requeues=MAX_REQUEUES)
    set_status(rt, job.job_id, "failed", mutate=lambda j: close_step(j, status="failed"),
               error=RecordedError.internal(f"the job's work was lost {MAX_REQUEUES} times at step {job.step} "
                                            f"({job.status})", request_id=job.request_id, requeues=MAX_REQUEUES))
    rt.store.forget_active(job.job_id)


class Reconciler:
    """A daemon thread running ``reconcile_once`` every ``interval_s`` (one instance at a time per Redis), and,
    every ``check_s`` between, ``restore_dead``: the messages of workers that stopped beating, back in their queues
    (``executor.worker.liveness``; seconds, where the sweep above waits out the visibility timeout); when it returns
    the time a worker was found dead, the pending work of jobs unchanged since is queued again (``pending_only``)."""

    def __init__(self, rt: Runtime, *, interval_s: float, stale_after_s: float,
                 redecide: Callable[[JobRecord], None], rerun: Callable[[JobRecord, CallRecord], None],
                 restore_dead: Callable[[], float | None] | None = None, check_s: float = 2.0) -> None:
        self._rt, self._interval, self._stale = rt, interval_s, stale_after_s
        self._redecide, self._rerun, self._restore_dead = redecide, rerun, restore_dead
        self._check_s = min(check_s, interval_s) if restore_dead is not None else interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="toolrail-reconciler", daemon=True)

    def start(self) -> "Reconciler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _restore_dead_workers(self) -> None:
        try:  # one transaction per message: replicas restoring at once push it once
            died_at = self._restore_dead()  # type: ignore[misc]
        except Exception as exc:  # noqa: BLE001 - the broker's errors are kombu's too; the sweep must go on
            log.warning("liveness.skipped", error=type(exc).__name__)
            return
        if died_at is not None:  # each death is claimed by one replica
            requeued = reconcile_once(self._rt, stale_after_s=time.time() - died_at, redecide=self._redecide,
                                      rerun=self._rerun, limit=1000, pending_only=True)
            log.warning("reconcile.after_death", died_at=died_at, requeued=requeued)

    def _loop(self) -> None:
        next_sweep = time.monotonic() + self._interval
        while not self._stop.wait(self._check_s):
            try:
                if self._restore_dead is not None:
                    self._restore_dead_workers()
                if time.monotonic() < next_sweep:
                    continue
                next_sweep = time.monotonic() + self._interval
                # one reconciler per interval across API replicas
                if self._rt.redis.set("tr:reconcile-lock", "1", nx=True, ex=max(1, int(self._interval * 0.9))):
                    requeued = reconcile_once(self._rt, stale_after_s=self._stale, redecide=self._redecide,
                                              rerun=self._rerun)
                    self._rt.redis.set(LAST_SWEEP_KEY, json.dumps({"at": time.time(), "requeued": requeued}),
                                       ex=max(60, int(self._interval * 10)))  # the console's workers view shows it
            except (redis.RedisError, ExecutorError) as exc:
                log.warning("reconcile.skipped", error=type(exc).__name__)
