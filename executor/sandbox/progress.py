"""Tool progress, from the sandbox's progress pipe to the job's event stream.

    tool process ── report_progress() ──▶ progress pipe (JSON lines, ≤ 10/s, tools.context)
        worker: ProgressReader (bounded parsing, ≤ 10/s, last one kept) ──▶ CallRun.on_progress
            executor.runs.progress_events ──XADD──▶ tr:job:<id>:events  ──▶  SSE ``event: progress``

The pipe is written by tool code, so the worker trusts nothing on it: a line is at most
``MAX_LINE_BYTES``, at most ``MAX_LINES_PER_CALL`` lines are parsed per call, a malformed line
is dropped (logged, never failing the call), and reports reach ``on_progress`` at most
``PROGRESS_MAX_PER_S`` per second — one made sooner is held back and replaced by the next, and
the one held back when the call ends is delivered then (before the call's own terminal event).
The recorder (``executor.runs.progress_events``) bounds again what reaches Redis.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any


from toolrail.logging import get_logger
from tools.context import MAX_PROGRESS_MESSAGE_CHARS, PROGRESS_MAX_PER_S

if TYPE_CHECKING:
    from executor.sandbox.boundary import CallRun

__all__ = ["MAX_LINES_PER_CALL", "MAX_LINE_BYTES", "ProgressReader", "parse_report"]

log = get_logger("toolrail.progress")

#: Longest progress line read (a longer one is dropped whole).
MAX_LINE_BYTES = 4096
#: Progress lines parsed per call; the rest are read, counted and dropped.
MAX_LINES_PER_CALL = 2000
#: Bytes read from the pipe after the call ended (a leftover process may still be writing).
_DRAIN_BYTES = 256 * 1024
#: Malformed lines logged one by one per call (the rest are counted in the summary).
_LOGGED_MALFORMED = 3


def parse_report(raw: bytes) -> dict[str, Any]:
    """One progress line as ``{progress, total, message}``; ``ValueError`` when it is not a valid report."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"a JSON {type(value).__name__}, not an object")

    def number(name: str, *, optional: bool) -> float | None:
        item = value.get(name)
        if item is None and optional:
            return None
        if isinstance(item, bool) or not isinstance(item, (int, float)) or not math.isfinite(item):
            raise ValueError(f"{name} is not a finite number")
        return item

    progress, total = number("progress", optional=False), number("total", optional=True)
    if total is not None and total < 0:
        raise ValueError("total is negative")
    message = value.get("message")
    if message is not None and not isinstance(message, str):
        raise ValueError("message is not a string")
    return {"progress": progress, "total": total, "message": message[:MAX_PROGRESS_MESSAGE_CHARS] if message else message}


class ProgressReader:
    """Reads one call's progress pipe (``feed`` each chunk, ``finish`` at the end) and hands reports to ``on_progress``."""

    def __init__(self, on_progress: Callable[[dict[str, Any]], None] | None, **ids: Any) -> None:
        self._on_progress = on_progress
        self._ids = ids
        self._buffer = bytearray()
        self._skipping = False  # inside a line longer than MAX_LINE_BYTES
        self._lines = self._malformed = self._over = self._delivered = 0
        self._last = -math.inf
        self._pending: dict[str, Any] | None = None
        self._failed = False

    @classmethod
    def for_call(cls, call: CallRun, *, tool: str) -> ProgressReader:
        """The reader of one sandboxed call, handing reports to its ``on_progress`` (None: read and dropped)."""
        return cls(call.on_progress, request_id=call.request_id, job_id=call.job_id, call_id=call.call_id, tool=tool)

    def feed(self, chunk: bytes) -> None:
        self._buffer += chunk
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                if len(self._buffer) > MAX_LINE_BYTES:
                    self._buffer.clear()
                    if not self._skipping:
                        self._skipping = True
                        self._drop("line longer than the limit", length=f">{MAX_LINE_BYTES}")
                return
            line = bytes(self._buffer[:end])
            del self._buffer[:end + 1]
            if self._skipping:  # the tail of an over-long line
                self._skipping = False
                continue
            if len(line) > MAX_LINE_BYTES:
                self._drop("line longer than the limit", length=len(line))
                continue
            self._line(line)

    def _line(self, raw: bytes) -> None:
        if not raw.strip():
            return
        self._lines += 1
        if self._lines > MAX_LINES_PER_CALL:
            self._over += 1
            return
        try:
            report = parse_report(raw)
        except ValueError as exc:
            self._drop(str(exc), line=raw[:200].decode(errors="replace"))
            return
        now = time.monotonic()
        if now - self._last >= 1.0 / PROGRESS_MAX_PER_S:
            self._pending = None
            self._deliver(report, now)
        else:
            self._pending = report

    def _drop(self, reason: str, **details: Any) -> None:
        self._malformed += 1
        if self._malformed <= _LOGGED_MALFORMED:
            log.warning("tool.progress_malformed", reason=reason, **details, **self._ids)

    def _deliver(self, report: dict[str, Any], now: float) -> None:
        self._last = now
        if self._on_progress is None or self._failed:
            return
        try:
            self._on_progress(report)
            self._delivered += 1
        except Exception as exc:  # noqa: BLE001 - progress never fails a call
            self._failed = True
            log.warning("tool.progress_dropped", reason=f"on_progress raised {type(exc).__name__}: {exc}", **self._ids)

    def drain(self, fd: int | None) -> None:
        """Read what the pipe still holds without waiting for its EOF (a bounded amount), then :meth:`finish`."""
        if fd is not None:
            with contextlib.suppress(OSError):  # BlockingIOError: empty; EBADF: already closed
                os.set_blocking(fd, False)
                left = _DRAIN_BYTES
                while left > 0 and (chunk := os.read(fd, min(65536, left))):
                    left -= len(chunk)
                    self.feed(chunk)
        self.finish()

    def finish(self) -> None:
        """The call ended: deliver the report held back, log what was dropped."""
        if self._pending is not None:
            report, self._pending = self._pending, None
            self._deliver(report, time.monotonic())
        if self._malformed or self._over:
            log.warning("tool.progress_truncated", lines=self._lines, malformed=self._malformed,
                        over_limit=self._over, max_lines=MAX_LINES_PER_CALL, **self._ids)
