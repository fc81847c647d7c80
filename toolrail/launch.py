"""One command of ``toolrail``, run: the settings checked, logging configured, the command's handler loaded by its
``"module:function"`` name, and a failure the user can fix told in one line (``toolrail.cli`` parses the command)."""

from __future__ import annotations

import argparse
import importlib
import sys

import httpx
import redis
from pydantic import ValidationError

from toolrail.errors import ToolrailError
from toolrail.logging import configure_logging
from toolrail.redis_embed import EmbeddedRedisError, RedisNotConfiguredError
from toolrail.settings import RedisUrlError, Settings, env_names, get_settings

__all__ = ["one_line_error", "run"]


def run(args: argparse.Namespace) -> int:
    """Run ``args.handler`` (a ``"module:function"`` name, or a callable of the parser's own) with ``args``."""
    try:
        get_settings()  # every command: a bad value is one line
        configure_logging()  # ... and an unknown TOOLRAIL_* variable one warning
        handler = args.handler
        if isinstance(handler, str):  # lazy: the command's module (the stack, Redis, torch) loads for it alone
            module, _, function = handler.partition(":")
            handler = getattr(importlib.import_module(module), function)
        return int(handler(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        message = one_line_error(exc)
        if message is None:
            raise
        print(f"toolrail: {message}", file=sys.stderr)
        return 1


def one_line_error(exc: BaseException) -> str | None:
    """A one-line explanation of a failure the user can fix (a service down, a bad setting); None otherwise.

    Connection problems and invalid settings are the user's environment, not a bug: they get one line
    naming what was tried, not a traceback.
    """
    if isinstance(exc, httpx.TransportError):
        url = exc.request.url if _has_request(exc) else "the API"
        reason = _reason(exc)
        hint = " (is the API running? start one with `toolrail serve`)" if isinstance(exc, httpx.ConnectError) else ""
        return f"cannot reach {url}: {reason}{hint}"
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return f"cannot reach Redis: {_reason(exc)} (check REDIS_URL or `toolrail serve --redis-url`)"
    if isinstance(exc, EmbeddedRedisError):
        return f"embedded Redis: {exc}"
    if isinstance(exc, (RedisNotConfiguredError, RedisUrlError)) or (isinstance(exc, ToolrailError) and exc.one_line):
        return str(exc)  # their messages name the variable or command
    if isinstance(exc, ValidationError) and exc.title == "Settings":
        fields = [str(error["loc"][0]) if error.get("loc") else "?" for error in exc.errors()]
        names = [env_names(field)[0] if field in Settings.model_fields else field for field in fields]
        return "invalid setting " + "; ".join(f"{name}: {error['msg'].removeprefix('Value error, ')}"
                                              for name, error in zip(names, exc.errors()))
    return None


def _has_request(exc: Exception) -> bool:
    try:
        return exc.request is not None  # type: ignore[attr-defined]
    except RuntimeError:  # httpx raises when the error carries no request
        return False


def _reason(exc: BaseException) -> str:
    text = (str(exc).strip() or type(exc).__name__).splitlines()[0]
    # httpx and redis wrap the OS error: "[Errno 111] Connection refused" → "Connection refused"
    if text.startswith("[Errno") and "] " in text:
        text = text.split("] ", 1)[1]
    return text[:300]
