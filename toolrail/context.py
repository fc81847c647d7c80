"""Request correlation: one ``request_id`` per request, carried everywhere.

The id lives in a structlog contextvar so that every log line emitted while a
request is being handled carries it, in the API, in Celery tasks and in the
sandboxed tool process alike.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import structlog

REQUEST_ID_HEADER = "X-Request-ID"
#: Celery message header carrying the request id (not Celery's ``correlation_id``,
#: which is the task id).
CELERY_REQUEST_ID_HEADER = "toolrail_request_id"

_VALID_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

__all__ = [
    "CELERY_REQUEST_ID_HEADER",
    "REQUEST_ID_HEADER",
    "bind_request",
    "current_request_id",
    "new_request_id",
    "request_scope",
    "sanitize_request_id",
]


def new_request_id() -> str:
    """A fresh request id (uuid4 hex, 32 characters)."""
    return uuid.uuid4().hex


def sanitize_request_id(candidate: str | None) -> str:
    """Return ``candidate`` if it is a safe id (header/log/key friendly), else a new one."""
    if candidate and _VALID_REQUEST_ID.match(candidate):
        return candidate
    return new_request_id()


def bind_request(request_id: str, **extra: object) -> None:
    """Start a unit of work: clear the context and bind the request id (and extras)."""
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(request_id=request_id, **extra)


def current_request_id() -> str | None:
    """The request id bound in this context, if any."""
    return structlog.contextvars.get_contextvars().get("request_id")


@contextmanager
def request_scope(request_id: str, **extra: object) -> Iterator[str]:
    """Bind ``request_id`` for the duration of a block, restoring the previous context after."""
    with structlog.contextvars.bound_contextvars(request_id=request_id, **extra):
        yield request_id
