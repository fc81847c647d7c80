"""The decider's commands, described: ``toolrail generate`` (structured output), ``toolrail decide`` (tool calls) and
``toolrail model pull | info``; each names its handler in ``decider.commands``, loaded only when it runs."""

from __future__ import annotations

import argparse

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``generate``, ``decide`` and the ``model`` group to the umbrella CLI."""
    generate = subparsers.add_parser("generate", help="print JSON that validates against a JSON Schema")
    generate.add_argument("--schema", required=True, help="JSON Schema file")
    generate.add_argument("--prompt", required=True, help="what to generate")
    generate.add_argument("--model", default=None, help="local HF model directory (default: TOOLRAIL_MODEL, else the packaged model)")
    generate.add_argument("--max-tokens", type=int, default=256)
    generate.add_argument("--max-reasks", type=int, default=2)
    generate.add_argument("--request-id", default=None)
    generate.set_defaults(handler="decider.commands:generate")

    decide = subparsers.add_parser("decide", help="print the tool calls the decider makes for a prompt")
    decide.add_argument("--tools", required=True, help="JSON file: a list of OpenAI function tool definitions")
    decide.add_argument("--prompt", required=True)
    decide.add_argument("--tool-choice", default="auto", choices=["auto", "required", "none"])
    decide.add_argument("--model", default=None, help="local HF model directory (default: TOOLRAIL_MODEL, else the packaged model)")
    decide.add_argument("--max-tokens", type=int, default=256)
    decide.add_argument("--request-id", default=None)
    decide.set_defaults(handler="decider.commands:decide")

    model = subparsers.add_parser("model", help="pull, convert and inspect the embedded engine's model")
    model.set_defaults(handler=lambda args: (model.print_help(), 0)[1])
    commands = model.add_subparsers(dest="model_command", metavar="SUBCOMMAND")

    pull = commands.add_parser("pull", help="install, verify and convert the default model (idempotent); prints its path")
    pull.add_argument("--cache-dir", default=None, help="cache root (default: TOOLRAIL_CACHE_DIR or ~/.cache/toolrail)")
    pull.add_argument("--dtype", default=None, choices=("bfloat16", "float32", "float16"),
                      help="dtype of the converted weights (default: bfloat16)")
    pull.add_argument("--force", action="store_true", help="convert again even if a converted copy exists")
    pull.add_argument("--quiet", action="store_true", help="no progress bar")
    pull.set_defaults(handler="decider.commands:pull")

    info = commands.add_parser("info", help="describe the model in effect (TOOLRAIL_MODEL or the default) without pulling")
    info.add_argument("--model", default=None, help="a local Hugging Face model directory (default: TOOLRAIL_MODEL)")
    info.add_argument("--cache-dir", default=None)
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(handler="decider.commands:info")
