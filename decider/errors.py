"""Decider errors.

    DeciderError
    ├── DeciderRetryableError        transport/backend trouble: retry the same request
    │   ├── BackendUnavailableError
    │   └── StreamInterruptedError
    └── DeciderPermanentError        the request itself cannot be served
        ├── UnsupportedSchemaError   (carries ``feature`` and ``path``)
        ├── PromptTooLongError       (carries ``prompt_tokens`` and ``context_length``)
        ├── InvalidRequestError
        ├── GuidedDecodingNotConfiguredError
        ├── GenerationBoundError     the decoder hit a bound (token limit, a repetition loop) before
        │                            the output closed (carries ``reason``: "max_tokens" | "loop")
        └── OutputValidationError    (carries ``errors``, ``attempts``, ``last_output``)

Retryable errors are never fed back to the model as "your output was wrong".
"""

from __future__ import annotations

from toolrail.errors import ToolrailError

__all__ = [
    "BackendUnavailableError",
    "DeciderError",
    "DeciderPermanentError",
    "DeciderRetryableError",
    "GenerationBoundError",
    "GuidedDecodingNotConfiguredError",
    "InvalidRequestError",
    "OutputValidationError",
    "PromptTooLongError",
    "StreamInterruptedError",
    "UnsupportedSchemaError",
]


class DeciderError(ToolrailError):
    """Base class of every decider error."""

    type = "decider_error"


class DeciderRetryableError(DeciderError):
    """A transient failure: the same request may succeed if retried."""

    status = 503
    retryable = True


class BackendUnavailableError(DeciderRetryableError):
    """The inference backend could not be reached or is not ready."""


class StreamInterruptedError(DeciderRetryableError):
    """A response stream ended before its final response; no partial call is returned."""


class DeciderPermanentError(DeciderError):
    """The request cannot be served as given."""


class InvalidRequestError(DeciderPermanentError):
    """The request is malformed (e.g. tool_choice=required with no tools); ``param`` names the field at fault
    (OpenAI's dotted path, ``messages.[2].tool_call_id``) and ``code`` the kind, when known."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        self.param = param
        self.code = code
        super().__init__(message)


class UnsupportedSchemaError(DeciderPermanentError):
    """A JSON Schema feature the constraint engine cannot enforce and we cannot check after decoding."""

    def __init__(self, feature: str, path: str = "", message: str | None = None) -> None:
        self.feature = feature
        self.path = path
        super().__init__(message or f"unsupported JSON Schema feature {feature!r} at {path or '/'}")


class PromptTooLongError(DeciderPermanentError):
    """The rendered prompt does not fit the model's context."""

    def __init__(self, prompt_tokens: int, context_length: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.context_length = context_length
        super().__init__(f"prompt has {prompt_tokens} tokens; the model's context holds {context_length}")


class GuidedDecodingNotConfiguredError(DeciderPermanentError):
    """The server would decode without the schema constraint; refusing to run."""


class GenerationBoundError(DeciderPermanentError):
    """Decoding stopped at a bound before the output closed: failed fast, not re-asked."""

    def __init__(self, reason: str, message: str, *, output: str = "", tokens: int = 0) -> None:
        self.reason = reason
        self.output = output
        self.tokens = tokens
        super().__init__(message)


class OutputValidationError(DeciderPermanentError):
    """Decoded output still failed validation (post-decoding checks) after every re-ask."""

    def __init__(self, errors: list[str], *, attempts: int, last_output: str) -> None:
        self.errors = list(errors)
        self.attempts = attempts
        self.last_output = last_output
        shown = "; ".join(self.errors[:3])
        super().__init__(f"output failed validation after {attempts} attempt(s): {shown}")
