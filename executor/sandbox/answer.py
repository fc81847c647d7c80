"""A tool's answer on its way to the worker: its bounds, its shape, the error types a tool may claim.

The tool process encodes it (``encode_result``); the call parent decodes it with a cap (``decode_object``) and
reduces it to a frame of known shape (``checked_answer``, refusing a type the tool may not claim).
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["MAX_FRAME_BYTES", "MAX_RESULT_BYTES", "MAX_RESULT_DEPTH", "OutputError", "RESERVED_TYPES",
           "SANDBOX_REPORTED_TYPES", "TOOL_RAISABLE_TYPES", "checked_answer", "decode_object", "encode_result",
           "error_frame", "json_depth", "tool_error_type"]

MAX_RESULT_BYTES = 1_000_000
#: A result with what rides around it (the tool's header line; the call parent's frame: isolation, spans).
MAX_FRAME_BYTES = MAX_RESULT_BYTES + 65536
#: Nesting depth a result may have (objects and arrays); deeper is ``tool_output_invalid``.
MAX_RESULT_DEPTH = 64
#: A tool's own error type (``tools.errors.ToolError.type``): snake_case, a letter first, at most 64 characters.
TOOL_ERROR_TYPE = re.compile(r"[a-z][a-z0-9_]{0,63}")
#: The platform's types a tool raises on purpose (``tools.errors``): a tool may report them as they are.
TOOL_RAISABLE_TYPES = frozenset({"tool_error", "tool_input_error", "insufficient_funds", "pattern_budget_exceeded"})
#: What the sandbox's own code in the tool process reports (``classify``, ``encode_result``, a failed set-up).
SANDBOX_REPORTED_TYPES = frozenset({"tool_memory_limit", "tool_output_invalid", "sandbox_denied", "tool_process_limit",
                                    "sandbox_error"})
#: Prefixes of the platform's own outcomes (limits, crashes, the sandbox, MCP servers): never a tool's own type.
RESERVED_TYPE_PREFIXES = ("tool_", "sandbox_", "mcp_", "toolrail_", "executor_")
#: The platform's other error types (the job API's, the run loop's, the check path's): never a tool's own type.
RESERVED_TYPES = frozenset({
    "ambiguous_output", "approval_conflict", "approval_expired", "call_as_text", "call_cancelled", "call_in_progress",
    "circuit_open", "concurrency_limited", "decider_unavailable", "generation_bound", "idempotency_conflict",
    "invalid_arguments", "invalid_output", "invalid_tool_calls", "not_found", "permanent", "rate_limited", "rejected",
    "repeated_call", "repeated_side_effect", "retryable", "schema_rejected", "store_unavailable", "timeout",
    "ungrounded_values", "unknown_tool", "unsupported_pattern", "validation_error", "webhook_url_not_allowed"})


def tool_error_type(claimed: Any, *, from_sandbox: bool = False) -> str | None:
    """``claimed`` when a tool may report it as its error's type, else None (the error is then ``tool_error``).

    A tool's own type (``order_not_found``) is kept; one that is not snake_case of at most 64
    characters, or that names an outcome of the platform's own (``tool_timeout``,
    ``sandbox_denied``, ``circuit_open``, ...), is refused, so a tool cannot pass its failure off
    as the platform's. ``from_sandbox``: the answer of a tool process, whose sandbox code also
    reports the failures it classifies itself (``SANDBOX_REPORTED_TYPES``).
    """
    if not isinstance(claimed, str) or not TOOL_ERROR_TYPE.fullmatch(claimed):
        return None
    if claimed in TOOL_RAISABLE_TYPES or (from_sandbox and claimed in SANDBOX_REPORTED_TYPES):
        return claimed
    if claimed in RESERVED_TYPES or claimed.startswith(RESERVED_TYPE_PREFIXES):
        return None
    return claimed


class OutputError(ValueError):
    """A tool's answer that is not a bounded JSON object (the call parent's typed refusal)."""


def json_depth(value: Any) -> int:
    """Nesting depth of a decoded JSON value, without recursion (a hostile value cannot blow the stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in node)
    return deepest


def decode_object(data: bytes, *, what: str, max_bytes: int = MAX_RESULT_BYTES, max_depth: int = MAX_RESULT_DEPTH) -> dict:
    """``data`` as a JSON object of bounded size and depth, or ``OutputError`` saying why not."""
    if len(data) > max_bytes:
        raise OutputError(f"{what} of more than {max_bytes} bytes")
    try:
        value = json.loads(data)
    except RecursionError:
        raise OutputError(f"{what} nests deeper than the JSON decoder allows") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise OutputError(f"{what} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise OutputError(f"{what} is a JSON {type(value).__name__}, not an object")
    if json_depth(value) > max_depth:
        raise OutputError(f"{what} nests deeper than {max_depth} levels")
    return value


def error_frame(kind: str, message: str, **details: Any) -> dict:
    return {"ok": False, "error": {"type": kind, "message": message, "details": details}}


def checked_answer(payload: dict) -> dict:
    """The tool process's answer reduced to ``{ok, result}`` or ``{ok: false, error}`` of known shape."""
    if payload.get("ok") is True:
        if not isinstance(payload.get("result"), dict):
            return error_frame("tool_output_invalid", "the tool's result is not a JSON object")
        return {"ok": True, "result": payload["result"]}
    error = payload.get("error")
    if payload.get("ok") is not False or not isinstance(error, dict):
        return error_frame("tool_output_invalid", "the tool's answer has neither a result nor an error")
    claimed = error.get("type")
    kind = tool_error_type(claimed, from_sandbox=True) or "tool_error"
    details = error.get("details") if isinstance(error.get("details"), dict) else {}
    if claimed is not None and kind != claimed:  # the tool claimed a type it may not: say so, do not believe it
        details = {**details, "refused_type": str(claimed)[:80]}
    return {"ok": False, "error": {"type": kind, "message": str(error.get("message", "tool failed"))[:2000],
                                   "details": details}}


def encode_result(payload: dict) -> bytes:
    """The tool process's answer as JSON; a value that cannot be one becomes a typed error."""
    try:
        result = payload.get("result")
        if payload.get("ok") and hasattr(result, "model_dump"):
            payload = {**payload, "result": result.model_dump(mode="json")}
        if payload.get("ok") and not isinstance(payload.get("result"), dict):
            kind = type(payload.get("result")).__name__
            payload = error_frame("tool_output_invalid", f"the tool returned a {kind}; a tool returns a JSON object (a dict)")
        return json.dumps(payload, ensure_ascii=False, default=str).encode()
    except RecursionError:
        return json.dumps(error_frame("tool_output_invalid", "the tool's result nests too deeply to encode")).encode()
    except (TypeError, ValueError) as exc:
        return json.dumps(error_frame("tool_output_invalid", f"the tool's result is not JSON: {exc}")).encode()
