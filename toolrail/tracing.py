"""One trace per job: OpenTelemetry setup per process kind, the job's spans, W3C context in dicts.

Every process calls :func:`setup` once with its kind (``api``, ``worker``, ``cli``).
The SDK's tracer provider is always installed (so a ``traceparent`` is generated when a request
brings none), but nothing leaves the process unless a sink is configured:

- ``OTEL_EXPORTER_OTLP_ENDPOINT`` set: OTLP/HTTP export (batch processor);
- ``TOOLRAIL_TRACE_STORE=redis``: finished spans go to Redis, one hash per tenant and trace
  (``tr:tenant:<tenant>:trace:<trace_id>``, field = span id, bounded, with a TTL; ``toolrail.trace_sinks``)
  — what ``toolrail run --trace`` and ``GET /v1/jobs/{id}/trace`` read, with no collector;
- ``TOOLRAIL_TRACE_STORE=memory``: the last spans in each process's memory (benchmarks);
- ``memory=True`` (tests, benchmarks): the SDK's in-memory exporter.

The sandbox child has no network: it records its span as data (``toolrail.span_data.ChildRecorder``, no
tracer provider there) and returns it in its result frame; the worker hands it to its own sinks
(:func:`adopt_spans`).

Spans (GenAI semantic conventions where they exist):

    POST /v1/jobs                    HTTP server (FastAPI instrumentation)
      job                            one per job: its id is chosen at POST and stored in
                                     ``JobRecord.trace_context``; the span is written once the
                                     job ends (:func:`end_job`), start = the job's creation
        step {n}                     one decide → run step
          chat {model}               one per decider attempt (tokens, time to first token,
                                     grammar compile time, re-ask number)
          execute_tool {name}        one per call (``gen_ai.tool.call.id``, status, error type)
            sandbox {name}           the sandbox child (the tool process's life)

Content (messages, arguments, results) is recorded only with ``TOOLRAIL_TRACE_CONTENT=1``.

Trace ids are per tenant. A job's context carries its tenant as baggage (``toolrail.tenant``, set at
submission, a client's own entry of that name dropped); every span started under it gets the
``toolrail.tenant`` attribute (``toolrail.trace_sinks.TenantStamp``), the API's server spans get it from the
authenticated key (:func:`tag_tenant`), and the Redis sink keys spans by it. A client's
``traceparent`` whose trace id another tenant already used starts a new trace, linked to the foreign
one (:func:`new_job_context` with a ``claim``): a job's trace never shows another tenant's spans.
In the API process baggage is trusted only in contexts toolrail attached itself (a stored job
context), never as a request brought it.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from toolrail.span_data import SCOPE
from toolrail.trace_sinks import (TENANT_ATTRIBUTE, BoundedMemoryExporter, RedisSpanExporter, TenantStamp,
                                  span_from_dict)
from toolrail.redis_embed import redis_url
from toolrail.settings import get_settings

if TYPE_CHECKING:
    from toolrail.settings import Settings

__all__ = [
    "CONTENT_ENV",
    "MAX_CHILD_SPANS",
    "PARENT_KEY",
    "REQUEST_ID_BAGGAGE",
    "SCOPE",
    "SENSITIVE",
    "TENANT_ATTRIBUTE",
    "TENANT_BAGGAGE",
    "adopt_spans",
    "capture_content",
    "child_context",
    "context_from",
    "current_context",
    "end_job",
    "execute_tool_span",
    "finish_chat",
    "inject",
    "job_context",
    "link_to",
    "memory_exporter",
    "name_step",
    "new_job_context",
    "record_decision",
    "record_tool",
    "recording",
    "setup",
    "start_chat",
    "step_span",
    "tag_request",
    "tag_tenant",
    "trace_id_of",
    "tracer",
    "use_context",
]

#: Environment switch of content capture (messages, tool arguments and results): off unless "1".
CONTENT_ENV = "TOOLRAIL_TRACE_CONTENT"
#: ``trace_context`` key holding the span id of the job span's parent (the POST's server span).
PARENT_KEY = "toolrail_parent_span_id"
#: Set on every span that carries content (messages, tool arguments or results): filter or redact on it.
SENSITIVE = "toolrail.sensitive"
#: Baggage entry carrying the request id across every hop.
REQUEST_ID_BAGGAGE = "toolrail.request_id"
#: Baggage entry (set by toolrail, never taken from a client) and span attribute naming the job's tenant.
TENANT_BAGGAGE = TENANT_ATTRIBUTE
#: ``trace_context`` key: ``<trace id>-<span id>`` of a client's parent span in another tenant's trace (linked to).
LINKED_KEY = "toolrail_linked_span"
#: Context key (never propagated) marking a context toolrail attached from a stored job context: baggage trusted.
_OWN_CONTEXT = otel_context.create_key("toolrail-own-context")
#: Most spans a sandbox child may hand back per call (the rest are dropped).
MAX_CHILD_SPANS = 16
_MAX_ATTRIBUTE_CHARS = 4000

_lock = threading.Lock()
_state: dict[str, Any] = {"pid": None, "provider": None, "kind": None, "processors": [], "memory": None}


# ----------------------------------------------------------------- setup


def setup(kind: str, *, settings: Settings | None = None, memory: bool = False, redis_client: Any = None,
          exporters: Sequence[SpanExporter] = ()) -> TracerProvider:
    """Install (once per process, again after a fork) the tracer provider of a process ``kind``.

    Sinks: OTLP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set; Redis when the settings say
    ``trace_store=redis``; the in-memory exporter with ``memory``; any ``exporters`` given.
    Calling it again in the same process adds sinks not yet there (a test's memory exporter).
    """
    if settings is None:
        settings = get_settings()
    with _lock:
        if _state["pid"] != os.getpid():
            _state.update(pid=os.getpid(), kind=kind, processors=[], memory=None,
                          provider=_new_provider(kind, settings))
        provider: TracerProvider = _state["provider"]
        wanted: list[tuple[str, Any]] = []  # (name, processor factory): built only when not there yet
        if settings.otlp_endpoint:
            wanted.append(("otlp", _otlp_processor))
        if settings.trace_store == "memory":
            wanted.append(("bounded", lambda: BatchSpanProcessor(BoundedMemoryExporter())))
        if settings.trace_store == "redis":
            def redis_processor() -> SpanProcessor:
                client = redis_client if redis_client is not None else _redis_of(settings)
                return BatchSpanProcessor(RedisSpanExporter(client, ttl_s=settings.trace_store_ttl_s,
                                                            max_spans=settings.trace_store_max_spans),
                                          schedule_delay_millis=200)
            # one sink per Redis: a later call with another client (a test's own database) adds its own
            wanted.append(("redis" if redis_client is None else f"redis:{id(redis_client)}", redis_processor))
        if memory:
            if _state["memory"] is None:
                _state["memory"] = InMemorySpanExporter()
            wanted.append(("memory", lambda: SimpleSpanProcessor(_state["memory"])))
        for exporter in exporters:
            wanted.append((f"exporter:{id(exporter)}", lambda exporter=exporter: BatchSpanProcessor(exporter)))
        present = {name for name, _ in _state["processors"]}
        for name, factory in wanted:
            if name not in present:
                processor = factory()
                provider.add_span_processor(processor)
                _state["processors"].append((name, processor))
        return provider


def _otlp_processor() -> SpanProcessor:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: PLC0415 - only when on

    return BatchSpanProcessor(OTLPSpanExporter())


def _new_provider(kind: str, settings: Settings) -> TracerProvider:
    service = os.environ.get("OTEL_SERVICE_NAME") or f"toolrail-{kind}"
    resource = Resource.create({"service.name": service, "service.namespace": "toolrail", "process.pid": os.getpid(),
                                "toolrail.process.kind": kind,
                                "deployment.environment.name": settings.environment or "local"})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(TenantStamp(trust_incoming=kind != "api", own=_OWN_CONTEXT))
    trace.set_tracer_provider(provider) if _global_unset() else _ProxySwap.swap(provider)
    return provider


def _global_unset() -> bool:
    return type(trace.get_tracer_provider()).__name__ == "ProxyTracerProvider"


class _ProxySwap:
    """After a fork the global provider (set once per process by OTel) must point at the child's provider."""

    @staticmethod
    def swap(provider: TracerProvider) -> None:
        trace._TRACER_PROVIDER = provider  # noqa: SLF001 - OTel allows one set per process; a fork is a new process


def _redis_of(settings: Settings) -> Any:
    import redis  # noqa: PLC0415

    return redis.Redis.from_url(redis_url(settings), socket_timeout=5, socket_connect_timeout=5)


def recording() -> bool:
    """Whether finished spans go anywhere in this process (else toolrail skips optional work for them)."""
    return bool(_state["processors"]) and _state["pid"] == os.getpid()


def tracer() -> trace.Tracer:
    """toolrail's tracer (the process's provider, or OTel's no-op one before :func:`setup`)."""
    provider = _state["provider"] if _state["pid"] == os.getpid() else None
    return (provider or trace.get_tracer_provider()).get_tracer(SCOPE)


def memory_exporter() -> InMemorySpanExporter | None:
    """The in-memory exporter of this process, when :func:`setup` installed one."""
    return _state["memory"] if _state["pid"] == os.getpid() else None


def capture_content() -> bool:
    """Whether message content, tool arguments and results may be recorded (``TOOLRAIL_TRACE_CONTENT=1``)."""
    return os.environ.get(CONTENT_ENV, "") == "1"


# ----------------------------------------------------------------- W3C context in dicts


def inject(carrier: dict[str, str] | None = None, *, context: otel_context.Context | None = None) -> dict[str, str]:
    """Write the W3C ``traceparent``/``tracestate``/``baggage`` of ``context`` (default: current) into a dict."""
    carrier = {} if carrier is None else carrier
    propagate.inject(carrier, context=context)
    return carrier


def context_from(carrier: Mapping[str, str] | None) -> otel_context.Context | None:
    """The context a dict carries (None when it holds no valid ``traceparent``)."""
    if not carrier or not carrier.get("traceparent"):
        return None
    ctx = propagate.extract(dict(carrier))
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def _own(ctx: otel_context.Context) -> otel_context.Context:
    """``ctx`` marked as attached by toolrail from a stored job context (its baggage is toolrail's)."""
    return otel_context.set_value(_OWN_CONTEXT, True, ctx)


def current_context() -> dict[str, str]:
    """The current span's W3C context as a dict (empty when no valid span is current)."""
    if not trace.get_current_span().get_span_context().is_valid:
        return {}
    return inject()


@contextlib.contextmanager
def use_context(carrier: Mapping[str, str] | None) -> Iterator[None]:
    """Make the context of ``carrier`` current for a block (nothing when it carries none)."""
    ctx = context_from(carrier)
    if ctx is None:
        yield
        return
    token = otel_context.attach(_own(ctx))
    try:
        yield
    finally:
        otel_context.detach(token)


@contextlib.contextmanager
def job_context(trace_context: Mapping[str, str] | None, *, switch: bool = False) -> Iterator[None]:
    """Run a block inside the job's trace.

    By default the current span stays the parent when it is already in the job's trace; otherwise
    (a reconciler-requeued or redelivered task without headers) the job span becomes the parent.
    With ``switch`` the job span is always the parent (publishing a step: each step hangs off the
    job). A current span of another trace gets a link to the job span.
    """
    job_ctx = context_from(trace_context)
    if job_ctx is None:
        yield
        return
    current = trace.get_current_span().get_span_context()
    same = current.is_valid and current.trace_id == trace.get_current_span(job_ctx).get_span_context().trace_id
    if same and not switch:
        yield
        return
    if current.is_valid and not same:
        link_to(trace_context)
    token = otel_context.attach(_own(job_ctx))
    try:
        yield
    finally:
        otel_context.detach(token)


def child_context() -> dict[str, str]:
    """The current context for a child process's envelope, or ``{}`` when nothing here records spans."""
    return current_context() if recording() else {}


def link_to(trace_context: Mapping[str, str] | None) -> None:
    """Link the current span to the span ``trace_context`` names (later polls, event streams, webhooks)."""
    ctx = context_from(trace_context)
    span = trace.get_current_span()
    if ctx is None or not span.is_recording():
        return
    target = trace.get_current_span(ctx).get_span_context()
    with contextlib.suppress(Exception):  # a span that no longer takes links: nothing to record
        span.add_link(target, {"toolrail.link": "job"})


# ----------------------------------------------------------------- the job span


def new_job_context(request_id: str, *, tenant: str | None = None,
                    claim: Callable[[str, str], str | None] | None = None) -> dict[str, str]:
    """At ``POST /v1/jobs``: choose the job span's id (a child of the current span, or a new trace)
    and return its W3C context, with the request id and ``tenant`` as baggage, for ``JobRecord.trace_context``.

    ``claim(trace_id, tenant)`` returns the tenant that owns a trace id (claiming it when unowned): when the
    current trace (a client's ``traceparent``) belongs to another tenant, the job starts a new trace whose job
    span links to the client's parent span (``LINKED_KEY``) and never joins the foreign one."""
    parent = trace.get_current_span().get_span_context()
    foreign = None
    if parent.is_valid and tenant is not None and claim is not None \
            and claim(format(parent.trace_id, "032x"), tenant) != tenant:
        foreign, parent = parent, trace.INVALID_SPAN_CONTEXT
    provider = _state["provider"] if _state["pid"] == os.getpid() else None
    ids = provider.id_generator if provider is not None else None
    if ids is None:
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator  # noqa: PLC0415

        ids = RandomIdGenerator()
    trace_id = parent.trace_id if parent.is_valid else ids.generate_trace_id()
    span = SpanContext(trace_id, ids.generate_span_id(), is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED),
                       trace_state=parent.trace_state if parent.is_valid else None)
    ctx = trace.set_span_in_context(trace.NonRecordingSpan(span))
    ctx = baggage.set_baggage(REQUEST_ID_BAGGAGE, request_id, context=ctx)
    ctx = baggage.set_baggage(TENANT_BAGGAGE, tenant, context=ctx) if tenant is not None else \
        baggage.remove_baggage(TENANT_BAGGAGE, context=ctx)  # a client's entry of that name never travels on
    carrier = inject(context=ctx)
    if parent.is_valid:
        carrier[PARENT_KEY] = format(parent.span_id, "016x")
    if foreign is not None:
        carrier[LINKED_KEY] = f"{foreign.trace_id:032x}-{foreign.span_id:016x}"
    return carrier


