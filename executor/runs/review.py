"""A person resolves a job in ``needs_review``: no dead end.

A run stops in ``needs_review`` when the model's calls did not pass their checks and re-asking is
spent. A reviewer answers in one of three ways (``POST /v1/jobs/{id}/review``):

- ``calls``: the calls to run instead, each validated against its tool's schema (422 otherwise,
  nothing changed). They become a step of their own, decided by the reviewer (the model's proposal
  stays recorded on its step); being a person's, they need no further approval or grounding;
- ``answer``: the text that ends the run (``succeeded``), recorded as the reviewer's;
- ``reject``: the reason, which the model sees (a system message) when it decides again.

Exactly one reviewer wins: the move out of ``needs_review`` is one compare-and-set of the job record;
the loser gets 409 with the state that won.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from executor.errors import ApprovalConflictError, InvalidApprovalError
from executor.runs import policy
from executor.store.models import Approval, CallRecord, JobRecord, Review
from toolrail import tracing
from toolrail.logging import get_logger
from tools.calls import call_id
from tools.validator import validate
from executor.runs.loop import job_specs, notify
from executor.runs.submit import enqueue_failed

if TYPE_CHECKING:
    from executor.ports import Runtime

__all__ = ["review"]

log = get_logger("toolrail.review")


class _NotInReview(Exception):
    def __init__(self, status: str) -> None:
        self.status = status


def review(rt: Runtime, job_id: str, *, tenant: str, calls: list[dict[str, Any]] | None = None,
           answer: str | None = None, reject: str | None = None,
           dispatch: Callable[[JobRecord, CallRecord], None], next_step: Callable[[JobRecord], None] | None) -> JobRecord:
    """Resolve ``job_id`` (in ``needs_review``) with exactly one of ``calls``, ``answer`` or ``reject``.

    Raises ``JobNotFoundError`` (404: unknown job, another tenant's), ``ApprovalConflictError`` (409: the job is
    not in review, or another reviewer's answer won) and ``InvalidApprovalError`` (422: an unknown tool, or
    arguments that fail its schema). Nothing changes on an error.
    """
    if sum(item is not None for item in (calls, answer, reject)) != 1:
        raise InvalidApprovalError("a review is exactly one of calls, answer or reject", job_id=job_id)
    job = rt.store.get(job_id, tenant=tenant)
    _check_in_review(job)
    if reject is not None and rt.settings.decider == "none":
        raise InvalidApprovalError("no decider is configured to decide again: give the calls to run or the answer",
                                   job_id=job_id, reason="no_decider")
    records = _reviewed_calls(rt, job, calls, job_specs(rt, job)) if calls is not None else []
    now = time.time()
    outcome: Literal["answer", "reject", "calls"] = "answer" if answer is not None else "reject" if reject is not None \
        else "calls"

    def mutate(j: JobRecord) -> dict[str, Any]:
        if j.status != "needs_review":
            raise _NotInReview(j.status)
        # at: when it landed (a cancel sent before it loses)
        policy.open_step(j).review = Review(by="reviewer", at=time.time(), outcome=outcome)
        j.error = None
        if answer is not None:
            j.status, j.content = "succeeded", answer
            return {"type": "review", "step": j.step, "status": "answered", "request_id": j.request_id}
        j.messages.append({"role": "system", "content": f"A reviewer rejected the proposed tool calls: {reject}"}
                          if reject is not None else
                          {"role": "system", "content": "A reviewer chose the tool calls of the next step."})
        j.step += 1
        step = policy.open_step(j, tool_choice="auto")
        if reject is not None:
            j.status = "queued"
            return {"type": "review", "step": j.step, "status": "rejected", "request_id": j.request_id}
        step.decided_by, step.decided_at, step.status = "reviewer", now, "running"
        for record in records:
            record.step = j.step
            record.id = call_id(j.request_id, record.index, attempt=0, step=j.step)
        j.status = "running" if any(r.status == "pending" for r in records) else "succeeded"
        return {"type": "review", "step": j.step, "status": "calls", "request_id": j.request_id}

    try:
        job = rt.store.update(job_id, mutate)
    except _NotInReview as raced:
        raise ApprovalConflictError(f"job {job_id} is {raced.status}: another answer was taken first", job_id=job_id,
                                    reason="job_not_in_review", job_status=raced.status) from None
    log.info("job.reviewed", job_id=job_id, outcome=outcome, step=job.step, status=job.status)
    notify(rt, job)
    try:
        if records:
            rt.store.set_calls(job_id, records, step=job.step)
            if rt.store.end_unstarted(job_id):  # a cancel landed after this review: none of them runs
                return rt.store.get(job_id)
            for record in records:
                if record.status == "pending":
                    dispatch(job, record)
            job = rt.store.get(job_id)
        elif reject is not None and next_step is not None:
            next_step(job)  # the model decides again, seeing the reason
    except Exception as exc:  # noqa: BLE001 - out of review with nothing queued: the job ends, never waits on nothing
        raise enqueue_failed(rt, job, exc) from exc
    if job.status == "succeeded":
        tracing.end_job(job)
    return job


def _check_in_review(job: JobRecord) -> None:
    if job.status != "needs_review":
        raise ApprovalConflictError(f"job {job.job_id} is {job.status}; only a job in needs_review can be reviewed",
                                    job_id=job.job_id, reason="job_not_in_review", job_status=job.status)


def _reviewed_calls(rt: Runtime, job: JobRecord, calls: list[dict[str, Any]], specs: dict[str, Any]) -> list[CallRecord]:
    """The reviewer's calls as records of the next step, each validated against its tool's schema."""
    if not calls:
        raise InvalidApprovalError("a review's calls may not be empty (reject or answer instead)", job_id=job.job_id)
    records, now = [], time.time()
    for index, call in enumerate(calls):
        name, arguments = call.get("name"), call.get("arguments") or {}
        spec = specs.get(name)
        if spec is None:
            raise InvalidApprovalError(f"the job offers no tool {str(name)[:80]!r}", job_id=job.job_id,
                                       errors=[{"path": f"/calls/{index}/name", "message": "not a tool of this job"}])
        errors = validate(arguments, spec.parameters)
        if errors:
            raise InvalidApprovalError(f"the reviewed arguments of {name!r} do not match its schema", job_id=job.job_id,
                                       errors=[{**error, "call": index} for error in errors])
        runnable = spec.entrypoint is not None
        records.append(CallRecord(id="", index=index, step=job.step + 1, name=name, arguments=arguments,
                                  status="pending" if runnable else "validated",
                                  queue=spec.queue_name if runnable else None,
                                  approval=Approval(state="approved", by="reviewer", at=now)))
    return records
