"""Where the executor's processes meet ``toolrail.tracing``: Celery, the API, the trace endpoint.

- :func:`instrument_celery` — OpenTelemetry's Celery instrumentation (the producer injects W3C
  context into the message headers on ``before_task_publish``; the worker extracts it on
  ``task_prerun``), plus a ``queue wait {queue}`` span per task: from the publish time stamped in
  the ``toolrail_published_at`` header to the task's start. Workers call it in
  ``worker_process_init`` (after the prefork fork, so the batch processor's thread lives in the
  pool process); publishing processes (the API) call it at start. A worker with no span sink
  only relays the context (current while a task runs, injected into what it publishes): the
  spans of each task would go nowhere, and making them costs every task.
- :func:`instrument_api` — FastAPI's instrumentation (an incoming ``traceparent`` is honoured, one
  is generated when absent), a link from each later request about a job (polls, event streams,
  the trace itself) to the job's span (a cancelled job's span is written by ``set_status``, as every end's).
- :func:`in_job_trace` — wraps ``enqueue(job)``/``dispatch(job, call)`` so what they publish is a
  child of the job's span (the reconciler's requeues included).
- :func:`step` — the ``step {n}`` span of a decide task (a call's ``execute_tool`` span is a stage of the call
  pipeline: ``executor.calls.stages.Span``).
- :func:`trace_router` — ``GET /v1/jobs/{id}/trace``: the job's spans from the Redis sink, its tenant's only
  (spans are stored per tenant and trace: a trace id two tenants used shows each its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
import time
import typing
from collections.abc import Callable, Iterator
from typing import Any

from celery.signals import before_task_publish, task_postrun, task_prerun
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from toolrail import tracing
from toolrail.trace_sinks import read_trace
from toolrail.logging import get_logger

__all__ = ["PUBLISHED_AT_HEADER", "StepScope", "in_job_trace", "instrument_api", "instrument_celery",
           "message_age_s", "step", "trace_router"]

log = get_logger("toolrail.tracing")

#: Celery message header: when the message was published (epoch seconds, the publisher's clock).
PUBLISHED_AT_HEADER = "toolrail_published_at"
_JOB_PATH = re.compile(r"^/v1/jobs/(job_[0-9a-f]{1,64})(?:/[a-z]+)?$")
#: What instrumented Celery in this process: (pid, "spans" or "relay").
_instrumented: dict[str, tuple[int, str]] = {}
#: The W3C headers a task message carries.
_CONTEXT_HEADERS = ("traceparent", "tracestate", "baggage")


# ----------------------------------------------------------------- Celery


def instrument_celery(kind: str, **setup_options: Any) -> None:
    """Set up tracing for a process that publishes or runs tasks, and instrument Celery (once per process).

    A process whose spans go nowhere (no sink: ``tracing.recording()`` is false) gets the context relay
    instead of the instrumentation: a client's ``traceparent`` and the job's trace still reach workers
    that do record, with no span made per task or publish."""
    import os  # noqa: PLC0415

    provider = tracing.setup(kind, **setup_options)
    mode = "relay" if not tracing.recording() else "spans"
    if _instrumented.get("celery") == (os.getpid(), mode):
        return
    from opentelemetry.instrumentation.celery import CeleryInstrumentor  # noqa: PLC0415

    instrumentor = CeleryInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:  # inherited from a parent process: its tracer is the parent's
        instrumentor.uninstrument()
    _RELAY.disconnect()
    if mode == "relay":
        _RELAY.connect()
    else:
        instrumentor.instrument(tracer_provider=provider)
    _instrumented["celery"] = (os.getpid(), mode)


class _ContextRelay:
    """Celery hooks of a worker that records no spans: the context a task brought is current while it runs and
    goes on in the headers of what it publishes, as under the instrumentation, with no span made per task."""

    def __init__(self) -> None:
        self._tokens: dict[str, object] = {}  # task id → the token of its attached context

    def connect(self) -> None:
        task_prerun.connect(self.enter, weak=False)
        task_postrun.connect(self.leave, weak=False)
        before_task_publish.connect(self.inject, weak=False)

    def disconnect(self) -> None:
        task_prerun.disconnect(self.enter)
        task_postrun.disconnect(self.leave)
        before_task_publish.disconnect(self.inject)
        self._tokens.clear()

    def enter(self, task: Any = None, task_id: str | None = None, **_: object) -> None:
        if task is None or task_id is None:
            return
        carrier = {key: value for key in _CONTEXT_HEADERS if isinstance(value := _header(task.request, key), str)}
        ctx = tracing.context_from(carrier)
        if ctx is not None:
            self._tokens[task_id] = otel_context.attach(ctx)

    def leave(self, task_id: str | None = None, **_: object) -> None:
        token = self._tokens.pop(task_id, None) if task_id is not None else None
        if token is not None:
            otel_context.detach(token)

    @staticmethod
    def inject(headers: dict | None = None, **_: object) -> None:
        if headers is not None:
            tracing.inject(headers)  # nothing when no valid context is current


_RELAY = _ContextRelay()


@before_task_publish.connect
def _stamp_published_at(headers: dict | None = None, **_: object) -> None:
    if headers is not None:
        headers[PUBLISHED_AT_HEADER] = time.time()


@task_prerun.connect
def _queue_wait_span(task: Any = None, **_: object) -> None:
    """A ``queue wait {queue}`` span: publish → start, a child of the publisher's span (clocks of two hosts)."""
    if task is None or not tracing.recording():
        return
    request = task.request
    published = _header(request, PUBLISHED_AT_HEADER)
    if published is None:
        return
    try:
        start_ns = int(float(published) * 1e9)
    except (TypeError, ValueError):
        return
    now_ns = time.time_ns()
    carrier = {key: value for key in _CONTEXT_HEADERS if isinstance(value := _header(request, key), str)}
    parent = tracing.context_from(carrier)
    if parent is None:
        return
    delivery = getattr(request, "delivery_info", None) or {}
    queue = delivery.get("routing_key") or "default"
    span = tracing.tracer().start_span(f"queue wait {queue}", context=parent, kind=SpanKind.CONSUMER,
                                       start_time=min(start_ns, now_ns))
    span.set_attribute("messaging.system", "redis")
    span.set_attribute("messaging.destination.name", queue)
    span.set_attribute("messaging.operation.type", "receive")
    span.set_attribute("toolrail.queue.wait_s", round(max(0, now_ns - start_ns) / 1e9, 6))
    span.set_attribute("celery.task_name", str(getattr(task, "name", "")))
    if delivery.get("redelivered"):
        span.set_attribute("toolrail.queue.redelivered", True)
    span.end(end_time=now_ns)


