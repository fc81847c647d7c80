"""How a sandboxed call ended, as the worker reads it: its result frame, its typed error, the isolation it got.

The call parent's one result frame is decoded with a cap (``read_frame``); a failure becomes its
``SandboxError`` subclass (``tool_failure``: a sandbox outcome by its type, any other type the tool's
own), a death without a frame is named from its exit and stderr (``death_error``), and a layer the
tool process could not apply is logged once as ``sandbox.degraded`` (``check_isolation``).
"""

from __future__ import annotations

import signal
from typing import Any

from executor.errors import (
    SandboxError,
    ToolCpuLimitError,
    ToolCrashedError,
    ToolMemoryError,
    ToolOutputError,
    ToolRaisedError,
)
from executor.sandbox.answer import MAX_RESULT_BYTES, MAX_RESULT_DEPTH, OutputError, decode_object
from executor.sandbox.pipes import Captured
from toolrail.logging import get_logger
from tools.spec import ToolSpec

__all__ = ["SandboxDeniedError", "ToolLeftProcessError", "ToolProcessLimitError", "check_isolation", "death_error",
           "read_frame", "tool_failure", "warn_once"]

log = get_logger("toolrail.sandbox")


class SandboxDeniedError(SandboxError):
    """The tool tried something the sandbox forbids (a file outside scratch, the network)."""

    type = "sandbox_denied"


class ToolProcessLimitError(SandboxError):
    """The tool tried to start more processes than its limit (a fork bomb)."""

    type = "tool_process_limit"


class ToolLeftProcessError(SandboxError):
    """The tool returned but left processes running; they were killed."""

    type = "tool_left_process"


_ERRORS: dict[str, type[SandboxError]] = {
    "tool_memory_limit": ToolMemoryError,
    "tool_output_invalid": ToolOutputError,
    "sandbox_denied": SandboxDeniedError,
    "tool_process_limit": ToolProcessLimitError,
    "tool_left_process": ToolLeftProcessError,
    "sandbox_error": SandboxError,
}
_degraded_logged: set[str] = set()


def read_frame(spec: ToolSpec, raw: Captured | None) -> dict[str, Any] | ToolOutputError | None:
    """The call parent's result frame: None when it wrote none (it died), a ``ToolOutputError`` when malformed."""
    if raw is None or not raw.data:
        return None
    if raw.dropped:
        return ToolOutputError(f"{spec.name}: the sandbox's result frame exceeds its cap", dropped_bytes=raw.dropped)
    try:
        return decode_object(bytes(raw.data), what=f"{spec.name}'s result frame", max_bytes=MAX_RESULT_BYTES + 65536,
                             max_depth=MAX_RESULT_DEPTH + 4)
    except OutputError as exc:
        return ToolOutputError(str(exc))


def tool_failure(error: dict[str, Any]) -> SandboxError:
    """The error a failed call ends with: the type, message and details of the call parent's checked frame, one
    level deep (``{type, message, details}``; a traceback, when asked for, is ``details.traceback``).

    A sandbox outcome (``sandbox_denied``, ``tool_memory_limit``, ...) is its own class; any other type is
    the tool's own (``order_not_found``), carried by a ``ToolRaisedError`` (the call parent refused the
    types a tool may not claim: ``executor.sandbox.answer.tool_error_type``).
    """
    kind = str(error.get("type") or "tool_error")
    cls = _ERRORS.get(kind, ToolRaisedError)
    failure = cls(str(error.get("message", "tool failed")))
    failure.details = dict(error.get("details") or {})  # set, not passed: a tool's detail may be named ``message``
    if cls is ToolRaisedError:
        failure.type = kind
    return failure


def death_error(spec: ToolSpec, returncode: int | None, stderr: bytes) -> SandboxError:
    tail = stderr[-600:].decode(errors="replace")
    if returncode is not None and returncode < 0:
        sig = -returncode
        if sig == signal.SIGXCPU:
            return ToolCpuLimitError(f"{spec.name} used more than its CPU time limit", signal="SIGXCPU")
        if sig == signal.SIGKILL and "MemoryError" in tail:
            return ToolMemoryError(f"{spec.name} exceeded its {spec.memory_mb} MB memory limit")
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        return ToolCrashedError(f"{spec.name} died of {name}", signal=name, stderr_tail=tail)
    if "MemoryError" in tail or "Cannot allocate memory" in tail:
        return ToolMemoryError(f"{spec.name} exceeded its {spec.memory_mb} MB memory limit", stderr_tail=tail)
    return ToolCrashedError(f"{spec.name} exited with status {returncode} without a result", exit_status=returncode,
                            stderr_tail=tail)


def warn_once(what: str, message: str, **details: Any) -> None:
    if what not in _degraded_logged:
        _degraded_logged.add(what)
        log.warning("sandbox.degraded", layer=what, message=message, **details)


def check_isolation(isolation: dict[str, Any], *, confine: bool, own_uid: bool) -> None:
    """Log (once per layer and process) any isolation layer the child could not apply."""
    def missing(key: str, good: tuple[str, ...]) -> str | None:
        value = str(isolation.get(key, ""))
        return value if value and not value.startswith(good) else None

    if (how := missing("network", ("netns", "userns+netns", "allowed"))) is not None:
        warn_once("network", "no network namespace: non-networked tools can reach the network", how=how)
    if (how := missing("scratch", ("own-mount",))) is not None:
        warn_once("scratch", "no mount namespace: other calls' scratch dirs are kept apart by modes and Landlock only",
                   how=how)
    if (how := missing("ipc", ("ipcns",))) is not None:
        warn_once("ipc", "no IPC namespace: System V IPC and message queues are shared between calls", how=how)
    if (how := missing("pid", ("pidns",))) is not None:
        warn_once("pid", "no PID namespace: leftover processes are found through the subreaper only", how=how)
    if (how := missing("processes", ("",))) is not None or str(isolation.get("processes", "")).startswith("unlimited"):
        warn_once("processes", "no per-call process limit (needs root or a user namespace)",
                   how=isolation.get("processes"))
    if not confine:
        return
    if (how := missing("filesystem", ("landlock",))) is not None:
        warn_once("filesystem", "no Landlock: tools can read what their uid can read", how=how)
    if (how := missing("sockets", ("seccomp", "allowed"))) is not None:
        warn_once("sockets", "no seccomp: non-networked tools can open Unix sockets", how=how)
    if own_uid and isolation.get("uid") and not str(isolation.get("uid")).isdigit():
        warn_once("uid_drop", "the tool process kept the worker's uid", how=isolation.get("uid"))
