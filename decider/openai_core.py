"""What the OpenAI-compatible surfaces share: one request read into an :class:`Ask`, decided whole
(:func:`complete`) or streamed as :class:`Piece` s (:func:`stream`), and the HTTP plumbing both use.

``decider.openai_api`` (Chat Completions) and ``decider.responses_api`` (Responses) differ only in how
they read a request into an :class:`Ask` and how they write the outcome; the decoding, the token bound,
the check after decoding, ``finish_reason`` and ``usage`` are decided here, once.

Token bounds, as vLLM applies them: a ``max_tokens`` past the model's context is refused (400, ``param``
naming the field); one within it is accepted and decoding runs to ``min(asked, platform cap, context left
after the prompt)``; when that is less than asked, the outcome says so (``max_tokens`` ``{requested,
applied}``). An output a bound cut ends with ``finish_reason: "length"`` and its usage counted.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from decider.checked import DEFAULT_MAX_REASKS, client_turn, decide_checked
from decider.errors import (
    BackendUnavailableError,
    DeciderError,
    DeciderRetryableError,
    GenerationBoundError,
    InvalidRequestError,
    OutputValidationError,
    PromptTooLongError,
    UnsupportedSchemaError,
)
from decider.protocol import DecideRequest, Decision
from decider.service import BackendDecider, DecisionPlan, get_default_decider
from toolrail.context import REQUEST_ID_HEADER
from toolrail.settings import get_settings
from tools.check import check_tool_calls
from tools.errors import SchemaRejectedError
from tools.evidence import ConversationValues
from tools.grounding import grounded_paths
from tools.schema_guard import DEFAULT_MAX_SCHEMA_BYTES, DEFAULT_MAX_SCHEMA_DEPTH, check_client_schema
from tools.spec import ToolSpec

__all__ = ["AnsweredError", "Ask", "BlockedPiece", "CallPiece", "CheckFailed", "EndPiece", "Limits", "ModelNotFound", "Outcome", "Planned",
           "TextPiece", "cancel_decoding", "check_bound", "check_model", "check_tool_answers", "client_calls", "complete",
           "default_decider", "error_for", "error_response", "plan", "schema_refusal", "stream", "stream_error",
           "unless_disconnected"]

#: Decoding bound of a request that sets none (OpenAI's is the context; a tool decision needs far less).
DEFAULT_MAX_TOKENS = 256
#: Largest output one request decodes when the operator sets no cap (``TOOLRAIL_MAX_TOKENS_CAP``).
DEFAULT_MAX_TOKENS_CAP = 1024
#: Model ids every surface answers to besides the served model's own: the platform's name.
MODEL_ALIASES = ("toolrail",)


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What one request may ask for; checked before any decoding."""

    #: Largest output decoded for one request: a larger ``max_tokens`` is clamped to it, never refused.
    max_tokens: int = DEFAULT_MAX_TOKENS_CAP
    #: The most any model this process may load holds (the embedded engine's ``max_seq_len``): a bound past it is
    #: refused before the model loads; the loaded model's own context is checked after. None: after only.
    context_tokens: int | None = None
    max_schema_bytes: int = DEFAULT_MAX_SCHEMA_BYTES
    max_schema_depth: int = DEFAULT_MAX_SCHEMA_DEPTH


@dataclass(frozen=True, kw_only=True)
class Ask:
    """One request, as either API states it, in the decider's terms."""

    request_id: str
    messages: list[dict[str, Any]]
    tools: list[ToolSpec] = field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    #: Structured output (``response_format`` / ``text.format``): the JSON Schema the answer must match.
    json_schema: dict[str, Any] | None = None
    #: The token bound the client asked for, and the name of the field it came in (for errors).
    max_tokens: int | None = None
    max_tokens_param: str = "max_tokens"
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = 0
    min_calls: int | None = None
    max_calls: int | None = None
    max_reasks: int | None = None


