"""The agent run: what the model sees at each step, when a run goes on, and what stops it.

A job is a run of steps: decide → check → run the calls → append each result as a ``tool``
message paired by ``tool_call_id`` in call order → decide again, until the model answers in
text, ``max_steps`` is reached or a guard trips. The steps are journaled on the job record
(``JobRecord.steps``, and every call carries its ``step``), so the conversation of the next
step is rebuilt from the record alone: a worker that dies anywhere resumes from the journal.

Pure functions of the record and the settings live here; ``executor.runs.loop`` does the I/O.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from decider.checked import REPEATED_ANSWERED_CALLS
from executor.store.models import TERMINAL_CALL, CallRecord, JobRecord, RecordedError, StepRecord
from toolrail.settings import Settings
from tools.check import call_key
from tools.spec import ToolSpec

__all__ = ["GuardTrip", "close_step", "continue_after_calls", "conversation", "deadline_passed",
           "deadline_trip", "ends_on_results", "guard_new_calls", "needs_approval", "open_step", "step_tool_choice", "tool_message"]


@dataclass(frozen=True)
class GuardTrip:
    """A guard that stopped a run: the metric label, the job error type and a message for the user."""

    guard: str
    type: str
    message: str
    details: dict[str, Any]

    def error(self) -> RecordedError:
        return RecordedError(type=self.type, message=self.message, details={"guard": self.guard, **self.details})


def _short(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str, sort_keys=True)
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


def tool_message(call: CallRecord, *, max_chars: int) -> dict[str, Any]:
    """The ``tool`` message that answers one call: its result as JSON, or a short typed error."""
    if call.status == "succeeded":
        content = _short(call.result, max_chars)
    else:
        error = call.error or RecordedError(type=call.status, message=f"the call ended as {call.status}")
        content = _short({"error": {"type": error.type, "message": _short(error.message, 300)}}, max_chars)
    return {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": content}


def _assistant_message(content: str | None, calls: list[CallRecord]) -> dict[str, Any]:
    return {"role": "assistant", "content": content,
            "tool_calls": [{"id": c.id, "type": "function",
                            "function": {"name": c.name, "arguments": json.dumps(c.arguments or {}, ensure_ascii=False)}}
                           for c in calls]}


def conversation(job: JobRecord, *, max_chars: int) -> list[dict[str, Any]]:
    """The messages of the current step: the job's own, then each earlier step's assistant turn and its results.

    Results are paired by ``tool_call_id`` and kept in call order (the order the model wrote the
    calls), never in the order the tools finished.
    """
    messages = list(job.messages)
    for record in job.steps:
        if record.index >= job.step:
            continue
        calls = [c for c in job.step_calls(record.index) if c.status in TERMINAL_CALL and c.status != "validated"]
        if not calls:
            continue
        messages.append(_assistant_message(record.content, calls))
        messages.extend(tool_message(c, max_chars=max_chars) for c in calls)
    return messages


def step_tool_choice(job: JobRecord) -> str | dict[str, Any]:
    """The tool choice of the current step: the job's on the first step, ``auto`` after tool results.

    A forced choice (``required`` or a named tool) on every step would force a call forever; like the
    OpenAI Agents SDK's ``reset_tool_choice``, later steps let the model answer. Recorded on the step.
    """
    return job.tool_choice if job.step == 0 else "auto"


def open_step(job: JobRecord, *, tool_choice: str | dict[str, Any] | None = None) -> StepRecord:
    """The journal entry of the current step (created once; a redone decision reuses it). ``tool_choice``
    defaults to the step's own (:func:`step_tool_choice`)."""
    record = job.journal(job.step)
    if record is not None:
        return record
    if tool_choice is None:
        tool_choice = step_tool_choice(job)
    record = StepRecord(index=job.step, status="deciding", tool_choice=tool_choice, started_at=time.time(),
                        decided_at=None, finished_at=None, attempts=[], content=None)
    job.steps.append(record)
    return record


