"""OpenAI-compatible ``POST /v1/chat/completions`` over the decider.

Mount :func:`create_router` into an app under ``/v1`` (the job API does), or serve
:func:`create_app` standalone. Supported: ``tools``, ``tool_choice`` (auto / required / none /
a named function), ``parallel_tool_calls``, ``stream`` (SSE, ``data: [DONE]``), ``stream_options.
include_usage``, ``response_format`` (``json_schema``, ``json_object``), ``max_tokens`` /
``max_completion_tokens``, ``temperature``, ``top_p``, ``seed``. Extensions (send through the
SDK's ``extra_body``): ``min_tool_calls``, ``max_tool_calls``, ``max_reasks``.

The request id comes from ``X-Request-ID`` (else a new one) and is returned in that header and
in the completion id ``chatcmpl-<request_id>``; tool-call ids are ``call_<request_id>_<n>``.
Errors are ``{"error": {"type", "message", "details"}}`` with a 4xx status for anything the
caller can fix, raised before any decoding. A generation bound (``max_tokens``, a cut repetition loop)
is not an error: as OpenAI answers it, a 200 with ``finish_reason: "length"`` and whatever complete
(and checked) calls the output holds.

A conversation that ends in an assistant turn with tool calls no message answers yet brings the
client's own decision: those calls are checked and answered as they are (same ids), or held back with
the findings (``toolrail.status: "needs_review"``) — the model is never asked to replace them.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError

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
from decider.checked import DEFAULT_MAX_REASKS, CheckedDecision, client_turn, decide_checked
from decider.protocol import DecideRequest, Decision
from decider.service import BackendDecider, DecisionPlan
from toolrail.context import REQUEST_ID_HEADER, request_scope, sanitize_request_id
from tools.check import check_tool_calls
from tools.evidence import ConversationValues
from tools.grounding import grounded_paths
from tools.errors import SchemaRejectedError
from tools.schema_guard import DEFAULT_MAX_SCHEMA_BYTES, DEFAULT_MAX_SCHEMA_DEPTH, check_client_schema
from tools.spec import ToolSpec
from toolrail.settings import get_settings

__all__ = ["ChatCompletionRequest", "create_app", "create_router", "error_response"]

DeciderFactory = Callable[[], BackendDecider]

DEFAULT_MAX_TOKENS_CAP = 1024


@dataclass(frozen=True, kw_only=True)
class ChatLimits:
    """What one chat completion may ask for; checked before any decoding."""

    max_tokens: int = DEFAULT_MAX_TOKENS_CAP
    max_schema_bytes: int = DEFAULT_MAX_SCHEMA_BYTES
    max_schema_depth: int = DEFAULT_MAX_SCHEMA_DEPTH


def _limit_refusal(body: ChatCompletionRequest, limits: ChatLimits, request_id: str) -> JSONResponse | None:
    """A 4xx for a request over its limits (token cap, schema size, depth, recursion, patterns), else None."""
    for name in ("max_tokens", "max_completion_tokens"):
        asked = getattr(body, name)
        if asked is not None and not 1 <= asked <= limits.max_tokens:
            return error_response(400, "max_tokens_out_of_range", f"{name} must be between 1 and {limits.max_tokens}",
                                  request_id, param=name, limit=limits.max_tokens)
    schemas = [(f"/tools/{i}/function/parameters", (tool.get("function") or {}).get("parameters"))
               for i, tool in enumerate(body.tools or []) if isinstance(tool, dict)]
    fmt = body.response_format or {}
    if isinstance(fmt.get("json_schema"), dict):
        schemas.append(("/response_format/json_schema/schema", fmt["json_schema"].get("schema")))
    for path, schema in schemas:
        if schema is None:
            continue
        try:
            check_client_schema(schema, path=path, max_bytes=limits.max_schema_bytes, max_depth=limits.max_schema_depth)
        except SchemaRejectedError as exc:
            return error_response(422, exc.type, str(exc), request_id, **exc.details)
    return None


async def _unless_disconnected(request: Request, work: Coroutine[Any, Any, Any], *,
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


def _cancel_decoding(decider: Any, request_id: str, attempts: int) -> None:
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


class ChatCompletionRequest(BaseModel):
    """The subset of the Chat Completions request this endpoint honours (unknown fields ignored)."""

    model_config = ConfigDict(extra="allow")

    model: str = "toolrail"
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    n: int | None = None
    min_tool_calls: int | None = None
    max_tool_calls: int | None = None
    max_reasks: int | None = None


def error_response(status: int, kind: str, message: str, request_id: str, **details: Any) -> JSONResponse:
    """An OpenAI-style error body (the SDK raises the matching ``APIStatusError`` subclass)."""
    return JSONResponse(status_code=status, headers={REQUEST_ID_HEADER: request_id},
                        content={"error": {"type": kind, "message": message, "code": kind, "details": details}})


def _error_for(exc: DeciderError, request_id: str) -> JSONResponse:
    if isinstance(exc, UnsupportedSchemaError):
        return error_response(422, "unsupported_schema", str(exc), request_id, feature=exc.feature, path=exc.path)
    if isinstance(exc, PromptTooLongError):
        return error_response(400, "context_length_exceeded", str(exc), request_id,
                              prompt_tokens=exc.prompt_tokens, context_length=exc.context_length)
    if isinstance(exc, InvalidRequestError):
        return error_response(400, "invalid_request_error", str(exc), request_id)
    if isinstance(exc, OutputValidationError):
        return error_response(502, "output_validation_failed", str(exc), request_id,
                              errors=exc.errors[:20], attempts=exc.attempts)
    if isinstance(exc, (BackendUnavailableError, DeciderRetryableError)):
        return error_response(503, "backend_unavailable", str(exc), request_id)
    return error_response(400, "invalid_request_error", str(exc), request_id)


def _completion_id(request_id: str) -> str:
    return f"chatcmpl-{request_id}"


def _usage(decision: Decision) -> dict[str, int]:
    usage = dict(decision.usage)
    prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    return {**usage, "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _arguments_text(call: Any) -> str:
    if call.arguments is not None:
        return json.dumps(call.arguments, ensure_ascii=False)
    return call.raw_arguments or ""


def _message(decision: Decision, plan: DecisionPlan) -> tuple[dict[str, Any], str]:
    if plan.mode == "tools" and decision.tool_calls:
        calls = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _arguments_text(c)}}
                 for c in decision.tool_calls]
        return {"role": "assistant", "content": None, "tool_calls": calls}, "tool_calls"
    return {"role": "assistant", "content": decision.content if decision.content is not None else decision.raw_output}, "stop"


def _checked_decision(checked: CheckedDecision) -> Decision:
    """The decision to answer with: the calls that passed every check, or a text answer.

    When the check held calls back for review and nothing else remains, the answer is a text
    saying so (the ``toolrail`` extension carries the findings); a held-back call is never sent.
    """
    last = checked.attempts[-1]
    usage = dict(last.usage)
    usage["completion_tokens"] = sum(a.usage.get("completion_tokens", 0) for a in checked.attempts)
    content = checked.content
    if checked.status == "needs_review" and not checked.calls and content is None:
        content = f"No call was made: {(checked.error or {}).get('message', 'the proposed calls failed their checks')}."
    if checked.status == "failed" and not checked.calls:
        content = _cut_text_answer(last.raw_output)
    return Decision(request_id=checked.request_id, raw_output=last.raw_output, tool_calls=checked.tool_calls,
                    content=None if checked.calls else content, usage=usage, platform=last.platform)


def _cut_text_answer(raw: str) -> str:
    """What a text answer cut at a bound had said (the ``{"content": "`` branch, read up to the cut)."""
    if not raw.lstrip().startswith("{"):
        return ""
    for end in range(len(raw), max(0, len(raw) - 8), -1):  # a cut may split an escape sequence
        try:
            value = json.loads(raw[:end] + '"}')
        except ValueError:
            continue
        return value.get("content", "") if isinstance(value, dict) and isinstance(value.get("content"), str) else ""
    return ""


async def _replayed(payload: dict[str, Any], *, include_usage: bool) -> AsyncIterator[str]:
    """A finished completion as the chunks of a stream: the whole message in one delta, then its finish."""
    base = {key: payload[key] for key in ("id", "created", "model", "system_fingerprint")}
    base["object"] = "chat.completion.chunk"
    choice = payload["choices"][0]
    delta = dict(choice["message"])
    if delta.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(delta["tool_calls"])]
    for part, finish in ((delta, None), ({}, choice["finish_reason"])):
        chunk = {**base, "choices": [{"index": 0, "delta": part, "finish_reason": finish, "logprobs": None}]}
        if include_usage:
            chunk["usage"] = None
        yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
    if include_usage:
        yield f"data: {json.dumps({**base, 'choices': [], 'usage': payload['usage']})}\n\n"
    yield f"data: {json.dumps({**base, 'choices': [], 'toolrail': payload['toolrail']}, ensure_ascii=False)}\n\n"
    yield "data: [DONE]\n\n"


def _finish(reason: str, backend_reason: str | None) -> str:
    return "length" if backend_reason == "length" and reason != "tool_calls" else reason


class _ChatCompletions:
    """The endpoint's logic, holding how to get the decider."""

    def __init__(self, get_decider: DeciderFactory, limits: ChatLimits | None = None) -> None:
        self.get_decider = get_decider
        self.limits = limits or ChatLimits()

    def _decide_request(self, body: ChatCompletionRequest, request_id: str) -> DecideRequest:
        try:
            tools = [ToolSpec.from_openai(tool) for tool in body.tools or []]
        except (ValueError, ValidationError) as exc:
            raise InvalidRequestError(f"invalid tool definition: {exc}") from None
        choice = body.tool_choice if body.tool_choice is not None else ("auto" if tools else "none")
        if choice == "required" and not tools:
            raise InvalidRequestError("tool_choice='required' needs a non-empty 'tools' list")
        if isinstance(choice, dict) and not tools:
            raise InvalidRequestError("a named tool_choice needs a non-empty 'tools' list")
        if body.n not in (None, 1):
            raise InvalidRequestError("only n=1 is supported")
        if not body.messages:
            raise InvalidRequestError("'messages' must not be empty")
        return DecideRequest(
            request_id=request_id, messages=body.messages, tools=tools, tool_choice=choice,
            parallel_tool_calls=body.parallel_tool_calls if body.parallel_tool_calls is not None else True,
            max_calls=body.max_tool_calls, min_calls=body.min_tool_calls,
            max_tokens=body.max_completion_tokens or body.max_tokens or 256,
            seed=body.seed if body.seed is not None else 0, temperature=body.temperature or 0.0,
            top_p=body.top_p if body.top_p is not None else 1.0,
        )

    @staticmethod
    def _json_schema(body: ChatCompletionRequest) -> dict[str, Any] | None:
        fmt = body.response_format or {}
        kind = fmt.get("type", "text")
        if kind == "text":
            return None
        if kind == "json_object":
            return {"type": "object"}
        if kind == "json_schema":
            spec = fmt.get("json_schema") or {}
            schema = spec.get("schema")
            if not isinstance(schema, dict):
                raise InvalidRequestError("response_format.json_schema.schema must be a JSON Schema object")
            return schema
        raise InvalidRequestError(f"unsupported response_format type {kind!r}")

    async def handle(self, request: Request) -> Any:
        # one id per request: when mounted in the job API its middleware already chose it (and will put it
        # in the response header and the logs); choosing again would give the completion another id
        request_id = getattr(request.state, "request_id", None) or sanitize_request_id(request.headers.get(REQUEST_ID_HEADER))
        with request_scope(request_id):
            try:
                raw = await request.json()
            except ValueError:
                return error_response(400, "invalid_request_error", "the body is not JSON", request_id)
            try:
                body = ChatCompletionRequest.model_validate(raw)
            except ValidationError as exc:
                return error_response(400, "invalid_request_error", "invalid request body", request_id,
                                      errors=json.loads(exc.json(include_url=False, include_input=False)))
            refusal = _limit_refusal(body, self.limits, request_id)
            if refusal is not None:
                return refusal
            try:
                turn = client_turn(body.messages)
                if turn is not None:  # the client's own calls: checked and answered as they are, no model asked
                    return self._client_calls(body, request_id, *turn)
                await asyncio.to_thread(self.get_decider)  # the first call loads the model: never on the event loop
                return await _unless_disconnected(request, self._complete(body, request_id), on_disconnect=lambda: (
                    _cancel_decoding(self.get_decider(), request_id, attempts=(body.max_reasks or 0) + 2)))
            except DeciderError as exc:
                return _error_for(exc, request_id)

    def _client_calls(self, body: ChatCompletionRequest, request_id: str, messages: list[dict[str, Any]],
                      calls: list[dict[str, Any]]) -> Any:
        """A conversation that ends in the client's own unanswered calls: they are checked (``decide_checked``, the
        client's output is final) and answered as they are, with their ids — or, failing their checks, held back
        with the findings (``toolrail.status: needs_review``, ``blocked_calls``). The model is never asked."""
        decide = self._decide_request(body.model_copy(update={"messages": messages}), request_id)
        checked = decide_checked(None, decide, first_output=calls)
        decision = _checked_decision(checked)
        ids = [call.get("id") for call in calls]
        tool_calls = [{"id": ids[c.index] if c.index < len(ids) and ids[c.index] else c.id, "type": "function",
                       "function": {"name": c.name, "arguments": _arguments_text(c)}} for c in decision.tool_calls]
        message = ({"role": "assistant", "content": None, "tool_calls": tool_calls} if tool_calls
                   else {"role": "assistant", "content": decision.content or ""})
        payload = {"id": _completion_id(request_id), "object": "chat.completion", "created": int(time.time()),
                   "model": body.model, "system_fingerprint": "toolrail-client",
                   "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop",
                                "logprobs": None}],
                   "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
                   "toolrail": checked.record()}
        headers = {REQUEST_ID_HEADER: request_id}
        if not body.stream:
            return JSONResponse(payload, headers=headers)
        include_usage = bool((body.stream_options or {}).get("include_usage"))
        return StreamingResponse(_replayed(payload, include_usage=include_usage), media_type="text/event-stream",
                                 headers={**headers, "Cache-Control": "no-cache"})

    async def _complete(self, body: ChatCompletionRequest, request_id: str) -> Any:
        import asyncio

        decider = self.get_decider()
        schema = self._json_schema(body)
        decide = self._decide_request(body, request_id)
        temperature = body.temperature or 0.0
        top_p = body.top_p if body.top_p is not None else 1.0
        if schema is not None and decide.tool_choice in ("none",) or schema is not None and not decide.tools:
            plan = await asyncio.to_thread(decider.plan_json, request_id, decide.messages, schema,
                                           max_tokens=decide.max_tokens, seed=decide.seed,
                                           temperature=temperature, top_p=top_p)
        else:
            plan = await asyncio.to_thread(decider.plan, decide)
        headers = {REQUEST_ID_HEADER: request_id}
        if body.stream:
            include_usage = bool((body.stream_options or {}).get("include_usage"))
            return StreamingResponse(self._sse(decider, plan, body.model, include_usage, decide.messages),
                                     media_type="text/event-stream",
                                     headers={**headers, "Cache-Control": "no-cache"})
        max_reasks = body.max_reasks if body.max_reasks is not None else DEFAULT_MAX_REASKS
        extension: dict[str, Any] | None = None
        if plan.mode == "json":
            try:
                value, decision = await decider.agenerate_json(schema, decide.messages, request_id=request_id,
                                                               max_tokens=decide.max_tokens, max_reasks=max_reasks,
                                                               seed=decide.seed, temperature=temperature, top_p=top_p)
                finish_reason = "stop"
            except GenerationBoundError as exc:  # cut (a loop): the text so far, as a length stop
                decision = Decision(request_id=request_id, raw_output=exc.output, content=exc.output,
                                    usage={"prompt_tokens": plan.prompt_tokens, "completion_tokens": exc.tokens})
                finish_reason = "length"
        elif plan.mode == "tools":
            checked = await asyncio.to_thread(decide_checked, decider, decide, max_reasks=max_reasks)
            if checked.status == "failed" and (checked.error or {}).get("type") != "generation_bound":
                error = checked.error or {}
                return error_response(502, error.get("type", "failed"), error.get("message", ""), request_id,
                                      **error.get("details", {}), toolrail=checked.record())
            # a generation bound is an answer, as OpenAI gives it: 200, finish_reason "length", the complete calls
            decision, extension = _checked_decision(checked), checked.record()
            finish_reason = "length" if checked.status == "failed" else None
        else:
            try:
                decision = await decider.arun(plan)
                finish_reason = None
            except GenerationBoundError as exc:
                decision = Decision(request_id=request_id, raw_output=exc.output, content=exc.output,
                                    usage={"prompt_tokens": plan.prompt_tokens, "completion_tokens": exc.tokens})
                finish_reason = "length"
        message, reason = _message(decision, plan)
        payload = {
            "id": _completion_id(request_id), "object": "chat.completion", "created": int(time.time()),
            "model": body.model, "system_fingerprint": f"toolrail-{decider.name}",
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason or reason, "logprobs": None}],
            "usage": _usage(decision),
        }
        if extension is not None:
            payload["toolrail"] = extension  # what the platform checked, narrowed, re-asked or held back
        return JSONResponse(payload, headers=headers)

    async def _sse(self, decider: BackendDecider, plan: DecisionPlan, model: str, include_usage: bool,
                   messages: list[dict[str, Any]]) -> AsyncIterator[str]:
        created = int(time.time())
        base = {"id": _completion_id(plan.request_id), "object": "chat.completion.chunk", "created": created,
                "model": model, "system_fingerprint": f"toolrail-{decider.name}"}

        def chunk(delta: dict[str, Any], finish: str | None = None, usage: dict[str, int] | None = None) -> str:
            payload = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}
            if include_usage:
                payload["usage"] = usage
            return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

        yield chunk({"role": "assistant", "content": None if plan.mode == "tools" else ""})
        # Calls of tools with alias fields or grounded fields are sent whole, once complete and
        # checked: a raw fragment already sent (沪) could not be taken back for the canonical value,
        # and a call whose grounded value the conversation does not state is never sent at all.
        deferred = {name for name, spec in plan.tools.items()
                    if "x-aliases" in json.dumps(spec.parameters) or grounded_paths(spec.parameters, side_effects=spec.side_effects)}
        # When the decider reads the call count after decoding, a second call may still be dropped: calls after
        # the first are sent whole with the decision.
        held_from = 1 if getattr(decider.config, "read_call_count", False) and plan.cut_repeats else None
        names: dict[int, str] = {}
        try:
            async for event in decider.astream(plan):
                if event.deltas:
                    out = []
                    for delta in event.deltas:
                        if delta.name is not None:
                            names[delta.index] = delta.name
                        if names.get(delta.index) in deferred or held_from is not None and delta.index >= held_from:
                            continue
                        out.append(delta.to_openai())
                    if out:
                        yield chunk({"tool_calls": out})
                elif event.content and plan.mode in ("text", "json"):
                    yield chunk({"content": event.content})
                if event.decision is not None:
                    decision = event.decision
                    if plan.mode == "tools" and not decision.tool_calls and decision.content is not None:
                        yield chunk({"content": decision.content})
                    held = [c for c in decision.tool_calls
                            if c.name in deferred or held_from is not None and c.index >= held_from]
                    check = check_tool_calls([c.model_dump() for c in held], plan.tools,
                                             evidence=ConversationValues.from_messages(messages))
                    late = [{"index": c.index, "id": c.id, "type": "function",
                             "function": {"name": c.name, "arguments": json.dumps(checked.arguments, ensure_ascii=False)}}
                            for c, checked in zip(held, check.calls) if checked.ok]
                    if late:
                        yield chunk({"tool_calls": late})
                    if len(late) < len(held):
                        blocked = [{"index": c.index, "name": c.name, "errors": checked.errors}
                                   for c, checked in zip(held, check.calls) if not checked.ok]
                        decision = decision.model_copy(update={"tool_calls": [
                            c for c in decision.tool_calls if c not in held or c.id in {x["id"] for x in late}]})
                        yield f"data: {json.dumps({**base, 'choices': [], 'toolrail': {'blocked_calls': blocked}}, ensure_ascii=False)}\n\n"
                    _, reason = _message(decision, plan)
                    yield chunk({}, _finish(reason, event.finish_reason))
                    if include_usage:
                        payload = {**base, "choices": [], "usage": _usage(decision)}
                        yield f"data: {json.dumps(payload)}\n\n"
        except GenerationBoundError as exc:  # an answer cut at a bound, as OpenAI streams it: finish_reason "length"
            yield chunk({}, "length")
            if include_usage:
                usage = {"prompt_tokens": plan.prompt_tokens, "completion_tokens": exc.tokens,
                         "total_tokens": plan.prompt_tokens + exc.tokens}
                yield f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n"
        except DeciderError as exc:
            error = {"error": {"type": type(exc).__name__, "message": str(exc), "details": {}}}
            yield f"data: {json.dumps(error)}\n\n"
        yield "data: [DONE]\n\n"


def create_router(get_decider: DeciderFactory | None = None, *, limits: ChatLimits | None = None,
                  dependencies: Sequence[Any] = ()) -> APIRouter:
    """A router with ``POST /chat/completions`` (mount it under ``/v1``).

    ``get_decider`` returns the decider to use (called per request; make it cheap);
    by default it is :func:`decider.service.get_default_decider` with the process settings.
    ``limits`` caps what one request may ask for; ``dependencies`` (FastAPI ``Depends``) run before
    the endpoint: the job API passes its tenant authentication and rate limit.
    """
    if get_decider is None:
        def get_decider() -> BackendDecider:
            from decider.service import get_default_decider

            return get_default_decider(get_settings())

    endpoint = _ChatCompletions(get_decider, limits)
    router = APIRouter()
    router.add_api_route("/chat/completions", endpoint.handle, methods=["POST"], name="chat_completions",
                         dependencies=list(dependencies))
    return router


def create_app(get_decider: DeciderFactory | None = None) -> FastAPI:
    """A standalone app serving the router under ``/v1``."""
    app = FastAPI(title="toolrail decider", version="0.1.0")
    app.include_router(create_router(get_decider), prefix="/v1")
    return app
