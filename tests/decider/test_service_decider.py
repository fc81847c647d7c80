"""The decider service: planning, the sync facade, re-asks, and the real model end to end."""

from __future__ import annotations

import copy
import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from decider.checked import decide_checked
from decider.errors import InvalidRequestError, PromptTooLongError, UnsupportedSchemaError
from decider.prompt import PromptRenderer, reask_messages
from decider.protocol import DecideRequest, Decider
from decider_fixtures import marker_tools, real_decider, tiny_decider, tiny_engine, weather_tools  # noqa: F401
from tools.spec import ToolSpec


def req(text, tools, **kw):
    return DecideRequest(request_id=kw.pop("request_id", "svc-1"), messages=[{"role": "user", "content": text}], tools=tools, **kw)


def test_implements_the_protocol(tiny_decider):  # noqa: F811
    assert isinstance(tiny_decider, Decider)


def test_sync_decide_from_many_threads(tiny_decider):  # noqa: F811
    def one(i):
        marker = f"M{i:06x}"
        decision = tiny_decider.decide(req(f"balance of {marker} please", marker_tools(), request_id=f"thr-{i}",
                                           tool_choice="required", max_calls=1, max_tokens=128))
        return marker, decision

    with ThreadPoolExecutor(8) as pool:
        for marker, decision in pool.map(one, range(8)):
            assert len(decision.tool_calls) == 1
            assert decision.tool_calls[0].arguments["account"] == marker
            assert decision.tool_calls[0].id == f"call_{decision.request_id}_0"


def test_plan_offers_every_tool_and_text_and_records_narrowing(tiny_decider):  # noqa: F811
    plan = tiny_decider.plan(req("北京明天天气怎么样", weather_tools()))
    assert '"get_weather"' in plan.grammar_json and '"transfer"' in plan.grammar_json  # no tool is dropped
    assert '"content"' in plan.grammar_json  # tool_choice=auto: a text answer is always allowed
    record = plan.platform
    assert record["tools_dropped"] == [] and record["text_allowed"] is True
    assert record["narrowed"]["get_weather"] == {"/city": ["Beijing"], "/date": ["tomorrow"]}
    assert "/to" not in record["narrowed"].get("transfer", {})  # free text is never narrowed
    assert len(record["constraint"]) == 16
    assert plan.usage()["grammar_compile_us"] >= 0


def test_base_plan_is_cached_when_nothing_is_narrowed(tiny_decider):  # noqa: F811
    import time

    tools = weather_tools()
    tiny_decider.plan(req("hello there", tools))
    started = time.perf_counter()
    for _ in range(20):
        plan = tiny_decider.plan(req("hello there", tools))
    assert plan.platform["narrowed"] == {}
    assert plan.compile_s < 0.05  # the base grammar comes from the cache


def test_required_tool_choice_has_no_text_branch(tiny_decider):  # noqa: F811
    plan = tiny_decider.plan(req("北京明天天气怎么样", weather_tools(), tool_choice="required"))
    assert '"content"' not in plan.grammar_json and plan.platform["text_allowed"] is False


def test_tool_choice_errors(tiny_decider):  # noqa: F811
    with pytest.raises(InvalidRequestError):
        tiny_decider.plan(req("x", [], tool_choice="required"))
    with pytest.raises(InvalidRequestError):
        tiny_decider.plan(req("x", weather_tools(), tool_choice={"type": "function", "function": {"name": "nope"}}))


def test_unsupported_tool_schema_refused_before_decoding(tiny_decider):  # noqa: F811
    bad = ToolSpec.from_openai({"name": "bad", "parameters": {"type": "object", "properties": {
        "x": {"type": "string", "pattern": "^(?!a).*$"}}}})
    with pytest.raises(UnsupportedSchemaError) as info:
        tiny_decider.plan(req("x", [bad]))
    assert info.value.path == "/tools/bad/parameters/properties/x/pattern"


