"""OpenAI-compatible ``POST /v1/chat/completions`` over the decider, to the letter of OpenAI's reference and the
openai-python types.

Mount :func:`create_router` into an app under ``/v1`` (the job API does), or serve
:func:`create_app` standalone. Supported: ``tools``, ``tool_choice`` (auto / required / none /
a named function), ``parallel_tool_calls``, ``stream`` (SSE, ``data: [DONE]``), ``stream_options.
include_usage``, ``response_format`` (``json_schema``, ``json_object``), ``max_tokens`` /
``max_completion_tokens``, ``temperature``, ``top_p``, ``seed``. Extensions (send through the
SDK's ``extra_body``): ``min_tool_calls``, ``max_tool_calls``, ``max_reasks``.

The request id comes from ``X-Request-ID`` (else a new one) and is returned in that header and
in the completion id ``chatcmpl-<request_id>``; tool-call ids are ``call_<request_id>_<n>``. A streamed
call sends ``id``, ``type`` and ``function.name`` in its first delta only. Errors are
``{"error": {"message", "type", "param", "code"}}`` with a 4xx status for anything the caller can fix,
raised before any decoding: an unknown ``model`` is a 404 ``model_not_found``, a ``tool`` message that
answers no earlier call a 400 naming it in ``param``. A conversation that ends in an assistant turn with tool
calls no message answers yet brings the client's own decision: those calls are checked and answered as they
are (same ids), or held back with the findings (``toolrail.status: "needs_review"``) — the model is never asked
to replace them. A generation bound (``max_tokens``, a cut repetition
loop) is not an error: as OpenAI answers it, a 200 with ``finish_reason: "length"``, whatever complete (and
checked) calls the output holds, and its ``usage`` counted. The bound itself is :mod:`decider.openai_core`'s.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError

from decider import openai_core as core
from decider.errors import DeciderError, InvalidRequestError
from decider.protocol import Decision
from decider.responses_api import create_router as responses_router
from decider.model import DEFAULT_MODEL_NAME
from decider.openai_core import Limits, error_response
from decider.service import BackendDecider
from toolrail.context import REQUEST_ID_HEADER, request_scope, sanitize_request_id
from tools.spec import ToolSpec

__all__ = ["ChatCompletionRequest", "ChatLimits", "create_app", "create_router", "error_response"]

DeciderFactory = Callable[[], BackendDecider]
#: The limits of one request (shared with the Responses API; the old name kept for callers).
ChatLimits = Limits


class ChatCompletionRequest(BaseModel):
    """The subset of the Chat Completions request this endpoint honours (unknown fields ignored)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
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


def _json_schema(body: ChatCompletionRequest) -> dict[str, Any] | None:
    fmt = body.response_format or {}
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            raise InvalidRequestError("response_format.json_schema.schema must be a JSON Schema object",
                                      param="response_format.json_schema.schema")
        return schema
    raise InvalidRequestError(f"unsupported response_format type {kind!r}", param="response_format.type")


def _ask(body: ChatCompletionRequest, request_id: str) -> core.Ask:
    """The request in the decider's terms; every check a caller can fix, before anything decodes."""
    try:
        tools = [ToolSpec.from_openai(tool) for tool in body.tools or []]
    except (ValueError, ValidationError) as exc:
        raise InvalidRequestError(f"invalid tool definition: {exc}", param="tools") from None
    choice = body.tool_choice if body.tool_choice is not None else ("auto" if tools else "none")
    if choice == "required" and not tools:
        raise InvalidRequestError("tool_choice='required' needs a non-empty 'tools' list", param="tool_choice")
    if isinstance(choice, dict) and not tools:
        raise InvalidRequestError("a named tool_choice needs a non-empty 'tools' list", param="tool_choice")
    if body.n not in (None, 1):
        raise InvalidRequestError("only n=1 is supported", param="n")
    if not body.messages:
        raise InvalidRequestError("'messages' must not be empty", param="messages")
    core.check_tool_answers(body.messages, param=lambda i: f"messages.[{i}].tool_call_id")
    asked, param = ((body.max_completion_tokens, "max_completion_tokens") if body.max_completion_tokens is not None
                    else (body.max_tokens, "max_tokens"))
    return core.Ask(
        request_id=request_id, messages=body.messages, tools=tools, tool_choice=choice,
        parallel_tool_calls=body.parallel_tool_calls if body.parallel_tool_calls is not None else True,
        json_schema=_json_schema(body), max_tokens=asked, max_tokens_param=param,
        temperature=body.temperature or 0.0, top_p=body.top_p if body.top_p is not None else 1.0,
        seed=body.seed if body.seed is not None else 0, min_calls=body.min_tool_calls, max_calls=body.max_tool_calls,
        max_reasks=body.max_reasks)


