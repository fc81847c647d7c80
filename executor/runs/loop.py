"""The executor's logic as plain functions: decide a step, run one call, advance the run.

A job is an agent run (``executor.runs.policy``): each step is decided, checked, its calls run, and the
results go back to the model for the next step. Celery tasks (``executor.worker.tasks``) only call these;
tests can call them directly against a real Redis. Every function is safe to run twice for the
same input: statuses only move forward, terminal calls are recorded once (``finish_call``), a
step advances once (a transaction on the job record), side effects go through idempotency
records keyed by (job, step, call).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from decider.errors import DeciderPermanentError
from decider.checked import CheckedDecision, ClientOutput, decide_checked
from tools.check import CallCheck
from decider.protocol import DecideRequest
from executor import metrics
from executor.runs import policy as runs
from executor.runs import webhooks
from executor.runs.progress_events import progress_recorder
from executor.ports import Runtime
from executor.calls.pipeline import Invocation
from executor.sandbox.boundary import CallRun
from executor.store.models import Approval, Attempt, EarlyDispatch, ProposedCall, RecordedError, StepRecord
from executor.store.records import TERMINAL_CALL, TERMINAL_JOB, CallRecord, JobRecord, StoredJob
from toolrail import tracing
from toolrail.logging import get_logger
from tools.calls import call_id
from tools.errors import UnknownToolError
from tools.evidence import Source, reference_day, sourced_values
from tools.grounding import provenance, untrusted
from tools.spec import ToolSpec

__all__ = ["Dispatch", "NextStep", "advance", "check_client_output", "decide_job", "finalize_job", "job_specs", "notify",
           "run_call", "set_status", "start_checked"]

log = get_logger("toolrail.executor")

#: ``dispatch(job, call)`` enqueues one call on its tool queue.
Dispatch = Callable[[JobRecord, CallRecord], None]
#: ``next_step(job)`` queues the decision of the job's next step (its own task: a run never holds a worker).
NextStep = Callable[[JobRecord], None]


def job_specs(rt: Runtime, job: JobRecord, *, inline: list[ToolSpec] | None = None) -> dict[str, ToolSpec]:
    """The tools this job may call: registered names plus inline specs (``inline``: those of ``job.inline_tools``
    already built, as the API builds them to check them)."""
    unregistered = [name for name in job.tools if name not in rt.registry]
    extra = rt.tenant_specs(job.tenant, unregistered) if unregistered else {}  # e.g. the tenant's MCP tools
    specs = {name: extra[name] if name in extra else rt.registry.get(name) for name in job.tools}
    for spec in inline if inline is not None else map(ToolSpec.from_openai, job.inline_tools):
        specs[spec.name] = spec
    return specs


def set_status(rt: Runtime, job_id: str, status: str, *, mutate: Callable[[JobRecord], Any] | None = None,
               read: StoredJob | None = None, leaving: frozenset[str] = frozenset(), **fields: Any) -> JobRecord:
    """Move a non-terminal job to ``status`` (and set ``fields``); tell its webhook about the new status.

    ``read``: the job as just read from the store, when the caller has it (the update then starts from it).
    ``leaving``: terminal statuses this move may leave all the same (a cancel leaves ``needs_review``)."""
    changed: dict[str, bool] = {}

    def apply(job: JobRecord) -> Any:
        changed.clear()  # a compare-and-set retry runs this again: only the attempt that lands counts
        if job.status in TERMINAL_JOB and job.status not in leaving:
            return None
        extra = mutate(job) if mutate is not None else None  # sees the status before the change
        changed["status"] = job.status != status
        job.status = status  # type: ignore[assignment]
        for key, value in fields.items():
            setattr(job, key, value)
        return extra

    job = rt.store.update(job_id, apply, read=read)
    if changed.get("status"):
        notify(rt, job)
        if job.status in TERMINAL_JOB:
            tracing.end_job(job)  # the job span: from the job's creation to now
    return job


def notify(rt: Runtime, job: JobRecord) -> None:
    """Queue the webhook of the job's new status, if it has one (``notify_status`` never raises, never waits on
    the receiver)."""
    webhooks.notify_status(rt, job)


def _client_output(job: JobRecord) -> ClientOutput | None:
    output = job.client_output
    if output is None or job.step > 0:
        return None
    if output.get("tool_calls") is not None:
        return list(output["tool_calls"])
    return output.get("raw_output", "")


def _decider_configured(rt: Runtime) -> bool:
    """Whether this deployment decides at all (read from settings: a tool worker never loads the model to ask)."""
    return rt.settings.decider != "none"


def decide_job(rt: Runtime, job_id: str, dispatch: Dispatch, *, next_step: NextStep | None = None) -> JobRecord:
    """Decide the current step (or take the client's output), check and re-ask, then dispatch its calls.

    Safe to run again for the same step: a job already running re-dispatches its unfinished calls, one
    awaiting approval or ended is left alone, and a decision redone replaces the step's calls.
    """
    job = rt.store.get(job_id)
    if job.status in TERMINAL_JOB or job.status == "awaiting_approval":
        return job
    if job.status == "running":  # a redelivered decide: the calls exist, make sure they are queued
        for call in job.step_calls():
            if call.status in {"pending", "running"}:
                dispatch(job, call)
        if job.step_calls() and all(c.status in TERMINAL_CALL for c in job.step_calls()):
            return advance(rt, job_id, next_step)
        return job
    if runs.deadline_passed(job):
        return _stop(rt, job, runs.deadline_trip(job))
    specs = job_specs(rt, job)
    first = _client_output(job)
    # the client's own output is final (decider.checked): the decider is asked for only when it decides
    decider = rt.decider if job.messages and first is None else None
    if first is None and (decider is None or decider() is None):
        return set_status(rt, job_id, "failed", error=RecordedError(type="decider_unavailable", message=
                          "no decider is configured and the job brought no tool calls"))
    tool_choice = runs.step_tool_choice(job)
    calls = job.calls
    job = set_status(rt, job_id, "validating" if first is not None else "deciding",
                     mutate=lambda j: runs.open_step(j, tool_choice=tool_choice) and None)
    if job.status in TERMINAL_JOB:  # cancelled meanwhile
        return job
    job.calls = calls  # the record as updated carries no calls; the earlier steps' calls are the journal
    request = DecideRequest(request_id=job.request_id, messages=runs.conversation(job, max_chars=rt.settings.tool_result_max_chars),
                            tools=list(specs.values()), tool_choice=tool_choice, parallel_tool_calls=job.parallel_tool_calls,
                            now=job.created_at, time_zone=job.time_zone)
    early = _EarlyDispatch(rt, job, specs, dispatch)
    try:
        decision = decide_checked(decider, request, first_output=first, max_reasks=job.max_reasks, on_call=early)
    except DeciderPermanentError as exc:
        early.ended = time.time()
        early.settle([])
        return _end_step(rt, job, "failed", error=RecordedError(type=type(exc).__name__, message=str(exc)))
    early.ended = time.time()
    if decision.status != "calls":
        early.settle([])  # review, failure or a text answer: whatever was queued early is no step's call
    attempts = _attempts(decision)
    error = RecordedError.model_validate(decision.error) if decision.error is not None else None
    if decision.status == "needs_review":
        if error is not None and runs.ends_on_results(job, error):  # the model only repeats what already ran
            return _end_step(rt, job, "succeeded", attempts=attempts, ended_by=error.type)
        log.warning("job.needs_review", job_id=job_id, step=job.step, attempts=len(attempts),
                    error_type=error.type if error else None)
        return _end_step(rt, job, "needs_review", attempts=attempts, error=error)
    if decision.status == "failed":
        return _end_step(rt, job, "failed", attempts=attempts, error=error)
    return _start_calls(rt, job, specs, decision, attempts, dispatch, next_step, early=early)


class _EarlyDispatch:
    """Dispatch while decoding: a call the decoder just closed, checked alone, is queued at once when its tool is
    read-only, runnable and needs no approval (``TOOLRAIL_DISPATCH_WHILE_DECODING``). Side-effecting calls wait
    for the whole decision: a later call could change what they mean.

    The decision stays the truth: :meth:`settle` keeps the early calls it makes (same id, name and arguments),
    moves the others to the job's ``discarded_calls`` (their outcome is still recorded), and journals, for each
    early call, how long before the decision's end it was queued.
    """

    def __init__(self, rt: Runtime, job: JobRecord, specs: dict[str, ToolSpec], dispatch: Dispatch) -> None:
        self.rt, self.job, self.specs, self.dispatch = rt, job, specs, dispatch
        self.enabled = rt.settings.dispatch_while_decoding
        #: Early calls by id, as stored (dispatched_at set); ``ended``: when the decision ended.
        self.sent: dict[str, CallRecord] = {}
        self.ended: float | None = None
        #: What :meth:`settle` journals on the step: each early call's lead on the decision's end.
        self.early: list[EarlyDispatch] = []

    def __call__(self, attempt: int, checked: CallCheck) -> None:
        spec = self.specs.get(checked.name)
        if not self.enabled or spec is None or spec.side_effects or spec.entrypoint is None:
            return
        job, settings = self.job, self.rt.settings
        if runs.needs_approval(spec, job, settings):
            return
        so_far = [(c.name, c.arguments) for c in self.sent.values()] + [(checked.name, checked.arguments)]
        if runs.guard_new_calls(job, so_far, settings) is not None:
            return  # the decision's own guard check decides what happens to this step
        call = CallRecord(id=call_id(job.request_id, checked.index, attempt=attempt, step=job.step), index=checked.index,
                          step=job.step, name=checked.name, arguments=checked.arguments, repairs=list(checked.repairs),
                          queue=spec.queue_name, dispatched_at=time.time())
        try:
            existing = self.rt.store.add_call(job.job_id, call)  # a redone decision finds its earlier record
            if existing is not None and existing.status in TERMINAL_CALL:
                self.sent[call.id] = existing
                return
            self.dispatch(job, call)
        except Exception as exc:  # noqa: BLE001 - early is an optimization: the decision's end queues it anyway
            log.warning("call.early_dispatch_failed", job_id=job.job_id, call_id=call.id, error=f"{type(exc).__name__}: {exc}")
            return
        self.sent[call.id] = existing or call
        log.info("call.dispatched_early", job_id=job.job_id, call_id=call.id, tool=call.name, attempt=attempt)

    def match(self, calls: list[CallRecord]) -> set[str]:
        """The ids of ``calls`` already queued early with the same name and arguments; a decided call whose id was
        queued early with other arguments gets an id of its own (the early one is discarded)."""
        kept = set()
        for call in calls:
            early = self.sent.get(call.id)
            if early is None:
                continue
            if (early.name, early.arguments) == (call.name, call.arguments):
                call.dispatched_at, call.status = early.dispatched_at, early.status
                kept.add(call.id)
            else:
                call.id = f"{call.id}_decided"
        return kept

    def settle(self, calls: list[CallRecord], *, record: bool = True) -> int | None:
        """Store the step's decided ``calls`` with what was queued early; None when nothing was (plain path).

        ``record=False``: the caller writes it into the step (:meth:`journal`) in its own update (one write less)."""
        if not self.sent:
            return None
        kept = {c.id for c in calls} & set(self.sent)
        specs = self.specs
        pending = self.rt.store.settle_calls(self.job.job_id, calls, step=self.job.step, discard=set(self.sent) - kept,
                                             keep_stale=lambda c: c.name in specs and not specs[c.name].side_effects)
        self.ended = ended = self.ended or time.time()
        self.early = [EarlyDispatch(id=cid, name=c.name, dispatched_before_end_s=round(ended - (c.dispatched_at or ended), 6),
                                    kept=cid in kept) for cid, c in self.sent.items()]
        if record:
            self.rt.store.update(self.job.job_id, lambda j: self.journal(runs.open_step(j)))
        return pending

    def journal(self, step: StepRecord) -> None:
        """Write what was queued early, and when the decision ended, into the step's journal entry."""
        if self.early:
            step.decision_ended_at, step.early_dispatch = self.ended, self.early


def check_client_output(rt: Runtime, job: JobRecord, *, specs: dict[str, ToolSpec] | None = None) -> JobRecord | None:
    """Step 0 of a job that brings its own calls, decided where it is submitted: no decide task.

    Checks the client's output through the same path as :func:`decide_job` (``decide_checked`` with
    no decider) and returns the record as that step would leave it — status, journal, attempts,
    calls — for the store to write in one go (``JobStore.create``); the caller dispatches its
    ``pending`` calls. Returns None when the job still needs the decide task: no client output, a
    deadline already passed, or calls a guard stops. An output that fails its check ends ``needs_review``
    here: the client's output is never re-asked (``decider.checked``). ``specs``: the job's (:func:`job_specs`), when
    the caller has them.
    """
    first = _client_output(job)
    if first is None or job.step > 0 or runs.deadline_passed(job):
        return None
    specs = job_specs(rt, job) if specs is None else specs
    tool_choice = runs.step_tool_choice(job)
    started = time.time()
    job = job.model_copy(update={"steps": list(job.steps)})  # what changes is set anew, but the journal grows in place
    runs.open_step(job, tool_choice=tool_choice)
    request = DecideRequest(request_id=job.request_id, messages=runs.conversation(job, max_chars=rt.settings.tool_result_max_chars),
                            tools=list(specs.values()), tool_choice=tool_choice, parallel_tool_calls=job.parallel_tool_calls,
                            now=job.created_at, time_zone=job.time_zone)
    decision = decide_checked(None, request, first_output=first, max_reasks=job.max_reasks)
    ended = time.time()
    attempts = _attempts(decision)
    status, calls = decision.status, []
    error = RecordedError.model_validate(decision.error) if decision.error is not None else None
    if decision.status == "calls":
        trip = runs.guard_new_calls(job, [(c.name, c.arguments) for c in decision.calls], rt.settings)
        if trip is not None:
            return None  # guards stop runs from the decide task (one place that records the trip)
        calls = _call_records(rt, job, specs, decision)
        waiting = any(c.status == "awaiting_approval" for c in calls)
        status = "awaiting_approval" if waiting else "running" if any(c.status == "pending" for c in calls) else "succeeded"
        if waiting:
            job.approval_deadline_at = time.time() + (job.approval_timeout_s or rt.settings.approval_timeout_s)
        for call in calls:
            call.dispatched_at = ended if call.status == "pending" and not waiting else None  # queued once stored
    elif decision.status == "text":  # a text answer ends the run
        status = "succeeded"
    job.status, job.attempts, job.error = status, attempts, error  # type: ignore[assignment] - a checked status
    job.content = decision.content if decision.status == "calls" else (decision.content or "") if status == "succeeded" else None
    _record_decision(job, attempts, job.content, status)
    runs.open_step(job, tool_choice=tool_choice).decision_ended_at = ended
    if status in TERMINAL_JOB:
        runs.close_step(job, status=status)
    job.decision_started_at, job.updated_at = started, time.time()
    job.decision_s = round(job.updated_at - started, 6)
    job.calls = calls
    return job


def start_checked(rt: Runtime, job: JobRecord, dispatch: Dispatch) -> int:
    """After a job from :func:`check_client_output` is stored: its webhook, approval index, span, calls queued; how
    many calls it queued."""
    if job.status != "queued":
        notify(rt, job)
    if job.status == "awaiting_approval":
        rt.store.mark_waiting(job)
    elif job.status in TERMINAL_JOB:
        tracing.end_job(job)
    to_run = [c for c in job.calls if c.status == "pending"] if job.status == "running" else []
    for call in to_run:
        dispatch(job, call)
    return len(to_run)  # said on the submit's ``job.created`` line


def _call_records(rt: Runtime, job: JobRecord, specs: dict[str, ToolSpec], decision: CheckedDecision) -> list[CallRecord]:
    """The step's call records: validated (inline tools), awaiting approval, or pending (to dispatch)."""
    calls, sources = [], None
    for checked in decision.calls:
        spec = specs[checked.name]
        runnable = spec.entrypoint is not None
        reason = runs.needs_approval(spec, job, rt.settings) if runnable else None
        shown: dict[str, Any] = {}  # the evidence a person is shown: provenance, and the untrusted paths in it
        if runnable and spec.side_effects and job.messages:  # tool output is untrusted input (tools.grounding)
            sources = _evidence_sources(rt, job, specs) if sources is None else sources
            found = provenance(spec.parameters, checked.arguments or {}, sources, side_effects=True)
            held = untrusted(found)  # stated only by tool results, or unclearly: a person decides
            shown = {"provenance": found}
            if held:
                why = "unclear" if all("unclear" in entry for entry in held) else "provenance"
                reason, shown["untrusted"] = reason or why, [entry["path"] for entry in held]
        status = "validated" if not runnable else "awaiting_approval" if reason else "pending"
        calls.append(CallRecord(id=call_id(job.request_id, checked.index, attempt=decision.attempt, step=job.step),
                                index=checked.index, step=job.step, name=checked.name, arguments=checked.arguments,
                                repairs=list(checked.repairs), status=status, queue=spec.queue_name if runnable else None,
                                approval=Approval(state="pending", required_by=reason, **shown) if reason else None))
    return calls


def _evidence_sources(rt: Runtime, job: JobRecord, specs: dict[str, ToolSpec]) -> list[tuple[Source, Any]]:
    """The step's conversation as evidence by source: the user, each tool's results (trusted when the tool's author
    flags ``trusted_output`` or the tenant lists it in ``TOOLRAIL_TRUSTED_TOOL_OUTPUTS``; an MCP tool marked so)."""
    trusted_here = set(rt.settings.trusted_tool_outputs.get(job.tenant, ()))

    def tool_source(name: str | None) -> Source:
        spec = specs.get(name) if name else None
        mcp = spec is not None and str(spec.public().get("source", "")).startswith("mcp:")
        return Source("tool", tool=name, mcp=mcp,
                      trusted=spec is not None and (spec.trusted_output or name in trusted_here))

    return sourced_values(runs.conversation(job, max_chars=rt.settings.tool_result_max_chars), tool_source=tool_source,
                          today=reference_day(job.created_at, job.time_zone))


def _attempts(decision: CheckedDecision) -> list[Attempt]:
    return [Attempt.model_validate(attempt.to_dict()) for attempt in decision.attempts]


def _record_decision(job: JobRecord, attempts: list[Attempt], content: str | None, status: str) -> None:
    record = runs.open_step(job)
    record.attempts, record.content, record.decided_at, record.status = attempts, content, time.time(), status


def _end_step(rt: Runtime, job: JobRecord, status: str, *, attempts: list[Attempt] | None = None,
              error: RecordedError | None = None, content: str | None = None, ended_by: str | None = None) -> JobRecord:
    """End the run at the current step's decision (an answer, review, or a failure); ``ended_by``: what ended it
    instead of review, journaled on the step."""
    def mutate(j: JobRecord) -> None:
        if attempts is not None:
            _record_decision(j, attempts, content, status)
        if ended_by is not None:
            runs.open_step(j).ended_by = ended_by
        runs.close_step(j, status=status)

    fields: dict[str, Any] = {"error": error}
    if attempts is not None:
        fields["attempts"] = attempts
    if content is not None:
        fields["content"] = content
    return set_status(rt, job.job_id, status, mutate=mutate, **fields)


def _stop(rt: Runtime, job: JobRecord, trip: runs.GuardTrip) -> JobRecord:
    """End the run because a guard tripped: failed, with the guard's typed error, counted in /metrics."""
    log.warning("run.guard_tripped", job_id=job.job_id, guard=trip.guard, step=job.step)
    pipe = rt.redis.pipeline(transaction=False)
    metrics.record_guard(pipe, metrics.metrics_key(), trip.guard)
    pipe.execute()
    return set_status(rt, job.job_id, "failed", error=trip.error(), mutate=lambda j: runs.close_step(j, status="failed"))


def _start_calls(rt: Runtime, job: JobRecord, specs: dict[str, ToolSpec], decision: CheckedDecision,
                 attempts: list[Attempt], dispatch: Dispatch, next_step: NextStep | None, *,
                 early: _EarlyDispatch | None = None) -> JobRecord:
    if not decision.calls:  # the model answered in text: the run is done
        return _end_step(rt, job, "succeeded", attempts=attempts, content=decision.content or "")
    trip = runs.guard_new_calls(job, [(c.name, c.arguments) for c in decision.calls], rt.settings)
    if trip is not None:
        if early is not None:
            early.settle([])
        def record(j: JobRecord) -> None:
            _record_decision(j, attempts, decision.content, "failed")
            runs.open_step(j).calls_not_run = [ProposedCall(name=c.name, arguments=c.arguments) for c in decision.calls]
        rt.store.update(job.job_id, record)
        return _stop(rt, job, trip)
    calls = _call_records(rt, job, specs, decision)
    queued = early.match(calls) if early is not None else set()  # already on their tool queues
    now = time.time()
    waiting = any(c.status == "awaiting_approval" for c in calls)
    for call in calls:
        if call.status == "pending" and not waiting and call.id not in queued:
            call.dispatched_at = now
    if early is None or early.settle(calls, record=False) is None:
        rt.store.set_calls(job.job_id, calls, step=job.step)
    to_run = [] if waiting else [c for c in calls if c.status == "pending" and c.id not in queued]
    status = "awaiting_approval" if waiting else "running" if to_run or queued else "succeeded"
    deadline = time.time() + (job.approval_timeout_s or rt.settings.approval_timeout_s) if waiting else None
    ended = early.ended if early is not None else None

    def mutate(j: JobRecord) -> None:
        _record_decision(j, attempts, decision.content, status)
        if ended is not None:
            runs.open_step(j).decision_ended_at = ended
        if early is not None:
            early.journal(runs.open_step(j))
        if status == "succeeded":
            runs.close_step(j, status=status)

    job = set_status(rt, job.job_id, status, mutate=mutate, attempts=attempts, content=decision.content,
                     approval_deadline_at=deadline)
    if waiting:
        rt.store.mark_waiting(job)
    if job.status == "cancelled":  # cancelled while deciding: the calls just written never run
        rt.store.end_unstarted(job.job_id)
        to_run = []
    for call in to_run:
        dispatch(job, call)
    log.info("job.calls_dispatched", job_id=job.job_id, step=job.step, calls=len(calls), dispatched=len(to_run),
             dispatched_early=len(queued), awaiting_approval=sum(c.status == "awaiting_approval" for c in calls))
    if queued and status == "running":  # early calls may all have ended before the job was running: advance now
        _maybe_advance(rt, job.job_id, next_step)
    return job


def run_call(rt: Runtime, job_id: str, call_id_: str, *, next_step: NextStep | None = None) -> CallRecord:
    """Run one call through the call pipeline (``rt.calls``: slot, admission, idempotency, span, breaker, sandbox),
    record its outcome, and advance the run when the step's last call ends."""
    job = rt.store.get(job_id)
    call = next((c for c in job.calls if c.id == call_id_), None)
    if call is None:
        dropped = next((c for c in job.discarded_calls if c.id == call_id_), None)
        if dropped is not None:  # queued while decoding, then left out of the decision: it no longer runs
            log.info("call.discarded", job_id=job_id, call_id=call_id_, status=dropped.status)
            return dropped
        raise UnknownToolError(f"call {call_id_} not in job {job_id}")
    if call.status in TERMINAL_CALL or job.status in TERMINAL_JOB:
        _maybe_advance(rt, job_id, next_step)
        return call
    if call.status == "awaiting_approval" or job.status == "awaiting_approval":
        log.warning("call.not_approved", job_id=job_id, call_id=call.id)  # never runs before a person approves it
        return call
    spec = job_specs(rt, job)[call.name]
    run = CallRun(request_id=job.request_id, job_id=job_id, call_id=call.id, idempotency_key=f"{job_id}:{call.id}",
                  arguments=call.arguments or {}, env=rt.tool_env(spec), on_progress=progress_recorder(rt, job_id, call))
    outcome = rt.calls(Invocation(job_id=job_id, tenant=job.tenant, call=call, spec=spec, run=run,
                                  queue=call.queue or spec.queue_name))
    if outcome.replayed:  # answered from its idempotency record: this delivery is one more attempt all the same
        call.attempts, call.started_at = call.attempts + 1, time.time()
    elif outcome.error is not None:
        log.warning("call.failed", job_id=job_id, call_id=call.id, error_type=outcome.error.type,
                    message=outcome.error.message)
    tool: dict[str, Any] = {}  # the sandbox's own start and end records, said on ``call.end``; a tool's own, each a line
    for line in outcome.ran.logs if outcome.ran is not None else ():
        if line.get("logger") == "toolrail.sandbox" and line.get("event") in ("tool.start", "tool.end"):
            # the first is the sandbox's start, written before any tool code runs: a later look-alike changes nothing
            tool.setdefault("tool_request_id", line.get("request_id"))
            tool.setdefault("tool_pid", line.get("pid"))
            continue
        log.info("tool.log", job_id=job_id, call_id=call.id, tool_event=line.get("event"),
                 tool_request_id=line.get("request_id"), tool_pid=line.get("pid"))
    call.finished_at = time.time()
    took = round(call.finished_at - (call.started_at or call.finished_at), 6)
    call.duration_s = outcome.duration_s if outcome.duration_s is not None else took
    if outcome.ok:
        call.status, call.result, call.error = "succeeded", outcome.result, None
    else:
        call.status, call.error = "failed", outcome.error
    remaining, read = rt.store.finish_call_and_read(job_id, call)  # the last call of its step: the job as it ended
    log.info("call.end", job_id=job_id, call_id=call.id, status=call.status, remaining=remaining, **tool)
    if remaining == 0:
        advance(rt, job_id, next_step, read=read)
    return call


def _maybe_advance(rt: Runtime, job_id: str, next_step: NextStep | None) -> None:
    """Advance a run whose step's last call ended but whose advance was lost (worker death)."""
    job = rt.store.get(job_id)
    calls = job.step_calls()
    if job.status == "running" and calls and all(c.status in TERMINAL_CALL for c in calls):
        advance(rt, job_id, next_step)


def advance(rt: Runtime, job_id: str, next_step: NextStep | None = None, *, read: StoredJob | None = None) -> JobRecord:
    """After a step's calls all ended: start the next step, or end the run.

    The step is closed and the next one opened in one transaction, and only by the process whose
    transaction moved the job; that process queues the next decision. If it dies before queuing,
    the reconciler finds the job ``deciding`` and queues it. ``read``: the job with its calls as just
    read from the store (``finish_call_and_read``), else it is read here.
    """
    job = read.job if read is not None else rt.store.get(job_id)
    calls = job.step_calls()
    if job.status != "running" or not calls or any(c.status not in TERMINAL_CALL for c in calls):
        return job
    verdict = runs.continue_after_calls(job, decider_configured=_decider_configured(rt))
    if isinstance(verdict, runs.GuardTrip):
        return _stop(rt, job, verdict)
    if verdict is not None:
        return finalize_job(rt, job_id, job=job, read=read)
    moved: dict[str, bool] = {}

    def mutate(j: JobRecord) -> dict[str, Any] | None:
        moved.clear()  # a compare-and-set retry runs this again: only the attempt that lands counts
        if j.status != "running" or j.step != job.step:
            return None
        runs.close_step(j, status="ran")
        j.step += 1
        j.status = "deciding"
        moved["yes"] = True
        return {"type": "step", "step": j.step, "status": "started", "request_id": j.request_id}

    job = rt.store.update(job_id, mutate, read=read)
    if moved:
        pipe = rt.redis.pipeline(transaction=False)
        metrics.record_step(pipe, metrics.metrics_key())
        pipe.execute()
        log.info("run.step", job_id=job_id, step=job.step)
        if next_step is not None:
            next_step(job)
    return job


def finalize_job(rt: Runtime, job_id: str, *, job: JobRecord | None = None, read: StoredJob | None = None) -> JobRecord:
    """End a run after its last step's calls, as a single round: failed if a call failed, else succeeded
    (``job``: the record as just read, with its calls, when the caller has it; ``read``: that read as the store
    returned it, which the status update starts from)."""
    job = job if job is not None else read.job if read is not None else rt.store.get(job_id)
    calls = job.step_calls()
    failed = [c for c in calls if c.status in {"failed", "rejected"}]
    if failed:
        error = RecordedError(type="tool_failed", message=f"{len(failed)} of {len(calls)} call(s) failed",
                              details={"calls": [{"id": c.id, "name": c.name, "error": c.error and c.error.model_dump()}
                                                 for c in failed]})
        job = set_status(rt, job_id, "failed", error=error, mutate=lambda j: runs.close_step(j, status="failed"),
                         read=read)
    else:
        job = set_status(rt, job_id, "succeeded", mutate=lambda j: runs.close_step(j, status="succeeded"), read=read)
    log.info("job.finished", job_id=job_id, status=job.status)
    return job
