"""Reading a call's pipes: stdout and stderr kept up to their caps, the result pipe until the call parent closes it,
progress reports as they come; then the tool's printed lines logged with a budget per stream.

Memory stays bounded whatever the tool prints: each stream keeps at most its cap, the rest is counted.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from executor.errors import CallCancelledError
from executor.sandbox.boundary import CallRun
from executor.sandbox.answer import MAX_FRAME_BYTES
from executor.sandbox.progress import ProgressReader
from toolrail.logging import get_logger
from tools.spec import ToolSpec

__all__ = ["MAX_LINE_CHARS", "MAX_OUTPUT_LINES", "MAX_STREAM_BYTES", "Captured", "collect", "log_output",
           "output_budgets"]

log = get_logger("toolrail.sandbox")

#: Bytes of a tool's stdout, and of its stderr, kept per call; the rest is read, discarded and counted.
MAX_STREAM_BYTES = 256_000
#: Lines of tool output logged per call (``tool.output``), and characters kept of each. Each stream has half of
#: them, and the lines one stream leaves unused go to the other: a flood on stdout never hides stderr.
MAX_OUTPUT_LINES = 200
MAX_LINE_CHARS = 1000
#: How long stdout/stderr are still drained after the result arrived (a leftover may hold them).
_DRAIN_S = 0.2
#: How often a running call asks whether its job was cancelled.
CANCEL_POLL_S = 0.25


@dataclass
class Captured:
    """One stream of a call: the first ``cap`` bytes kept, the rest counted."""

    cap: int
    data: bytearray = field(default_factory=bytearray)
    total: int = 0

    @property
    def dropped(self) -> int:
        return self.total - len(self.data)

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.cap - len(self.data)
        if room > 0:
            self.data += chunk[:room]


_CAPS = {"stdout": MAX_STREAM_BYTES, "stderr": MAX_STREAM_BYTES, "result": MAX_FRAME_BYTES}


def collect(fds: dict[str, int], request: bytes, *, timeout: float, progress: ProgressReader | None = None,
            cancelled: Callable[[], bool] | None = None) -> dict[str, Captured]:
    """Write the request, read stdout, stderr and the result pipe with caps, until the result is complete.

    Memory stays bounded whatever the tool prints: each stream keeps at most its cap.
    The result pipe has one writer, the call parent: its EOF ends the call (stdout and stderr
    are drained briefly after, since a leftover process may hold them open). Progress reports
    (tool-written JSON lines) go to ``progress`` as they come; their pipe's EOF is never waited for.
    ``cancelled`` is asked every ``CANCEL_POLL_S`` until the result comes: true raises ``CallCancelledError``
    (the caller kills the call).
    """
    started = time.monotonic()
    deadline = started + timeout
    next_poll = started + CANCEL_POLL_S
    captured = {name: Captured(_CAPS[name]) for name in ("stdout", "stderr", "result")}
    pending = memoryview(request)
    by_fd = {fd: name for name, fd in fds.items() if name != "stdin"}
    drain_until: float | None = None
    with selectors.PollSelector() as selector:  # no epoll descriptor to make and close per call
        stdin = fds.get("stdin")
        if stdin is not None:
            os.set_blocking(stdin, False)
            selector.register(stdin, selectors.EVENT_WRITE)
        for fd in by_fd:
            selector.register(fd, selectors.EVENT_READ)
        open_readers = {fd for fd, name in by_fd.items() if name != "progress"}
        while open_readers:
            now = time.monotonic()
            if drain_until is not None and now >= drain_until:
                break
            remaining = deadline - now
            if remaining <= 0:
                raise subprocess.TimeoutExpired("sandbox child", timeout)
            wait = remaining if drain_until is None else min(remaining, drain_until - now)
            if cancelled is not None and drain_until is None:
                if now >= next_poll:
                    next_poll = now + CANCEL_POLL_S
                    if cancelled():
                        raise CallCancelledError(f"the job was cancelled: the call was stopped after "
                                                 f"{now - started:.1f} s (its process killed); what it changed "
                                                 "before may stand", stopped_after_s=round(now - started, 3))
                wait = min(wait, max(0.0, next_poll - now))
            for key, _ in selector.select(wait):
                if key.fd == stdin:
                    try:
                        pending = pending[os.write(stdin, pending):]
                    except (BrokenPipeError, BlockingIOError) as exc:
                        if isinstance(exc, BlockingIOError):
                            continue
                        pending = pending[len(pending):]
                    if not pending:
                        selector.unregister(stdin)
                        os.close(stdin)
                        fds.pop("stdin", None)
                        stdin = None
                    continue
                chunk = os.read(key.fd, 65536)
                if by_fd[key.fd] == "progress":
                    if not chunk:
                        selector.unregister(key.fd)
                    elif progress is not None:
                        progress.feed(chunk)
                    continue
                if chunk:
                    captured[by_fd[key.fd]].add(chunk)
                    continue
                selector.unregister(key.fd)
                open_readers.discard(key.fd)
                if by_fd[key.fd] == "result":
                    drain_until = time.monotonic() + _DRAIN_S
    if progress is not None:
        progress.drain(fds.get("progress"))  # reports written just before the answer, then the one held back
    return captured


def _output_lines(streams: dict[str, Captured], call_id: str) -> tuple[dict[str, list[bytes]], list[dict[str, Any]]]:
    """The non-blank lines of stdout and stderr, and the sandbox's own structured events (JSON lines on stderr
    carrying the call's id: ``tool.start``, ``tool.end``), which are records, not output."""
    lines: dict[str, list[bytes]] = {}
    records: list[dict[str, Any]] = []
    for name in ("stdout", "stderr"):
        if name not in streams:
            continue
        kept = lines[name] = []
        for raw in bytes(streams[name].data).splitlines():
            if name == "stderr" and raw.startswith(b"{"):
                try:
                    item = json.loads(raw)
                except (ValueError, RecursionError):
                    item = None
                if isinstance(item, dict) and item.get("call_id") == call_id:
                    records.append(item)
                    continue
            if raw.strip():
                kept.append(raw)
    return lines, records


