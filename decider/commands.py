"""What ``toolrail generate | decide | model pull | info`` do (their parsers: ``decider.cli``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from decider.errors import DeciderError
from decider.model import DEFAULT_MODEL_DTYPE, model_info, pull_model
from decider.protocol import DecideRequest
from decider.schema import prepare_schema
from decider.service import get_default_decider
from toolrail.context import new_request_id
from toolrail.settings import get_settings
from tools.spec import ToolSpec

__all__ = ["decide", "generate", "info", "pull"]


def _load_decider(model: str | None) -> Any:
    """The decider the worker would use (``TOOLRAIL_DECIDER``, ``TOOLRAIL_MODEL``), ``--model`` overriding the model."""
    return get_default_decider(get_settings().model_copy(update={"model": model}) if model else get_settings())


def generate(args: argparse.Namespace) -> int:
    try:
        schema = json.loads(Path(args.schema).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"cannot read schema {args.schema}: {exc}", file=sys.stderr)
        return 2
    try:
        prepare_schema(schema)  # refuse unsupported features before loading the model
        decider = _load_decider(args.model)
        value, decision = decider.generate_json(schema, args.prompt, request_id=args.request_id or new_request_id(),
                                                max_tokens=args.max_tokens, max_reasks=args.max_reasks)
    except DeciderError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(value, ensure_ascii=False))
    return 0


def decide(args: argparse.Namespace) -> int:
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


def pull(args: argparse.Namespace) -> int:
    # a ModelError is one line from toolrail's main (toolrail.launch.one_line_error)
    print(pull_model(args.cache_dir, dtype=args.dtype or DEFAULT_MODEL_DTYPE, progress=not args.quiet, force=args.force))
    return 0


def info(args: argparse.Namespace) -> int:
    found = model_info(args.model or get_settings().model, cache_dir=args.cache_dir)
    if args.json:
        print(json.dumps(found.as_dict(), indent=2))
        return 0 if found.present else 1
    for key, value in found.as_dict().items():
        print(f"{key:>12}: {value}")
    if not found.present:
        print("not converted yet: run `toolrail model pull`", file=sys.stderr)
        return 1
    return 0
