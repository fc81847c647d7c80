"""Where finished spans go without a collector, and spans as plain data.

- :func:`span_to_dict` / :func:`span_from_dict` — a span as JSON-able data: the sandbox child's
  result frame carries its spans this way, and the Redis sink stores them so.
- :class:`RedisSpanExporter` — one Redis hash per tenant and trace (``tr:tenant:<tenant>:trace:<trace_id>``:
  span id → JSON; a span without a ``toolrail.tenant`` attribute: ``tr:trace:<trace_id>``), bounded, with a
  TTL; :func:`read_trace` reads one tenant's back (``GET /v1/jobs/{id}/trace``, ``toolrail run --trace``).
- :class:`TenantStamp` — the processor that puts a job context's tenant on every span started under it;
  :class:`TraceClaims` — which tenant first used a trace id (a foreign one starts a new trace).
- :class:`BoundedMemoryExporter` — the last spans in the process's memory (benchmarks).
"""

from __future__ import annotations

import collections
import contextlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry import baggage
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from toolrail.span_data import SCOPE

__all__ = ["BoundedMemoryExporter", "RedisSpanExporter", "TENANT_ATTRIBUTE", "TenantStamp", "TraceClaims",
           "read_trace", "span_from_dict", "span_to_dict", "trace_key"]

#: The span attribute (and baggage entry) naming the tenant whose job a span belongs to.
TENANT_ATTRIBUTE = "toolrail.tenant"


def span_to_dict(span: ReadableSpan) -> dict[str, Any]:
    """A finished span as plain JSON-able data (the sandbox frame and the Redis sink use it)."""
    ctx = span.get_span_context()
    parent = span.parent
    return {
        "name": span.name, "trace_id": format(ctx.trace_id, "032x"), "span_id": format(ctx.span_id, "016x"),
        "parent_span_id": format(parent.span_id, "016x") if parent is not None else None,
        "kind": span.kind.name, "start_ns": span.start_time, "end_ns": span.end_time,
        "status": span.status.status_code.name, "status_description": span.status.description,
        "attributes": {k: list(v) if isinstance(v, tuple) else v for k, v in (span.attributes or {}).items()},
        "events": [{"name": e.name, "time_ns": e.timestamp, "attributes": dict(e.attributes or {})} for e in span.events],
        "links": [{"trace_id": format(link.context.trace_id, "032x"), "span_id": format(link.context.span_id, "016x")}
                  for link in span.links],
        "resource": {k: v for k, v in span.resource.attributes.items() if isinstance(v, (str, int, float, bool))},
        "scope": span.instrumentation_scope.name if span.instrumentation_scope else SCOPE,
    }


def span_from_dict(data: Mapping[str, Any]) -> ReadableSpan:
    """The inverse of :func:`span_to_dict` (raises ``ValueError``/``KeyError``/``TypeError`` on bad data)."""
    trace_id, span_id = int(str(data["trace_id"]), 16), int(str(data["span_id"]), 16)
    parent = data.get("parent_span_id")
    attributes = {str(k): v for k, v in dict(data.get("attributes") or {}).items()
                  if isinstance(v, (str, int, float, bool, list))}
    return ReadableSpan(
        name=str(data["name"])[:200], context=SpanContext(trace_id, span_id, is_remote=False,
                                                          trace_flags=TraceFlags(TraceFlags.SAMPLED)),
        parent=SpanContext(trace_id, int(str(parent), 16), is_remote=True) if parent else None,
        resource=Resource(dict(data.get("resource") or {})), attributes=attributes,
        kind=SpanKind[str(data.get("kind", "INTERNAL"))],
        status=Status(StatusCode[str(data.get("status", "UNSET"))], data.get("status_description")),
        start_time=int(data["start_ns"]), end_time=int(data["end_ns"]),
        instrumentation_scope=InstrumentationScope(str(data.get("scope") or SCOPE)))


