"""One grammar cache per engine: its deciders and its own ``json_schema`` requests compile through it."""

from __future__ import annotations

import json

import pytest

from decider.errors import InvalidRequestError
from decider.protocol import DecideRequest
from decider.schema import canonical_json
from decider.service import EmbeddedDecider
from decider_fixtures import tiny_engine, weather_tools  # noqa: F401


def test_deciders_and_the_engine_share_one_cache(tiny_engine):  # noqa: F811
    first, second = EmbeddedDecider.from_engine(tiny_engine), EmbeddedDecider.from_engine(tiny_engine)
    assert first.grammar_cache is second.grammar_cache is tiny_engine.grammar_cache
    cache = tiny_engine.grammar_cache
    request = DecideRequest(request_id="cache-1", messages=[{"role": "user", "content": "weather in Paris today"}],
                            tools=weather_tools()[:1], tool_choice="required")
    before = cache.stats()
    plan = first.plan(request)
    after_first = cache.stats()
    second.plan(request.model_copy(update={"request_id": "cache-2"}))
    after_second = cache.stats()
    assert after_second["hits"] > after_first["hits"] and after_second["misses"] == after_first["misses"]
    assert after_first["misses"] >= before["misses"]
    # the engine's own json_schema path finds the grammar its decider compiled: same key, same options
    assert tiny_engine.compile_json_schema(plan.grammar_json) is plan.compiled.grammar
    assert cache.stats()["hits"] == after_second["hits"] + 1


def test_stats_count_compiles(tiny_engine):  # noqa: F811
    cache = tiny_engine.grammar_cache
    schema = canonical_json({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
                             "additionalProperties": False})
    before = cache.stats()
    compiled = cache.compile(schema)
    again = cache.compile(schema)
    stats = cache.stats()
    assert again.cache_hit and again.grammar is compiled.grammar
    assert stats["hits"] == before["hits"] + 1 + (1 if compiled.cache_hit else 0)
    assert stats["size"] <= stats["maxsize"] and stats["compile_s_max"] >= stats["compile_s_p50"] >= 0
    with pytest.raises(InvalidRequestError):
        tiny_engine.compile_json_schema(json.dumps({"type": "string", "pattern": "("}))
