"""The OpenAI-compatible endpoints in the job API (:func:`add_openai_endpoints`): ``/v1/chat/completions``
(``decider.openai_api``) and ``/v1/responses``, where each response is a job, stored per tenant under the
response's id.

``decider.responses_api`` makes the response; :class:`JobResponses` keeps it as a job whose conversation is
the one the response ended (what ``previous_response_id`` continues), whose calls are the response's
function calls (``validated``: the client runs them) and whose ``response`` is the object the API answered
with (what ``GET /v1/responses/{id}`` returns). ``GET /v1/jobs/{id}`` shows the same job.

:class:`HostedTools` runs a response whose tools are toolrail's own (an ``mcp`` tool with ``server_label:
"toolrail"``) as an ordinary job of the run loop — decided, checked, run in the sandbox, held for a person where
policy says so — and answers with what the job did as OpenAI's items: each call that ran an ``mcp_call`` (its
output as text), each call waiting for a person an ``mcp_approval_request`` (whose id names the job and the call,
so the ``mcp_approval_response`` the client sends back approves or rejects it), a client's own function tool's
call a ``function_call``, the final answer a message. Reading the response again reads the job as it now stands.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from fastapi import Depends, FastAPI
from starlette.concurrency import run_in_threadpool

from decider.embedded import DEFAULT_MAX_SEQ_LEN
from decider.errors import InvalidRequestError
from decider.openai_api import ChatLimits, create_router
from decider.responses_api import HOSTED_LABEL
from decider.responses_api import create_router as responses_router
from executor.api.bodies import JobCreate
from executor.api.waiting import MAX_WAIT_S, SETTLED, JobWaiter
from executor.errors import JobNotFoundError
from executor.runs.policy import conversation
from executor.store.records import CallRecord, JobRecord, JobStore
from toolrail.settings import Settings
from tools.spec import ToolSpec

__all__ = ["HostedTools", "JobResponses", "add_openai_endpoints", "hosted_view"]

#: Creates a job from a job API body: ``(body, request_id, tenant, job_id, response) -> job``.
CreateJob = Callable[[JobCreate, str, str, str, dict[str, Any]], JobRecord]
#: Approves or rejects one waiting call: ``(job_id, call_id, tenant, "approve" | "reject") -> Resolution.public()``.
Resolve = Callable[[str, str, str, str], dict[str, Any]]
#: Every tool a tenant's job may call when it names none (the job API's own default): ``tenant -> names``.
ToolNames = Callable[[str], list[str]]



def add_openai_endpoints(app: FastAPI, settings: Settings, store: JobStore, *, tenant: Any, models: list[str],
                         create: CreateJob, resolve: Resolve, tool_names: ToolNames, waiter: JobWaiter) -> None:
    """Both endpoints under ``/v1``, each request charged to ``tenant`` (the API's rate-limited tenant dependency);
    a response with toolrail's own tools runs as a job (:class:`HostedTools` over ``create``, ``resolve``)."""
    limits = ChatLimits(max_tokens=settings.max_tokens_cap, max_schema_bytes=settings.max_schema_bytes,
                        max_schema_depth=settings.max_schema_depth,
                        context_tokens=None if settings.decider == "triton" else DEFAULT_MAX_SEQ_LEN)
    app.include_router(create_router(limits=limits, models=models, dependencies=[Depends(tenant)]), prefix="/v1")
    app.include_router(responses_router(store=JobResponses(store, settings.tool_result_max_chars), tenant_of=tenant,
                                        limits=limits, models=models,
                                        hosted=HostedTools(create, resolve, tool_names, waiter)), prefix="/v1")

class JobResponses:
    """A ``decider.responses_api.ResponseStore`` on the job store."""

    def __init__(self, store: JobStore, tool_result_max_chars: int) -> None:
        self.store, self.max_chars = store, tool_result_max_chars

    def save(self, tenant: str, response: dict[str, Any], conversation: list[dict[str, Any]], *, request_id: str) -> None:
        calls = [CallRecord(id=item["call_id"], index=index, name=item["name"], arguments=_object(item["arguments"]),
                            status="validated")
                 for index, item in enumerate(i for i in response["output"] if i["type"] == "function_call")]
        texts = [part["text"] for item in response["output"] if item["type"] == "message" for part in item["content"]]
        status = {"completed": "succeeded", "incomplete": "failed", "failed": "failed"}[response["status"]]
        error = response.get("error") or ({"type": "generation_bound", "message": "the output was cut at "
                                           "max_output_tokens", "details": {}} if response["status"] == "incomplete" else None)
        job = JobRecord(job_id=response["id"], request_id=request_id,
                        tenant=tenant, status=status, created_at=response["created_at"], messages=conversation,
                        tools=[t["name"] for t in response.get("tools") or []], calls=calls,
                        content="".join(texts) if texts else None, error=error, response=response,
                        tool_choice=response["tool_choice"] if isinstance(response["tool_choice"], (str, dict)) else "auto",
                        parallel_tool_calls=bool(response.get("parallel_tool_calls", True)))
        self.store.create(job)

    def load(self, tenant: str, response_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        if not response_id.startswith("resp_") or not all(c.isalnum() or c in "_-" for c in response_id):
            return None
        job_id, step = _continued(response_id) or (response_id, None)
        try:
            job = self.store.get(job_id, tenant=tenant)
        except JobNotFoundError:
            return None
        if job.response is None or (step is not None and not _is_hosted(job.response)):
            return None
        if _is_hosted(job.response):  # the run as it now stands; a continuation shows its calls from its step on
            view = {**hosted_view(job, job.response, from_step=step or 0), "id": response_id}
            # what a next response goes on from: the run's conversation, its calls and their results, its answer
            answer = [{"role": "assistant", "content": job.content}] if job.content else []
            return view, [m for m in conversation(job, max_chars=self.max_chars) if m.get("role") != "system"] + answer
        return job.response, job.messages


class HostedTools:
    """``decider.responses_api.HostedRuns`` on the job API."""

    def __init__(self, create: CreateJob, resolve: Resolve, tool_names: ToolNames, waiter: JobWaiter) -> None:
        self._create, self._resolve, self._tool_names, self._waiter = create, resolve, tool_names, waiter

    async def respond(self, tenant: str, response: dict[str, Any], messages: list[dict[str, Any]],
                      hosted: dict[str, Any], function_tools: list[ToolSpec],
                      approvals: list[dict[str, Any]], *, request_id: str) -> dict[str, Any]:
        if approvals:  # this response continues that run: its id names the run and the step (nothing more is stored)
            job_id, step = await self._answer(tenant, approvals)
            job = await self._waiter.job(job_id, tenant=tenant, wait_s=MAX_WAIT_S)
            return {**hosted_view(job, response, from_step=step), "id": _continuation_id(job_id, step)}
        body = await run_in_threadpool(_job_body, messages, hosted, function_tools, lambda: self._tool_names(tenant))
        job = await run_in_threadpool(self._create, body, request_id, tenant, response["id"], response)
        if job.status not in SETTLED:
            job = await self._waiter.job(job.job_id, tenant=tenant, wait_s=MAX_WAIT_S)
        return hosted_view(job, response)

    async def _answer(self, tenant: str, approvals: list[dict[str, Any]]) -> tuple[str, int]:
        """Each ``mcp_approval_response`` given to the call it answers; ``(job_id, the step they were in)``."""
        job_id, step = "", 0
        for index, answer in enumerate(approvals):
            target = _approval_target(str(answer.get("approval_request_id") or ""))
            if target is None or (job_id and target[0] != job_id):
                raise InvalidRequestError("approval_request_id names no approval request of one toolrail run",
                                          param=f"input[{index}].approval_request_id")
            job_id, call_id = target
            decision = "approve" if answer.get("approve") is True else "reject"
            resolved = await run_in_threadpool(self._resolve, job_id, call_id, tenant, decision)
            step = resolved["call"]["step"]
        return job_id, step


def _job_body(messages: list[dict[str, Any]], hosted: dict[str, Any], function_tools: list[ToolSpec],
              every_tool: Callable[[], list[str]]) -> JobCreate:
    """The job a hosted response runs as; ``every_tool()``: the tools a job naming none may call (``always`` without
    ``allowed_tools`` holds every one of them, not only the side-effecting ones)."""
    allowed = hosted.get("allowed_tools")
    names = allowed.get("tool_names") if isinstance(allowed, dict) else allowed
    if function_tools and not names:
        raise InvalidRequestError(f"with function tools beside toolrail's own, name toolrail's in the mcp tool's "
                                  f"allowed_tools", param="tools")
    inline = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                "parameters": t.parameters}} for t in function_tools]
    policy = hosted.get("require_approval")
    if policy == "always":
        approval: Any = list(names) if names else every_tool()
    elif isinstance(policy, dict) and isinstance(policy.get("always"), dict):
        approval = list(policy["always"].get("tool_names") or []) or None
    else:  # "never" or unset: the tools' own flags and the tenant's policy still hold a call for a person
        approval = None
    try:
        return JobCreate.model_validate({"messages": messages, "tools": (list(names) + inline) if names else None,
                                         "require_approval": approval})
    except ValueError as exc:
        raise InvalidRequestError(f"the request cannot run as a toolrail job: {exc}", param="input") from None


