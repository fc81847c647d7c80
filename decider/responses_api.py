"""OpenAI's Responses API over the decider: ``POST /v1/responses``, ``GET /v1/responses/{id}``, streamed events.

Modelled on the openai-python types (``openai.types.responses``), what the OpenAI Agents SDK and LangChain's
``use_responses_api`` speak. Supported: ``input`` as text or items (messages with text parts, ``function_call``,
``function_call_output``; earlier output messages), ``instructions``, function ``tools`` (``strict`` schemas),
``tool_choice`` (auto / none / required / a named function / ``allowed_tools``), ``parallel_tool_calls``,
``max_output_tokens`` (a cut answer is ``status: "incomplete"`` with ``incomplete_details.reason:
"max_output_tokens"``), ``text.format`` (``json_schema``, ``json_object``), ``temperature``, ``top_p``,
``previous_response_id``, ``store`` and ``stream``. The stream is OpenAI's event sequence, numbered from 0:
``response.created``, ``response.in_progress``, per output item ``response.output_item.added``, its content
(``response.content_part.added``, ``response.output_text.delta`` ... ``.done``, ``response.content_part.done``;
or ``response.function_call_arguments.delta`` ... ``.done``), ``response.output_item.done``, then
``response.completed`` (``response.incomplete`` when cut, ``response.failed`` on failure).

The decoding, the check after it and the token bound are Chat Completions' own (:mod:`decider.openai_core`).
A stored response keeps the conversation it ended (input and output as chat messages) in a
:class:`ResponseStore`, per tenant: the job API stores each response as a job (``executor.api.responses``),
the standalone app in memory. A request naming ``previous_response_id`` continues that conversation (its
``instructions`` are not carried over, as OpenAI's are not).

toolrail's own tools run server-side where the request says so: an ``mcp`` tool with ``server_label:
"toolrail"`` (the Agents SDK's ``HostedMCPTool``). The job API's run loop then decides and runs them (sandboxed,
checked, approvals held for a person) and the response carries OpenAI's ``mcp_call`` and
``mcp_approval_request`` items (:class:`HostedRuns`; the standalone app has none and refuses such a request).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Protocol

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError

from decider import openai_core as core
from decider.errors import DeciderError, InvalidRequestError
from decider.model import DEFAULT_MODEL_NAME
from decider.openai_core import Limits, error_response
from decider.service import BackendDecider
from toolrail.context import REQUEST_ID_HEADER, request_scope, sanitize_request_id
from tools.spec import ToolSpec

__all__ = ["HOSTED_LABEL", "HostedRuns", "MemoryResponseStore", "ResponseRequest", "ResponseStore", "create_router"]

#: The ``server_label`` of the ``mcp`` tool that asks for toolrail's own tools, run server-side.
HOSTED_LABEL = "toolrail"


class ResponseStore(Protocol):
    """Where responses are kept, per tenant: the response object and the conversation it ended."""

    def save(self, tenant: str, response: dict[str, Any], conversation: list[dict[str, Any]], *, request_id: str) -> None:
        """Keep ``response`` and the conversation it ended; ``request_id`` is the request that made it."""
        ...

    def load(self, tenant: str, response_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        """The response and its conversation; None when absent or another tenant's."""
        ...


class HostedRuns(Protocol):
    """Runs a response whose tools are toolrail's own (``executor.api.responses.HostedTools``)."""

    async def respond(self, tenant: str, response: dict[str, Any], messages: list[dict[str, Any]],
                      hosted: dict[str, Any], function_tools: list[ToolSpec],
                      approvals: list[dict[str, Any]], *, request_id: str) -> dict[str, Any]:
        """The finished ``response`` (or ``in_progress`` past the wait); ``approvals``: the input's
        ``mcp_approval_response`` items, which continue the run that asked for them."""
        ...


