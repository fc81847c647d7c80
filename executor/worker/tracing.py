"""Where the worker's tasks meet ``toolrail.tracing``: Celery's instrumentation, the queue-wait span, the job's trace.

- :func:`instrument_celery` — OpenTelemetry's Celery instrumentation (the producer injects W3C
  context into the message headers on ``before_task_publish``; the worker extracts it on
  ``task_prerun``), plus a ``queue wait {queue}`` span per task: from the publish time stamped in
  the ``toolrail_published_at`` header to the task's start. Workers call it in
  ``worker_process_init`` (after the prefork fork, so the batch processor's thread lives in the
  pool process); publishing processes (the API) call it at start. A worker with no span sink
  only relays the context (current while a task runs, injected into what it publishes): the
  spans of each task would go nowhere, and making them costs every task.
- :func:`in_job_trace` — wraps ``enqueue(job)``/``dispatch(job, call)`` so what they publish is a
  child of the job's span (the reconciler's requeues included).
- :func:`step` — the ``step {n}`` span of a decide task (a call's ``execute_tool`` span is a stage of the call
  pipeline: ``executor.calls.stages.Span``).

The API's side (its instrumentation, the trace endpoint) is ``executor.api.tracing``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from celery.signals import before_task_publish, task_postrun, task_prerun
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from toolrail import tracing
from toolrail.logging import get_logger

__all__ = ["CONTEXT_HEADERS", "PUBLISHED_AT_HEADER", "StepScope", "in_job_trace", "instrument_celery", "message_age_s",
           "step"]

log = get_logger("toolrail.tracing")

#: Celery message header: when the message was published (epoch seconds, the publisher's clock).
PUBLISHED_AT_HEADER = "toolrail_published_at"
#: What instrumented Celery in this process: (pid, "spans" or "relay").
_instrumented: dict[str, tuple[int, str]] = {}
#: The W3C headers a task message carries.
CONTEXT_HEADERS = ("traceparent", "tracestate", "baggage")


# ----------------------------------------------------------------- Celery


def instrument_celery(kind: str, **setup_options: Any) -> None:
    """Set up tracing for a process that publishes or runs tasks, and instrument Celery (once per process).

    A process whose spans go nowhere (no sink: ``tracing.recording()`` is false) gets the context relay
    instead of the instrumentation: a client's ``traceparent`` and the job's trace still reach workers
    that do record, with no span made per task or publish."""
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
        carrier = {key: value for key in CONTEXT_HEADERS if isinstance(value := _header(task.request, key), str)}
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
    carrier = {key: value for key in CONTEXT_HEADERS if isinstance(value := _header(request, key), str)}
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
