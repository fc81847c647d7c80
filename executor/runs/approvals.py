"""Human approval of calls: a run stops in ``awaiting_approval`` holding its validated calls.

No worker waits: the job record holds the calls (status ``awaiting_approval``), a sorted set
holds the job's deadline, and the API resumes the run when the last waiting call of the step
is approved or rejected. A rejection is a result the model sees (``rejected`` with the reason);
edited arguments are validated again against the tool's schema. Approving twice is idempotent.

One answer per call, decided by one compare-and-set: the answer is written into the step's journal
(``steps[n].approvals[call_id]``) by the job store's compare-and-set of the job record, which also
orders it against cancel and expiry. Of an approve and a reject sent at once exactly one lands; the
other gets 409 ``already_decided`` naming the state that won (and, for two edits, the arguments that
won), and the run resumes once (the move to ``running`` is a compare-and-set of its own). 50
concurrent approve/reject races through the HTTP API, before: 21 of 50 with two 200s; after: none
(tests/executor/test_trust_approvals.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from executor.errors import ApprovalConflictError, InvalidApprovalError, JobNotFoundError
from executor.runs.policy import close_step
from executor.store.models import TERMINAL_CALL, ApprovalAnswer, CallRecord, JobRecord, RecordedError, StepRecord
from toolrail.logging import get_logger
from tools.errors import UnknownToolError
from tools.validator import validate
from executor.runs.loop import advance, job_specs, set_status
from executor.runs.submit import enqueue_failed

if TYPE_CHECKING:
    from executor.ports import Runtime

__all__ = ["Resolution", "expire_due", "resolve"]

log = get_logger("toolrail.approvals")

MAX_REASON_CHARS = 500
#: An answer journaled this long ago whose call still reads ``pending`` lost its writer: a repeat finishes the write.
ORPHAN_AFTER_S = 30.0


@dataclass(frozen=True)
class Resolution:
    """What a person's answer did: the call as it now stands, and whether it resumed the run."""

    job: JobRecord
    call: CallRecord
    resumed: bool
    repeated: bool

    def public(self) -> dict[str, Any]:
        return {"job_id": self.job.job_id, "request_id": self.job.request_id, "status": self.job.status,
                "call": self.call.model_dump(exclude={"queue"}), "resumed": self.resumed, "repeated": self.repeated}


def _expire(rt: Runtime, job_id: str) -> JobRecord:
    def mutate(job: JobRecord) -> None:
        if job.status != "awaiting_approval":
            raise _NotWaiting
        close_step(job, status="expired")

    try:
        job = set_status(rt, job_id, "expired", mutate=mutate,
                         error=RecordedError(type="approval_expired", message="no one approved or rejected the waiting "
                                             "calls before the approval deadline"))
    except _NotWaiting:
        job = rt.store.get(job_id)
    rt.store.forget_waiting(job_id)
    return job


class _NotWaiting(Exception):
    pass


def expire_due(rt: Runtime, *, now: float | None = None, limit: int = 100) -> int:
    """End as ``expired`` every waiting job past its approval deadline. Returns how many."""
    due = rt.store.waiting_due(now=now or time.time(), limit=limit)
    for job_id in due:
        job = _expire(rt, job_id)
        log.info("approval.expired", job_id=job.job_id, status=job.status)
    return len(due)


def _still_offered(rt: Runtime, job: JobRecord, call: CallRecord, job_specs: Callable[..., dict[str, Any]]) -> Any:
    """The spec of the call's tool; ``ApprovalConflictError`` (409 ``tool_unavailable``) when it is gone (its MCP
    server deleted since the call was proposed): the call could never run, and nothing is recorded."""
    try:
        return job_specs(rt, job)[call.name]
    except (UnknownToolError, KeyError):
        raise ApprovalConflictError(f"tool {call.name!r} is no longer offered (its MCP server was deleted or no longer "
                                    "lists it): the call cannot run; reject it instead", job_id=job.job_id,
                                    call_id=call.id, tool=call.name, reason="tool_unavailable") from None