class RedisSpanExporter(SpanExporter):
    """Finished spans to Redis, one hash per tenant and trace (``tr:tenant:<tenant>:trace:<trace_id>``: span id →
    JSON; by the span's ``toolrail.tenant``), bounded, with a TTL.

    What ``toolrail run --trace`` and ``GET /v1/jobs/{id}/trace`` read without a collector.
    """

    _PUT = """
    if redis.call('HLEN', KEYS[1]) < tonumber(ARGV[3]) or redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
      redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
    end
    redis.call('EXPIRE', KEYS[1], ARGV[4])
    return 1
    """

    def __init__(self, client: Any, *, ttl_s: int = 86400, max_spans: int = 2000, prefix: str = "tr") -> None:
        self._redis, self._ttl_s, self._max = client, ttl_s, max_spans
        self._prefix = prefix
        self._put = client.register_script(self._PUT)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            pipe = self._redis.pipeline(transaction=False)
            for span in spans:
                data = span_to_dict(span)
                tenant = data["attributes"].get(TENANT_ATTRIBUTE)
                self._put(keys=[trace_key(data["trace_id"], self._prefix, tenant=str(tenant) if tenant else None)],
                          args=[data["span_id"], json.dumps(data, default=str), self._max, self._ttl_s], client=pipe)
            pipe.execute()
        except Exception:  # noqa: BLE001 - a trace sink never fails the work it watches
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


class BoundedMemoryExporter(SpanExporter):
    """The last ``max_spans`` finished spans in this process's memory (``TOOLRAIL_TRACE_STORE=memory``:
    benchmarks measure tracing's own cost with it, no sink's I/O included)."""

    def __init__(self, max_spans: int = 10_000) -> None:
        self.spans: collections.deque[ReadableSpan] = collections.deque(maxlen=max_spans)
        self.exported = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans.extend(spans)
        self.exported += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def trace_key(trace_id: str, prefix: str = "tr", *, tenant: str | None = None) -> str:
    """The hash of one tenant's spans of a trace (``tenant`` None: spans no tenant's job context started)."""
    return f"{prefix}:tenant:{tenant}:trace:{trace_id}" if tenant else f"{prefix}:trace:{trace_id}"


def read_trace(client: Any, trace_id: str, *, tenant: str | None = None, prefix: str = "tr") -> list[dict[str, Any]]:
    """The spans the Redis sink holds for one tenant's trace, by start time."""
    raw = client.hgetall(trace_key(trace_id, prefix, tenant=tenant))
    spans = []
    for value in raw.values():
        with contextlib.suppress(ValueError):
            spans.append(json.loads(value))
    return sorted(spans, key=lambda s: (s.get("start_ns") or 0, s.get("name", "")))


class TraceClaims:
    """Which tenant a trace id belongs to: the first to use it (``tr:trace-owner:<trace_id>``, with the sink's TTL).

    ``claims(trace_id, tenant)`` returns the owner, claiming the id for ``tenant`` when nobody has; when Redis
    does not answer, no tenant owns it for sure, so the caller is told it is foreign (a new trace, safe)."""

    _CLAIM = """
    local owner = redis.call('GET', KEYS[1])
    if owner then return owner end
    redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
    return ARGV[1]
    """

    def __init__(self, client: Any, *, ttl_s: int = 86400, prefix: str = "tr") -> None:
        self._ttl_s, self._prefix = ttl_s, prefix
        self._claim = client.register_script(self._CLAIM)

    def __call__(self, trace_id: str, tenant: str) -> str | None:
        try:
            owner = self._claim(keys=[f"{self._prefix}:trace-owner:{trace_id}"], args=[tenant, self._ttl_s])
        except Exception:  # noqa: BLE001 - a trace claim never fails the request it serves
            return None
        return owner.decode() if isinstance(owner, bytes) else str(owner)


class TenantStamp(SpanProcessor):
    """Put the job's tenant (its context's ``toolrail.tenant`` baggage) on every span started under it.

    ``trust_incoming`` false (the API): a request's own baggage is the client's word, so only contexts toolrail
    attached itself from a stored job context (those carrying the ``own`` context key) are read; the API's
    server spans get the authenticated tenant from ``toolrail.tracing.tag_tenant``."""

    def __init__(self, *, trust_incoming: bool, own: str) -> None:
        self.trust_incoming, self.own = trust_incoming, own

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        ctx = parent_context if parent_context is not None else otel_context.get_current()
        if not self.trust_incoming and not otel_context.get_value(self.own, ctx):
            return
        tenant = baggage.get_baggage(TENANT_ATTRIBUTE, ctx)
        if tenant:
            span.set_attribute(TENANT_ATTRIBUTE, str(tenant))

    def on_end(self, span: ReadableSpan) -> None:
        return None

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