def end_job(job: Any, *, status: str | None = None) -> None:
    """Write the job span (start: the job's creation; end: now) once the job has ended.

    Safe to call twice (the Redis sink keys spans by id; OTLP receivers see a duplicate).
    """
    if not recording():  # before parsing the context: nothing to write it to
        return
    ctx = context_from(getattr(job, "trace_context", None))
    if ctx is None:
        return
    span_ctx = trace.get_current_span(ctx).get_span_context()
    own = SpanContext(span_ctx.trace_id, span_ctx.span_id, is_remote=False, trace_flags=span_ctx.trace_flags)
    parent_hex = job.trace_context.get(PARENT_KEY)
    parent = SpanContext(span_ctx.trace_id, int(parent_hex, 16), is_remote=True) if parent_hex else None
    status = status or str(getattr(job, "status", ""))
    error_type = getattr(getattr(job, "error", None), "type", None)  # the job's RecordedError, if any
    attributes: dict[str, Any] = {"toolrail.job.id": job.job_id, "toolrail.request_id": job.request_id,
                                  "toolrail.job.status": status, "toolrail.tenant": getattr(job, "tenant", "")}
    if status not in ("succeeded",) and error_type:
        attributes["error.type"] = str(error_type)
    links = []
    linked = str(job.trace_context.get(LINKED_KEY) or "").split("-")
    if len(linked) == 2 and len(linked[0]) == 32 and len(linked[1]) == 16:
        with contextlib.suppress(ValueError):
            links.append(Link(SpanContext(int(linked[0], 16), int(linked[1], 16), is_remote=True),
                              {"toolrail.link": "client_parent_in_another_tenants_trace"}))
    span = ReadableSpan(name="job", context=own, parent=parent, resource=_state["provider"].resource,
                        attributes=attributes, kind=SpanKind.INTERNAL, links=links,
                        status=Status(StatusCode.OK if status == "succeeded" else StatusCode.ERROR,
                                      None if status == "succeeded" else status),
                        start_time=int(float(job.created_at) * 1e9), end_time=time.time_ns(),
                        instrumentation_scope=InstrumentationScope(SCOPE))
    _deliver([span])


