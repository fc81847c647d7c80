"""Where the API meets ``toolrail.tracing``: its instrumentation, links from job requests to the job's span, and
``GET /v1/jobs/{id}/trace``.

- :func:`instrument_api` — FastAPI's instrumentation (an incoming ``traceparent`` is honoured, one
  is generated when absent), a link from each later request about a job (polls, event streams,
  the trace itself) to the job's span (a cancelled job's span is written by ``set_status``, as every end's).
- :func:`trace_router` — ``GET /v1/jobs/{id}/trace``: the job's spans from the Redis sink, its tenant's only
  (spans are stored per tenant and trace: a trace id two tenants used shows each its own).
"""

from __future__ import annotations

import asyncio
import re
import typing
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from opentelemetry import trace

from executor.errors import JobNotFoundError
from executor.worker.tracing import instrument_celery
from toolrail import tracing
from toolrail.trace_sinks import read_trace

__all__ = ["instrument_api", "trace_router"]

_JOB_PATH = re.compile(r"^/v1/jobs/(job_[0-9a-f]{1,64})(?:/[a-z]+)?$")


def instrument_api(app: Any, runtime: Any, **setup_options: Any) -> bool:
    """FastAPI's instrumentation on ``app``, Celery's for publishing, and links from job requests to the job span;
    whether the API's spans are recorded.

    Where the API's spans go nowhere (no sink), neither instrumentation runs (False): the API's
    ``RequestGate`` makes an incoming ``traceparent`` current for the request (the job joins the
    client's trace, and what the request publishes carries it), and Celery gets the relay.
    The instrumentation cost about 0.85 ms of the API's CPU per job that way (bench/worker_cpu.py).
    """
    instrument_celery("api", **setup_options)
    if not tracing.recording():
        return False
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor  # noqa: PLC0415 - only where spans are made

    FastAPIInstrumentor.instrument_app(app, tracer_provider=tracing.setup("api", **setup_options),
                                       excluded_urls="/healthz,/readyz,/metrics",
                                       exclude_spans=["receive", "send"])

    @app.middleware("http")
    async def link_to_job(request: Any, call_next: Callable) -> Any:
        match = _JOB_PATH.match(request.url.path) if tracing.recording() else None
        if match is not None and request.method == "GET" and trace.get_current_span().is_recording():
            try:
                job = await asyncio.to_thread(runtime.store.get, match.group(1))
                tracing.link_to(job.trace_context)
            except Exception:  # noqa: BLE001 - a missing job is the endpoint's 404 to give, not ours
                pass
        return await call_next(request)  # a cancelled job's span: set_status writes it (executor.runs.submit.cancel)

    return True


def trace_router(runtime: Any, tenant: Any) -> Any:
    """``GET /v1/jobs/{job_id}/trace``: the job's spans (``TOOLRAIL_TRACE_STORE=redis``), oldest first."""
    router = APIRouter()
    depends = typing.get_args(tenant)[1]  # ``Annotated[str, Depends(...)]``: the API's authentication and rate limit

    @router.get("/v1/jobs/{job_id}/trace", tags=["jobs"])
    def job_trace(job_id: str, tenant_name: str = depends) -> dict[str, Any]:
        """The spans of the job's trace that reached the Redis sink (empty unless ``TOOLRAIL_TRACE_STORE=redis``)."""
        if len(job_id) > 100 or not all(c.isalnum() or c in "_-" for c in job_id):
            raise JobNotFoundError(f"job {job_id[:100]!r} not found")
        job = runtime.store.get(job_id, tenant=tenant_name)
        trace_id = tracing.trace_id_of(job.trace_context)
        spans = read_trace(runtime.redis, trace_id, tenant=job.tenant) if trace_id else []  # this tenant's spans only
        return {"job_id": job.job_id, "request_id": job.request_id, "trace_id": trace_id,
                "store": runtime.settings.trace_store, "spans": spans}

    return router
