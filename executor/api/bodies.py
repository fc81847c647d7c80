"""The job API's request bodies and its error type: OpenAI's shapes as they come, checked at the boundary.

Split from :mod:`executor.api.app` (which re-exports ``ApiError`` and ``JobCreate``) to keep each module one concern.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from executor.errors import ExecutorError
from executor.runtime import Runtime
from toolrail.settings import Settings
from tools.check import CONTRACT_VALIDATORS, check_tool_calls
from tools.spec import ToolSpec
from executor.runs.webhooks import validate_webhook_url
from toolrail.errors import ToolrailError

__all__ = ["AnyToolCall", "ApiError", "ApprovalBody", "JobCreate", "Message", "NamedChoice", "RejectionBody", "check_conversation",
           "error_body", "refuse_invalid_calls", "run_fields"]

class ApiError(ToolrailError):
    """An error with an HTTP status and the standard error body."""

    def __init__(self, status: int, type_: str, message: str, **details: Any) -> None:
        super().__init__(message, **details)
        self.status, self.type = status, type_


def error_body(type_: str, message: str, details: Any = None) -> dict[str, Any]:
    return {"error": {"type": type_, "message": message, "details": details or {}}}


# ----------------------------------------------------------------- request bodies


class ClientCall(BaseModel):
    """A tool call in the flat shape: ``{name, arguments, id?}``."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64)
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    id: str | None = Field(default=None, max_length=200)

    def flat(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64)
    #: OpenAI sends a JSON string (possibly broken: the check repairs it); an object is taken too.
    arguments: str | dict[str, Any] = ""


