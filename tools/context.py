"""What a running tool may know about its call, and the one thing it may say back: its progress.

The sandbox child sets the call's context before invoking the tool function; a side-effecting
tool passes ``idempotency_key`` to the system it changes, so that even a re-run after a
crash between the effect and the executor's record applies the effect once.

``report_progress(progress, total=None, message=None)`` sends one progress report to the
worker, which puts it on the job's event stream (``GET /v1/jobs/{id}/events``, ``event:
progress``). It is cheap and never blocks: reports are written as one JSON line each to the
call's progress pipe (``CallContext.progress_fd``), at most ``PROGRESS_MAX_PER_S`` per second
— a report made sooner is held back and replaced by the next one, and the one held back when
the tool returns is written then, so the last report is always delivered — and at most
``PROGRESS_MAX_REPORTS`` per call. Outside a tool run (tests, a REPL) it does nothing. Bad
arguments (a non-number, NaN, a negative total) raise ``TypeError``/``ValueError`` at once.
"""

from __future__ import annotations

import contextvars
import json
import math
import os
import threading
import time
from dataclasses import dataclass

__all__ = ["CallContext", "MAX_PROGRESS_MESSAGE_CHARS", "PROGRESS_MAX_PER_S", "PROGRESS_MAX_REPORTS", "current_call",
           "encode_progress", "flush_progress", "report_progress", "set_current_call"]

#: Characters of a progress message kept (the rest is cut): a line stays below ``PIPE_BUF``, so it is written whole.
MAX_PROGRESS_MESSAGE_CHARS = 500
#: Progress reports written per second per call at most.
PROGRESS_MAX_PER_S = 10
#: Progress reports written per call at most (the last one held back is still written when the tool returns).
PROGRESS_MAX_REPORTS = 1000


@dataclass(frozen=True)
class CallContext:
    request_id: str
    job_id: str
    call_id: str
    idempotency_key: str
    scratch_dir: str
    #: The descriptor of the call's progress pipe (set by the sandbox); None: progress reports go nowhere.
    progress_fd: int | None = None


_current: contextvars.ContextVar[CallContext | None] = contextvars.ContextVar("toolrail_call", default=None)


def current_call() -> CallContext:
    """The context of the call being executed (raises outside a tool run)."""
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError("no tool call is running in this context")
    return ctx


class _ProgressWriter:
    """The rate-limited writer of one call's progress pipe (a tool process runs one call: one writer per process)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()  # a tool may report from its own threads
        self._last = -math.inf
        self._pending: dict | None = None
        self._written = 0
        try:
            os.set_blocking(fd, False)  # a full pipe drops a report; it never stalls the tool
        except OSError:
            self._fd = -1

    def report(self, report: dict) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._last >= 1.0 / PROGRESS_MAX_PER_S:
                self._pending = None
                self._write(report, now)
            else:
                self._pending = report  # encoded only if it is ever written: a held-back report costs little

    def flush(self) -> None:
        with self._lock:
            if self._pending is not None:
                report, self._pending = self._pending, None
                self._write(report, time.monotonic(), final=True)

    def _write(self, report: dict, now: float, *, final: bool = False) -> None:
        if self._fd < 0 or (self._written >= PROGRESS_MAX_REPORTS and not final):
            return
        self._last = now
        self._written += 1
        try:
            os.write(self._fd, json.dumps(report, ensure_ascii=False, separators=(",", ":")).encode() + b"\n")
        except BlockingIOError:
            pass  # the worker reads slower than we report: this one is dropped
        except OSError:
            self._fd = -1  # the pipe is gone (the call is ending): stop trying


_writer: _ProgressWriter | None = None


def set_current_call(ctx: CallContext | None) -> None:
    """Set (or clear) the call this process runs; a context with a ``progress_fd`` opens its progress channel."""
    global _writer
    _current.set(ctx)
    _writer = _ProgressWriter(ctx.progress_fd) if ctx is not None and ctx.progress_fd is not None else None


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"report_progress: {name} must be a number, not {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"report_progress: {name} must be finite, not {value}")
    return value


def _checked(progress: float, total: float | None, message: str | None) -> dict:
    report = {"progress": _number("progress", progress)}
    if total is not None:
        if _number("total", total) < 0:
            raise ValueError(f"report_progress: total must not be negative, not {total}")
        report["total"] = total
    if message is not None:
        if not isinstance(message, str):
            raise TypeError(f"report_progress: message must be a string, not {type(message).__name__}")
        report["message"] = message[:MAX_PROGRESS_MESSAGE_CHARS]
    return report


def encode_progress(progress: float, total: float | None = None, message: str | None = None) -> bytes:
    """One progress report as the JSON line the worker reads; ``TypeError``/``ValueError`` for bad arguments."""
    return json.dumps(_checked(progress, total, message), ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def report_progress(progress: float, total: float | None = None, message: str | None = None) -> None:
    """Report the running call's progress (e.g. ``report_progress(3, 10, "page 3 of 10")``); a no-op outside a tool run."""
    report = _checked(progress, total, message)
    writer = _writer
    if writer is not None:
        writer.report(report)


def flush_progress() -> None:
    """Write the report held back by the rate limit, if any (the sandbox calls it when the tool returns)."""
    writer = _writer
    if writer is not None:
        writer.flush()
