"""``toolrail model pull`` and ``toolrail model info``."""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``model`` command group."""
    model = subparsers.add_parser("model", help="pull, convert and inspect the embedded engine's model")
    model.set_defaults(handler=lambda args: (model.print_help(), 0)[1])
    commands = model.add_subparsers(dest="model_command", metavar="SUBCOMMAND")

    pull = commands.add_parser("pull", help="install, verify and convert the default model (idempotent); prints its path")
    pull.add_argument("--cache-dir", default=None, help="cache root (default: TOOLRAIL_CACHE_DIR or ~/.cache/toolrail)")
    pull.add_argument("--dtype", default=None, choices=("bfloat16", "float32", "float16"),
                      help="dtype of the converted weights (default: bfloat16)")
    pull.add_argument("--force", action="store_true", help="convert again even if a converted copy exists")
    pull.add_argument("--quiet", action="store_true", help="no progress bar")
    pull.set_defaults(handler=_pull)

    info = commands.add_parser("info", help="describe the model in effect (TOOLRAIL_MODEL or the default) without pulling")
    info.add_argument("--model", default=None, help="a local Hugging Face model directory (default: TOOLRAIL_MODEL)")
    info.add_argument("--cache-dir", default=None)
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(handler=_info)


def _pull(args: argparse.Namespace) -> int:
    from decider.model import DEFAULT_MODEL_DTYPE, pull_model

    # a ModelError is one line from toolrail's main (toolrail.cli.one_line_error)
    print(pull_model(args.cache_dir, dtype=args.dtype or DEFAULT_MODEL_DTYPE, progress=not args.quiet, force=args.force))
    return 0


def _info(args: argparse.Namespace) -> int:
    from decider.model import model_info
    from toolrail.settings import get_settings

    info = model_info(args.model or get_settings().model, cache_dir=args.cache_dir)
    if args.json:
        print(json.dumps(info.as_dict(), indent=2))
        return 0 if info.present else 1
    for key, value in info.as_dict().items():
        print(f"{key:>12}: {value}")
    if not info.present:
        print("not converted yet: run `toolrail model pull`", file=sys.stderr)
        return 1
    return 0