class OpenAIToolCall(BaseModel):
    """A tool call in OpenAI's shape: ``{id, type: "function", function: {name, arguments}}``."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(default=None, max_length=200)
    type: Literal["function"] = "function"
    function: FunctionCall
    index: int | None = Field(default=None, ge=0)  # kept by clients that merge streamed deltas

    def flat(self) -> dict[str, Any]:
        call = {"name": self.function.name, "arguments": self.function.arguments}
        return {**call, "id": self.id} if self.id else call


def _call_shape(value: Any) -> str:
    if isinstance(value, dict):
        return "openai" if "function" in value or "type" in value else "flat"
    return "openai" if isinstance(value, OpenAIToolCall) else "flat"


#: Either shape; the discriminator picks one, so a bad call gets the errors of its own shape only.
AnyToolCall = Annotated[Annotated[ClientCall, Tag("flat")] | Annotated[OpenAIToolCall, Tag("openai")],
                        Discriminator(_call_shape)]


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: str = Field(max_length=20_000)


class Message(BaseModel):
    """One chat message, OpenAI's shape (including what the openai SDK adds when a reply is sent back)."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = Field(default=None, max_length=20_000)
    name: str | None = Field(default=None, max_length=64)
    tool_call_id: str | None = Field(default=None, max_length=200)
    tool_calls: list[AnyToolCall] | None = Field(default=None, max_length=16)
    # fields of the SDK's ChatCompletionMessage, accepted so a reply can be appended as is
    refusal: str | None = Field(default=None, max_length=20_000)
    annotations: list[dict[str, Any]] | None = Field(default=None, max_length=64)
    audio: dict[str, Any] | None = None
    function_call: None = None

    @model_validator(mode="after")
    def _role_fields(self) -> "Message":
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"only assistant messages carry tool_calls, not {self.role!r}")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        if self.tool_call_id and self.role != "tool":
            raise ValueError(f"only tool messages carry tool_call_id, not {self.role!r}")
        for call in self.tool_calls or []:
            if not call.id:
                raise ValueError("every tool call of an assistant message needs an id (tool messages answer by it)")
        return self

    def normalized(self) -> dict[str, Any]:
        """The stored form: text content, ``system`` for ``developer``, OpenAI-shaped calls with string arguments."""
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        message: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role}
        if content is not None or self.role != "assistant":
            message["content"] = content if content is not None else ""
        if self.name:
            message["name"] = self.name
        if self.tool_call_id:
            message["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            message["tool_calls"] = [_openai_call(call.flat()) for call in self.tool_calls]
        return message


def _openai_call(call: dict[str, Any]) -> dict[str, Any]:
    arguments = call.get("arguments", "")
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": text}}


def check_conversation(messages: list[Message]) -> None:
    """Each tool message answers a call of an earlier assistant message, once."""
    open_calls: dict[str, str] = {}
    answered: set[str] = set()
    for position, message in enumerate(messages):
        for call in message.tool_calls or []:
            open_calls[str(call.id)] = call.flat()["name"]
        if message.role == "tool":
            call_id = str(message.tool_call_id)
            if call_id not in open_calls:
                raise ApiError(422, "unknown_tool_call_id", f"messages[{position}] answers tool call {call_id!r}, "
                               "which no earlier assistant message made", position=position, tool_call_id=call_id,
                               known=sorted(open_calls))
            if call_id in answered:
                raise ApiError(422, "duplicate_tool_result", f"messages[{position}] answers tool call {call_id!r} again",
                               position=position, tool_call_id=call_id)
            answered.add(call_id)


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$")
    description: str = Field(default="", max_length=2_000)
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class InlineTool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"] = "function"
    function: FunctionDef


class NamedChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"] = "function"
    function: dict[str, str]


class JobCreate(BaseModel):
    """A job: a conversation to decide on, or tool calls/raw output the client brings."""

    model_config = ConfigDict(extra="forbid")

    messages: list[Message] = Field(default_factory=list, max_length=64)
    tools: list[str | InlineTool] | None = Field(default=None, max_length=32,
                                                 description="registered tool names or inline OpenAI function specs; default: all registered")
    tool_calls: list[AnyToolCall] | None = Field(default=None, max_length=16,
                                                 description="calls to check and run: flat {name, arguments} or OpenAI's "
                                                             "{id, type, function: {name, arguments}}")
    raw_output: str | None = Field(default=None, max_length=100_000)
    tool_choice: Literal["auto", "required", "none"] | NamedChoice = "auto"
    parallel_tool_calls: bool = True
    max_reasks: int | None = Field(default=None, ge=0, le=10)
    max_steps: int | None = Field(default=None, ge=1, description="most decide → run steps of this run (default: "
                                  "TOOLRAIL_MAX_STEPS for a conversation, 1 when the job brings its calls)")
    require_approval: list[str] | Literal["side_effects"] | None = Field(
        default=None, description="tools whose calls wait for a person's approval, or \"side_effects\" for every "
                                  "side-effecting tool")
    webhook_url: str | None = Field(default=None, max_length=2048, description="where job.* events are POSTed "
                                    "(Standard Webhooks signatures)")
    approval_timeout_s: float | None = Field(default=None, gt=0, le=7 * 24 * 3600,
                                             description="seconds a step may wait for approval before the job expires")
    time_zone: str | None = Field(default=None, max_length=64, description="the user's IANA time zone "
                                  "(Asia/Shanghai): \"tomorrow\" is read against the request's day there (default UTC)")

    @field_validator("time_zone")
    @classmethod
    def _known_zone(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                ZoneInfo(value)
            except (ValueError, ZoneInfoNotFoundError):
                raise ValueError(f"unknown IANA time zone: {value!r}") from None
        return value

    @field_validator("tools")
    @classmethod
    def _unique_tools(cls, value: list[str | InlineTool] | None) -> list[str | InlineTool] | None:
        if value is not None:
            names = [v if isinstance(v, str) else v.function.name for v in value]
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"tools listed twice: {dupes}")
        return value


class ApprovalBody(BaseModel):
    """``POST …/approve``: optionally the arguments to run instead (validated against the tool's schema)."""

    model_config = ConfigDict(extra="forbid")

    arguments: dict[str, Any] | None = None


class RejectionBody(BaseModel):
    """``POST …/reject``: the reason, which the model sees as the call's result."""

    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(default=None, max_length=500)


class ReviewedCall(BaseModel):
    """One call a reviewer runs instead of the model's (validated against the tool's schema)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=200)
    arguments: dict[str, Any] = Field(default_factory=dict)


class ReviewBody(BaseModel):
    """``POST /v1/jobs/{id}/review``: exactly one of the calls to run, a text answer, or a rejection's reason."""

    model_config = ConfigDict(extra="forbid")

    calls: list[ReviewedCall] | None = Field(default=None, min_length=1, max_length=64)
    answer: str | None = Field(default=None, max_length=100_000)
    reject: str | None = Field(default=None, min_length=1, max_length=500, description="the reason the model sees")

    @model_validator(mode="after")
    def _exactly_one(self) -> "ReviewBody":
        if sum(item is not None for item in (self.calls, self.answer, self.reject)) != 1:
            raise ValueError("a review is exactly one of calls, answer or reject")
        return self


def refuse_invalid_calls(body: JobCreate, specs: dict[str, ToolSpec] | None) -> None:
    """422 ``invalid_tool_calls`` when the client's own ``tool_calls`` fail validation and cleaning: nothing stored.

    As the OpenAI API answers a malformed request, with the JSON path into the request body of every
    problem (``/tool_calls/0/arguments/amount``, ``/tool_calls/1/function/name``) — the same check path
    the job would take (clean, validate, normalize). The contract findings a person reviews (a value the
    conversation does not state, a repeated side effect) are not malformed: those jobs are stored and go
    to review as before. ``raw_output`` is model text, checked by the job (a conversation keeps its re-ask).
    """
    if body.tool_calls is None or specs is None:  # specs: the job's (``executor.runs.loop.job_specs``)
        return

    check = check_tool_calls([call.flat() for call in body.tool_calls], specs)
    problems = [{"path": "/tool_calls" + str(e.get("path") or "").rstrip("/"), "message": str(e.get("message", "")),
                 "validator": e.get("validator")} for e in check.errors if e.get("validator") not in CONTRACT_VALIDATORS]
    for call in check.calls:
        shape = body.tool_calls[call.index] if call.index < len(body.tool_calls) else None
        prefix = f"/tool_calls/{call.index}" + ("/function" if isinstance(shape, OpenAIToolCall) else "")
        for error in call.errors:
            if error.get("validator") in CONTRACT_VALIDATORS:
                continue
            inner = str(error.get("path") or "").rstrip("/")  # "/" is the arguments object itself
            path = f"{prefix}/name" if call.name not in specs else f"{prefix}/arguments{inner}"
            problems.append({"path": path, "message": str(error.get("message", "")), "validator": error.get("validator"),
                             "tool": call.name or None})
    if not body.tool_calls and (body.tool_choice == "required" or isinstance(body.tool_choice, NamedChoice)):
        problems.append({"path": "/tool_calls", "message": "tool_choice requires a call, but tool_calls is empty",
                         "validator": "minItems"})
    if problems:
        shown = "; ".join(f"{p['path']}: {p['message']}" for p in problems[:3])
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise ApiError(422, "invalid_tool_calls", f"tool_calls fail their tools' schemas: {shown}{more}", errors=problems)


def run_fields(runtime: Runtime, body: JobCreate, settings: Settings, *, client_output: dict[str, Any] | None,
                names: list[str], inline: list[dict[str, Any]]) -> dict[str, Any]:
    """The run settings of a new job: steps, approval policy, webhook. 4xx on bad values, nothing stored."""
    if body.max_steps is not None and body.max_steps > settings.max_steps_limit:
        raise ApiError(422, "validation_error", f"max_steps may be at most {settings.max_steps_limit}",
                       max_steps=body.max_steps, limit=settings.max_steps_limit)
    default_steps = settings.max_steps if body.messages and client_output is None else 1
    if isinstance(body.require_approval, list):
        known = set(names) | {t["function"]["name"] for t in inline}
        unknown = sorted(set(body.require_approval) - known)
        if unknown:
            raise ApiError(422, "unknown_tool", f"require_approval names tools the job does not offer: {unknown}",
                           tools=unknown)
    webhook_url = None
    if body.webhook_url is not None:
        try:
            webhook_url = validate_webhook_url(body.webhook_url, allow_private=settings.webhook_allow_private)
        except ExecutorError as exc:
            raise ApiError(422, exc.type, str(exc), **exc.details) from None
    return {"max_steps": body.max_steps or default_steps, "require_approval": body.require_approval,
            "approval_timeout_s": body.approval_timeout_s, "time_zone": body.time_zone,
            "webhook_url": webhook_url}  # the deadline: executor.runs.submit, for every entry point
