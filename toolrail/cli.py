"""The umbrella CLI: ``toolrail <command> ...``.

Each stage package contributes its commands through a ``register(subparsers)``
function in its own ``cli`` module; this module only assembles them.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from collections.abc import Sequence

from toolrail import __version__
from toolrail.errors import ToolrailError

__all__ = ["build_parser", "main"]

#: Modules that contribute subcommands, in the order they appear in ``--help``.
COMMAND_MODULES = ("executor.cli", "executor.tools_cli", "mcpbridge.cli", "decider.cli", "decider.model_cli", "engine_build.cli", "toolrail.config_cli")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="toolrail",
        description="Serverless tool execution for LLM agents: schema-constrained decisions, validated and isolated tool runs.",
    )
    parser.add_argument("--version", action="version", version=f"toolrail {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        module.register(subparsers)
    return parser


def _terminate(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``toolrail`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    # SIGTERM runs the same clean-up as Ctrl-C: child workers and an embedded Redis are stopped.
    signal.signal(signal.SIGTERM, _terminate)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 0
    try:
        from toolrail.logging import configure_logging  # noqa: PLC0415
        from toolrail.settings import get_settings  # noqa: PLC0415

        get_settings()  # every command: a bad value is one line
        configure_logging()  # ... and an unknown TOOLRAIL_* variable one warning
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
    import httpx  # noqa: PLC0415
    import redis  # noqa: PLC0415
    from pydantic import ValidationError  # noqa: PLC0415

    from toolrail.redis_embed import EmbeddedRedisError, RedisNotConfiguredError  # noqa: PLC0415
    from toolrail.settings import RedisUrlError  # noqa: PLC0415

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
        from toolrail.settings import Settings, env_names  # noqa: PLC0415

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


if __name__ == "__main__":
    sys.exit(main())
