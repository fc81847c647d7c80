"""What a job record holds, typed: the job, its calls, each step's journal, the approvals, reviews and errors.

    JobRecord                 tr:job:<id> (the calls live in their own hash, see ``executor.store.records``)
    ├── attempts: [Attempt]   the current step's decision attempts (also on its StepRecord)
    ├── error: RecordedError  {type, message, details}
    ├── steps: [StepRecord]   the run's journal, one entry a step
    │   ├── attempts: [Attempt]
    │   ├── review: Review             a person's answer to a job in needs_review
    │   ├── approvals: {call_id: ApprovalAnswer}   each call's answer, claimed by compare-and-set
    │   ├── early_dispatch: [EarlyDispatch]
    │   └── calls_not_run: [ProposedCall]
    └── calls: [CallRecord]
        ├── error: RecordedError
        └── approval: Approval    why a person must decide, and what they decided

One serializer, pydantic's: the record's JSON (in Redis, in the API, in webhooks) is ``model_dump`` /
``model_dump_json`` of these models, in the shapes the dicts they replace had. A :class:`Sparse` model
writes only the keys that were set (given, assigned or read), as those dicts did: a step journal
entry or an approval grows keys as the run goes. Records stored before these models load as they are.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, Field, model_serializer

from toolrail.errors import ToolrailError

__all__ = ["Approval", "ApprovalAnswer", "Attempt", "CallRecord", "DECIDING_JOB", "EarlyDispatch", "JobRecord",
           "NOT_STARTED", "ProposedCall", "RecordedError", "Review", "Sparse", "StepRecord", "TERMINAL_CALL", "TERMINAL_JOB"]

JobStatus = Literal["queued", "deciding", "validating", "running", "awaiting_approval", "succeeded", "failed",
                    "needs_review", "cancelled", "expired"]
CallStatus = Literal["pending", "awaiting_approval", "running", "succeeded", "failed", "validated", "rejected"]
TERMINAL_JOB = frozenset({"succeeded", "failed", "needs_review", "cancelled", "expired"})
TERMINAL_CALL = frozenset({"succeeded", "failed", "validated", "rejected"})
#: Statuses of a job while its output is being decided or checked (what the decision latency measures).
DECIDING_JOB = frozenset({"validating", "deciding"})


class Sparse(BaseModel):
    """A record whose JSON holds only the fields that were set (given, assigned or read from JSON), in field order.

    A plain serializer (the values it returns are serialized by their own types): a wrap serializer, filtering
    the full dump, cost 20 us more per read-and-write of a five-step record (bench in the commit message)."""

    @model_serializer(mode="plain")
    def _set_fields_only(self) -> dict[str, Any]:
        fields_set = self.model_fields_set
        return {key: getattr(self, key) for key in type(self).model_fields if key in fields_set}


class RecordedError(BaseModel):
    """An error as a job or a call records it (and the API shows it): ``{type, message, details}``."""

    type: str
    message: str = ""
    details: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def of(cls, exc: BaseException, *, request_id: str | None = None, where: str = "the work") -> RecordedError:
        """The one mapping of an exception that ends a call or a job to what it records, as the API maps the root
        once: a ``ToolrailError`` that ends the work by its own class (permanent, or retryable with a bounded wait,
        ``max_retries``, that ran out) records itself (``to_dict()``); anything else (a bug, retries spent) is
        ``internal_error`` naming ``where`` it failed. ``request_id``: added to the details (the logs' key)."""
        if isinstance(exc, ToolrailError) and (not exc.retryable or getattr(exc, "max_retries", None) is not None):
            error = cls(**exc.to_dict())
            if request_id is not None:
                error.details = {**error.details, "request_id": request_id}
            return error
        return cls.internal(f"{where} failed ({type(exc).__name__})", request_id=request_id or "",
                            exception=type(exc).__name__)

    @classmethod
    def internal(cls, message: str, *, request_id: str, **details: Any) -> RecordedError:
        """Work the platform ended (a bug, exhausted retries, work lost again and again): what happened and the
        request id the logs have it under, never a trace."""
        return cls(type="internal_error", message=f"{message}; the logs have it under request_id {request_id}",
                   details={"request_id": request_id, **details})


#: What a call a cancel ended before it started says (as the call pipeline's cancellation says it).
NOT_STARTED = RecordedError(type="call_cancelled", message="the job was cancelled before the call started; it did not run",
                            details={"stopped_after_s": 0.0})


class Attempt(BaseModel):
    """One decision attempt as the job journals it (``decider.checked.CheckedAttempt``)."""

    attempt: int
    source: Literal["client", "decider"] = "decider"
    raw_output: str = ""
    errors: list[dict[str, Any]] = Field(default_factory=list)
    findings: list[dict[str, Any]] = Field(default_factory=list)
    repairs: list[str] = Field(default_factory=list)
    platform: dict[str, Any] = Field(default_factory=dict)
    usage: dict[str, int] = Field(default_factory=dict)
    latency_s: float = 0.0


class Approval(Sparse):
    """A call that needs a person: why (``required_by``: tool, job, tenant, provenance, unclear), the evidence shown,
    and once decided the answer (``state``, ``at``, a rejection's ``reason``, an edit's ``original_arguments``)."""

    state: Literal["pending", "approved", "rejected"]
    required_by: str | None = None
    provenance: list[dict[str, Any]] | None = None
    untrusted: list[str] | None = None
    at: float | None = None
    by: str | None = None
    reason: str | None = None
    edited: bool | None = None
    original_arguments: dict[str, Any] | None = None


class ApprovalAnswer(BaseModel):
    """The answer a step journals for one call (``steps[n].approvals[call_id]``): the state that won, the call's
    approval as it stands after it, and the arguments it runs with."""

    state: Literal["approved", "rejected"]
    record: Approval
    arguments: dict[str, Any] | None = None


class Review(BaseModel):
    """A person's answer to a job in ``needs_review`` (``POST /v1/jobs/{id}/review``), on the step it resolved."""

    by: str
    at: float
    outcome: Literal["answer", "reject", "calls"]


class EarlyDispatch(BaseModel):
    """A call queued while its step was still decoding: how long before the decision's end, and whether it was kept."""

    id: str
    name: str
    dispatched_before_end_s: float
    kept: bool


class ProposedCall(BaseModel):
    """A call the decision made that a guard stopped: never run."""

    name: str
    arguments: dict[str, Any] | None = None


class StepRecord(Sparse):
    """One step's journal entry: its decision (attempts, content, who decided), its timing and how it ended."""

    index: int
    status: str | None = None
    tool_choice: str | dict[str, Any] | None = None
    started_at: float | None = None
    decided_at: float | None = None
    finished_at: float | None = None
    attempts: list[Attempt] = Field(default_factory=list)
    content: str | None = None
    decision_ended_at: float | None = None
    early_dispatch: list[EarlyDispatch] = Field(default_factory=list)
    #: What ended the run at this step instead of review (``repeated_answered_calls``).
    ended_by: str | None = None
    calls_not_run: list[ProposedCall] = Field(default_factory=list)
    #: ``reviewer``: a person chose this step's calls.
    decided_by: str | None = None
    review: Review | None = None
    approvals: dict[str, ApprovalAnswer] = Field(default_factory=dict)


class CallRecord(BaseModel):
    id: str
    index: int
    name: str
    arguments: dict[str, Any] | None = None
    status: CallStatus = "pending"
    attempts: int = 0
    result: Any = None
    error: RecordedError | None = None
    repairs: list[str] = Field(default_factory=list)
    queue: str | None = None
    #: The run step (0-based) whose decision made this call.
    step: int = 0
    #: Set when the call needs a human (or a reviewer chose it).
    approval: Approval | None = None
    #: When the call was queued on its tool queue (epoch seconds).
    dispatched_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    duration_s: float | None = None

    def approval_state(self) -> str | None:
        """``pending``, ``approved`` or ``rejected`` when the call needs a person's answer, else None."""
        return self.approval.state if self.approval is not None else None


class JobRecord(BaseModel):
    job_id: str
    request_id: str
    tenant: str
    status: JobStatus = "queued"
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)
    messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[str] = Field(default_factory=list)
    inline_tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    max_reasks: int = 2
    client_output: dict[str, Any] | None = None
    attempts: list[Attempt] = Field(default_factory=list)
    content: str | None = None
    error: RecordedError | None = None
    #: When the job last entered deciding/validating, and how long that took once it left.
    decision_started_at: float | None = None
    decision_s: float | None = None
    calls: list[CallRecord] = Field(default_factory=list)
    #: Run loop: most decide → run steps, the current step (0-based), and the finished steps' journal.
    max_steps: int = 1
    step: int = 0
    steps: list[StepRecord] = Field(default_factory=list)
    #: Approval policy of this job: tool names, ``"side_effects"``, or None (tool flags and tenant policy still apply).
    require_approval: list[str] | str | None = None
    #: Seconds a step may wait for approval (None: ``TOOLRAIL_APPROVAL_TIMEOUT_S``), and when the wait ends.
    approval_timeout_s: float | None = None
    approval_deadline_at: float | None = None
    #: The user's IANA time zone: relative days ("tomorrow") are read against ``created_at`` there (None: UTC).
    time_zone: str | None = None
    #: When the whole run must have ended (epoch seconds); None: no deadline.
    deadline_at: float | None = None
    #: Where ``job.*`` events are POSTed (Standard Webhooks); None: the tenant default, if any.
    webhook_url: str | None = None
    #: W3C trace context of the job's root span (``traceparent``, ``tracestate``, ``baggage``).
    trace_context: dict[str, str] = Field(default_factory=dict)
    #: Calls queued while their step was still being decoded that the final decision did not make (a re-ask,
    #: review, a changed call): they belong to no step; what came of them is kept here (read from the store).
    discarded_calls: list[CallRecord] = Field(default_factory=list)
    #: The OpenAI Responses API object this job answered with (``POST /v1/responses``: a response is a job).
    response: dict[str, Any] | None = None

    def public(self) -> dict[str, Any]:
        """What the API returns: the record, every call (by step, then index) and each step with its own calls."""
        data = self.model_dump(exclude={"client_output", "inline_tools", "trace_context"})
        calls = [c.model_dump(exclude={"queue"}) for c in sorted(self.calls, key=lambda c: (c.step, c.index))]
        data["calls"] = calls
        data["steps"] = [{**step, "calls": [c for c in calls if c["step"] == step.get("index")]} for step in data["steps"]]
        return data

    def step_calls(self, step: int | None = None) -> list[CallRecord]:
        """The calls of one step (default: the current one), in call order."""
        wanted = self.step if step is None else step
        return sorted((c for c in self.calls if c.step == wanted), key=lambda c: c.index)

    def journal(self, step: int) -> StepRecord | None:
        """The journal entry of ``step``, if it has one."""
        return next((entry for entry in self.steps if entry.index == step), None)