@dataclass
class Outcome:
    """A whole decision as the APIs answer it."""

    decision: Decision
    #: ``stop``, ``length`` or ``tool_calls``.
    finish_reason: str
    usage: dict[str, int]
    #: What the platform checked, narrowed, re-asked or held back (the ``toolrail`` extension), when it checked.
    extension: dict[str, Any] | None = None
    #: ``{"requested", "applied"}`` when the token bound applied is below the one asked for.
    max_tokens: dict[str, int] | None = None


@dataclass(frozen=True)
class TextPiece:
    """Text of the answer, as decoded."""

    text: str


@dataclass(frozen=True)
class CallPiece:
    """A piece of tool call ``index``: ``id`` and ``name`` on its first piece only, then argument text."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class BlockedPiece:
    """Calls held back after decoding (their checks failed): never sent."""

    calls: list[dict[str, Any]]


@dataclass(frozen=True)
class EndPiece:
    """The end of a stream: why it ended and what it used; ``error`` when it failed."""

    finish_reason: str
    usage: dict[str, int]
    decision: Decision | None = None
    error: DeciderError | None = None
    max_tokens: dict[str, int] | None = None


Piece = TextPiece | CallPiece | BlockedPiece | EndPiece


# ----------------------------------------------------------------- errors


def error_response(status: int, kind: str, message: str, request_id: str, *, param: str | None = None,
                   code: str | None = None, **details: Any) -> JSONResponse:
    """OpenAI's error body, ``{"error": {"message", "type", "param", "code"}}`` (the SDK raises the matching
    ``APIStatusError`` subclass); ``type`` is the class (``invalid_request_error``, ``server_error``), ``code``
    the kind; anything more is in ``details``."""
    error_type = "invalid_request_error" if status < 500 else "server_error"
    body = {"message": message, "type": error_type, "param": param, "code": code or kind, "details": details}
    return JSONResponse(status_code=status, headers={REQUEST_ID_HEADER: request_id}, content={"error": body})


def error_for(exc: DeciderError, request_id: str) -> JSONResponse:
    """The HTTP answer to a decider error raised before any output was sent."""
    if isinstance(exc, UnsupportedSchemaError):
        return error_response(422, "unsupported_schema", str(exc), request_id, feature=exc.feature, path=exc.path)
    if isinstance(exc, PromptTooLongError):
        return error_response(400, "context_length_exceeded", str(exc), request_id, param="messages",
                              prompt_tokens=exc.prompt_tokens, context_length=exc.context_length)
    if isinstance(exc, InvalidRequestError):
        return error_response(400, exc.code or "invalid_request_error", str(exc), request_id, param=exc.param)
    if isinstance(exc, OutputValidationError):
        return error_response(502, "output_validation_failed", str(exc), request_id,
                              errors=exc.errors[:20], attempts=exc.attempts)
    if isinstance(exc, (BackendUnavailableError, DeciderRetryableError)):
        return error_response(503, "backend_unavailable", str(exc), request_id)
    return error_response(400, "invalid_request_error", str(exc), request_id)


def stream_error(exc: DeciderError) -> dict[str, Any]:
    """The ``error`` object of a failure met after a stream began."""
    return {"message": str(exc), "type": "server_error" if isinstance(exc, DeciderRetryableError) else "invalid_request_error",
            "param": getattr(exc, "param", None), "code": getattr(exc, "code", None) or type(exc).__name__}


def check_model(model: str | None, served: Sequence[str]) -> None:
    """Refuse a model this process does not serve (404 ``model_not_found``, as OpenAI answers it)."""
    if model is not None and model not in served and model not in MODEL_ALIASES:
        raise ModelNotFound(model)


class AnsweredError(Exception):
    """A refusal that knows its own HTTP answer (``response``): both endpoints catch this one class."""

    def response(self, request_id: str) -> JSONResponse:
        raise NotImplementedError


class ModelNotFound(AnsweredError):
    """The request names a model nobody serves here."""

    def __init__(self, model: str) -> None:
        self.model = model
        super().__init__(f"The model {model!r} does not exist or you do not have access to it.")

    def response(self, request_id: str) -> JSONResponse:
        return error_response(404, "model_not_found", str(self), request_id, param="model")


def schema_refusal(schemas: Sequence[tuple[str, Any]], limits: Limits, request_id: str) -> JSONResponse | None:
    """A 422 for a client schema over the limits (size, depth, recursion, patterns), else None."""
    for path, schema in schemas:
        if schema is None:
            continue
        try:
            check_client_schema(schema, path=path, max_bytes=limits.max_schema_bytes, max_depth=limits.max_schema_depth)
        except SchemaRejectedError as exc:
            return error_response(422, exc.type, str(exc), request_id, **exc.details)
    return None


def check_tool_answers(messages: Sequence[Mapping[str, Any]], *, param: Callable[[int], str]) -> None:
    """Every ``tool`` message must answer a call an earlier assistant message made (400 naming it otherwise)."""
    made: set[str] = set()
    for position, message in enumerate(messages):
        for call in message.get("tool_calls") or () if message.get("role") == "assistant" else ():
            if isinstance(call, Mapping) and call.get("id"):
                made.add(str(call["id"]))
        if message.get("role") == "tool":
            answered = message.get("tool_call_id")
            if not answered or str(answered) not in made:
                raise InvalidRequestError(
                    f"Invalid parameter: a 'tool' message must answer a tool call of an earlier assistant message; "
                    f"{answered!r} answers none", param=param(position), code="invalid_tool_call_id")


# ----------------------------------------------------------------- decoding


def default_decider() -> BackendDecider:
    """The process's decider (:func:`decider.service.get_default_decider` with the process settings)."""
    return get_default_decider(get_settings())