def close_step(job: JobRecord, *, status: str) -> None:
    """Mark the current step's journal entry finished."""
    for record in job.steps:
        if record.index == job.step and record.finished_at is None:
            record.status, record.finished_at = status, time.time()


def needs_approval(spec: ToolSpec, job: JobRecord, settings: Settings) -> str | None:
    """Why a call of ``spec`` must wait for a person (``tool``, ``job`` or ``tenant``), or None."""
    if spec.requires_approval:
        return "tool"
    for source, policy in (("job", job.require_approval), ("tenant", settings.approval_policies.get(job.tenant))):
        if policy == "side_effects" and spec.side_effects:
            return source
        if isinstance(policy, list) and spec.name in policy:
            return source
    return None


def guard_new_calls(job: JobRecord, new_calls: Iterable[tuple[str, Any]], settings: Settings) -> GuardTrip | None:
    """Check the calls a step is about to run against the run's budgets and the identical-call guard."""
    earlier = [(c.name, c.arguments or {}) for c in job.calls if c.step < job.step]
    fresh = list(new_calls)
    everything = earlier + fresh
    if len(everything) > settings.run_max_calls:
        return GuardTrip("run_calls", "call_budget_exceeded",
                         f"the run would make {len(everything)} calls; at most {settings.run_max_calls} are allowed",
                         {"limit": settings.run_max_calls, "calls": len(everything)})
    per_tool = Counter(name for name, _ in everything)
    for name, count in per_tool.items():
        if count > settings.run_max_calls_per_tool:
            return GuardTrip("tool_calls", "tool_budget_exceeded",
                             f"the run would call {name!r} {count} times; at most {settings.run_max_calls_per_tool}",
                             {"tool": name, "limit": settings.run_max_calls_per_tool, "calls": count})
    same = Counter(call_key(name, arguments) for name, arguments in everything)
    for name, arguments in fresh:
        count = same[call_key(name, arguments)]
        if count > settings.run_max_identical_calls:
            return GuardTrip("identical_calls", "loop_detected",
                             f"the run made the same call to {name!r} {count} times (at most "
                             f"{settings.run_max_identical_calls}); it is stuck in a loop",
                             {"tool": name, "arguments": arguments, "limit": settings.run_max_identical_calls,
                              "calls": count})
    return None


def continue_after_calls(job: JobRecord, *, decider_configured: bool, now: float | None = None) -> GuardTrip | str | None:
    """After a step's calls all ended: None to decide again, a reason string to end the run as a single round
    (its calls' outcomes decide the status), or the guard that stops it."""
    calls = job.step_calls()
    if job.max_steps <= 1:
        return "single_step"
    if not job.messages or not decider_configured:
        return "no_conversation"
    if any(c.status == "validated" for c in calls):
        return "client_executes"  # calls of tools the client runs: the client holds the results
    if job.step + 1 >= job.max_steps:
        return GuardTrip("max_steps", "max_steps_reached",
                         f"the run used all {job.max_steps} steps without a final answer",
                         {"limit": job.max_steps})
    if deadline_passed(job, now=now):
        return deadline_trip(job)
    return None


def ends_on_results(job: JobRecord, error: RecordedError | None) -> bool:
    """Whether a step whose decision went to review ends the run on its calls' results instead (``succeeded``, as a
    one-step job ends): after a step whose calls all succeeded, the model only repeated calls whose results the
    conversation holds (also when offered the answer only) — nothing new to run, nothing for a person to decide."""
    if job.step == 0 or error is None or error.type != REPEATED_ANSWERED_CALLS:
        return False
    earlier = job.step_calls(job.step - 1)
    return bool(earlier) and all(c.status == "succeeded" for c in earlier)


def deadline_passed(job: JobRecord, *, now: float | None = None) -> bool:
    return job.deadline_at is not None and (now or time.time()) > job.deadline_at


def deadline_trip(job: JobRecord) -> GuardTrip:
    return GuardTrip("deadline", "deadline_exceeded", "the run did not end before its deadline",
                     {"deadline_at": job.deadline_at})

