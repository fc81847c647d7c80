"""The one root of the platform's errors: every error it raises on purpose is a ``ToolrailError``.

    ToolrailError
    ├── tools.errors.ToolError            a tool's own failure, and the check path's (cleaning, schemas, patterns)
    ├── decider.errors.DeciderError       the decider: retryable (backend down) or permanent (the request)
    ├── executor.errors.ExecutorError     the executor: retryable (store, locks) or permanent (jobs, sandbox)
    ├── executor.api.bodies.ApiError      an API answer with its own status
    ├── executor.api.ratelimit.RateLimitedError
    └── engine_build.errors.EngineBuildError

Each class carries ``type`` (the stable machine name), ``status`` (its HTTP status in an API answer), whether a
retry may help (``retryable``) and ``details``; ``to_dict()`` is the ``{type, message, details}`` shape of API
bodies and job records, ``http_error()`` what a client is shown (less, where a class says so). The API maps the
root once (``executor.api.app``), as httpx maps its exceptions once at the transport.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ToolrailError"]


class ToolrailError(Exception):
    """Base class of every error the platform raises on purpose."""

    type = "toolrail_error"
    #: The HTTP status of this error in an API answer; ``retryable``: whether the same request may succeed later.
    status = 500
    retryable = False
    #: Whether the message alone tells a user what to fix: a command prints it as one line, no traceback.
    one_line = False
    #: Seconds a client should wait before retrying a ``retryable`` error (the API's ``Retry-After``; None: 1 s).
    retry_after_s: float | None = None

    def __init__(self, message: str = "", /, **details: Any) -> None:
        super().__init__(message)
        self.details: dict[str, Any] = details

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "message": str(self), "details": self.details}

    def http_error(self) -> dict[str, Any]:
        """The ``{type, message, details}`` a client gets for this error (``to_dict()`` unless a class says less)."""
        return self.to_dict()