def context_length(decider: Any) -> int | None:
    return getattr(decider, "context_length", None)


def check_bound(ask: Ask, context: int | None) -> None:
    """Refuse a token bound below 1 or past ``context`` (400 naming the field)."""
    asked = ask.max_tokens
    if asked is not None and (asked < 1 or context is not None and asked > context):
        raise InvalidRequestError(f"{ask.max_tokens_param} must be between 1 and the model's context ({context} tokens), "
                                  f"got {asked}", param=ask.max_tokens_param, code="integer_out_of_range")


def _bounded(ask: Ask, decider: Any, limits: Limits) -> int:
    """The token bound to decode under (before the prompt is counted); refuses one past the model's context."""
    if ask.max_tokens is None:
        return min(DEFAULT_MAX_TOKENS, limits.max_tokens)
    check_bound(ask, context_length(decider))
    return min(ask.max_tokens, limits.max_tokens)


@dataclass
class Planned:
    """An :class:`Ask` checked and planned: the plan to decode and the request the checked loop re-plans from."""

    ask: Ask
    plan: DecisionPlan
    decide: DecideRequest
    max_tokens: dict[str, int] | None


def decide_request(ask: Ask, max_tokens: int = DEFAULT_MAX_TOKENS) -> DecideRequest:
    """``ask`` as the decider's request (what the checked loop re-plans from)."""
    return DecideRequest(
        request_id=ask.request_id, messages=ask.messages, tools=ask.tools, tool_choice=ask.tool_choice,
        parallel_tool_calls=ask.parallel_tool_calls, max_calls=ask.max_calls, min_calls=ask.min_calls,
        max_tokens=max_tokens, seed=ask.seed, temperature=ask.temperature, top_p=ask.top_p)


def plan(decider: BackendDecider, ask: Ask, limits: Limits) -> Planned:
    """Check ``ask`` and plan it (blocking: grammar compilation; run it in a thread)."""
    bound = _bounded(ask, decider, limits)
    decide = decide_request(ask, bound)
    if ask.json_schema is not None and (ask.tool_choice == "none" or not ask.tools):
        planned = decider.plan_json(ask.request_id, ask.messages, ask.json_schema, max_tokens=bound, seed=ask.seed,
                                    temperature=ask.temperature, top_p=ask.top_p)
    else:
        planned = decider.plan(decide)
    clamp = None
    if ask.max_tokens is not None and planned.max_tokens < ask.max_tokens:
        clamp = {"requested": ask.max_tokens, "applied": planned.max_tokens}
    return Planned(ask, planned, decide, clamp)


