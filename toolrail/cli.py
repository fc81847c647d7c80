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

__all__ = ["build_parser", "main"]

#: Modules that contribute subcommands, in the order they appear in ``--help``.
COMMAND_MODULES = ("executor.cli", "decider.cli", "decider.model_cli", "engine_build.cli")


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
        return int(handler(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
