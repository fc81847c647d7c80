"""The boundary between the executor and the decider.

The executor only knows ``Decider.decide(DecideRequest) -> Decision``; backends
(embedded engine, Triton) live behind it in the decider package.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from tools.calls import ToolCall
from tools.spec import ToolSpec

__all__ = ["DecideRequest", "Decider", "Decision"]


class DecideRequest(BaseModel):
    """One decision to make: a conversation, the tools allowed, and where we are in the re-ask loop."""

    model_config = ConfigDict(frozen=True)

    request_id: str
    messages: list[dict[str, Any]]
    tools: list[ToolSpec]
    #: 0 for the first try; n for the n-th re-ask (the messages then carry the errors).
    attempt: int = 0
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    max_calls: int | None = None
    #: A caller's own lower bound on the number of calls (the OpenAI endpoint's ``min_tool_calls``).
    min_calls: int | None = None
    max_tokens: int = 256
    #: The request's clock (epoch seconds; None: now) and the user's IANA time zone (None: UTC): the day that
    #: relative dates ("tomorrow") are read against when a call's dates are checked.
    now: float | None = None
    time_zone: str | None = None
    seed: int | None = 0
    temperature: float = 0.0
    top_p: float = 1.0


class Decision(BaseModel):
    """What the model decided, bound to its request."""

    request_id: str
    #: The decoded text exactly as the model produced it.
    raw_output: str
    tool_calls: list[ToolCall] = Field(default_factory=list)
    #: Assistant text when the model answered without calling a tool.
    content: str | None = None
    backend: str = ""
    usage: dict[str, int] = Field(default_factory=dict)
    #: Log-likelihood of ``raw_output`` under the model (sum over its tokens), when the backend reports it.
    logprob: float | None = None
    #: What the platform did to this decision (constraint hash, narrowed fields, bounds): recorded on the attempt so a forced outcome never looks like the model's choice.
    platform: dict[str, Any] = Field(default_factory=dict)
    #: Why decoding ended, as the backend said: ``stop`` (the output closed) or ``length`` (a token bound cut it).
    finish_reason: str | None = None


@runtime_checkable
class Decider(Protocol):
    """Turns a conversation plus tool specs into tool calls (synchronous: called from Celery tasks)."""

    def decide(self, request: DecideRequest) -> Decision:
        """Decide for one request. Raises ``decider.errors.DeciderError`` subclasses."""
        ...
