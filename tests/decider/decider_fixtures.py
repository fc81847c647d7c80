"""Shared fixtures of the decider tests (import them into a test module with ``from decider_fixtures import *``).

Fast tests run the real embedded engine over a tiny random-init Llama that shares SmolLM2's
tokenizer (``decider.model.tiny_random_model``): grammars compile exactly as for the real model,
decoding takes milliseconds. Tests marked ``model`` load the real SmolLM2 weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.spec import ToolSpec

__all__ = ["SCHEMA_DIR", "load_schemas", "marker_tools", "real_decider", "tiny_decider", "tiny_engine", "weather_tools"]

SCHEMA_DIR = Path(__file__).parent / "schemas"


def load_schemas() -> list[tuple[str, dict]]:
    """Every contract schema as ``(name, schema)``."""
    return [(p.stem, json.loads(p.read_text(encoding="utf-8"))) for p in sorted(SCHEMA_DIR.glob("*.json"))]


@pytest.fixture(scope="session")
def tiny_engine(tmp_path_factory):
    """The embedded engine over a tiny random model (session-wide; closed at the end)."""
    from decider.embedded import EmbeddedEngine
    from decider.model import ModelError, resolve_model_path, tiny_random_model

    try:
        resolve_model_path(None, pull=False)
    except ModelError as exc:  # only the missing model skips: any other failure here is a regression
        pytest.skip(f"default model tokenizer not available: {exc}")
    path = tiny_random_model(tmp_path_factory.mktemp("tiny-llama"))
    engine = EmbeddedEngine.load(path, max_batch_size=32)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def tiny_decider(tiny_engine):
    """An :class:`EmbeddedDecider` over the tiny engine."""
    from decider.service import EmbeddedDecider

    return EmbeddedDecider.from_engine(tiny_engine)


@pytest.fixture(scope="session")
def real_decider():
    """The default decider on the real SmolLM2-135M-Instruct weights."""
    from decider.service import EmbeddedDecider

    return EmbeddedDecider.load(None)


def weather_tools() -> list[ToolSpec]:
    """A weather tool with enum fields and declared aliases, and a grounded transfer tool."""
    weather = ToolSpec.from_openai({"name": "get_weather", "description": "查询城市天气 / weather of a city", "parameters": {
        "type": "object", "properties": {
            "city": {"type": "string", "enum": ["Shanghai", "Beijing", "Paris"], "x-grounded": True,
                     "x-aliases": {"沪": "Shanghai", "上海": "Shanghai", "北京": "Beijing"}},
            "date": {"type": "string", "enum": ["today", "tomorrow"],
                     "x-aliases": {"今天": "today", "明天": "tomorrow"}},
        }, "required": ["city", "date"]}})
    transfer = ToolSpec.from_openai({"name": "transfer", "description": "转账 / send money", "parameters": {
        "type": "object", "x-grounded": True, "properties": {
            "to": {"type": "string", "maxLength": 20},
            "amount": {"type": "number", "exclusiveMinimum": 0},
        }, "required": ["to", "amount"]}})
    return [weather, transfer]


def marker_tools() -> list[ToolSpec]:
    """Balance + transfer, both keyed by a grounded account marker (the interleaving reproduction)."""
    account = {"type": "string", "pattern": "^M[0-9a-f]{6}$", "x-grounded": True}
    balance = ToolSpec.from_openai({"name": "get_balance", "description": "query an account balance", "parameters": {
        "type": "object", "properties": {"account": account}, "required": ["account"]}})
    transfer = ToolSpec.from_openai({"name": "transfer", "description": "transfer money from an account", "parameters": {
        "type": "object", "properties": {"account": account,
                                         "amount": {"type": "integer", "minimum": 1, "maximum": 100000, "x-grounded": True}},
        "required": ["account", "amount"]}})
    return [balance, transfer]
