"""Executor errors.

    ExecutorError
    ├── RetryableError              transport trouble; Celery's retry policy handles it
    │   ├── StoreUnavailableError   Redis unreachable
    │   └── CallInProgressError     another delivery holds the call's idempotency lock
    └── PermanentError              retrying the same input cannot help
        ├── JobNotFoundError
        ├── IdempotencyConflictError   same key, different payload
        ├── WebhookUrlError         a webhook URL that is not http(s) or not public (SSRF; 422)
        ├── ApprovalConflictError   an approval that cannot apply now (409)
        ├── InvalidApprovalError    edited arguments that fail the schema (422)
        ├── CleaningError           raw output that cannot be repaired (carries ``errors``)
        └── SandboxError            a tool run that ended badly (carries ``type``)
            ├── ToolTimeoutError
            ├── ToolMemoryError
            ├── ToolCpuLimitError
            ├── ToolCrashedError
            ├── ToolRaisedError     the tool raised; ``details`` carries its own error
            ├── CallCancelledError  the job was cancelled while the call ran: its process was killed
            └── ToolOutputError     the tool's result was not JSON or too large

``to_dict()`` gives the ``{type, message, details}`` shape used in API bodies and job records. Each class
carries its HTTP ``status`` and whether a retry may help (``retryable``); the API maps them in one handler
(``http_error()``: the body a client gets, which never names internals a retry cannot fix).
"""

from __future__ import annotations

from typing import Any

from toolrail.errors import ToolrailError
from tools.errors import CleaningError  # the check path lives in tools/; re-exported for callers

__all__ = [
    "ApprovalConflictError",
    "CallCancelledError",
    "CallInProgressError",
    "CleaningError",
    "ExecutorError",
    "IdempotencyConflictError",
    "InvalidApprovalError",
    "JobNotFoundError",
    "PermanentError",
    "RetryableError",
    "SandboxError",
    "StoreUnavailableError",
    "ToolCpuLimitError",
    "ToolCrashedError",
    "ToolMemoryError",
    "ToolOutputError",
    "ToolRaisedError",
    "ToolTimeoutError",
    "WebhookUrlError",
]


class ExecutorError(ToolrailError):
    """Base class of the executor's errors (``toolrail.errors``: ``type``, ``status``, ``retryable``, ``details``)."""

    type = "executor_error"
    status = 400


class RetryableError(ExecutorError):
    type = "retryable"
    status = 503
    retryable = True
    #: Retries before the work ends with this error, typed (None: the task's own budget, then ``internal_error``).
    max_retries: int | None = None


class StoreUnavailableError(RetryableError):
    type = "store_unavailable"

    def http_error(self) -> dict[str, Any]:
        return {"type": "unavailable", "message": "the job store is unavailable; retry shortly", "details": {}}


class CallInProgressError(RetryableError):
    type = "call_in_progress"


class PermanentError(ExecutorError):
    type = "permanent"


class JobNotFoundError(PermanentError):
    type = "not_found"
    status = 404

    def http_error(self) -> dict[str, Any]:
        return {"type": self.type, "message": str(self), "details": {}}


class IdempotencyConflictError(PermanentError):
    type = "idempotency_conflict"
    status = 409


class WebhookUrlError(PermanentError):
    """A webhook URL that is refused: not http(s), unparsable, with credentials, or resolving to a non-public
    address (loopback, private, link-local, ...) while ``TOOLRAIL_WEBHOOK_ALLOW_PRIVATE`` is off."""

    type = "webhook_url_not_allowed"
    status = 422


class ApprovalConflictError(PermanentError):
    """An approval that cannot apply now: the job ended, the call needs none, or it was decided otherwise (409)."""

    type = "approval_conflict"
    status = 409

    def http_error(self) -> dict[str, Any]:
        return {"type": self.details.get("reason", self.type), "message": str(self), "details": self.details}


class InvalidApprovalError(PermanentError):
    """Edited arguments of an approval that fail the tool's schema (422)."""

    type = "invalid_arguments"
    status = 422


class SandboxError(PermanentError):
    type = "sandbox_error"


class ToolTimeoutError(SandboxError):
    type = "tool_timeout"


class ToolMemoryError(SandboxError):
    type = "tool_memory_limit"


class ToolCpuLimitError(SandboxError):
    type = "tool_cpu_limit"


class ToolCrashedError(SandboxError):
    type = "tool_crashed"


class ToolRaisedError(SandboxError):
    type = "tool_error"


class CallCancelledError(SandboxError):
    """The call's job was cancelled while it ran: the tool process was killed. Not the tool's failure (a breaker
    never counts it); whatever the tool changed before the kill may stand (its idempotency record says so)."""

    type = "call_cancelled"


class ToolOutputError(SandboxError):
    type = "tool_output_invalid"