def _usage(decider: BackendDecider, plan: DecisionPlan, usage: Mapping[str, int], output: str = "") -> dict[str, int]:
    """OpenAI's usage: prompt and completion tokens counted always (a cut output's too), plus the decider's figures."""
    prompt = int(usage.get("prompt_tokens") or plan.prompt_tokens)
    completion = int(usage.get("completion_tokens") or 0)
    if not completion and output:
        completion = decider._count_tokens(output)  # noqa: SLF001 - the decider's own tokenizer count
    return {**usage, "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _cut(request_id: str, exc: GenerationBoundError, content: str | None) -> Decision:
    return Decision(request_id=request_id, raw_output=exc.output, content=content, usage={"completion_tokens": exc.tokens},
                    finish_reason="length")


def _cut_text_answer(raw: str) -> str:
    """What a text answer cut at a bound had said (the ``{"content": "`` branch, read up to the cut)."""
    stripped = raw.lstrip()
    if not stripped.startswith("{"):
        return ""
    for end in range(len(stripped), max(0, len(stripped) - 8), -1):  # a cut may split an escape sequence
        for tail in ('"}', "}"):
            try:
                value = json.loads(stripped[:end] + tail)
            except ValueError:
                continue
            return value.get("content", "") if isinstance(value, dict) and isinstance(value.get("content"), str) else ""
    return ""


def checked_decision(checked: Any) -> Decision:
    """The answer of the checked loop: the calls that passed every check, or a text answer.

    When the check held calls back for review and nothing else remains, the answer is a text saying so
    (the ``toolrail`` extension carries the findings); a held-back call is never sent.
    """
    last = checked.attempts[-1]
    usage = dict(last.usage)
    usage["completion_tokens"] = sum(a.usage.get("completion_tokens", 0) for a in checked.attempts)
    cut = checked.status == "failed"
    content = checked.content
    if checked.status == "needs_review" and not checked.calls and content is None:
        content = f"No call was made: {(checked.error or {}).get('message', 'the proposed calls failed their checks')}."
    if cut and not checked.calls:
        content = _cut_text_answer(last.raw_output)
    return Decision(request_id=checked.request_id, raw_output=last.raw_output, tool_calls=checked.tool_calls,
                    content=None if checked.calls else content, usage=usage, platform=last.platform,
                    finish_reason="length" if cut else "stop")


def _checked_outcome(decider: BackendDecider, planned: Planned, checked: Any) -> Outcome:
    decision = checked_decision(checked)
    reason = "length" if decision.finish_reason == "length" else "tool_calls" if decision.tool_calls else "stop"
    return Outcome(decision, reason, _usage(decider, planned.plan, decision.usage, decision.raw_output),
                   checked.record(), planned.max_tokens)


def client_calls(ask: Ask) -> tuple[Decision, dict[str, Any], list[str | None]] | None:
    """When the conversation ends in the client's own unanswered calls: the decision they make once checked (the
    client's output is final: answered as they are, or held back with the findings), the check's record and the
    calls' own ids; else None. The model is never asked in the client's place."""
    turn = client_turn(ask.messages)
    if turn is None:
        return None
    messages, calls = turn
    checked = decide_checked(None, decide_request(replace(ask, messages=messages)), first_output=calls)
    return checked_decision(checked), checked.record(), [call.get("id") for call in calls]


async def complete(decider: BackendDecider, planned: Planned) -> Outcome:
    """Decide ``planned`` whole: structured output re-asked on failed checks, tool calls through the checked loop
    (decide → check → re-ask → review), text as decoded. A bound cut is an answer (``length``), not an error;
    any other failure raises (``DeciderError``)."""
    plan, ask = planned.plan, planned.ask
    max_reasks = ask.max_reasks if ask.max_reasks is not None else DEFAULT_MAX_REASKS
    if plan.mode == "tools":
        checked = await asyncio.to_thread(decide_checked, decider, planned.decide, max_reasks=max_reasks)
        if checked.status == "failed" and (checked.error or {}).get("type") != "generation_bound":
            raise CheckFailed(checked)
        return _checked_outcome(decider, planned, checked)
    try:
        if plan.mode == "json":
            _, decision = await decider.agenerate_json(ask.json_schema, ask.messages, request_id=ask.request_id,
                                                       max_tokens=plan.max_tokens, max_reasks=max_reasks, seed=ask.seed,
                                                       temperature=ask.temperature, top_p=ask.top_p, cut_is_final=True)
        else:
            decision = await decider.arun(plan)
    except GenerationBoundError as exc:  # cut (a loop, or JSON cut at max_tokens): the text so far, as a length stop
        decision = _cut(ask.request_id, exc, exc.output)
    reason = "length" if decision.finish_reason == "length" else "stop"
    content = decision.content if decision.content is not None else decision.raw_output
    decision = decision.model_copy(update={"content": content})
    return Outcome(decision, reason, _usage(decider, plan, decision.usage, decision.raw_output), None, planned.max_tokens)


class CheckFailed(AnsweredError):
    """The checked loop failed for a reason other than a bound: answered 502 with its record."""

    def __init__(self, checked: Any) -> None:
        self.checked = checked
        super().__init__((checked.error or {}).get("message", "the decision failed its checks"))

    def response(self, request_id: str) -> JSONResponse:
        error = self.checked.error or {}
        return error_response(502, error.get("type", "failed"), error.get("message", ""), request_id,
                              **error.get("details", {}), toolrail=self.checked.record())


class _TextBranch:
    """Reads a tools-mode text answer (``{"content": "..."}``) as it is decoded, for streaming it as text."""

    def __init__(self) -> None:
        self.raw = ""
        self.sent = 0

    def feed(self, raw: str) -> str:
        self.raw += raw
        if not self.raw.lstrip().startswith("{"):
            return ""
        text = _cut_text_answer(self.raw)
        new, self.sent = text[self.sent:], max(self.sent, len(text))
        return new


async def stream(decider: BackendDecider, planned: Planned, messages: Sequence[Mapping[str, Any]]) -> AsyncIterator[Piece]:
    """Decode ``planned`` as :class:`Piece` s, ending with one :class:`EndPiece`.

    Calls of tools with alias fields or grounded fields are sent whole, once complete and checked: a raw
    fragment already sent (沪) could not be taken back for the canonical value, and a call whose grounded value
    the conversation does not state is never sent at all. When the decider reads the call count after
    decoding, calls after the first are sent whole with the decision (a later one may still be dropped).
    """
    plan = planned.plan
    deferred = {name for name, spec in plan.tools.items()
                if "x-aliases" in json.dumps(spec.parameters) or grounded_paths(spec.parameters, side_effects=spec.side_effects)}
    held_from = 1 if getattr(decider.config, "read_call_count", False) and plan.cut_repeats else None
    names: dict[int, str] = {}
    text = _TextBranch()
    try:
        async for event in decider.astream(plan):
            for delta in event.deltas:
                if delta.name is not None:
                    names[delta.index] = delta.name
                if names.get(delta.index) in deferred or held_from is not None and delta.index >= held_from:
                    continue
                first = delta.name is not None
                yield CallPiece(delta.index, delta.arguments, delta.id if first else None, delta.name)
            if plan.mode == "tools" and event.raw and not names:
                if piece := text.feed(event.raw):
                    yield TextPiece(piece)
            elif plan.mode != "tools" and event.content:
                yield TextPiece(event.content)
            if event.decision is None:
                continue
            decision = event.decision
            if plan.mode == "tools" and not decision.tool_calls and decision.content is not None \
                    and len(decision.content) > text.sent:
                yield TextPiece(decision.content[text.sent:])
            held = [c for c in decision.tool_calls if c.name in deferred or held_from is not None and c.index >= held_from]
            check = check_tool_calls([c.model_dump() for c in held], plan.tools,
                                     evidence=ConversationValues.from_messages(list(messages)))
            late = [(c, checked) for c, checked in zip(held, check.calls) if checked.ok]
            for call, checked in late:
                yield CallPiece(call.index, json.dumps(checked.arguments, ensure_ascii=False), call.id, call.name)
            if len(late) < len(held):
                yield BlockedPiece([{"index": c.index, "name": c.name, "errors": checked.errors}
                                    for c, checked in zip(held, check.calls) if not checked.ok])
                kept = {c.id for c, _ in late}
                decision = decision.model_copy(update={"tool_calls": [
                    c for c in decision.tool_calls if c not in held or c.id in kept]})
            cut = event.finish_reason == "length"
            reason = "length" if cut else "tool_calls" if plan.mode == "tools" and decision.tool_calls else "stop"
            yield EndPiece(reason, _usage(decider, plan, decision.usage, decision.raw_output), decision,
                           max_tokens=planned.max_tokens)
            return
    except GenerationBoundError as exc:  # an answer cut at a bound, as OpenAI streams it: finish_reason "length"
        yield EndPiece("length", _usage(decider, plan, {"completion_tokens": exc.tokens}, exc.output),
                       _cut(plan.request_id, exc, None), max_tokens=planned.max_tokens)
    except DeciderError as exc:
        yield EndPiece("error", _usage(decider, plan, {}), error=exc)


# ----------------------------------------------------------------- HTTP


async def unless_disconnected(request: Request, work: Coroutine[Any, Any, Any], *,
                              on_disconnect: Callable[[], None]) -> Any:
    """Await ``work``; when the client hangs up first, cancel it and answer 499 to nobody.

    Cancelling the task cancels the decider's async path down to the backend request; ``on_disconnect``
    stops what a thread may still be decoding.
    """
    task = asyncio.ensure_future(work)
    hangup = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, hangup}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        on_disconnect()
        await asyncio.wait({task})
        return Response(status_code=499)
    finally:
        for pending in (task, hangup):
            if not pending.done():
                pending.cancel()