def _schemas(body: ChatCompletionRequest) -> list[tuple[str, Any]]:
    schemas = [(f"/tools/{i}/function/parameters", (tool.get("function") or {}).get("parameters"))
               for i, tool in enumerate(body.tools or []) if isinstance(tool, dict)]
    fmt = body.response_format or {}
    if isinstance(fmt.get("json_schema"), dict):
        schemas.append(("/response_format/json_schema/schema", fmt["json_schema"].get("schema")))
    return schemas


def _completion_id(request_id: str) -> str:
    return f"chatcmpl-{request_id}"


def _arguments_text(call: Any) -> str:
    if call.arguments is not None:
        return json.dumps(call.arguments, ensure_ascii=False)
    return call.raw_arguments or ""


def _message(outcome: core.Outcome) -> dict[str, Any]:
    decision = outcome.decision
    if decision.tool_calls:
        calls = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _arguments_text(c)}}
                 for c in decision.tool_calls]
        return {"role": "assistant", "content": None, "tool_calls": calls}
    return {"role": "assistant", "content": decision.content if decision.content is not None else decision.raw_output}


def _extension(record: dict[str, Any] | None, clamp: dict[str, int] | None) -> dict[str, Any] | None:
    """The ``toolrail`` field: what the platform checked, narrowed, re-asked or held back, and a clamped bound."""
    if record is None and clamp is None:
        return None
    return {**(record or {}), **({"max_tokens": clamp} if clamp else {})}


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


