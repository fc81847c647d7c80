"""A sandbox call's span recorded as plain data (``ChildRecorder``), with no OpenTelemetry import.

The fork server runs every call's parent and is forked once per call: whatever it imports is
copied (page tables) and touched at every call. OpenTelemetry's SDK (with psutil, through its
resource detection) was ~4 MB of that image for one span of plain data, so the recorder lives
here, apart from the sinks (``toolrail.trace_sinks``, which re-exports it).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["SCOPE", "ChildRecorder"]

#: The instrumentation scope of toolrail's own spans.
SCOPE = "toolrail"

_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")


class _DataSpan:
    """One span being recorded as data (``set_attribute`` as on an SDK span)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def set_attribute(self, key: str, value: Any) -> None:
        self.data["attributes"][key] = value
        if key == "error.type":
            self.data["status"], self.data["status_description"] = "ERROR", str(value)


class ChildRecorder:
    """The sandbox child's spans, recorded as data under the call's W3C context and returned in its frame.

    No tracer provider here, on purpose: a live ``TracerProvider`` registers an at-fork handler that
    re-detects the process's resource in every forked process, and the monitor forks the call's init
    and tool processes inside new namespaces, where an untraced call hung on it (a futex wait in the
    init process, with the fork server holding a warmed provider). One span needs W3C ids, two
    timestamps and its attributes; the worker turns it into an SDK span (``span_from_dict``).
    """

    def __init__(self, trace_context: Mapping[str, str] | None) -> None:
        match = _TRACEPARENT.match(str((trace_context or {}).get("traceparent", "")))
        self.trace_id, self.parent_id = (match.group(1), match.group(2)) if match else (None, None)
        self.spans: list[dict[str, Any]] = []

    @contextlib.contextmanager
    def span(self, name: str, **attributes: Any) -> Iterator[_DataSpan | None]:
        if self.trace_id is None:
            yield None
            return
        pid = attributes.get("process.pid", os.getpid())
        data = {"name": name, "trace_id": self.trace_id, "span_id": os.urandom(8).hex(), "parent_span_id": self.parent_id,
                "kind": "INTERNAL", "start_ns": time.time_ns(), "end_ns": None, "status": "UNSET",
                "status_description": None, "attributes": {k: v for k, v in attributes.items() if v is not None},
                "events": [], "links": [], "scope": SCOPE,
                "resource": {"service.name": "toolrail-sandbox", "service.namespace": "toolrail", "process.pid": pid,
                             "toolrail.process.kind": "sandbox"}}
        try:
            yield _DataSpan(data)
        finally:
            data["end_ns"] = time.time_ns()
            self.spans.append(data)

    @staticmethod
    def warm() -> None:
        """Nothing to warm (kept for the fork server's call): recording a span is plain data."""

    def finished(self) -> list[dict[str, Any]]:
        spans, self.spans = self.spans, []
        return spans