# ----------------------------------------------------------------- spans of a run


def tag_tenant(tenant: str) -> None:
    """Put the authenticated tenant on the current span (the API's server span): the Redis sink keys it so."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attribute(TENANT_ATTRIBUTE, tenant)


def tag_request(request_id: str) -> None:
    """Put the request id on the current span (the API's server span)."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attribute("toolrail.request_id", request_id)


def name_step(span: trace.Span, job: Any) -> None:
    """Name a ``step`` span after the job's step once known, with the job's status and attempts so far."""
    if not span.is_recording():
        return
    span.update_name(f"step {job.step}")
    span.set_attribute("toolrail.step", int(job.step))
    span.set_attribute("toolrail.job.status", str(job.status))
    span.set_attribute("toolrail.decision.attempts", len(getattr(job, "attempts", []) or []))


def _request_attributes(span: trace.Span) -> None:
    request_id = baggage.get_baggage(REQUEST_ID_BAGGAGE)
    if request_id:
        span.set_attribute("toolrail.request_id", str(request_id))


@contextlib.contextmanager
def step_span(job_id: str, step: int | None = None, **attributes: Any) -> Iterator[trace.Span]:
    """``step {n}``: one decide → run step of a job (name the step later with ``name_step`` when unknown here)."""
    with tracer().start_as_current_span("step" if step is None else f"step {step}", kind=SpanKind.INTERNAL) as span:
        span.set_attribute("toolrail.job.id", job_id)
        if step is not None:
            span.set_attribute("toolrail.step", step)
        _set(span, attributes)
        _request_attributes(span)
        yield span


def start_chat(model: str, *, attempt: int, provider: str = "toolrail",
               messages: Sequence[Mapping[str, Any]] | None = None) -> trace.Span:
    """A ``chat {model}`` span started (not made current) for one attempt that is decided, then checked:
    make it current around the model call (``trace.use_span``), end it with :func:`finish_chat`."""
    span = tracer().start_span(f"chat {model}", kind=SpanKind.CLIENT, record_exception=False)
    span.set_attribute("gen_ai.operation.name", "chat")
    span.set_attribute("gen_ai.provider.name", provider)
    span.set_attribute("gen_ai.request.model", model)
    span.set_attribute("toolrail.decision.attempt", attempt)
    span.set_attribute("toolrail.decision.reask", attempt)
    _request_attributes(span)
    if messages is not None and capture_content():
        span.set_attribute("gen_ai.input.messages", _clip(json.dumps(list(messages), ensure_ascii=False, default=str)))
        span.set_attribute(SENSITIVE, True)
    return span


def finish_chat(span: trace.Span, *, errors: Sequence[Mapping[str, Any]] = (), error_type: str | None = None) -> None:
    """End an attempt's ``chat`` span with what the check found (re-asked when errors were found)."""
    if span.is_recording():
        span.set_attribute("toolrail.decision.check_errors", len(errors))
        validators = sorted({str(e.get("validator")) for e in errors if e.get("validator")})
        if validators:
            span.set_attribute("toolrail.decision.check_validators", validators)
        if error_type:
            span.set_attribute("error.type", error_type)
            span.set_status(Status(StatusCode.ERROR, error_type))
    span.end()


def record_decision(span: trace.Span, *, usage: Mapping[str, Any], finish_reason: str | None = None,
                    output: str | None = None) -> None:
    """Put a decision's figures on its ``chat`` span: tokens, time to first token, grammar times."""
    if not span.is_recording():
        return
    figures = {
        "gen_ai.usage.input_tokens": usage.get("prompt_tokens"),
        "gen_ai.usage.output_tokens": usage.get("completion_tokens"),
        "toolrail.decision.time_to_first_token_s": _seconds(usage.get("ttft_us")),
        "toolrail.grammar.compile_s": _seconds(usage.get("grammar_compile_us")),
        "toolrail.grammar.mask_s": _seconds(usage.get("grammar_mask_us")),
        "toolrail.decision.candidates_s": _seconds(usage.get("candidates_us")),
    }
    for key, value in figures.items():
        if value is not None:
            span.set_attribute(key, value)
    if finish_reason:
        span.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
    if output is not None and capture_content():
        span.set_attribute("gen_ai.output.messages", _clip(output))
        span.set_attribute(SENSITIVE, True)


@contextlib.contextmanager
def execute_tool_span(name: str, call_id: str, *, arguments: Any = None, **attributes: Any) -> Iterator[trace.Span]:
    """``execute_tool {name}``: one call's run (GenAI execute_tool span). Record the end with :func:`record_tool`."""
    with tracer().start_as_current_span(f"execute_tool {name}", kind=SpanKind.INTERNAL, record_exception=False) as span:
        span.set_attribute("gen_ai.operation.name", "execute_tool")
        span.set_attribute("gen_ai.tool.name", name)
        span.set_attribute("gen_ai.tool.call.id", call_id)
        span.set_attribute("gen_ai.tool.type", "function")
        _set(span, attributes)
        _request_attributes(span)
        if arguments is not None and capture_content():  # sensitive: opt-in only
            span.set_attribute("gen_ai.tool.call.arguments", _clip(json.dumps(arguments, ensure_ascii=False, default=str)))
            span.set_attribute(SENSITIVE, True)
        yield span


def record_tool(span: trace.Span, *, status: str, error: Mapping[str, Any] | None = None, result: Any = None,
                replayed: bool = False) -> None:
    """The outcome of an ``execute_tool`` span: status, error type, and (opt-in) the result."""
    if not span.is_recording():
        return
    span.set_attribute("toolrail.call.status", status)
    if replayed:
        span.set_attribute("toolrail.call.replayed", True)
    if error:
        span.set_attribute("error.type", str(error.get("type", "tool_error")))
        span.set_status(Status(StatusCode.ERROR, str(error.get("message", ""))[:200]))
    elif result is not None and capture_content():
        span.set_attribute("gen_ai.tool.call.result", _clip(json.dumps(result, ensure_ascii=False, default=str)))
        span.set_attribute(SENSITIVE, True)


def _set(span: trace.Span, attributes: Mapping[str, Any]) -> None:
    for key, value in attributes.items():
        if value is not None:
            span.set_attribute(key if "." in key else f"toolrail.{key}", value)


def _seconds(micros: Any) -> float | None:
    return None if micros is None else round(float(micros) / 1e6, 6)


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_ATTRIBUTE_CHARS else text[:_MAX_ATTRIBUTE_CHARS] + "…"


# ----------------------------------------------------------------- spans a sandbox child returned


def adopt_spans(items: Any, *, trace_context: Mapping[str, str] | None) -> int:
    """Hand spans a sandbox child returned to this process's sinks; only spans of the call's own trace
    are taken, at most :data:`MAX_CHILD_SPANS`. Returns how many were taken."""
    ctx = context_from(trace_context)
    if not isinstance(items, list) or ctx is None or not recording():
        return 0
    trace_id = format(trace.get_current_span(ctx).get_span_context().trace_id, "032x")
    tenant = baggage.get_baggage(TENANT_BAGGAGE, ctx)  # the call's, never what the child wrote
    spans = []
    for item in items[:MAX_CHILD_SPANS]:
        try:
            if isinstance(item, dict) and item.get("trace_id") == trace_id:
                attributes = {k: v for k, v in dict(item.get("attributes") or {}).items() if k != TENANT_ATTRIBUTE}
                if tenant:
                    attributes[TENANT_ATTRIBUTE] = str(tenant)
                spans.append(span_from_dict({**item, "attributes": attributes}))
        except (KeyError, ValueError, TypeError):
            continue
    _deliver(spans)
    return len(spans)


def _deliver(spans: list[ReadableSpan]) -> None:
    for span in spans:
        for _, processor in list(_state["processors"]):
            processor.on_end(span)


def trace_id_of(trace_context: Mapping[str, str] | None) -> str | None:
    """The trace id (32 hex) a stored context names, or None."""
    ctx = context_from(trace_context)
    if ctx is None:
        return None
    return format(trace.get_current_span(ctx).get_span_context().trace_id, "032x")
