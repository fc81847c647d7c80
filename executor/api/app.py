"""The job API (FastAPI).

    POST /v1/jobs               submit a job (an agent run) → 202 {job_id, request_id, status}
                                (Prefer: wait=S → 200 with the record once it settles within S)
    GET  /v1/jobs               the tenant's recent jobs
    GET  /v1/jobs/{id}          status, each step with its calls and results, the final content (?wait=S: long-poll)
    POST /v1/jobs/{id}/calls/{call_id}/approve|reject   a person's answer to a call awaiting approval
    POST /v1/jobs/{id}/review   a person resolves needs_review: calls to run, a text answer, or a rejection
    GET  /v1/jobs/{id}/events   Server-Sent Events of each state change
    GET  /v1/tools              registered tools and their schemas
    GET  /v1/models             the served model(s), in OpenAI's shape
    GET  /healthz  /readyz  /metrics

Jobs take OpenAI's shapes as they are: ``tool_calls`` as ``{id, type: "function", function:
{name, arguments: "<json string>"}}`` (or the flat ``{name, arguments}``), and whole
conversations in ``messages`` (assistant ``tool_calls``, ``tool`` messages answering them by
``tool_call_id``, text content parts, the ``developer`` role). They are normalized here, at
the boundary, into one form: text content, OpenAI-shaped assistant calls.

Every error a client can cause is a 4xx with ``{"error": {"type", "message", "details"}}``;
Redis being down is a 503; nothing answers with a stack trace.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import hmac
import inspect
import math
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Annotated, Any, Literal

import redis
from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from jsonschema.exceptions import SchemaError
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.core import GaugeMetricFamily
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from decider.checked import client_turn
from executor.api.console import console_router
from executor.api.context import ApiSurface, JobDesk
from executor.api.bodies import ApiError, ApprovalBody, JobCreate, NamedChoice, RejectionBody, ReviewBody
from executor.api.bodies import check_conversation as _check_conversation
from executor.api.bodies import error_body as _error_body
from executor.api.bodies import refuse_invalid_calls as _refuse_invalid_calls
from executor.api.bodies import run_fields as _run_fields
from executor.api.middleware import LocalOnly, RequestGate
from executor.errors import JobNotFoundError
from executor.metrics import MULTIPROCESS_DIR_ENV, OutcomeCollector, PublicView
from executor.api.ratelimit import install_load_control, rate_limited
from executor.api.readiness import Readiness
from executor.runtime import Runtime
from executor.runs.submit import cancel, submit
from executor.worker.config import task_time_limit_for, worker_queues
from executor.api.sse import AsyncRedisFactory, SlotStreamingResponse, StreamSlots, job_event_stream
from executor.api.waiting import JobWaiter, RecordResponse
from executor.store.records import CallRecord, JobRecord
from executor.api.tracing import instrument_api, trace_router
from executor.worker.tracing import in_job_trace, message_age_s
from toolrail import tracing
from toolrail.errors import ToolrailError
from toolrail.extensions import API_GROUP, installed
from toolrail.logging import configure_logging, get_logger
from toolrail.settings import Settings, get_settings
from toolrail.trace_sinks import TraceClaims
from tools.errors import SchemaRejectedError, UnknownToolError
from tools.schema_guard import check_client_schema
from tools.spec import ToolSpec
from tools.validator import validator_for
from executor.runs.review import review
from executor.runs.approvals import resolve
from executor.runs.reconcile import Reconciler
from executor.runs.loop import job_specs
from executor.runs.webhooks import deliveries
from decider.model import DEFAULT_MODEL_NAME

__all__ = ["ApiError", "JobCreate", "app_from_environment", "create_app"]

log = get_logger("toolrail.api")


# ----------------------------------------------------------------- auth


async def tenant_of(request: Request, authorization: Annotated[str | None, Header()] = None,
                    x_api_key: Annotated[str | None, Header()] = None) -> str:
    """The tenant of the caller's API key; ``default`` when no keys are configured."""
    tenants: dict[str, str] = request.app.state.tenants
    if not tenants:
        tracing.tag_tenant("default")
        return "default"
    key = x_api_key
    if authorization and authorization.lower().startswith("bearer "):
        key = authorization[7:].strip()
    tenant = tenants.get(key or "")
    if tenant is None:
        raise ApiError(401, "unauthorized", "a valid API key is required (Authorization: Bearer <key> or X-API-Key)")
    tracing.tag_tenant(tenant)  # the server span is stored with this tenant's spans, never by a client's baggage
    return tenant


