"""``toolrail run --trace``: a job's spans as a tree (names, durations, process), without a collector.

The spans come from ``GET /v1/jobs/{id}/trace`` (the Redis sink, ``TOOLRAIL_TRACE_STORE=redis``);
they arrive in batches a moment after the job ends, so :func:`fetch_trace` waits until the job
span is in and the count holds still.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["fetch_trace", "render_tree"]


def fetch_trace(client: Any, job_id: str, *, wait_s: float = 5.0) -> dict[str, Any]:
    """The job's trace from the API, once its ``job`` span arrived and no span came for a moment."""
    deadline = time.monotonic() + wait_s
    last, body = -1, {}
    while True:
        response = client.get(f"/v1/jobs/{job_id}/trace")
        if response.status_code >= 400:
            return {"error": response.json().get("error", {"message": response.text}), "spans": []}
        body = response.json()
        spans = body.get("spans", [])
        settled = any(s["name"] == "job" for s in spans) and len(spans) == last
        if settled or time.monotonic() > deadline:
            return body
        last = len(spans)
        time.sleep(0.3)


def render_tree(trace: dict[str, Any]) -> str:
    """The spans as an indented tree: name, duration, the process that recorded it (service[pid])."""
    spans = trace.get("spans", [])
    if not spans:
        if trace.get("error"):
            return f"trace: {trace['error'].get('message')}"
        store = trace.get("store")
        hint = "" if store == "redis" else " (the API keeps no spans: set TOOLRAIL_TRACE_STORE=redis where it runs)"
        return f"trace {trace.get('trace_id') or '-'}: no spans{hint}"
    by_id = {s["span_id"]: s for s in spans}
    children: dict[str | None, list[dict[str, Any]]] = {}
    for span in spans:
        parent = span.get("parent_span_id")
        children.setdefault(parent if parent in by_id else None, []).append(span)
    for items in children.values():
        items.sort(key=lambda s: (s.get("start_ns") or 0, s["name"]))
    start = min(s.get("start_ns") or 0 for s in spans)
    lines = [f"trace {trace.get('trace_id')}  ({len(spans)} spans; offset from the first span, duration, process)"]

    def walk(span: dict[str, Any], prefix: str, last: bool, top: bool) -> None:
        branch = "" if top else ("└─ " if last else "├─ ")
        duration = ((span.get("end_ns") or 0) - (span.get("start_ns") or 0)) / 1e6
        offset = ((span.get("start_ns") or 0) - start) / 1e6
        resource = span.get("resource") or {}
        process = f"{resource.get('service.name', '?')}[{resource.get('process.pid', '?')}]"
        label = f"{prefix}{branch}{span['name']}{_detail(span)}"
        lines.append(f"{label:<64} +{offset:9.1f} ms {duration:9.1f} ms  {process}")
        kids = children.get(span["span_id"], [])
        for index, kid in enumerate(kids):
            walk(kid, prefix + ("" if top else ("   " if last else "│  ")), index == len(kids) - 1, False)

    roots = children.get(None, [])
    for root in roots:
        walk(root, "", True, True)
    return "\n".join(lines)


def _detail(span: dict[str, Any]) -> str:
    """A few attributes worth seeing in the tree (status, tokens, attempt, error type)."""
    attrs = span.get("attributes") or {}
    parts = []
    if "toolrail.decision.attempt" in attrs:
        parts.append(f"attempt {attrs['toolrail.decision.attempt']}")
    if "gen_ai.usage.input_tokens" in attrs:
        parts.append(f"in {attrs['gen_ai.usage.input_tokens']} tok")
    if "gen_ai.usage.output_tokens" in attrs:
        parts.append(f"out {attrs['gen_ai.usage.output_tokens']} tok")
    if attrs.get("toolrail.decision.check_errors"):
        parts.append(f"{attrs['toolrail.decision.check_errors']} check error(s)")
    for key in ("toolrail.job.status", "toolrail.call.status", "error.type"):
        if key in attrs:
            parts.append(str(attrs[key]))
    return f"  [{', '.join(parts)}]" if parts else ""
