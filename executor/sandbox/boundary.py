"""The call boundary: what a sandbox is told about one call, what it answers, and the one method it has.

Every tool call crosses here: the process sandbox (``executor.sandbox.process``) and an MCP server's
client (``mcpbridge``) both implement ``Sandbox.run(spec, call) -> SandboxResult``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from tools.spec import ToolSpec

__all__ = ["CallRun", "Sandbox", "SandboxResult"]


@dataclass(frozen=True)
class CallRun:
    """What the sandbox needs to know about one call."""

    request_id: str
    job_id: str
    call_id: str
    idempotency_key: str
    arguments: dict[str, Any]
    #: Extra variables granted to this tool (e.g. the ledger URL for networked tools).
    env: dict[str, str] = field(default_factory=dict)
    #: Called in the worker with each progress report of the tool (``{progress, total, message}``), at most
    #: 10 per second, the last one always; never raises into the call (``executor.sandbox.progress``).
    on_progress: Callable[[dict[str, Any]], None] | None = field(default=None, compare=False, repr=False)
    #: W3C context of the call's ``execute_tool`` span: the child records its span under it and returns it.
    trace_context: dict[str, str] = field(default_factory=dict)
    #: Whether the call's job was cancelled (cheap; a runner polls it a few times a second and, when true, stops the
    #: call and raises ``CallCancelledError``). None: nothing watches.
    cancelled: Callable[[], bool] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class SandboxResult:
    result: Any
    duration_s: float
    pid: int
    network: str
    #: The tool's structured log records (JSON lines on its stderr).
    logs: list[dict[str, Any]]
    isolation: dict[str, str] = field(default_factory=dict)
    #: What the tool printed: ``{stream: {"lines": n, "dropped_bytes": n}}``.
    output: dict[str, dict[str, int]] = field(default_factory=dict)


class Sandbox(Protocol):
    def run(self, spec: ToolSpec, call: CallRun) -> SandboxResult:
        """Run one call; raise a ``SandboxError`` subclass when it ends badly."""
        ...
