"""Structured logging: JSON lines in production, pretty on a terminal.

Every event passes through ``merge_contextvars`` so the bound ``request_id``
appears on each line of a request's life.
"""

from __future__ import annotations

import logging
import os
import sys

import structlog

__all__ = ["configure_logging", "get_logger"]

_configured = False


def configure_logging(*, json: bool | None = None, level: str | None = None, force: bool = False) -> None:
    """Configure structlog and the stdlib root logger once per process.

    ``json`` defaults to True unless stderr is a TTY (override with ``TOOLRAIL_LOG_JSON``).
    """
    global _configured
    if _configured and not force:
        return
    if json is None:
        env = os.environ.get("TOOLRAIL_LOG_JSON")
        json = (env.lower() in {"1", "true", "yes"}) if env else not sys.stderr.isatty()
    level_name = (level or os.environ.get("TOOLRAIL_LOG_LEVEL", "INFO")).upper()
    level_no = logging.getLevelName(level_name)
    if not isinstance(level_no, int):
        level_no = logging.INFO

    shared = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer = structlog.processors.JSONRenderer(ensure_ascii=False) if json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[*shared, structlog.processors.StackInfoRenderer(), structlog.processors.format_exc_info, renderer]
        if json
        else [*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        # the process's real stderr: Celery wraps sys.stderr in a logging proxy inside workers
        logger_factory=structlog.PrintLoggerFactory(file=sys.__stderr__ or sys.stderr),
        cache_logger_on_first_use=False,
    )
    _configured = True


def get_logger(name: str | None = None) -> structlog.stdlib.BoundLogger:
    """A structlog logger; configures logging with defaults on first use."""
    configure_logging()
    return structlog.get_logger(name) if name else structlog.get_logger()
