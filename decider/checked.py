"""The one check-and-re-ask loop: decide → check → re-ask with the exact errors → review.

:func:`decide_checked` is shared by the job executor, the OpenAI-compatible endpoint and the
benchmark. It takes a client-supplied output as attempt 0 when there is one, checks every
attempt with the tools' own check path (:mod:`tools.check`: clean, validate, normalize aliases,
declared grounding), re-asks the decider with the exact errors, and returns a
:class:`CheckedDecision` that records every attempt and everything the platform did:

- the constraint each attempt was decoded under (schema hash), fields narrowed to typed
  candidates, bounds added (``platform``);
- validation errors and grounding findings (``errors`` / ``findings``), repairs made.

Contract findings — a grounded value the conversation does not state, or a side-effecting call
identical to one the conversation already made — are re-asked once; if the model insists, the
decision ends ``needs_review``: such a call never runs unreviewed.

**The client's output is the client's** (the one rule, here): an output the client brought (its
``tool_calls``, its ``raw_output``, the unanswered calls of the conversation's last assistant turn,
a call through MCP) is checked as attempt 0 and is final — it passes, or the decision ends
``needs_review`` carrying the client's calls and the findings. The platform's model is never asked
to replace it; a re-ask happens only where the decider made the decision. A text answer that is a tool
call written as text (an offered tool's call in JSON, or ``tool(...)``) is not an answer: it is a
``call_as_text`` finding, re-asked once with calls required, then review. A decoder that
hits a bound (``GenerationBoundError``) ends the decision at once as ``failed`` — a re-ask would
hit the same bound; the calls that closed before the bound and pass their checks are kept on it
(``calls``), for a caller whose contract is to answer with them (the OpenAI endpoint's
``finish_reason: "length"``); the job API runs none of them. Transport errors propagate untouched
(they are the caller's to retry).
"""

from __future__ import annotations

import inspect
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import structlog
from opentelemetry import trace

from decider.errors import GenerationBoundError, InvalidRequestError
from decider.parser import parse_output
from decider.prompt import reask_messages
from decider.protocol import DecideRequest, Decider, Decision
from decider.tool_formats import read_native_calls
from tools.calls import ToolCall, call_id
from tools.check import (
    CONTRACT_VALIDATORS,
    CallCheck,
    OutputCheck,
    answered_calls,
    check_output,
    check_tool_calls,
    extract_calls,
    flag_repeated_calls,
    flag_repeated_side_effects,
    prior_calls,
    settled_calls,
)
from tools.evidence import ConversationValues, reference_day
from toolrail import tracing

__all__ = ["CheckedAttempt", "CheckedDecision", "ClientOutput", "DEFAULT_MAX_REASKS", "OnCheckedCall",
           "REPEATED_ANSWERED_CALLS", "client_turn", "decide_checked"]

logger = structlog.get_logger(__name__)

DEFAULT_MAX_REASKS = 2
#: Re-asks spent on grounding findings alone: once with the reason, then review.
MAX_GROUNDING_REASKS = 1
#: The validator of a text answer that is a tool call written as text (re-asked once with calls required).
CALL_AS_TEXT = "call_as_text"

#: The review error of a decision that only repeated calls whose results the conversation holds: a run ends on
#: those results instead of waiting for a person (``executor.runs.policy.ends_on_results``).
REPEATED_ANSWERED_CALLS = "repeated_answered_calls"

#: A client's own output as attempt 0: raw model text, or calls already split (any common shape).
ClientOutput = str | Sequence[Mapping[str, Any]]


