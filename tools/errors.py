"""Tool errors, raised inside a tool and reported as typed call errors.

    ToolError                 base; ``retryable`` says whether running again may help
    ├── ToolInputError        the arguments are valid JSON Schema-wise but make no sense (permanent)
    │   └── PatternBudgetError  a text too long to check against a pattern within the matching budget
    ├── InsufficientFundsError
    ├── UnknownToolError      no tool of that name is registered (permanent)
    ├── CleaningError         raw model output that cannot be repaired into JSON (carries ``errors``)
    │   └── AmbiguousOutputError  the output reads two ways (two JSON values for one call,
    │                             a key given twice with different values): never guessed
    └── SchemaRejectedError   a client's JSON Schema the platform will not run (carries ``path``):
        │                     recursive or remote ``$ref``, too large, too deep (permanent)
        └── UnsupportedPatternError  a ``pattern`` no linear-time engine can run (backreference,
                                     lookaround); carries ``path``, ``pattern`` and ``reason``

A tool's own subclass keeps its ``type``, message and details in the call's error record, one
level deep (``{"type": "order_not_found", "message": ..., "details": {...}}``). The type must
be snake_case of at most 64 characters and name no outcome of the platform's own (``tool_*``,
``sandbox_*``, ``mcp_*``, ``timeout``, ``circuit_open``, ...: see
``executor.sandbox.answer.tool_error_type``); a refused one is recorded as ``tool_error`` with
``details.refused_type``. Details must be JSON (what is not becomes a string).
"""

from __future__ import annotations

from typing import Any

from toolrail.errors import ToolrailError

__all__ = ["AmbiguousOutputError", "CleaningError", "InsufficientFundsError", "PatternBudgetError", "SchemaRejectedError", "ToolError",
           "ToolInputError", "UnknownToolError", "UnsupportedPatternError"]


class ToolError(ToolrailError):
    """Base class of errors a tool reports on purpose: ``type`` names the failure, ``details`` are its data (the
    message is positional only: a detail may be called ``message`` too)."""

    type = "tool_error"
    status = 422


class ToolInputError(ToolError):
    type = "tool_input_error"


class PatternBudgetError(ToolInputError):
    """Checking a text against a pattern would cost more than the budget allows (linear, but long)."""

    type = "pattern_budget_exceeded"


class InsufficientFundsError(ToolError):
    type = "insufficient_funds"


class UnknownToolError(ToolError):
    type = "unknown_tool"


class CleaningError(ToolError):
    """Raw output that cannot be repaired into a JSON value; ``errors`` are ``{path, message}`` dicts."""

    type = "invalid_output"

    def __init__(self, message: str, errors: list[dict[str, Any]] | None = None, **details: Any) -> None:
        super().__init__(message, errors=errors or [], **details)
        self.errors = errors or []


class AmbiguousOutputError(CleaningError):
    """The output can be read more than one way; the platform refuses to pick one."""

    type = "ambiguous_output"


class SchemaRejectedError(ToolError):
    """A client-supplied JSON Schema refused before anything runs; ``path`` is the JSON pointer at fault."""

    type = "schema_rejected"

    def __init__(self, path: str, message: str, **details: Any) -> None:
        super().__init__(message, path=path, **details)
        self.path = path


class UnsupportedPatternError(SchemaRejectedError):
    """A ``pattern`` (or ``patternProperties`` key) that RE2, a linear-time engine, cannot run."""

    type = "unsupported_pattern"

    def __init__(self, path: str, pattern: str, reason: str) -> None:
        super().__init__(path, f"pattern {pattern[:200]!r} at {path or '/'} is not supported: {reason}",
                         pattern=pattern, reason=reason)
        self.pattern, self.reason = pattern, reason
