"""The OpenAI-compatible endpoints in the job API (:func:`add_openai_endpoints`): ``/v1/chat/completions``
(``decider.openai_api``) and ``/v1/responses``, where each response is a job, stored per tenant under the
response's id.

``decider.responses_api`` makes the response; :class:`JobResponses` keeps it as a job whose conversation is
the one the response ended (what ``previous_response_id`` continues), whose calls are the response's
function calls (``validated``: the client runs them) and whose ``response`` is the object the API answered
with (what ``GET /v1/responses/{id}`` returns). ``GET /v1/jobs/{id}`` shows the same job.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Depends, FastAPI

from decider.embedded import DEFAULT_MAX_SEQ_LEN
from decider.openai_api import ChatLimits, create_router
from decider.responses_api import create_router as responses_router
from executor.errors import JobNotFoundError
from executor.store.records import CallRecord, JobRecord, JobStore
from toolrail.settings import Settings

__all__ = ["JobResponses", "add_openai_endpoints"]


def add_openai_endpoints(app: FastAPI, settings: Settings, store: JobStore, *, tenant: Any, models: list[str]) -> None:
    """Both endpoints under ``/v1``, each request charged to ``tenant`` (the API's rate-limited tenant dependency)."""
    limits = ChatLimits(max_tokens=settings.max_tokens_cap, max_schema_bytes=settings.max_schema_bytes,
                        max_schema_depth=settings.max_schema_depth,
                        context_tokens=None if settings.decider == "triton" else DEFAULT_MAX_SEQ_LEN)
    app.include_router(create_router(limits=limits, models=models, dependencies=[Depends(tenant)]), prefix="/v1")
    app.include_router(responses_router(store=JobResponses(store), tenant_of=tenant, limits=limits, models=models),
                       prefix="/v1")


class JobResponses:
    """A ``decider.responses_api.ResponseStore`` on the job store."""

    def __init__(self, store: JobStore) -> None:
        self.store = store

    def save(self, tenant: str, response: dict[str, Any], conversation: list[dict[str, Any]], *, request_id: str) -> None:
        calls = [CallRecord(id=item["call_id"], index=index, name=item["name"], arguments=_object(item["arguments"]),
                            status="validated")
                 for index, item in enumerate(i for i in response["output"] if i["type"] == "function_call")]
        texts = [part["text"] for item in response["output"] if item["type"] == "message" for part in item["content"]]
        status = {"completed": "succeeded", "incomplete": "failed", "failed": "failed"}[response["status"]]
        error = response.get("error") or ({"type": "generation_bound", "message": "the output was cut at "
                                           "max_output_tokens"} if response["status"] == "incomplete" else None)
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
        try:
            job = self.store.get(response_id, tenant=tenant)
        except JobNotFoundError:
            return None
        return (job.response, job.messages) if job.response is not None else None


def _object(arguments: str) -> dict[str, Any] | None:
    try:
        value = json.loads(arguments)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