Tenant = Annotated[str, Depends(rate_limited(tenant_of))]  # authenticated, then charged to the tenant's bucket


# ----------------------------------------------------------------- app


def native_telemetry_off() -> dict[str, Any]:
    """FastAPI's own OpenTelemetry (newer releases): off. toolrail instruments the API itself (``instrument_api``);
    FastAPI's would add a second server span and spans per dependency and serialization to every request, for
    whatever global tracer provider is set, sink or not (~4 % of the API's CPU on a validate-only job)."""
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False, "operation_spans": False}}


def app_from_environment() -> FastAPI:
    """The API a serving process runs, over its settings and ``REDIS_URL``: ``toolrail serve`` builds it, and so
    does each process of ``--api-workers N`` (uvicorn's factory).

    Everything built here (imports, the app, its models and schemas) lives as long as the process, so it is
    frozen: the collector no longer walks it, and its first full collection under load no longer stalls every
    request in flight (110-150 ms at 16 clients; bench/results/executor.md). Not for a process that builds and
    drops apps (tests: ``create_app``): what it froze would never be collected."""
    configure_logging()
    settings = get_settings()
    app = create_app(settings, Runtime.from_settings(settings))
    gc.collect()
    gc.freeze()
    return app


def create_app(settings: Settings, runtime: Runtime, *, enqueue: Callable[[JobRecord], None] | None = None,
               ping_workers: Callable[[], int] | None = None, mount_openai: bool | None = None,
               rerun: Callable[[JobRecord, CallRecord], None] | None = None) -> FastAPI:
    """Build the API over a runtime. ``enqueue`` queues a job's decide step and ``rerun`` one call on its tool queue
    (the runtime's queues by default, Celery's where it has none; with ``enqueue`` given and no ``rerun``, approvals
    and the reconciler are off). Webhooks go out on the runtime's queues."""
    if runtime.queues is None:  # the deployment's Celery queues, unless the runtime brings its own
        from executor.worker.tasks import QUEUES  # lazy: the Celery app reads REDIS_URL at import; not when queues are given

        runtime.queues = QUEUES
    if enqueue is None:
        enqueue, rerun = runtime.queues.decide, runtime.queues.dispatch
    if ping_workers is None:
        ping_workers = _celery_ping
    tenants = settings.tenants_by_key()
    enqueue, rerun = in_job_trace(enqueue), in_job_trace(rerun) if rerun is not None else None  # publish in the job trace
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        reconciler = None
        if rerun is not None and settings.reconcile_interval_s > 0:
            limit = settings.task_time_limit_s or task_time_limit_for(settings.visibility_timeout_s)
            reconciler = Reconciler(runtime, interval_s=settings.reconcile_interval_s,
                                    stale_after_s=settings.visibility_timeout_s + limit, redecide=enqueue, rerun=rerun,
                                    restore_dead=getattr(runtime.queues, "restore_dead_workers", None)).start()
        async with AsyncExitStack() as extensions:  # e.g. /mcp's session manager, the MCP tools' refresh
            for running in _.state.lifespans:
                await extensions.enter_async_context(running())
            yield
        if reconciler is not None:
            reconciler.stop()

    app = FastAPI(title="toolrail", version="0.1.0", description="Serverless tool execution for LLM agents.",
                  lifespan=lifespan, **native_telemetry_off())
    spans = instrument_api(app, runtime)  # server spans (traceparent honoured or generated), links from job requests
    metrics = CollectorRegistry()
    shared_dir = os.environ.get(MULTIPROCESS_DIR_ENV)  # several API processes: their counters are summed at the scrape
    counters = None if shared_dir else metrics
    jobs_created = Counter("toolrail_jobs_created_total", "Jobs accepted", ["tenant"], registry=counters)
    http_latency = Histogram("toolrail_http_request_duration_seconds", "API latency", ["method", "route", "status"],
                             registry=counters, buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
    if shared_dir:
        metrics.register(MultiProcessCollector(None, path=shared_dir))
    metrics.register(_QueueDepth(runtime))
    metrics.register(OutcomeCollector(runtime.redis))
    readiness = Readiness(runtime.redis, ping_workers, expected_queues=lambda: worker_queues(runtime.registry))
    started_at = int(time.time())
    install_load_control(app, settings=settings, runtime=runtime, metrics=metrics, counters=counters)

    app.add_middleware(RequestGate, latency=http_latency, max_bytes=settings.max_body_bytes,  # outside every route
                       max_depth=settings.max_json_depth, trace_context=not spans, local=LocalOnly(
                           keyed=bool(tenants), allowed_hosts=settings.allowed_hosts,
                           allowed_origins=settings.allowed_origins))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        details = [{"loc": list(e.get("loc", ())), "message": e.get("msg"), "type": e.get("type")} for e in exc.errors()[:20]]
        return JSONResponse(_error_body("validation_error", "the request body is invalid", {"errors": details}),
                            status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        type_ = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized"}.get(exc.status_code, "http_error")
        return JSONResponse(_error_body(type_, str(exc.detail)), status_code=exc.status_code)

    @app.exception_handler(redis.RedisError)
    async def _redis_down(_: Request, exc: redis.RedisError) -> JSONResponse:
        return JSONResponse(_error_body("unavailable", "the job store is unavailable; retry shortly"), status_code=503,
                            headers={"Retry-After": "1"})

    @app.exception_handler(ToolrailError)  # the one mapping of the platform's errors: status, retryability on the class
    async def _typed_error(_: Request, exc: ToolrailError) -> JSONResponse:
        error = exc.http_error()
        retry_after = max(1, math.ceil(exc.retry_after_s or 1))
        return JSONResponse(_error_body(error["type"], error["message"], error["details"]), status_code=exc.status,
                            headers={"Retry-After": str(retry_after)} if exc.retryable else None)

    app.state.tenants = tenants
    trace_claims = TraceClaims(runtime.redis, ttl_s=settings.trace_store_ttl_s)  # a client's trace id: whose it is
    stream_slots = app.state.stream_slots = StreamSlots(settings.sse_max_streams_per_tenant)
    metrics.register(stream_slots)
    events_redis = AsyncRedisFactory(runtime.redis, block_s=settings.sse_heartbeat_s)
    waiter = JobWaiter(runtime.store, runtime.redis, limit=settings.wait_max_per_tenant)

    @app.get("/healthz", tags=["ops"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["ops"])
    def readyz() -> JSONResponse:
        """200 once Redis answers and workers have answered recently; else 503 saying what it waits for."""
        ready, body = readiness.check()
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics", tags=["ops"], response_class=PlainTextResponse)  # documents text/plain in the OpenAPI spec
    def metrics_endpoint(authorization: Annotated[str | None, Header()] = None) -> Response:
        """The scrape. With API keys set, tenant names and tenants' private tools (MCP tools, their queues) appear
        only to the bearer of ``TOOLRAIL_METRICS_KEY``; anyone else gets every series summed over tenants, those
        tools and queues summed as ``mcp`` (``executor.metrics.PublicView``)."""
        bearer = authorization[7:].strip() if authorization and authorization.lower().startswith("bearer ") else ""
        per_tenant = not tenants or (bool(settings.metrics_key) and hmac.compare_digest(bearer, settings.metrics_key))
        public = PublicView(metrics, drop_tenant=bool(tenants), public=lambda: (
            runtime.registry.names(), ["decide", "webhooks", *runtime.registry.queues()]))  # a tenant's MCP tools: "mcp"
        return Response(generate_latest(metrics if per_tenant else public), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/tools", tags=["tools"])
    def list_tools(tenant: Tenant) -> dict[str, Any]:
        extra = [spec.public() for spec in runtime.tenant_specs(tenant).values()]  # e.g. MCP tools, with their source
        return {"tools": [spec.public() for spec in runtime.registry.specs()] + extra}

    @app.get("/v1/models", tags=["models"])
    def list_models(tenant: Tenant) -> dict[str, Any]:
        """The served model(s), as OpenAI's ``GET /v1/models`` lists them (``client.models.list()``)."""
        return {"object": "list", "data": _served_models(settings, created=started_at)}

    @app.get("/v1/models/{model_id:path}", tags=["models"])
    def get_model(model_id: str, tenant: Tenant) -> dict[str, Any]:
        for model in _served_models(settings, created=started_at):
            if model["id"] == model_id:
                return model
        raise ApiError(404, "model_not_found", f"model {model_id!r} is not served here", model=model_id)

    @app.post("/v1/jobs", status_code=202, tags=["jobs"])
    async def create_job(body: JobCreate, request: Request, tenant: Annotated[str, Depends(tenant_of)],
                         idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
                         prefer: Annotated[str | None, Header(max_length=200)] = None) -> JSONResponse:
        """202 with the job's id; with ``Prefer: wait=S``, 200 with the record once it settles within S
        (``executor.api.waiting``). The tenant is charged its token in the same thread as the job's own Redis work:
        one hand-off to the thread pool per submit, not one for the rate limit and one for the job."""
        job, created = await run_in_threadpool(_create_job, body, request.state.request_id, tenant, idempotency_key)
        return await waiter.submitted(job, created=created, prefer=prefer)

    def _create_job(body: JobCreate, request_id: str, tenant: str, idempotency_key: str | None, *,
                    job_id: str | None = None, response: dict[str, Any] | None = None) -> tuple[JobRecord, bool]:
        app.state.rate_limiter.check(tenant)
        names, inline_specs = _resolve_tools(runtime, body, settings, tenant=tenant)
        inline = [spec.to_openai() for spec in inline_specs]
        if not body.messages and body.tool_calls is None and body.raw_output is None:
            raise ApiError(422, "validation_error", "give messages to decide on, or tool_calls / raw_output to validate")
        if body.tool_calls is not None and body.raw_output is not None:
            raise ApiError(422, "validation_error", "give tool_calls or raw_output, not both")
        if isinstance(body.tool_choice, NamedChoice):
            chosen = body.tool_choice.function.get("name")
            if chosen not in names and chosen not in {t["function"]["name"] for t in inline}:
                raise ApiError(422, "unknown_tool", f"tool_choice names {chosen!r}, which is not among the job's tools",
                               tool=chosen)
        if body.tool_choice == "required" and not names and not inline:
            raise ApiError(400, "invalid_request", "tool_choice=required with an empty tool list")
        _check_conversation(body.messages)
        messages = [m.normalized() for m in body.messages]
        client_output = None
        if body.tool_calls is not None:
            client_output = {"tool_calls": [c.flat() for c in body.tool_calls]}
        elif body.raw_output is not None:
            client_output = {"raw_output": body.raw_output}
        elif (turn := client_turn(messages)) is not None:  # a last assistant turn's unanswered calls: the client's
            messages, calls = turn
            client_output = {"tool_calls": calls}
        max_reasks = settings.default_max_reasks if body.max_reasks is None else body.max_reasks
        if max_reasks > settings.max_reasks_limit:
            raise ApiError(422, "validation_error", f"max_reasks may be at most {settings.max_reasks_limit}")
        trace_context = tracing.new_job_context(request_id, tenant=tenant, claim=trace_claims)
        run = _run_fields(runtime, body, settings, client_output=client_output, names=names, inline=inline)
        job = JobRecord(job_id=job_id or f"job_{uuid.uuid4().hex}", request_id=request_id, tenant=tenant,
                        messages=messages, tools=names, response=response,
                        inline_tools=inline, tool_choice=body.tool_choice if isinstance(body.tool_choice, str)
                        else body.tool_choice.model_dump(), parallel_tool_calls=body.parallel_tool_calls,
                        max_reasks=max_reasks, client_output=client_output, trace_context=trace_context, **run)
        # the client's output is checked twice (refused if malformed, then as the job's step 0): one set of specs
        specs = job_specs(runtime, job, inline=inline_specs) if client_output is not None else None
        _refuse_invalid_calls(body, specs)  # the client's own malformed calls: 422 with their paths, nothing stored
        body_hash = hashlib.sha256(body.model_dump_json().encode()).hexdigest() if idempotency_key else None
        # The client's own calls are checked here and stored decided, their calls queued straight to the tool
        # queues: no decide task (unless the check needs a decider's re-ask). The one path MCP takes too.
        job, created = submit(runtime, job, enqueue=enqueue, dispatch=rerun, idempotency_key=idempotency_key,
                              body_hash=body_hash, specs=specs)  # a broker refusal: the job ended failed, 503
        if created:  # its ``job.created`` line is the submit's (MCP's jobs have one too)
            jobs_created.labels(tenant).inc()
        return job, created

    @app.post("/v1/jobs/{job_id}/calls/{call_id}/approve", tags=["jobs"])
    def approve_call(job_id: str, call_id: str, tenant: Tenant, body: ApprovalBody | None = None) -> dict[str, Any]:
        """Approve a call waiting for a person, optionally with edited arguments (validated again); when no call of
        the step waits any more, the run resumes. Approving twice answers the same."""
        return _resolve(job_id, call_id, tenant, "approve", arguments=body.arguments if body else None)

    @app.post("/v1/jobs/{job_id}/calls/{call_id}/reject", tags=["jobs"])
    def reject_call(job_id: str, call_id: str, tenant: Tenant, body: RejectionBody | None = None) -> dict[str, Any]:
        """Reject a waiting call: it never runs, and the model sees the reason as the call's result."""
        return _resolve(job_id, call_id, tenant, "reject", reason=body.reason if body else None)

    @app.post("/v1/jobs/{job_id}/review", tags=["jobs"])
    def review_job(job_id: str, tenant: Tenant, body: ReviewBody) -> dict[str, Any]:
        """Resolve a job in ``needs_review``: run the given calls instead (validated again), end it with a text
        answer, or reject the model's proposal (the model sees the reason and decides again)."""
        runtime.store.get(_checked_id(job_id), tenant=tenant)  # 404 first: unknown jobs, other tenants
        if rerun is None:
            raise ApiError(503, "unavailable", "this API process does not queue work")
        calls = [call.model_dump() for call in body.calls] if body.calls is not None else None
        job = review(runtime, _checked_id(job_id), tenant=tenant, calls=calls, answer=body.answer, reject=body.reject,
                     dispatch=rerun, next_step=enqueue)
        return job.public()

    def _resolve(job_id: str, call_id: str, tenant: str, decision: Literal["approve", "reject"], **answer: Any) -> dict[str, Any]:
        runtime.store.get(_checked_id(job_id), tenant=tenant)  # 404 first: unknown jobs, other tenants
        if rerun is None:
            raise ApiError(503, "unavailable", "this API process does not queue work")
        outcome = resolve(runtime, _checked_id(job_id), call_id[:300], tenant=tenant, decision=decision,
                          dispatch=rerun, next_step=enqueue, **answer)
        log.info("job.approval", job_id=job_id, call_id=call_id, decision=decision, resumed=outcome.resumed)
        return outcome.public()

    @app.get("/v1/jobs", tags=["jobs"])
    def list_jobs(tenant: Tenant, limit: int = 50) -> dict[str, Any]:
        limit = max(1, min(limit, 200))
        return {"jobs": runtime.store.list_jobs(tenant, limit=limit)}

    @app.get("/v1/jobs/{job_id}", tags=["jobs"])
    async def get_job(job_id: str, tenant: Tenant, wait: Annotated[float, Query(ge=0)] = 0) -> RecordResponse:
        """The record: status, each step with its calls and results, the answer; webhook deliveries when it has any.
        ``wait=S``: answered the moment the job settles (ends or waits for a person), or after S (at most 60)."""
        job = await waiter.job(_checked_id(job_id), tenant=tenant, wait_s=wait)
        data = job.public()
        if job.webhook_url or settings.webhook_urls:
            data["webhooks"] = await run_in_threadpool(deliveries, runtime, job.job_id)
        return RecordResponse(data)

    @app.post("/v1/jobs/{job_id}/cancel", tags=["jobs"])
    def cancel_job(job_id: str, tenant: Tenant) -> JSONResponse:
        """Stop a job: calls not yet started end ``call_cancelled`` and never run; a running one is stopped. A job in
        ``needs_review`` can be cancelled too (ordered against a review by one compare-and-set each)."""
        runtime.store.get(_checked_id(job_id), tenant=tenant)  # 404 for other tenants
        job, cancelled = cancel(runtime, job_id, "the job was cancelled by its owner")
        if not cancelled:
            raise ApiError(409, "already_terminal", f"job {job_id} already ended: {job.status}", job_status=job.status)
        log.info("job.cancelled", job_id=job_id, tenant=tenant)
        return JSONResponse({"job_id": job_id, "request_id": job.request_id, "status": job.status})

    @app.get("/v1/jobs/{job_id}/events", tags=["jobs"])
    async def job_events(job_id: str, tenant: Tenant, last_event_id: Annotated[str | None, Header()] = None,
                         timeout_s: float = 60.0) -> StreamingResponse:
        """SSE of the job's state changes until it ends, ``timeout_s`` passes or the client goes away.

        A coroutine per stream, never a thread; ``: heartbeat`` comments every ``TOOLRAIL_SSE_HEARTBEAT_S``
        while idle; at most ``TOOLRAIL_SSE_MAX_STREAMS_PER_TENANT`` open streams per tenant (429 beyond).
        """
        await asyncio.to_thread(runtime.store.get, _checked_id(job_id), tenant=tenant)  # 404 for other tenants
        start = last_event_id if last_event_id and _valid_stream_id(last_event_id) else "0"
        if not stream_slots.acquire(tenant):
            raise ApiError(429, "too_many_streams", f"at most {stream_slots.limit} open event streams per tenant; close "
                           "one first", limit=stream_slots.limit)
        stream = job_event_stream(events_redis.client(), runtime.store.events_key(job_id), last_id=start,
                                  duration_s=max(1.0, min(timeout_s, 300.0)), heartbeat_s=settings.sse_heartbeat_s)
        return SlotStreamingResponse(stream, slots=stream_slots, tenant=tenant, media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    app.include_router(trace_router(runtime, Tenant))
    app.include_router(console_router(runtime, settings, Tenant, stream_slots=stream_slots))  # /console, /v1/console/*
    if mount_openai is None:
        mount_openai = settings.decider in {"embedded", "triton"}
    if mount_openai:
        try:
            from executor.api.responses import add_openai_endpoints  # lazy: torch, only where this API decides

            add_openai_endpoints(
                app, settings, runtime.store, tenant=rate_limited(tenant_of),
                models=[m["id"] for m in _served_models(settings, created=started_at)], waiter=waiter,
                create=lambda body, request_id, tenant, job_id, response: _create_job(
                    body, request_id, tenant, None, job_id=job_id, response=response)[0],
                resolve=lambda job_id, call_id, tenant, decision: _resolve(job_id, call_id, tenant, decision),
                tool_names=lambda tenant: _resolve_tools(runtime, JobCreate(), settings, tenant=tenant)[0])
        except ImportError as exc:
            log.warning("openai_endpoint.unavailable", error=str(exc))
    app.state.lifespans = []  # an extension's background work, run for as long as the app serves
    surface = ApiSurface(settings, JobDesk(runtime, enqueue, rerun), Depends(rate_limited(tenant_of)),
                         rate_limiter=getattr(app.state, "rate_limiter", None))
    for mount in installed(API_GROUP):  # mcpbridge: /mcp, /v1/mcp-servers
        mount(app, surface)
    return app




def _served_models(settings: Settings, *, created: int) -> list[dict[str, Any]]:
    """OpenAI model objects for the decider this process serves (none when ``decider=none``)."""
    if settings.decider == "none":
        return []
    if settings.decider == "triton":
        model_id = settings.triton_model
    elif settings.decider == "custom":
        model_id = settings.model or "custom"
    else:
        model_id = settings.model or DEFAULT_MODEL_NAME
    return [{"id": model_id, "object": "model", "created": created, "owned_by": "toolrail", "backend": settings.decider}]


def _checked_id(job_id: str) -> str:
    if len(job_id) > 100 or not all(c.isalnum() or c in "_-" for c in job_id):
        raise JobNotFoundError(f"job {job_id[:100]!r} not found")
    return job_id


def _valid_stream_id(value: str) -> bool:
    left, _, right = value.partition("-")
    return left.isdigit() and (right.isdigit() or right == "")


def _resolve_tools(runtime: Runtime, body: JobCreate, settings: Settings,
                   tenant: str = "default") -> tuple[list[str], list[ToolSpec]]:
    """The job's registered (or MCP) tool names, and its inline tools' specs, each checked: 422 for any refused."""
    if body.tools is None:
        return runtime.registry.names() + sorted(runtime.tenant_specs(tenant)), []
    # the tenant's MCP tools are read only when a name is not a registered tool (no Redis read otherwise)
    unknown = any(isinstance(item, str) and item not in runtime.registry for item in body.tools)
    mcp = sorted(runtime.tenant_specs(tenant)) if unknown else []
    names, inline = [], []
    for index, item in enumerate(body.tools):
        if isinstance(item, str):
            try:
                if item not in mcp:
                    runtime.registry.get(item)
            except UnknownToolError:
                raise ApiError(422, "unknown_tool", f"unknown tool {item!r}", tool=item, known=runtime.registry.names()) from None
            names.append(item)
        else:
            fn = item.function
            if fn.name in runtime.registry:
                raise ApiError(422, "tool_name_taken", f"inline tool {fn.name!r} has the name of a registered tool", tool=fn.name)
            try:
                check_client_schema(fn.parameters, path=f"/tools/{index}/function/parameters",
                                    max_bytes=settings.max_schema_bytes, max_depth=settings.max_schema_depth)
                validator_for(fn.parameters)  # the metaschema check, with patterns compiled for RE2
                spec = ToolSpec.from_openai(item.model_dump())
            except SchemaRejectedError as exc:  # recursive $ref, too large or deep, a pattern RE2 cannot run
                raise ApiError(422, exc.type, f"tool {fn.name!r}: {exc}", tool=fn.name, **exc.details) from None
            except (SchemaError, ValueError) as exc:
                message = exc.message if isinstance(exc, SchemaError) else str(exc)
                raise ApiError(422, "invalid_tool_schema", f"tool {fn.name!r}: {message}", tool=fn.name) from None
            inline.append(spec)
    return names, inline


def _celery_ping() -> tuple[int, set[str]]:
    """How many workers answer, and the queues they consume (one broadcast, as a ping)."""
    from executor.worker.celery import app as celery_app  # lazy: the Celery app reads REDIS_URL at import

    replies = celery_app.control.inspect(timeout=0.5).active_queues() or {}
    return len(replies), {queue["name"] for queues in replies.values() for queue in queues or []}


class _QueueDepth:
    """Prometheus collector: the depth of every Celery queue, read at scrape time."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    def collect(self):  # noqa: ANN201 - prometheus collector protocol
        gauge = GaugeMetricFamily("toolrail_queue_depth", "Messages waiting per Celery queue", labels=["queue"])
        age = GaugeMetricFamily("toolrail_queue_oldest_age_seconds", "Age of the oldest message per Celery queue "
                                "(from its publish-time header; 0 when empty)", labels=["queue"])
        try:
            queues = worker_queues(self._runtime.registry)  # the workers' own list (webhooks included)
            pipe = self._runtime.redis.pipeline()
            for queue in queues:
                pipe.llen(queue)
                pipe.lindex(queue, -1)  # kombu pushes left and pops right: the oldest message is last
            replies, now = pipe.execute(), time.time()
            for queue, depth, oldest in zip(queues, replies[::2], replies[1::2], strict=True):
                gauge.add_metric([queue], depth)
                age.add_metric([queue], message_age_s(oldest, now=now))
        except redis.RedisError:
            pass
        yield gauge
        yield age
