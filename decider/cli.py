"""Decider commands: ``toolrail generate`` (structured output) and ``toolrail decide`` (tool calls)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["register"]


def _load_decider(model: str | None) -> Any:
    """The decider the worker would use (``TOOLRAIL_DECIDER``, ``TOOLRAIL_MODEL``), ``--model`` overriding the model."""
    from decider.service import get_default_decider
    from toolrail.settings import get_settings

    return get_default_decider(get_settings().model_copy(update={"model": model}) if model else get_settings())


def _generate(args: argparse.Namespace) -> int:
    from decider.errors import DeciderError
    from toolrail.context import new_request_id

    try:
        schema = json.loads(Path(args.schema).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"cannot read schema {args.schema}: {exc}", file=sys.stderr)
        return 2
    try:
        from decider.schema import prepare_schema

        prepare_schema(schema)  # refuse unsupported features before loading the model
        decider = _load_decider(args.model)
        value, decision = decider.generate_json(schema, args.prompt, request_id=args.request_id or new_request_id(),
                                                max_tokens=args.max_tokens, max_reasks=args.max_reasks)
    except DeciderError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(value, ensure_ascii=False))
    return 0


def _decide(args: argparse.Namespace) -> int:
    from decider.errors import DeciderError
    from decider.protocol import DecideRequest
    from toolrail.context import new_request_id
    from tools.spec import ToolSpec

    try:
        raw_tools = json.loads(Path(args.tools).read_text(encoding="utf-8"))
        tools = [ToolSpec.from_openai(tool) for tool in raw_tools]
    except (OSError, ValueError) as exc:
        print(f"cannot read tools {args.tools}: {exc}", file=sys.stderr)
        return 2
    request = DecideRequest(request_id=args.request_id or new_request_id(), tools=tools,
                            messages=[{"role": "user", "content": args.prompt}], tool_choice=args.tool_choice,
                            max_tokens=args.max_tokens)
    try:
        decision = _load_decider(args.model).decide(request)
    except DeciderError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(decision.model_dump(exclude={"raw_output"}), ensure_ascii=False, indent=2))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``generate`` and ``decide`` to the umbrella CLI."""
    generate = subparsers.add_parser("generate", help="print JSON that validates against a JSON Schema")
    generate.add_argument("--schema", required=True, help="JSON Schema file")
    generate.add_argument("--prompt", required=True, help="what to generate")
    generate.add_argument("--model", default=None, help="local HF model directory (default: TOOLRAIL_MODEL, else the packaged model)")
    generate.add_argument("--max-tokens", type=int, default=256)
    generate.add_argument("--max-reasks", type=int, default=2)
    generate.add_argument("--request-id", default=None)
    generate.set_defaults(handler=_generate)

    decide = subparsers.add_parser("decide", help="print the tool calls the decider makes for a prompt")
    decide.add_argument("--tools", required=True, help="JSON file: a list of OpenAI function tool definitions")
    decide.add_argument("--prompt", required=True)
    decide.add_argument("--tool-choice", default="auto", choices=["auto", "required", "none"])
    decide.add_argument("--model", default=None, help="local HF model directory (default: TOOLRAIL_MODEL, else the packaged model)")
    decide.add_argument("--max-tokens", type=int, default=256)
    decide.add_argument("--request-id", default=None)
    decide.set_defaults(handler=_decide)