class MemoryResponseStore:
    """A :class:`ResponseStore` in this process's memory (the standalone app's): the newest ``capacity`` kept."""

    def __init__(self, capacity: int = 1000) -> None:
        self.capacity = capacity
        self._items: OrderedDict[tuple[str, str], tuple[dict[str, Any], list[dict[str, Any]]]] = OrderedDict()

    def save(self, tenant: str, response: dict[str, Any], conversation: list[dict[str, Any]], *, request_id: str) -> None:
        self._items[(tenant, response["id"])] = (response, conversation)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def load(self, tenant: str, response_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        return self._items.get((tenant, response_id))


class ResponseRequest(BaseModel):
    """The subset of ``responses.create`` this endpoint honours (unknown fields ignored)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str | list[dict[str, Any]] = ""
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    text: dict[str, Any] | None = None
    temperature: float | None = None
    top_p: float | None = None
    store: bool | None = None
    stream: bool = False
    metadata: dict[str, str] | None = None


# ----------------------------------------------------------------- input


def _text_of(content: Any, where: str) -> str:
    """A message's text: a string, or its text parts (``input_text``, ``output_text``) joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequestError(f"{where} must be a string or a list of content parts", param=where)
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text"):
            raise InvalidRequestError(f"content part type {kind!r} is not supported (text parts only)",
                                      param=f"{where}[{i}].type")
        texts.append(str(part.get("text", "")))
    return "".join(texts)


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses input items as chat messages (consecutive ``function_call`` s make one assistant turn)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise InvalidRequestError(f"message role {role!r} is not supported", param=f"input[{i}].role")
            messages.append({"role": "system" if role == "developer" else role,
                             "content": _text_of(item.get("content", ""), f"input[{i}].content")})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls") and not last.get("content"):
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": output if isinstance(output, str) else _text_of(output, f"input[{i}].output")})
        elif kind == "mcp_call":  # a hosted tool's call sent back as history: what ran and what it answered
            messages += [{"role": "assistant", "content": None, "tool_calls": [{
                              "id": item.get("id"), "type": "function",
                              "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}}]},
                         {"role": "tool", "tool_call_id": item.get("id"),
                          "content": str(item.get("output") or item.get("error") or "")}]
        elif kind in ("reasoning", "mcp_list_tools", "mcp_approval_request", "mcp_approval_response"):
            continue  # nothing of a reasoning item reaches the model; the mcp items are the hosted run's own
        else:
            raise InvalidRequestError(f"input item type {kind!r} is not supported", param=f"input[{i}].type")
    return messages


def _tools(body: ResponseRequest) -> list[ToolSpec]:
    specs = []
    for i, tool in enumerate(body.tools or []):
        if tool.get("type") == "mcp" and tool.get("server_label") == HOSTED_LABEL:
            continue
        if tool.get("type") != "function":
            raise InvalidRequestError(f"tool type {tool.get('type')!r} is not supported (function tools, and toolrail's "
                                      f"own as an mcp tool with server_label {HOSTED_LABEL!r})", param=f"tools[{i}].type")
        try:
            specs.append(ToolSpec.from_openai(tool))
        except (ValueError, ValidationError) as exc:
            raise InvalidRequestError(f"invalid tool definition: {exc}", param=f"tools[{i}]") from None
    return specs


def _choice(body: ResponseRequest, tools: list[ToolSpec]) -> tuple[str | dict[str, Any], list[ToolSpec]]:
    """Chat's ``tool_choice`` (and the tools it leaves) for the Responses one."""
    choice = body.tool_choice
    if choice is None:
        return ("auto" if tools else "none"), tools
    if isinstance(choice, str):
        if choice == "required" and not tools:
            raise InvalidRequestError("tool_choice 'required' needs tools", param="tool_choice")
        return choice, tools
    if choice.get("type") == "function":
        if not tools:
            raise InvalidRequestError("a named tool_choice needs tools", param="tool_choice")
        return {"type": "function", "function": {"name": choice.get("name")}}, tools
    if choice.get("type") == "allowed_tools":
        allowed = {t.get("name") for t in choice.get("tools") or [] if isinstance(t, dict)}
        kept = [t for t in tools if t.name in allowed]
        return (choice.get("mode") or "auto") if kept else "none", kept
    raise InvalidRequestError(f"tool_choice type {choice.get('type')!r} is not supported", param="tool_choice.type")


def _json_schema(body: ResponseRequest) -> dict[str, Any] | None:
    fmt = (body.text or {}).get("format") or {"type": "text"}
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise InvalidRequestError("text.format.schema must be a JSON Schema object", param="text.format.schema")
        return fmt["schema"]
    raise InvalidRequestError(f"text.format type {kind!r} is not supported", param="text.format.type")


# ----------------------------------------------------------------- output


def _usage(usage: Mapping[str, int]) -> dict[str, Any]:
    prompt, completion = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion}


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def _output_messages(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output as the chat messages that continue its conversation."""
    calls = [{"id": o["call_id"], "type": "function", "function": {"name": o["name"], "arguments": o["arguments"]}}
             for o in output if o["type"] == "function_call"]
    if calls:
        return [{"role": "assistant", "content": None, "tool_calls": calls}]
    return [{"role": "assistant", "content": "".join(c["text"] for o in output for c in o["content"])}] if output else []


class _Turn:
    """One response being made: its request, ids and the object the API answers with."""

    def __init__(self, body: ResponseRequest, model: str, request_id: str, tools: list[dict[str, Any]]) -> None:
        self.id = f"resp_{uuid.uuid4().hex}"
        self.body = body
        self.request_id = request_id
        self.created_at = time.time()
        self.object: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": "in_progress",
            "background": False, "error": None, "incomplete_details": None, "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens, "max_tool_calls": body.max_tool_calls, "model": model,
            "output": [], "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id, "reasoning": None, "store": body.store is not False,
            "temperature": body.temperature if body.temperature is not None else 0.0,
            "text": {"format": (body.text or {}).get("format") or {"type": "text"}},
            "tool_choice": body.tool_choice if body.tool_choice is not None else "auto", "tools": tools,
            "top_p": body.top_p if body.top_p is not None else 1.0, "truncation": "disabled", "usage": None,
            "metadata": body.metadata or {},
        }

    def item_id(self, kind: str, index: int = 0) -> str:
        return f"{kind}_{self.id[5:]}_{index}"

    def finish(self, reason: str, output: list[dict[str, Any]], usage: Mapping[str, int],
               extension: dict[str, Any] | None = None) -> dict[str, Any]:
        self.object.update(status="incomplete" if reason == "length" else "completed", output=output, usage=_usage(usage),
                           incomplete_details={"reason": "max_output_tokens"} if reason == "length" else None,
                           completed_at=time.time() if reason != "length" else None)
        if extension:
            self.object["toolrail"] = extension
        return self.object

    def fail(self, exc: DeciderError) -> dict[str, Any]:
        self.object.update(status="failed", error={"code": "server_error", "message": str(exc)})
        return self.object


async def _replayed(response: dict[str, Any]) -> AsyncIterator[str]:
    """A finished response as its stream of events: each output item whole, then ``response.completed``."""
    events: list[dict[str, Any]] = [{"type": "response.created", "response": {**response, "status": "in_progress",
                                                                              "output": []}}]
    for position, item in enumerate(response["output"]):
        events.append({"type": "response.output_item.added", "output_index": position, "item": item})
        if item["type"] == "function_call":
            events += [{"type": "response.function_call_arguments.delta", "item_id": item["id"],
                        "output_index": position, "delta": item["arguments"]},
                       {"type": "response.function_call_arguments.done", "item_id": item["id"],
                        "output_index": position, "arguments": item["arguments"]}]
        events.append({"type": "response.output_item.done", "output_index": position, "item": item})
    events.append({"type": "response.completed", "response": response})
    for number, event in enumerate(events):
        yield f"event: {event['type']}\ndata: {json.dumps({**event, 'sequence_number': number}, ensure_ascii=False)}\n\n"


def _tools_echo(body: ResponseRequest) -> list[dict[str, Any]]:
    return [{k: t.get(k) for k in ("type", "server_label", "server_url", "allowed_tools", "require_approval")}
            if t.get("type") == "mcp" else  # never its headers: they may carry a secret
            {"type": "function", "name": t.get("name"), "description": t.get("description"),
             "parameters": t.get("parameters"), "strict": t.get("strict", True)} for t in body.tools or []]


def _hosted(body: ResponseRequest) -> dict[str, Any] | None:
    return next((t for t in body.tools or [] if t.get("type") == "mcp" and t.get("server_label") == HOSTED_LABEL), None)


# ----------------------------------------------------------------- endpoint


class _Responses:
    def __init__(self, get_decider: Callable[[], BackendDecider], store: ResponseStore, limits: Limits,
                 models: Sequence[str], hosted: HostedRuns | None = None) -> None:
        self.hosted = hosted
        self.get_decider = get_decider
        self.store = store
        self.limits = limits
        self.models = tuple(models)

    def _ask(self, body: ResponseRequest, request_id: str, tenant: str) -> tuple[core.Ask, list[dict[str, Any]]]:
        """The request in the decider's terms, and the conversation it continues and extends (without instructions)."""
        history: list[dict[str, Any]] = []
        if body.previous_response_id:
            found = self.store.load(tenant, body.previous_response_id)
            if found is None:
                raise InvalidRequestError(f"Previous response with id {body.previous_response_id!r} not found.",
                                          param="previous_response_id", code="previous_response_not_found")
            history = list(found[1])
        conversation = history + input_messages(body.input)
        if not conversation:
            raise InvalidRequestError("'input' must not be empty", param="input")
        core.check_tool_answers(conversation, param=lambda i: "input")
        messages = ([{"role": "system", "content": body.instructions}] if body.instructions else []) + conversation
        tools = _tools(body)
        choice, tools = _choice(body, tools)
        return core.Ask(
            request_id=request_id, messages=messages, tools=tools, tool_choice=choice,
            parallel_tool_calls=body.parallel_tool_calls is not False, json_schema=_json_schema(body),
            max_tokens=body.max_output_tokens, max_tokens_param="max_output_tokens",
            temperature=body.temperature or 0.0, top_p=body.top_p if body.top_p is not None else 1.0,
            max_calls=body.max_tool_calls), conversation

    async def create(self, request: Request, tenant: str) -> Any:
        request_id = getattr(request.state, "request_id", None) or sanitize_request_id(request.headers.get(REQUEST_ID_HEADER))
        with request_scope(request_id):
            try:
                body = ResponseRequest.model_validate(await request.json())
            except ValueError as exc:
                errors = json.loads(exc.json(include_url=False, include_input=False)) if isinstance(exc, ValidationError) else []
                param = ".".join(str(p) for p in errors[0]["loc"]) if errors and errors[0].get("loc") else None
                return error_response(400, "invalid_request_error", "invalid request body", request_id, param=param,
                                      errors=errors)
            schemas = [(f"/tools/{i}/parameters", t.get("parameters")) for i, t in enumerate(body.tools or [])]
            schemas.append(("/text/format/schema", ((body.text or {}).get("format") or {}).get("schema")))
            refusal = core.schema_refusal(schemas, self.limits, request_id)
            if refusal is not None:
                return refusal
            try:
                core.check_model(body.model, self.models)
                ask, conversation = await asyncio.to_thread(self._ask, body, request_id, tenant)
                core.check_bound(ask, self.limits.context_tokens)
                if _hosted(body) is not None:
                    return await self._hosted_run(body, ask, tenant)
                await asyncio.to_thread(self.get_decider)  # the first call loads the model: never on the event loop
                turn = _Turn(body, body.model or self.models[0], request_id, _tools_echo(body))
                return await core.unless_disconnected(request, self._respond(turn, ask, conversation, tenant),
                                                      on_disconnect=lambda: core.cancel_decoding(
                                                          self.get_decider(), request_id, attempts=4))
            except core.AnsweredError as exc:  # an unknown model (404), a failed check (502)
                return exc.response(request_id)
            except DeciderError as exc:
                return core.error_for(exc, request_id)

    async def _hosted_run(self, body: ResponseRequest, ask: core.Ask, tenant: str) -> Any:
        """toolrail's own tools, run server-side by the job API's loop: the response is that run."""
        if self.hosted is None:
            raise InvalidRequestError(f"toolrail's own tools (an mcp tool with server_label {HOSTED_LABEL!r}) run "
                                      "server-side only on the job API (toolrail serve)", param="tools")
        turn = _Turn(body, body.model or self.models[0], ask.request_id, _tools_echo(body))
        approvals = [i for i in body.input if isinstance(i, dict) and i.get("type") == "mcp_approval_response"] \
            if isinstance(body.input, list) else []
        response = await self.hosted.respond(tenant, turn.object, ask.messages, _hosted(body) or {}, ask.tools,
                                             approvals, request_id=ask.request_id)
        headers = {REQUEST_ID_HEADER: ask.request_id}
        if not body.stream:
            return JSONResponse(response, headers=headers)
        return StreamingResponse(_replayed(response), media_type="text/event-stream",
                                 headers={**headers, "Cache-Control": "no-cache"})

    def _save(self, tenant: str, turn: _Turn, conversation: list[dict[str, Any]]) -> None:
        if turn.body.store is not False:
            self.store.save(tenant, turn.object, conversation + _output_messages(turn.object["output"]),
                            request_id=turn.request_id)

    async def _client_calls(self, turn: _Turn, conversation: list[dict[str, Any]], tenant: str, decision: Any,
                            record: dict[str, Any], ids: list[str | None]) -> Any:
        """Input that ends in the client's own ``function_call`` s with no output yet: they are checked and answered
        as they are, with their ``call_id`` s (or held back with the findings in ``toolrail``) - never replaced."""
        output = [_call_item(turn.item_id("fc", c.index), ids[c.index] if c.index < len(ids) and ids[c.index] else c.id,
                             c.name, json.dumps(c.arguments, ensure_ascii=False) if c.arguments is not None else "",
                             "completed") for c in decision.tool_calls]
        if not output:
            output = [_message_item(turn.item_id("msg"), decision.content or "", "completed")]
        turn.finish("stop", output, {}, record)
        await asyncio.to_thread(self._save, tenant, turn, conversation[:-1])
        headers = {REQUEST_ID_HEADER: turn.request_id}
        if not turn.body.stream:
            return JSONResponse(turn.object, headers=headers)
        return StreamingResponse(_replayed(turn.object), media_type="text/event-stream",
                                 headers={**headers, "Cache-Control": "no-cache"})

    async def _respond(self, turn: _Turn, ask: core.Ask, conversation: list[dict[str, Any]], tenant: str) -> Any:
        client = core.client_calls(ask)
        if client is not None:  # the client's own calls: checked and answered as they are, no model asked
            return await self._client_calls(turn, conversation, tenant, *client)
        decider = self.get_decider()
        planned = await asyncio.to_thread(core.plan, decider, ask, self.limits)
        headers = {REQUEST_ID_HEADER: ask.request_id}
        if turn.body.stream:
            return StreamingResponse(self._events(decider, planned, turn, conversation, tenant),
                                     media_type="text/event-stream", headers={**headers, "Cache-Control": "no-cache"})
        outcome = await core.complete(decider, planned)
        decision = outcome.decision
        status = "incomplete" if outcome.finish_reason == "length" else "completed"
        if decision.tool_calls:
            output = [_call_item(turn.item_id("fc", c.index), c.id, c.name,
                                 json.dumps(c.arguments, ensure_ascii=False) if c.arguments is not None else c.raw_arguments or "",
                                 status) for c in decision.tool_calls]
        else:
            output = [_message_item(turn.item_id("msg"), decision.content or "", status)]
        extension = {**(outcome.extension or {}), **({"max_tokens": outcome.max_tokens} if outcome.max_tokens else {})}
        turn.finish(outcome.finish_reason, output, outcome.usage, extension)
        await asyncio.to_thread(self._save, tenant, turn, conversation)
        return JSONResponse(turn.object, headers=headers)

    async def _events(self, decider: BackendDecider, planned: core.Planned, turn: _Turn,
                      conversation: list[dict[str, Any]], tenant: str) -> AsyncIterator[str]:
        sequence = 0

        def event(kind: str, **fields: Any) -> str:
            nonlocal sequence
            payload = {"type": kind, "sequence_number": sequence, **fields}
            sequence += 1
            return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

        yield event("response.created", response=dict(turn.object))
        yield event("response.in_progress", response=dict(turn.object))
        items: list[dict[str, Any]] = []  # in output order
        calls: dict[int, dict[str, Any]] = {}  # call index -> its item
        message: dict[str, Any] | None = None

        def close_open(status: str) -> list[str]:
            out = []
            for position, item in enumerate(items):
                if item["status"] != "in_progress":
                    continue
                item["status"] = status
                if item["type"] == "message":
                    part = item["content"][0]
                    out += [event("response.output_text.done", item_id=item["id"], output_index=position,
                                  content_index=0, text=part["text"], logprobs=[]),
                            event("response.content_part.done", item_id=item["id"], output_index=position,
                                  content_index=0, part=part)]
                else:
                    out.append(event("response.function_call_arguments.done", item_id=item["id"], output_index=position,
                                     arguments=item["arguments"]))
                out.append(event("response.output_item.done", output_index=position, item=item))
            return out

        async for piece in core.stream(decider, planned, planned.ask.messages):
            if isinstance(piece, core.TextPiece):
                if message is None:
                    message = _message_item(turn.item_id("msg"), "", "in_progress")
                    items.append(message)
                    position = len(items) - 1
                    yield event("response.output_item.added", output_index=position, item={**message, "content": []})
                    yield event("response.content_part.added", item_id=message["id"], output_index=position,
                                content_index=0, part=dict(message["content"][0]))
                message["content"][0]["text"] += piece.text
                yield event("response.output_text.delta", item_id=message["id"], output_index=items.index(message),
                            content_index=0, delta=piece.text, logprobs=[])
            elif isinstance(piece, core.CallPiece):
                if piece.id is not None:
                    item = _call_item(turn.item_id("fc", piece.index), piece.id, piece.name or "", "", "in_progress")
                    calls[piece.index] = item
                    items.append(item)
                    yield event("response.output_item.added", output_index=len(items) - 1, item=dict(item))
                item = calls[piece.index]
                item["arguments"] += piece.arguments
                if piece.arguments:
                    yield event("response.function_call_arguments.delta", item_id=item["id"],
                                output_index=items.index(item), delta=piece.arguments)
            elif isinstance(piece, core.EndPiece):
                if piece.error is not None:
                    for line in close_open("incomplete"):
                        yield line
                    turn.object["output"] = items
                    yield event("response.failed", response=turn.fail(piece.error))
                    break
                for line in close_open("incomplete" if piece.finish_reason == "length" else "completed"):
                    yield line
                kept = {c.id for c in piece.decision.tool_calls} if piece.decision is not None else set()
                output = [i for i in items if i["type"] == "message" or i["call_id"] in kept]
                extension = {"max_tokens": piece.max_tokens} if piece.max_tokens else None
                turn.finish(piece.finish_reason, output, piece.usage, extension)
                await asyncio.to_thread(self._save, tenant, turn, conversation)
                kind = "response.incomplete" if piece.finish_reason == "length" else "response.completed"
                yield event(kind, response=turn.object)

    async def retrieve(self, response_id: str, request: Request, tenant: str) -> Any:
        request_id = getattr(request.state, "request_id", None) or sanitize_request_id(request.headers.get(REQUEST_ID_HEADER))
        found = await asyncio.to_thread(self.store.load, tenant, response_id[:200])
        if found is None:
            return error_response(404, "not_found", f"No response found with id {response_id[:200]!r}.", request_id,
                                  param="response_id")
        return JSONResponse(found[0], headers={REQUEST_ID_HEADER: request_id})


def _default_tenant() -> str:
    return "default"


def create_router(get_decider: Callable[[], BackendDecider] | None = None, *, store: ResponseStore | None = None,
                  tenant_of: Callable[..., str] | None = None, limits: Limits | None = None,
                  models: Sequence[str] = (DEFAULT_MODEL_NAME,), hosted: HostedRuns | None = None) -> APIRouter:
    """A router with ``POST /responses`` and ``GET /responses/{id}`` (mount it under ``/v1``).

    ``store`` keeps responses (default: in memory); ``tenant_of`` is a FastAPI dependency naming the caller's
    tenant (the job API's authentication and rate limit), default one tenant for everyone.
    """
    endpoint = _Responses(get_decider or core.default_decider, store or MemoryResponseStore(), limits or Limits(), models,
                          hosted)
    tenant_dependency = Depends(tenant_of or _default_tenant)

    async def create_response(request: Request, tenant: str = tenant_dependency) -> Any:
        return await endpoint.create(request, tenant)

    async def get_response(response_id: str, request: Request, tenant: str = tenant_dependency) -> Any:
        return await endpoint.retrieve(response_id, request, tenant)

    router = APIRouter()
    router.add_api_route("/responses", create_response, methods=["POST"], name="create_response")
    router.add_api_route("/responses/{response_id}", get_response, methods=["GET"], name="get_response")
    return router