async def _disconnected(request: Request) -> None:
    """Return when the client hangs up: ``http.disconnect`` on the request's own receive channel.

    Not ``request.is_disconnected()``: behind ``BaseHTTPMiddleware`` its zero-timeout read never
    sees the message.
    """
    try:
        while (await request.receive())["type"] != "http.disconnect":
            pass
    except RuntimeError:  # the channel is closed or already drained: nothing more will come
        await asyncio.Event().wait()


#: How long, after a hang-up, each new attempt of the request is cancelled as it starts.
REAP_S = 30.0
_REAPERS: set[asyncio.Task[None]] = set()  # referenced until done (the loop keeps weak references only)


def cancel_decoding(decider: Any, request_id: str, attempts: int) -> None:
    """Stop every generation of ``request_id`` the backend runs now or starts soon (re-asks included).

    A decision made in a thread (the checked re-ask loop) is not stopped by cancelling the task
    that awaits it: cancelling its live generation ends that attempt, and the loop would start the
    next. So the request's attempts are cancelled as they appear, for :data:`REAP_S`, unless the
    decider can cancel a request itself (``decider.cancel(request_id)``).
    """
    cancel = getattr(decider, "cancel", None)
    if callable(cancel):
        cancel(request_id)
        return
    cancel = getattr(getattr(decider, "backend", None), "cancel", None)
    if callable(cancel):
        task = asyncio.get_running_loop().create_task(_reap(cancel, request_id, attempts))
        _REAPERS.add(task)
        task.add_done_callback(_REAPERS.discard)


async def _reap(cancel: Callable[[str, int], bool], request_id: str, attempts: int) -> None:
    deadline = time.monotonic() + REAP_S
    while time.monotonic() < deadline:
        for attempt in range(attempts + 1):
            cancel(request_id, attempt)
        await asyncio.sleep(0.05)
