"""The umbrella CLI: ``toolrail <command> ...``.

Each stage package describes its commands in its ``cli`` module: ``register(subparsers)`` adds the parsers, and
each names its handler as ``"module:function"`` (``handler=``). This module assembles the parsers; a handler's
module is loaded only when its command runs (``toolrail.launch``), so ``--help`` reads the parsers alone.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from collections.abc import Sequence

from toolrail import __version__

__all__ = ["build_parser", "main"]

#: Modules that describe subcommands, in the order they appear in ``--help`` (each imports argparse alone).
COMMAND_MODULES = ("executor.cli", "mcpbridge.cli", "decider.cli", "engine_build.cli", "toolrail.config_cli")


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
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return 0
    # lazy: settings, logging and the command's own module load only when a command runs, never for --help
    launch = importlib.import_module("toolrail.launch")
    return launch.run(args)


if __name__ == "__main__":
    sys.exit(main())