def message_age_s(raw: bytes | str | None, *, now: float) -> float:
    """How long a queued Celery message has waited, from its ``toolrail_published_at`` header (0 if unknown)."""
    if not raw:
        return 0.0
    try:
        published = json.loads(raw).get("headers", {}).get(PUBLISHED_AT_HEADER)
        return max(0.0, now - float(published)) if published is not None else 0.0
    except (ValueError, TypeError, AttributeError):
        return 0.0


def _header(request: Any, key: str) -> Any:
    value = getattr(request, key, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(key)
    return value


def in_job_trace(publish: Callable[..., Any]) -> Callable[..., Any]:
    """``publish(job, ...)`` run inside the job's trace: the task it queues is a child of the job span."""

    @functools.wraps(publish)
    def wrapper(job: Any, *args: Any, **kwargs: Any) -> Any:
        with tracing.job_context(getattr(job, "trace_context", None), switch=True):
            return publish(job, *args, **kwargs)

    return wrapper


# ----------------------------------------------------------------- the run's spans in the worker


class StepScope:
    """The ``step`` span of a decide task; :meth:`done` names it after the step the task decided."""

    def __init__(self, span: trace.Span | None) -> None:
        self.span = span

    def done(self, job: Any) -> None:
        if self.span is not None:
            tracing.name_step(self.span, job)


@contextlib.contextmanager
def step(runtime_of: Callable[[], Any], job_id: str) -> Iterator[StepScope]:
    """``step {n}`` around a decide task; in the job's trace even when the task brought no context."""
    if not tracing.recording():
        yield StepScope(None)
        return
    carrier = None
    if not trace.get_current_span().get_span_context().is_valid:  # a task published without a context
        with contextlib.suppress(Exception):
            carrier = runtime_of().store.get(job_id).trace_context
    with tracing.job_context(carrier), tracing.step_span(job_id) as span:
        yield StepScope(span)


# ----------------------------------------------------------------- the API


def instrument_api(app: Any, runtime: Any, **setup_options: Any) -> None:
    """FastAPI's instrumentation on ``app``, Celery's for publishing, and links from job requests to the job span.

    Where the API's spans go nowhere (no sink), neither instrumentation runs: a plain ASGI
    middleware makes an incoming ``traceparent`` current for the request (the job joins the
    client's trace, and what the request publishes carries it), and Celery gets the relay.
    The instrumentation cost about 0.85 ms of the API's CPU per job that way (bench/worker_cpu.py).
    """
    instrument_celery("api", **setup_options)
    if not tracing.recording():
        app.add_middleware(_IncomingContext)
        return
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


class _IncomingContext:
    """Plain ASGI middleware of an API that records no spans: the request's W3C context is current while it runs."""

    _NAMES = tuple(name.encode() for name in _CONTEXT_HEADERS)

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        carrier = {name.decode(): value.decode("latin-1") for name, value in scope.get("headers", ())
                   if name in self._NAMES}
        ctx = tracing.context_from(carrier) if carrier else None
        if ctx is None:
            await self.app(scope, receive, send)
            return
        token = otel_context.attach(ctx)
        try:
            await self.app(scope, receive, send)
        finally:
            otel_context.detach(token)


def trace_router(runtime: Any, tenant: Any) -> Any:
    """``GET /v1/jobs/{job_id}/trace``: the job's spans (``TOOLRAIL_TRACE_STORE=redis``), oldest first."""
    from fastapi import APIRouter  # noqa: PLC0415

    from executor.errors import JobNotFoundError  # noqa: PLC0415

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