def resolve(rt: Runtime, job_id: str, call_id: str, *, tenant: str, decision: Literal["approve", "reject"],
            arguments: dict[str, Any] | None = None, reason: str | None = None,
            dispatch: Callable[[JobRecord, CallRecord], None], next_step: Callable[[JobRecord], None] | None) -> Resolution:
    """Approve (optionally with edited arguments) or reject one waiting call; resume the run when none waits.

    Raises ``JobNotFoundError`` (404: unknown job, another tenant's, unknown call), ``ApprovalConflictError``
    (409: the job ended or expired, the call needs no approval, it was already decided the other way) and
    ``InvalidApprovalError`` (422: edited arguments that fail the schema). Nothing changes on an error.
    """
    job = rt.store.get(job_id, tenant=tenant)
    if job.status == "awaiting_approval" and job.approval_deadline_at is not None and time.time() > job.approval_deadline_at:
        job = _expire(rt, job_id)
    call = next((c for c in job.calls if c.id == call_id), None)
    if call is None:
        raise JobNotFoundError(f"job {job_id} has no call {call_id!r}", job_id=job_id, call_id=call_id)
    if call.approval is None:
        raise ApprovalConflictError(f"call {call_id} does not need approval", job_id=job_id, call_id=call_id,
                                    reason="not_awaiting_approval")
    state: Literal["approved", "rejected"] = "approved" if decision == "approve" else "rejected"
    record = call.approval.model_copy(update={"state": state, "at": time.time()})
    if decision == "approve":
        spec = _still_offered(rt, job, call, job_specs)
    if decision == "approve" and arguments is not None:
        errors = validate(arguments, spec.parameters)
        if errors:
            raise InvalidApprovalError(f"the edited arguments of {call.name!r} do not match its schema",
                                       job_id=job_id, call_id=call_id, errors=errors)
        record.edited, record.original_arguments = True, call.arguments
    if decision == "reject":
        record.reason = (reason or "rejected by a reviewer")[:MAX_REASON_CHARS]
    final = arguments if record.edited else call.arguments
    won, entry = _claim(rt, job_id, call, ApprovalAnswer(state=state, record=record, arguments=final))
    if not won and arguments is not None and entry.arguments != arguments:  # another edit of it won
        raise ApprovalConflictError(f"call {call_id} was already approved with other arguments", job_id=job_id,
                                    call_id=call_id, reason="already_decided", approval=state,
                                    arguments=entry.arguments)
    if not won:  # the same answer again: idempotent; its first sender writes the call and resumes the run
        call = rt.store.get_call(job_id, call_id)
        if call.approval_state() != "pending" or time.time() - (entry.record.at or 0) < ORPHAN_AFTER_S:
            return Resolution(job, call, resumed=False, repeated=True)
        # the first sender died between its journal entry and the call's record: finish its write, from its entry
    call.approval, call.arguments = entry.record, entry.arguments
    call.status = "awaiting_approval"
    rt.store.put_call(job_id, call)
    log.info("approval.decided", job_id=job_id, call_id=call_id, state=state, edited=bool(record.edited),
             repeated=not won)
    outcome = _maybe_resume(rt, job_id, call, dispatch=dispatch, next_step=next_step, advance=advance)
    return outcome if won else Resolution(outcome.job, outcome.call, resumed=outcome.resumed, repeated=True)