def test_prompt_too_long(tiny_decider):  # noqa: F811
    with pytest.raises(PromptTooLongError):
        tiny_decider.decide(req("word " * 3000, marker_tools()))


def test_tool_choice_none_is_plain_text(tiny_decider):  # noqa: F811
    decision = tiny_decider.decide(req("hello", marker_tools(), tool_choice="none", max_tokens=8))
    assert decision.tool_calls == [] and decision.content == decision.raw_output


def test_reask_and_render_never_mutate_the_callers_messages(tiny_engine):  # noqa: F811
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
                                                                      "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c", "content": "ok"}]
    before = copy.deepcopy(messages)
    out = reask_messages(messages, output="[]", errors=["/x: bad"])
    PromptRenderer(tiny_engine.tokenizer).render_tools(messages, weather_tools())
    assert messages == before
    assert out[:4] == before and out[-1]["role"] == "user" and "/x: bad" in out[-1]["content"]


@pytest.mark.model
def test_real_model_end_to_end(real_decider):  # noqa: F811
    """SmolLM2-135M-Instruct behind the check loop: 北京明天天气 → get_weather(Beijing, tomorrow).

    With a transfer tool offered too, whatever the small model adds to it never passes unless the
    conversation states its values (they are not stated here).
    """
    weather = [t for t in weather_tools() if t.name == "get_weather"]
    result = decide_checked(real_decider, req("北京明天天气怎么样", weather, request_id="real-1", max_tokens=64))
    assert result.status == "calls", result.record()
    assert [(c.name, c.arguments) for c in result.calls] == [("get_weather", {"city": "Beijing", "date": "tomorrow"})]
    assert result.tool_calls[0].id.startswith("call_real-1_")
    both = decide_checked(real_decider, req("北京明天天气怎么样", weather_tools(), request_id="real-2", max_tokens=96))
    assert all(c.name == "get_weather" for c in both.calls), both.record()
    value, _ = real_decider.generate_json({"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                                           "required": ["city"], "additionalProperties": False},
                                          "Name a city in France as JSON.", request_id="real-3", max_tokens=48)
    assert isinstance(value["city"], str) and json.dumps(value)


def test_cli_generate_prints_valid_json(tiny_engine, capsys):  # noqa: F811
    from decider.schema import validation_errors
    from decider_fixtures import SCHEMA_DIR
    from tests.harness.fixtures import environment
    from toolrail.cli import main

    path = SCHEMA_DIR / "27_weather_call.json"
    # the default decider, whatever a session fixture run earlier in this process left in the environment
    with environment({"TOOLRAIL_DECIDER": None}):
        assert main(["generate", "--schema", str(path), "--prompt", "weather", "--model", str(tiny_engine.model_path)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert validation_errors(json.loads(path.read_text()), json.loads(printed)) == []


def test_cli_generate_refuses_unsupported_schema(tmp_path, capsys):
    from toolrail.cli import main

    path = tmp_path / "s.json"
    path.write_text(json.dumps({"type": "object", "propertyNames": {"pattern": "^x"}}))
    assert main(["generate", "--schema", str(path), "--prompt", "x"]) == 1
    assert "propertyNames" in capsys.readouterr().err


def test_calibrated_choice_is_recorded_on_user_turns_only(tiny_engine):  # noqa: F811
    """The model's scored call-or-answer choice: recorded on the decision, never applied after a tool result."""
    from decider.service import DeciderConfig, EmbeddedDecider

    decider = EmbeddedDecider.from_engine(tiny_engine, config=DeciderConfig(call_bias=0.0))
    decision = decider.decide(req("北京明天天气怎么样", weather_tools(), request_id="choice-1", max_tokens=48))
    choice = decision.platform["call_choice"]
    assert choice["chosen"] in ("calls", "text") and choice["bias"] == 0.0
    assert set(choice) == {"calls_lift", "text_lift", "bias", "evidence", "chosen", "best_tool"}
    assert choice["evidence"] is True  # the conversation states a city and a date get_weather takes
    after_result = DecideRequest(request_id="choice-2", tools=weather_tools(), max_tokens=48, messages=[
        {"role": "user", "content": "北京明天天气怎么样"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c0", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Beijing", "date": "tomorrow"}'}}]},
        {"role": "tool", "tool_call_id": "c0", "content": '{"temp_c": 21}'}])
    assert "call_choice" not in decider.plan(after_result).platform
    assert not decider.plan(after_result).branches


def test_the_offset_without_evidence_applies_when_no_typed_field_finds_a_value(tiny_engine):  # noqa: F811
    from decider.service import DeciderConfig, EmbeddedDecider

    import asyncio

    decider = EmbeddedDecider.from_engine(tiny_engine, config=DeciderConfig(call_bias=5.0, call_bias_without_evidence=-3.0))
    with_values, without = (asyncio.run(decider._choose_branch(decider.plan(req(text, weather_tools()))))  # noqa: SLF001
                            for text in ("北京明天天气怎么样", "tell me a joke"))
    assert (with_values.platform["call_choice"]["evidence"], with_values.platform["call_choice"]["bias"]) == (True, 5.0)
    assert (without.platform["call_choice"]["evidence"], without.platform["call_choice"]["bias"]) == (False, -3.0)


def test_repetition_penalty_reaches_the_engine_and_keeps_output_valid(tiny_engine):  # noqa: F811
    from decider.service import DeciderConfig, EmbeddedDecider
    from tools.check import check_tool_calls

    decider = EmbeddedDecider.from_engine(tiny_engine, config=DeciderConfig(repetition_penalty=1.3))
    request = req("balance of M00ab12 please", marker_tools(), request_id="pen-1", tool_choice="required", max_tokens=96)
    assert decider._generation(decider.plan(request)).repetition_penalty == 1.3  # noqa: SLF001
    decision = decider.decide(request)
    specs = {t.name: t for t in marker_tools()}
    assert check_tool_calls([c.model_dump() for c in decision.tool_calls], specs).ok


def test_the_call_count_is_the_models_preference_read_at_each_boundary(tiny_engine, monkeypatch):  # noqa: F811
    import asyncio

    from decider.parser import ToolCallStreamParser
    from decider.service import CLOSE_CALLS, MORE_CALLS, DeciderConfig, EmbeddedDecider

    decider = EmbeddedDecider.from_engine(tiny_engine, config=DeciderConfig(read_call_count=True))
    plan = decider.plan(req("balance of M000001 please", marker_tools(), tool_choice="required"))
    one = '{"name": "get_balance", "arguments": {"account": "M000001"}}'
    text = f"[{one}, {one.replace('1', '2')}, {one.replace('1', '3')}]"
    seen = []

    def score(prompt, continuations):  # the model prefers closing after the second call only
        assert continuations == [CLOSE_CALLS, MORE_CALLS] and prompt.startswith(plan.prompt)
        seen.append(prompt[len(plan.prompt):])
        return [0.0, -1.0] if len(seen) == 2 else [-1.0, 0.0]

    monkeypatch.setattr(tiny_engine, "score_continuations", score, raising=False)
    parser = ToolCallStreamParser(plan.request_id)
    parser.feed(text)
    decision = decider._decision(plan, parser, "stop", {})  # noqa: SLF001
    read = asyncio.run(decider._read_call_count(plan, parser, decision))  # noqa: SLF001
    assert [c.arguments["account"] for c in read.tool_calls] == ["M000001", "M000002"]
    assert seen == [f"[{one}", text[:len(f"[{one}, {one.replace('1', '2')}")]]  # each prefix ends at a call's brace
    assert [r["after"] for r in read.platform["call_count_read"]] == [0, 1] and read.platform["calls_after_read"] == 2
