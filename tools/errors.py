"""Tool errors, raised inside a tool and reported as typed call errors.

    ToolError                 base; ``retryable`` says whether running again may help
    ├── ToolInputError        the arguments are valid JSON Schema-wise but make no sense (permanent)
    ├── InsufficientFundsError
    └── UnknownToolError      no tool of that name is registered (permanent)
"""

from __future__ import annotations

from typing import Any

__all__ = ["InsufficientFundsError", "ToolError", "ToolInputError", "UnknownToolError"]


class ToolError(Exception):
    """Base class of errors a tool reports on purpose."""

    retryable = False
    type = "tool_error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "message": str(self), "details": self.details}


class ToolInputError(ToolError):
    type = "tool_input_error"


class InsufficientFundsError(ToolError):
    type = "insufficient_funds"


class UnknownToolError(ToolError):
    type = "unknown_tool"
