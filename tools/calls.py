"""The tool-call contract shared by the decider and the executor.

A call's ``id`` is derived from the request id and ``index`` counts calls within one
request only, so no call can ever be attributed to another request's batch slot.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ToolCall", "call_id"]


def call_id(request_id: str, index: int, *, attempt: int = 0, step: int = 0) -> str:
    """``call_<request_id>_<index>`` (``s<step>_`` before the index for a run's later steps, ``_a<attempt>``
    appended for re-asks after the first)."""
    base = f"call_{request_id}_{index}" if not step else f"call_{request_id}_s{step}_{index}"
    return f"{base}_a{attempt}" if attempt else base


class ToolCall(BaseModel):
    """One tool call bound to its request."""

    model_config = ConfigDict(extra="forbid")

    id: str
    index: int = Field(ge=0)
    name: str
    arguments: dict[str, Any] | None = None
    #: The arguments exactly as produced (a JSON string, possibly broken) before cleaning.
    raw_arguments: str | None = None