class _ChatCompletions:
    """The endpoint's logic, holding how to get the decider."""

    def __init__(self, get_decider: DeciderFactory, limits: Limits | None = None,
                 models: Sequence[str] = (DEFAULT_MODEL_NAME,)) -> None:
        self.get_decider = get_decider
        self.limits = limits or Limits()
        self.models = tuple(models)

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
                errors = json.loads(exc.json(include_url=False, include_input=False))
                param = ".".join(str(p) for p in errors[0]["loc"]) if errors and errors[0].get("loc") else None
                return error_response(400, "invalid_request_error", "invalid request body", request_id, param=param,
                                      errors=errors)
            refusal = core.schema_refusal(_schemas(body), self.limits, request_id)
            if refusal is not None:
                return refusal
            try:
                core.check_model(body.model, self.models)
                ask = _ask(body, request_id)
                core.check_bound(ask, self.limits.context_tokens)  # before the model loads: what no model here holds
                client = core.client_calls(ask)
                if client is not None:  # the client's own calls: checked and answered as they are, no model asked
                    return self._client_calls(body, ask, *client)
                await asyncio.to_thread(self.get_decider)  # the first call loads the model: never on the event loop
                return await core.unless_disconnected(request, self._complete(body, ask), on_disconnect=lambda: (
                    core.cancel_decoding(self.get_decider(), request_id, attempts=(body.max_reasks or 0) + 2)))
            except core.AnsweredError as exc:  # an unknown model (404), a failed check (502)
                return exc.response(request_id)
            except DeciderError as exc:
                return core.error_for(exc, request_id)

    def _client_calls(self, body: ChatCompletionRequest, ask: core.Ask, decision: Decision, record: dict[str, Any],
                      ids: list[str | None]) -> Any:
        """The client's own unanswered calls, answered as they are with their ids (or held back with the findings:
        ``toolrail.status: needs_review``, ``blocked_calls``)."""
        tool_calls = [{"id": ids[c.index] if c.index < len(ids) and ids[c.index] else c.id, "type": "function",
                       "function": {"name": c.name, "arguments": _arguments_text(c)}} for c in decision.tool_calls]
        message = ({"role": "assistant", "content": None, "tool_calls": tool_calls} if tool_calls
                   else {"role": "assistant", "content": decision.content or ""})
        payload = {"id": _completion_id(ask.request_id), "object": "chat.completion", "created": int(time.time()),
                   "model": body.model or self.models[0], "system_fingerprint": "toolrail-client",
                   "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop",
                                "logprobs": None}],
                   "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}, "toolrail": record}
        headers = {REQUEST_ID_HEADER: ask.request_id}
        if not body.stream:
            return JSONResponse(payload, headers=headers)
        include_usage = bool((body.stream_options or {}).get("include_usage"))
        return StreamingResponse(_replayed(payload, include_usage=include_usage), media_type="text/event-stream",
                                 headers={**headers, "Cache-Control": "no-cache"})

    async def _complete(self, body: ChatCompletionRequest, ask: core.Ask) -> Any:
        decider = self.get_decider()
        planned = await asyncio.to_thread(core.plan, decider, ask, self.limits)
        headers = {REQUEST_ID_HEADER: ask.request_id}
        model = body.model or self.models[0]
        if body.stream:
            include_usage = bool((body.stream_options or {}).get("include_usage"))
            return StreamingResponse(self._sse(decider, planned, model, include_usage), media_type="text/event-stream",
                                     headers={**headers, "Cache-Control": "no-cache"})
        outcome = await core.complete(decider, planned)
        payload = {
            "id": _completion_id(ask.request_id), "object": "chat.completion", "created": int(time.time()),
            "model": model, "system_fingerprint": f"toolrail-{decider.name}",
            "choices": [{"index": 0, "message": _message(outcome), "finish_reason": outcome.finish_reason, "logprobs": None}],
            "usage": outcome.usage,
        }
        extension = _extension(outcome.extension, outcome.max_tokens)
        if extension is not None:
            payload["toolrail"] = extension
        return JSONResponse(payload, headers=headers)

    async def _sse(self, decider: BackendDecider, planned: core.Planned, model: str,
                   include_usage: bool) -> AsyncIterator[str]:
        base = {"id": _completion_id(planned.plan.request_id), "object": "chat.completion.chunk",
                "created": int(time.time()), "model": model, "system_fingerprint": f"toolrail-{decider.name}"}

        def event(payload: dict[str, Any]) -> str:
            return f"data: {json.dumps({**base, **payload}, ensure_ascii=False)}\n\n"

        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            # with include_usage every chunk carries "usage": null but the last, empty one (OpenAI's stream)
            return event({"choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
                          **({"usage": None} if include_usage else {})})

        yield chunk({"role": "assistant", "content": None if planned.plan.mode == "tools" else ""})
        async for piece in core.stream(decider, planned, planned.ask.messages):
            if isinstance(piece, core.TextPiece):
                yield chunk({"content": piece.text})
            elif isinstance(piece, core.CallPiece):
                entry: dict[str, Any] = {"index": piece.index, "function": {"arguments": piece.arguments}}
                if piece.id is not None:  # the call's first delta: its id, type and name, once
                    entry = {"index": piece.index, "id": piece.id, "type": "function",
                             "function": {"name": piece.name, "arguments": piece.arguments}}
                yield chunk({"tool_calls": [entry]})
            elif isinstance(piece, core.BlockedPiece):
                yield event({"choices": [], "toolrail": {"blocked_calls": piece.calls}})
            elif piece.error is not None:
                yield f"data: {json.dumps({'error': core.stream_error(piece.error)})}\n\n"
            else:
                yield chunk({}, piece.finish_reason)
                if include_usage:
                    yield event({"choices": [], "usage": piece.usage})
                if piece.max_tokens:
                    yield event({"choices": [], "toolrail": {"max_tokens": piece.max_tokens}})
        yield "data: [DONE]\n\n"


def create_router(get_decider: DeciderFactory | None = None, *, limits: Limits | None = None,
                  dependencies: Sequence[Any] = (), models: Sequence[str] = (DEFAULT_MODEL_NAME,)) -> APIRouter:
    """A router with ``POST /chat/completions`` (mount it under ``/v1``).

    ``get_decider`` returns the decider to use (called per request; make it cheap); by default
    :func:`decider.openai_core.default_decider`. ``limits`` caps what one request may ask for; ``dependencies`` (FastAPI
    ``Depends``) run before the endpoint: the job API passes its tenant authentication and rate limit.
    ``models`` are the ids a request may name (``toolrail`` always answers too).
    """
    endpoint = _ChatCompletions(get_decider or core.default_decider, limits, models)
    router = APIRouter()
    router.add_api_route("/chat/completions", endpoint.handle, methods=["POST"], name="chat_completions",
                         dependencies=list(dependencies))
    return router


def create_app(get_decider: DeciderFactory | None = None, *, models: Sequence[str] = (DEFAULT_MODEL_NAME,)) -> FastAPI:
    """A standalone app serving Chat Completions and the Responses API under ``/v1`` (responses kept in memory)."""
    app = FastAPI(title="toolrail decider", version="0.1.0")
    app.include_router(create_router(get_decider, models=models), prefix="/v1")
    app.include_router(responses_router(get_decider, models=models), prefix="/v1")
    return app
