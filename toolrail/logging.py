"""Structured logging: JSON lines in production, pretty on a terminal.

Every event passes through ``merge_contextvars`` so the bound ``request_id``
appears on each line of a request's life. The format and level come from
``Settings.log_format`` / ``Settings.log_level`` (``TOOLRAIL_LOG_FORMAT``, ``TOOLRAIL_LOG_LEVEL``).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog
from toolrail.settings import Settings, unknown_variables

__all__ = ["QUIET_LOGGERS", "StaticFields", "configure_logging", "get_logger"]

_configured = False
#: Libraries whose INFO lines print whole URLs (httpx: ``HTTP Request: POST https://host/path?token=... "200 OK"``):
#: a webhook receiver's or an MCP server's URL carries its secrets, so only their warnings pass, at any level.
QUIET_LOGGERS = ("httpx", "httpcore", "httpx2", "httpcore2")


class StaticFields:
    """Processor: adds fields that hold for the whole process (environment, worker group) to every event."""

    def __init__(self, **fields: str) -> None:
        self.fields = {key: value for key, value in fields.items() if value}

    def __call__(self, _logger: Any, _method: str, event: dict[str, Any]) -> dict[str, Any]:
        for key, value in self.fields.items():
            event.setdefault(key, value)
        return event


def configure_logging(*, json: bool | None = None, level: str | None = None, force: bool = False) -> None:
    """Configure structlog and the stdlib root logger once per process.

    ``json`` and ``level`` override the settings; ``log_format=auto`` means JSON unless stderr is a TTY.
    """
    global _configured
    if _configured and not force:
        return

    settings = Settings()
    if json is None:
        json = settings.log_format == "json" or (settings.log_format == "auto" and not sys.stderr.isatty())
    level_no = logging.getLevelName((level or settings.log_level).upper())
    if not isinstance(level_no, int):
        level_no = logging.INFO

    shared = [
        structlog.contextvars.merge_contextvars,
        StaticFields(environment=settings.environment, worker_group=settings.worker_group),
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer = structlog.processors.JSONRenderer(ensure_ascii=False) if json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[*shared, structlog.processors.StackInfoRenderer(), structlog.processors.format_exc_info, renderer]
        if json
        else [*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        # the process's real stderr: Celery wraps sys.stderr in a logging proxy inside workers. One write per
        # line (``print`` makes two under PYTHONUNBUFFERED): processes sharing the stream never splice lines
        logger_factory=structlog.WriteLoggerFactory(file=sys.__stderr__ or sys.stderr),
        cache_logger_on_first_use=False,
    )
    for name in QUIET_LOGGERS:  # the stdlib loggers: Celery's worker routes them to its log at --loglevel
        logging.getLogger(name).setLevel(max(logging.WARNING, level_no))
    first = not _configured
    _configured = True
    if first:  # once per process, at its start: a misspelt variable is said, never silently ignored

        for name, nearest in unknown_variables().items():
            structlog.get_logger("toolrail.settings").warning("settings.unknown_variable", variable=name,
                                                              did_you_mean=nearest)


def get_logger(name: str | None = None) -> structlog.stdlib.BoundLogger:
    """A structlog logger; configures logging with defaults on first use."""
    configure_logging()
    return structlog.get_logger(name) if name else structlog.get_logger()