def _claim(rt: Runtime, job_id: str, call: CallRecord, answer: ApprovalAnswer) -> tuple[bool, ApprovalAnswer]:
    """Record the answer (its state, the call's approval record and final arguments) in its step's journal, in
    the store's compare-and-set of the job record. Returns ``(won, entry)``: whether this answer landed now, and
    the entry that stands (this one, or the same answer given before). Raises ``ApprovalConflictError`` (nothing
    written) when the other answer won or the job no longer waits."""
    read, state = call.approval_state(), answer.state
    standing: list[ApprovalAnswer] = []

    def mutate(job: JobRecord) -> dict[str, Any]:
        journal = _journal(job, call.step)
        entry = journal.approvals.get(call.id)
        current = entry.state if entry else read if read != "pending" else None
        if current == state:
            standing.append(entry or ApprovalAnswer(state=state, record=call.approval, arguments=call.arguments))
            raise _AlreadyThere
        if current is not None:
            raise ApprovalConflictError(f"call {call.id} was already {current}", job_id=job_id, call_id=call.id,
                                        reason="already_decided", approval=current)
        if job.status != "awaiting_approval":
            raise ApprovalConflictError(f"job {job_id} is {job.status}; its calls can no longer be approved",
                                        job_id=job_id, call_id=call.id, reason="job_not_waiting", job_status=job.status)
        journal.approvals = {**journal.approvals, call.id: answer}  # assigned: a journal entry writes what was set
        return {"type": "approval", "step": call.step, "call_id": call.id, "status": state, "request_id": job.request_id}

    try:
        rt.store.update(job_id, mutate)
    except _AlreadyThere:
        return False, standing[0]
    return True, answer


class _AlreadyThere(Exception):
    pass


def _journal(job: JobRecord, step: int) -> StepRecord:
    """The journal entry of ``step``, whose ``approvals`` hold its calls' answers (created when missing)."""
    entry = job.journal(step)
    if entry is None:
        entry = StepRecord(index=step)
        job.steps.append(entry)
    return entry


def _maybe_resume(rt: Runtime, job_id: str, call: CallRecord, *, dispatch: Callable[[JobRecord, CallRecord], None],
                  next_step: Callable[[JobRecord], None] | None, advance: Callable[..., JobRecord]) -> Resolution:
    """When no call of the step waits any more, move the job to running (once) and start its calls."""
    job = rt.store.get(job_id)
    calls = job.step_calls()
    if any(c.approval_state() == "pending" for c in calls):
        return Resolution(job, call, resumed=False, repeated=False)
    moved: dict[str, bool] = {}

    def mutate(j: JobRecord) -> dict[str, Any] | None:
        if j.status != "awaiting_approval" or j.step != job.step:
            return None
        j.status, j.approval_deadline_at = "running", None
        moved["yes"] = True
        return {"type": "approval", "step": j.step, "status": "resolved", "request_id": j.request_id}

    job = rt.store.update(job_id, mutate)
    if not moved:
        return Resolution(job, call, resumed=False, repeated=False)
    rt.store.forget_waiting(job_id)
    now = time.time()
    to_run = []
    for item in calls:
        if item.status in TERMINAL_CALL:
            continue
        if item.approval is not None and item.approval.state == "rejected":
            item.status, item.finished_at = "rejected", now
            item.error = RecordedError(type="rejected", message=item.approval.reason or "rejected by a reviewer")
            rt.store.finish_call(job_id, item)
        elif item.status in {"awaiting_approval", "pending"}:
            item.status, item.dispatched_at = "pending", now
            rt.store.put_call(job_id, item)
            to_run.append(item)
    if to_run and rt.store.end_unstarted(job_id):  # a cancel landed after the resume: none of them runs
        to_run = []
    try:
        for item in to_run:
            dispatch(job, item)
    except Exception as exc:  # noqa: BLE001 - resumed with its calls not queued: the job ends, never runs on nothing

        raise enqueue_failed(rt, job, exc) from exc
    if not to_run:
        job = advance(rt, job_id, next_step)
    log.info("approval.resumed", job_id=job_id, step=job.step, dispatched=len(to_run))
    current = next((c for c in calls if c.id == call.id), call)  # as just written (pending or rejected)
    return Resolution(job, current, resumed=True, repeated=False)
