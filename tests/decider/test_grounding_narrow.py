"""Grounding: candidate spans, numbers, enum evidence, tool dropping, and the per-request compile cost."""

from __future__ import annotations

import statistics
import time

from decider.grammar import GrammarCache
from decider.grounding import collect_evidence, ground_tools, parse_chinese_number
from decider.schema import canonical_json, prepare_schema, tool_calls_schema
from decider_fixtures import tiny_engine, weather_tools  # noqa: F401


def user(text):
    return [{"role": "user", "content": text}]


def test_chinese_spans_stop_at_function_words_and_tool_vocabulary():
    tools = weather_tools()
    from decider.grounding import tool_vocabulary

    spans = collect_evidence(user("帮我给李小明转1.5万块，然后查一下上海今天的天气"), boundary_words=tool_vocabulary(tools)).spans
    assert "李小明" in spans and "上海" in spans
    assert not any("今天" in s and len(s) > 2 for s in spans)
    assert not any(s.startswith("帮") or s.endswith("的") for s in spans)


def test_numbers_digits_separators_and_chinese_numerals():
    evidence = collect_evidence(user("给张三转账五百元, 再转 1,250.50 和 1.5万; 三个"))
    assert {500, 1250.5, 15000, 3} <= set(evidence.numbers)
    assert 3 in evidence.numbers  # 三个 (measure word), while 张三 alone is a name
    assert 3 not in collect_evidence(user("给张三转账")).numbers
    assert parse_chinese_number("一万五千") == 15000
    assert parse_chinese_number("三点五") == 3.5


def test_evidence_ignores_the_system_prompt():
    evidence = collect_evidence([{"role": "system", "content": "today tomorrow Paris"}, {"role": "user", "content": "hi"}])
    assert not evidence.mentions("Paris")


def test_enum_narrowed_to_cue_words_and_aliases_kept():
    result = ground_tools(weather_tools(), user("沪明天天气"))
    weather = result.parameters["get_weather"]["properties"]
    assert weather["date"]["enum"] == ["tomorrow"]
    assert weather["city"]["enum"] == ["Shanghai"] and weather["city"]["x-aliases"] == {"沪": "Shanghai"}
    assert "transfer" in result.dropped  # no amount anywhere


def test_tool_dropped_when_enum_has_no_evidence():
    result = ground_tools(weather_tools(), user("北京后天天气"))  # only today|tomorrow exist
    assert set(result.dropped) == {"get_weather", "transfer"}


def test_forced_choice_keeps_tools():
    result = ground_tools(weather_tools(), user("北京后天天气"), allow_drop=False)
    assert set(result.parameters) == {"get_weather", "transfer"}
    weather = result.parameters["get_weather"]["properties"]
    assert weather["city"]["enum"][0] == "Beijing"
    assert weather["date"]["enum"] == ["today", "tomorrow"]  # no evidence: left as declared


def test_numbers_and_names_narrowed_and_filtered_by_field_constraints():
    result = ground_tools(weather_tools(), user("Transfer 1,250.50 to Alice Smith"))
    transfer = result.parameters["transfer"]["properties"]
    assert transfer["amount"]["enum"] == [1250.5]
    assert "Alice Smith" in transfer["to"]["enum"]
    assert all(len(v) <= 20 for v in transfer["to"]["enum"])


def test_optional_field_without_evidence_removed_and_default_forced():
    from tools.spec import ToolSpec

    spec = ToolSpec.from_openai({"name": "t", "parameters": {"type": "object", "x-grounded": True, "properties": {
        "q": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}, "n": {"type": "integer", "default": 1},
        "lang": {"type": "string", "enum": ["en", "zh"], "default": "en"}}, "required": ["q", "lang"]}})
    props = ground_tools([spec], user("weather Oslo"))
    narrowed = props.parameters["t"]
    assert "unit" not in narrowed["properties"] and "n" not in narrowed["properties"]
    assert narrowed["properties"]["lang"] == {"enum": ["en"]}
    assert narrowed["required"] == ["q", "lang"]


def test_narrowed_grammar_compile_overhead(tiny_engine, capsys):
    """Per-request narrowed grammars compile in milliseconds; the base grammar comes from the cache."""
    cache = GrammarCache(tiny_engine.compiler, tiny_engine.tokenizer_info)
    tools = weather_tools()
    base = tool_calls_schema([(t.name, prepare_schema(t.parameters).grammar_schema) for t in tools])
    cache.compile(canonical_json(base))
    assert cache.compile(canonical_json(base)).cache_hit
    prompts = ["北京明天天气怎么样", "沪今天天气", "给张三转账五百元", "Transfer 300 to Bob and weather in Paris tomorrow",
               "给李四转 88 元，再看看上海明天", "Send 12.5 to Carol", "weather today in Oslo", "上海今天和明天的天气"]
    timings = []
    for i, prompt in enumerate(prompts * 2):
        started = time.perf_counter()
        result = ground_tools(tools, user(prompt + " " * i))  # distinct text: no cache hits
        schema = tool_calls_schema([(n, prepare_schema(p).grammar_schema) for n, p in result.parameters.items()], allow_text=True)
        compiled = cache.compile(canonical_json(schema))
        timings.append(time.perf_counter() - started)
        assert compiled.grammar is not None
    mean_ms, max_ms = statistics.mean(timings) * 1e3, max(timings) * 1e3
    with capsys.disabled():
        print(f"\n[grounding] narrowed grammar per request: mean {mean_ms:.1f} ms, max {max_ms:.1f} ms over {len(timings)}")
    assert mean_ms < 200