@dataclass
class CheckedAttempt:
    """One attempt as recorded on the job and in the OpenAI extension field."""

    attempt: int
    source: Literal["client", "decider"]
    raw_output: str
    errors: list[dict[str, Any]] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)
    repairs: list[str] = field(default_factory=list)
    platform: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=dict)
    latency_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CheckedDecision:
    """The outcome of the loop: calls to run, a text answer, review, or a failure."""

    request_id: str
    status: Literal["calls", "text", "needs_review", "failed"]
    attempts: list[CheckedAttempt]
    #: Calls that passed every check (to execute), in call order.
    calls: list[CallCheck] = field(default_factory=list)
    #: Calls of the last attempt that did not pass (never executed).
    blocked: list[CallCheck] = field(default_factory=list)
    content: str | None = None
    #: ``{type, message, details}`` when ``status`` is needs_review or failed.
    error: dict[str, Any] | None = None

    @property
    def attempt(self) -> int:
        return self.attempts[-1].attempt if self.attempts else 0

    @property
    def tool_calls(self) -> list[ToolCall]:
        """The passing calls as ``ToolCall``s with ids bound to the request (what may run)."""
        return [ToolCall(id=call_id(self.request_id, c.index, attempt=self.attempt), index=c.index, name=c.name,
                         arguments=c.arguments, raw_arguments=c.raw_arguments) for c in self.calls]

    def record(self) -> dict[str, Any]:
        """The platform's record of this decision (the OpenAI endpoint's ``toolrail`` extension)."""
        last = self.attempts[-1] if self.attempts else None
        return {"status": self.status, "attempts": [a.to_dict() for a in self.attempts],
                "findings": last.findings if last else [], "error": self.error,
                "blocked_calls": [{"index": c.index, "name": c.name, "errors": c.errors} for c in self.blocked]}