def _is_hosted(response: dict[str, Any]) -> bool:
    return any(t.get("type") == "mcp" and t.get("server_label") == HOSTED_LABEL for t in response.get("tools") or [])


def _approval_id(job: JobRecord, call: CallRecord) -> str:
    return f"mcpr_{job.job_id[len('resp_'):]}_{call.id}"


def _approval_target(approval_id: str) -> tuple[str, str] | None:
    """``(job_id, call_id)`` an approval request id names (:func:`_approval_id`)."""
    head, _, call_id = approval_id.partition("_")[2].partition("_")
    if approval_id.startswith("mcpr_") and len(head) == 32 and all(c in "0123456789abcdef" for c in head) and call_id:
        return f"resp_{head}", call_id
    return None


def _continuation_id(job_id: str, step: int) -> str:
    """The id of the response that continued hosted run ``job_id`` at ``step`` (an approval answered there)."""
    return f"{job_id}_s{step}"


def _continued(response_id: str) -> tuple[str, int] | None:
    """``(job_id, step)`` a continuation's id names (:func:`_continuation_id`)."""
    job_id, separator, step = response_id.rpartition("_s")
    return (job_id, int(step)) if separator and job_id.startswith("resp_") and step.isdigit() else None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def hosted_view(job: JobRecord, response: dict[str, Any], *, from_step: int = 0) -> dict[str, Any]:
    """``response`` as the hosted run ``job`` now stands (its calls from ``from_step`` on)."""
    output: list[dict[str, Any]] = []
    for call in sorted((c for c in job.calls if c.step >= from_step), key=lambda c: (c.step, c.index)):
        arguments = _text(call.arguments if call.arguments is not None else {})
        if call.status == "validated":  # a client's own function tool: the client runs it
            output.append({"type": "function_call", "id": f"fc_{call.id}", "call_id": call.id, "name": call.name,
                           "arguments": arguments, "status": "completed"})
        elif call.status == "awaiting_approval" and call.approval_state() == "pending":
            output.append({"type": "mcp_approval_request", "id": _approval_id(job, call), "name": call.name,
                           "arguments": arguments, "server_label": HOSTED_LABEL})
        elif call.status in ("succeeded", "failed", "rejected"):
            error = call.error.message if call.error and call.status != "succeeded" else None
            output.append({"type": "mcp_call", "id": call.id, "name": call.name, "arguments": arguments,
                           "server_label": HOSTED_LABEL, "output": _text(call.result) if call.status == "succeeded"
                           else None, "error": error or (call.status if call.status != "succeeded" else None),
                           "status": "completed" if call.status == "succeeded" else "failed"})
    if job.content:
        output.append({"type": "message", "id": f"msg_{job.job_id[len('resp_'):]}", "role": "assistant",
                       "status": "completed", "content": [{"type": "output_text", "text": job.content,
                                                          "annotations": []}]})
    status = {"succeeded": "completed", "awaiting_approval": "completed", "cancelled": "cancelled"}.get(
        job.status, "failed" if job.status in SETTLED else "in_progress")
    error = None
    if status == "failed":
        error = {"code": "server_error", "message": (job.error and job.error.message) or f"the run ended "
                 f"{job.status}" + (": a person reviews it in the console" if job.status == "needs_review" else "")}
    return {**response, "status": status, "output": output, "error": error,
            "toolrail": {"job_id": job.job_id, "job_status": job.status}}


def _object(arguments: str) -> dict[str, Any] | None:
    try:
        value = json.loads(arguments)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