def output_budgets(counts: dict[str, int], total: int = MAX_OUTPUT_LINES) -> dict[str, int]:
    """Lines logged of each stream: an equal share each, and what one stream leaves unused goes to the others."""
    budgets = {name: 0 for name in counts}
    left, waiting = total, sorted(counts, key=lambda n: counts[n])
    while waiting:
        share = left // len(waiting)
        name = waiting.pop(0)
        budgets[name] = min(counts[name], share if waiting else left)
        left -= budgets[name]
    return budgets


def log_output(streams: dict[str, Captured], *, spec: ToolSpec, call: CallRun) -> list[dict[str, Any]]:
    """One bounded ``tool.output`` event per line the tool printed, each stream with its own budget
    (``output_budgets``); one ``tool.output_truncated`` per stream that lost lines or bytes, with the counts.
    Returns the sandbox's structured (JSON) records."""
    ids = {"request_id": call.request_id, "job_id": call.job_id, "call_id": call.call_id, "tool": spec.name}
    lines, records = _output_lines(streams, call.call_id)
    budgets = output_budgets({name: len(found) for name, found in lines.items()})
    for name, found in lines.items():
        for raw in found[:budgets[name]]:
            log.info("tool.output", stream=name, line=raw.decode(errors="replace")[:MAX_LINE_CHARS], **ids)
    for name, found in lines.items():
        captured, not_logged = streams[name], len(found) - budgets[name]
        if not_logged or captured.dropped:
            log.warning("tool.output_truncated", stream=name, lines_logged=budgets[name], lines_not_logged=not_logged,
                        max_lines=MAX_OUTPUT_LINES, kept_bytes=len(captured.data), dropped_bytes=captured.dropped, **ids)
    return records