def client_turn(messages: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
    """``(conversation before it, its calls)`` when the conversation ends in an assistant turn whose tool calls no
    message answers yet — the client's own decision, brought to be checked and run — else None."""
    if not messages:
        return None
    last = messages[-1]
    if last.get("role") != "assistant" or not last.get("tool_calls"):
        return None
    return [dict(m) for m in messages[:-1]], [dict(c) for c in last["tool_calls"]]


def _check_client(output: ClientOutput, specs: Mapping[str, Any],
                  evidence: ConversationValues | None) -> tuple[str, OutputCheck]:
    if isinstance(output, str):
        native = read_native_calls(output)  # a client's own model writing its family's syntax
        if native is not None:
            return output, check_tool_calls(native[1], specs, evidence=evidence)
        return output, check_output(output, specs, evidence=evidence)
    calls = [dict(c) for c in output]
    return json.dumps(calls, ensure_ascii=False, default=str), check_tool_calls(calls, specs, evidence=evidence)


def _check_decision(decision: Decision, specs: Mapping[str, Any], evidence: ConversationValues | None) -> OutputCheck:
    if decision.tool_calls:
        calls = [c.model_dump() for c in decision.tool_calls]
        return check_tool_calls(calls, specs, evidence=evidence)
    if decision.content is not None:
        return OutputCheck(calls=[], content=decision.content)
    return check_output(decision.raw_output, specs, evidence=evidence)


def _written_call(content: str, specs: Mapping[str, Any]) -> str | None:
    """The offered tool a text answer calls in writing (a JSON call object or ``name(...)``), else None."""
    try:
        pairs = extract_calls(content)[0]
    except Exception:  # noqa: BLE001 - text that does not even clean up as JSON holds no JSON call
        pairs = []
    for name, _ in pairs:
        if name in specs:
            return name
    for name in specs:
        if re.search(rf"(?<![\w.]){re.escape(name)}\s*\(", content):
            return name
    return None


def _flag_call_as_text(check: OutputCheck, specs: Mapping[str, Any]) -> None:
    if check.content is None or check.calls or check.errors:
        return
    name = _written_call(check.content, specs)
    if name is not None:
        check.errors.append({"path": "", "validator": CALL_AS_TEXT, "tool": name, "message": (
            f"the answer is a call of {name} written as text; a call must be made as a tool call, not described"
            " in the answer")})


def _bound_calls(exc: GenerationBoundError, request: DecideRequest, specs: Mapping[str, Any],
                 evidence: ConversationValues | None, enforce: Callable[[OutputCheck], None]) -> list[CallCheck]:
    """The calls that closed before ``exc``'s bound and pass every check a whole output's calls get."""
    closed = parse_output(exc.output, request_id=request.request_id, attempt=request.attempt).closed_calls
    if not closed:
        return []
    check = check_tool_calls([c.model_dump() for c in closed], specs, evidence=evidence)
    enforce(check)
    for checked, call in zip(check.calls, closed):
        checked.index = call.index
    return [c for c in check.calls if c.ok] if not check.errors else []


def _enforce(check: OutputCheck, specs: Mapping[str, Any], prior: Mapping[str, str], *, require: bool,
             answered: Mapping[str, str] | None = None, settled: Mapping[str, str] | None = None) -> None:
    """The request-level checks every attempt gets, client's or decider's: no repeat of a call whose result the
    conversation holds (a side effect's: made since the user's last message), no other repeated side effect, and a
    call when ``tool_choice`` requires one."""
    if answered:
        flag_repeated_calls(check, specs, answered, settled)
    flag_repeated_side_effects(check, specs, prior)
    if require and not check.calls and not check.errors:
        check.errors.append({"path": "", "message": "a tool call is required, but the output holds none",
                             "validator": "minItems"})


def _attempt(number: int, source: Literal["client", "decider"], raw: str, check: OutputCheck, *,
             platform: Mapping[str, Any] | None = None, usage: Mapping[str, int] | None = None,
             latency_s: float = 0.0) -> CheckedAttempt:
    errors = check.all_errors()
    return CheckedAttempt(attempt=number, source=source, raw_output=raw, errors=errors,
                          findings=[e for e in errors if e.get("validator") == "grounded"],
                          repairs=[r for c in check.calls for r in c.repairs], platform=dict(platform or {}),
                          usage=dict(usage or {}), latency_s=round(latency_s, 4))


def _review_error(check: OutputCheck, attempts: int, *, answer_only: bool = False) -> dict[str, Any]:
    """Why a decision went to review. ``answer_only``: the last re-ask offered the answer only (every call of the
    attempt before repeated one whose result the conversation holds)."""
    errors = check.all_errors()
    grounded = [e for e in errors if e.get("validator") == "grounded"]
    repeats = {"repeated_call", CALL_AS_TEXT} if answer_only else {"repeated_call"}
    if errors and all(e.get("validator") in repeats for e in errors):
        return {"type": REPEATED_ANSWERED_CALLS, "message": "the model only repeated calls whose results the "
                "conversation already holds (also when offered the answer only): there is nothing new to run",
                "details": {"errors": errors}}
    if errors and all(e.get("validator") == "repeated_side_effect" for e in errors):
        return {"type": "repeated_side_effect", "message": "a side-effecting call the conversation already made was "
                "proposed again; a person must confirm it", "details": {"errors": errors}}
    if errors and all(e.get("validator") == CALL_AS_TEXT for e in errors):
        return {"type": CALL_AS_TEXT, "message": "the model wrote a tool call as text, also when asked to answer in text "
                "or to call; a person must decide", "details": {"errors": errors}}
    if grounded and len(grounded) == len(errors):
        fields = sorted({f"{e.get('tool')}{e.get('path')}" for e in grounded})
        return {"type": "ungrounded_values", "message": f"values not stated in the conversation: {', '.join(fields)} "
                f"(after {attempts} attempt(s)); a person must confirm them", "details": {"errors": errors}}
    return {"type": "invalid_tool_calls", "message": f"tool calls still invalid after {attempts} attempt(s)",
            "details": {"errors": errors}}


def _as_sent(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _client_review_error(error: dict[str, Any], check: OutputCheck) -> dict[str, Any]:
    """The review error of a client's own output: the findings, the client's calls as it sent them, and why no
    model was asked instead."""
    calls = [{"index": c.index, "name": c.name, "arguments": c.arguments if c.arguments is not None else
              _as_sent(c.raw_arguments), "errors": c.errors} for c in check.calls]
    message = (f"{error['message']}; the client's own output is never replaced by the platform's model: a person "
               "decides (POST /v1/jobs/{id}/review)")
    return {**error, "message": message, "details": {**error.get("details", {}), "client_calls": calls}}


#: ``on_call(attempt, call)``: a call of a decider attempt, checked on its own, the moment the decoder closed it.
OnCheckedCall = Callable[[int, CallCheck], None]


def _reports_calls(decider: Decider) -> bool:
    """Whether ``decider.decide`` takes ``on_call`` (the streaming deciders do; a plain ``Decider`` need not)."""
    try:
        return "on_call" in inspect.signature(decider.decide).parameters
    except (TypeError, ValueError):
        return False


def _early_reporter(on_call: OnCheckedCall, number: int, specs: Mapping[str, Any], evidence: ConversationValues | None,
                    enforce: Callable[[OutputCheck], None]) -> Callable[[ToolCall], None]:
    """Checks each call the decoder closes alone, as the whole output will be checked, and passes on those that pass."""

    def report(call: ToolCall) -> None:
        alone = check_tool_calls([call.model_dump()], specs, evidence=evidence)
        enforce(alone)  # the request-level checks a call can fail on its own (``require`` needs the whole output)
        if alone.ok and alone.calls:
            checked = alone.calls[0]
            checked.index = call.index
            on_call(number, checked)

    return report


def _decide(decider: Decider, request: DecideRequest, chat: list[Any],
            on_call: Callable[[ToolCall], None] | None = None) -> Decision:
    """One model call inside a ``chat {model}`` span (tokens, time to first token, grammar times, re-ask
    number); the span stays open in ``chat`` until the attempt is checked and recorded."""
    backend = getattr(decider, "backend", None)
    path = str(getattr(getattr(decider, "tokenizer", None), "name_or_path", "") or "")
    model = getattr(backend, "model_name", None) or path.rstrip("/").rsplit("/", 1)[-1] or type(decider).__name__
    span = tracing.start_chat(str(model), attempt=request.attempt, provider=str(getattr(decider, "name", "toolrail")),
                              messages=request.messages)
    try:
        with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
            if on_call is not None and _reports_calls(decider):
                decision = decider.decide(request, on_call=on_call)  # type: ignore[call-arg]
            else:
                decision = decider.decide(request)
    except GenerationBoundError as exc:
        span.set_attribute("error.type", f"generation_bound.{exc.reason}")
        chat.append(span)  # recorded (and ended) as the failed attempt
        raise
    except Exception as exc:
        tracing.finish_chat(span, error_type=type(exc).__name__)
        raise
    tracing.record_decision(span, usage=decision.usage, output=decision.raw_output)
    chat.append(span)
    return decision


def decide_checked(decider: Decider | Callable[[], Decider | None] | None, request: DecideRequest, *,
                   first_output: ClientOutput | None = None,
                   max_reasks: int = DEFAULT_MAX_REASKS,
                   on_attempt: Callable[[CheckedAttempt], None] | None = None,
                   on_call: OnCheckedCall | None = None) -> CheckedDecision:
    """Decide (or take ``first_output``), check, re-ask with the errors; see the module docstring.

    ``first_output``: the client's own output, final (see the module docstring): ``decider`` is then never
    asked, nor loaded — it may be None, or a zero-argument callable that is called only when the decider
    decides.
    ``on_attempt`` sees each attempt as it is recorded (logs are written here). ``on_call(attempt,
    call)`` is told, while a decider attempt is still decoding, of each call whose JSON just closed and
    that passes its check on its own (same check path, same conversation evidence); the call's id is
    ``call_id(request_id, call.index, attempt=attempt)``. The returned decision is the whole truth: a
    call told early may be missing from it (a later re-ask, a cut repeat, review) — the caller reconciles.
    """
    if first_output is not None:
        decider = None  # the client's output is final: its model is the client's, never ours
    elif callable(decider) and not isinstance(decider, Decider):
        decider = decider()
    if decider is None and first_output is None:
        raise InvalidRequestError("no decider is configured and the request brings no output to check")
    specs = {spec.name: spec for spec in request.tools}
    # Grounding checks model output against the conversation (never the re-ask feedback). Calls a
    # client sends with no conversation are the client's own values: nothing to ground them in.
    evidence = ConversationValues.from_messages(request.messages, today=reference_day(request.now, request.time_zone)) \
        if request.messages else None
    require = request.tool_choice == "required" or isinstance(request.tool_choice, Mapping)
    prior = prior_calls(list(request.messages))
    answered = answered_calls(list(request.messages))
    settled = settled_calls(list(request.messages))

    def enforce(check: OutputCheck, *, require: bool = False) -> None:  # the request-level checks, this request's
        _enforce(check, specs, prior, require=require, answered=answered, settled=settled)

    attempts: list[CheckedAttempt] = []
    messages = list(request.messages)
    grounding_reasks = 0
    text_only = calls_required = False
    check: OutputCheck | None = None
    raw = ""

    chat: list[Any] = []  # the open ``chat {model}`` span of the attempt being decided, ended once it is checked

    def record(attempt: CheckedAttempt) -> None:
        attempts.append(attempt)
        if chat:
            tracing.finish_chat(chat.pop(), errors=attempt.errors)
        # a client's own output that passed its check was not decided here: its attempt is on the job's record and
        # the submit's ``job.created`` line says it; INFO is for what a decider answered or what a check refused
        said = logger.debug if attempt.source == "client" and not attempt.errors else logger.info
        said("decider.decided", request_id=request.request_id, attempt=attempt.attempt, source=attempt.source,
                    calls=[c.name for c in (check.calls if check else [])], text=check.content is not None if check else False,
                    latency_s=attempt.latency_s, prompt_tokens=attempt.usage.get("prompt_tokens"),
                    completion_tokens=attempt.usage.get("completion_tokens"),
                    constraint=attempt.platform.get("constraint"), narrowed=attempt.platform.get("narrowed") or None,
                    errors=[f"{e.get('path')}: {e.get('message')}" for e in attempt.errors][:8] or None)
        if on_attempt is not None:
            on_attempt(attempt)

    if first_output is not None:
        raw, check = _check_client(first_output, specs, evidence)
        enforce(check, require=require)
        record(_attempt(0, "client", raw, check, platform={"grounding": "checked against the conversation" if evidence
                        else "not checked: no conversation (the client's calls carry its own values)"}))
    while check is None or not check.ok:
        if check is not None:
            errors = check.all_errors()
            grounding_only = all(e.get("validator") in CONTRACT_VALIDATORS for e in errors)
            exhausted = len(attempts) > max_reasks or decider is None
            if grounding_only and not exhausted:
                exhausted = grounding_reasks >= MAX_GROUNDING_REASKS
                grounding_reasks += 0 if exhausted else 1
            written = bool(errors) and all(e.get("validator") == CALL_AS_TEXT for e in errors)
            # re-asked once with calls required already, or the platform had forbidden calls (every call repeated an
            # answered one): requiring calls then would only ask for the repeat again
            exhausted = exhausted or (written and (calls_required or text_only))
            if exhausted:
                logger.warning("decider.needs_review", request_id=request.request_id, attempts=len(attempts))
                error = _review_error(check, len(attempts), answer_only=text_only)
                if first_output is not None:
                    error = _client_review_error(error, check)
                return CheckedDecision(request.request_id, "needs_review", attempts,
                                       calls=[c for c in check.calls if c.ok], blocked=[c for c in check.calls if not c.ok],
                                       content=check.content, error=error)
            # every call repeats one already answered: the re-ask offers the answer only (recorded on the attempt), on
            # the conversation as it was — the grammar holds calls back, and a small model parrots feedback it is shown
            # (SmolLM2-135M answered a newcomer "Your previous reply was invalid: ..." in bench/newcomer.py)
            text_only = bool(errors) and all(e.get("validator") == "repeated_call" for e in errors)
            messages = list(request.messages) if text_only else reask_messages(messages, output=raw, errors=errors)
            calls_required = calls_required or written
        number = len(attempts)
        started = time.perf_counter()
        update: dict[str, Any] = {"messages": messages, "attempt": number}
        if text_only:
            update["tool_choice"] = "none"
        elif calls_required and request.tool_choice == "auto":
            update["tool_choice"] = "required"
        try:
            decision = _decide(decider, request.model_copy(update=update), chat,
                               _early_reporter(on_call, number, specs, evidence, enforce) if on_call is not None else None)
        except GenerationBoundError as exc:
            failed = OutputCheck(calls=[], errors=[{"path": "", "message": str(exc), "validator": exc.reason}])
            record(_attempt(number, "decider", exc.output, failed, usage={"completion_tokens": exc.tokens},
                            latency_s=time.perf_counter() - started))
            kept = _bound_calls(exc, request.model_copy(update={"attempt": number}), specs, evidence, enforce)
            return CheckedDecision(request.request_id, "failed", attempts, calls=kept, error={
                "type": "generation_bound", "message": str(exc), "details": {"reason": exc.reason, "tokens": exc.tokens}})
        raw = decision.raw_output
        check = _check_decision(decision, specs, evidence)
        if request.tool_choice == "auto":
            _flag_call_as_text(check, specs)
        enforce(check, require=require or update.get("tool_choice") == "required")
        platform = dict(decision.platform)
        if text_only:
            platform.update(reask_tool_choice="none", why="every call of the previous attempt repeated one whose "
                            "result the conversation holds")
        elif update.get("tool_choice") == "required":
            platform.update(reask_tool_choice="required", why="the previous answer was a tool call written as text")
        record(_attempt(number, "decider", raw, check, platform=platform, usage=decision.usage,
                        latency_s=time.perf_counter() - started))
    status: Literal["calls", "text"] = "calls" if check.calls else "text"
    return CheckedDecision(request.request_id, status, attempts, calls=list(check.calls), content=check.content)
