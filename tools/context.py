"""What a running tool may know about its call: request id, call id, idempotency key.

The sandbox child sets this before invoking the tool function; a side-effecting tool
passes ``idempotency_key`` to the system it changes, so that even a re-run after a
crash between the effect and the executor's record applies the effect once.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

__all__ = ["CallContext", "current_call", "set_current_call"]


@dataclass(frozen=True)
class CallContext:
    request_id: str
    job_id: str
    call_id: str
    idempotency_key: str
    scratch_dir: str


_current: contextvars.ContextVar[CallContext | None] = contextvars.ContextVar("toolrail_call", default=None)


def current_call() -> CallContext:
    """The context of the call being executed (raises outside a tool run)."""
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError("no tool call is running in this context")
    return ctx


def set_current_call(ctx: CallContext | None) -> None:
    _current.set(ctx)
