"""The real openai SDK against the real server on loopback (uvicorn in a thread)."""

from __future__ import annotations

import json

import openai
import pytest

from decider.openai_api import create_app
from decider.schema import validation_errors
from decider_fixtures import marker_tools, tiny_decider, tiny_engine, weather_tools  # noqa: F401
from tests.harness.serving import api_server

MARKER_TEXT = "Account M0a1b2c: check the balance of M0a1b2c, then transfer 250 from M0a1b2c."


@pytest.fixture(scope="module")
def client(tiny_decider):  # noqa: F811
    with api_server(create_app(lambda: tiny_decider)) as base:
        yield openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)


def _tools(specs):
    return [spec.to_openai() for spec in specs]


def test_non_streaming_parallel_tool_calls(client):
    raw = client.chat.completions.with_raw_response.create(
        model="toolrail", messages=[{"role": "user", "content": MARKER_TEXT}], tools=_tools(marker_tools()),
        tool_choice="required", extra_headers={"X-Request-ID": "sdk-req-1"}, extra_body={"min_tool_calls": 2, "max_tool_calls": 2})
    assert raw.headers["x-request-id"] == "sdk-req-1"
    completion = raw.parse()
    assert completion.id == "chatcmpl-sdk-req-1"
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert [c.id for c in calls] == ["call_sdk-req-1_0", "call_sdk-req-1_1"]
    for call in calls:
        args = json.loads(call.function.arguments)
        assert args["account"] == "M0a1b2c"
        assert call.function.name in {"get_balance", "transfer"}
    assert completion.usage.prompt_tokens > 0


def test_streaming_parallel_tool_calls_one_id_each(client):
    stream = client.chat.completions.create(
        model="toolrail", messages=[{"role": "user", "content": MARKER_TEXT}], tools=_tools(marker_tools()),
        tool_choice="required", stream=True, stream_options={"include_usage": True},
        extra_headers={"X-Request-ID": "sdk-stream-1"}, extra_body={"min_tool_calls": 2, "max_tool_calls": 2})
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        assert chunk.id == "chatcmpl-sdk-stream-1"
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                entry = calls.setdefault(delta.index, {"id": delta.id, "name": "", "arguments": ""})
                assert entry["id"] == f"call_sdk-stream-1_{delta.index}"
                assert delta.id in (None, entry["id"])
                entry["name"] += (delta.function.name or "") if delta.function else ""
                entry["arguments"] += (delta.function.arguments or "") if delta.function else ""
    assert finish == "tool_calls"
    assert sorted(calls) == [0, 1]
    for entry in calls.values():
        assert entry["name"] in {"get_balance", "transfer"}
        assert json.loads(entry["arguments"])["account"] == "M0a1b2c"


def test_aliases_normalized_in_both_modes(client):
    messages = [{"role": "user", "content": "沪明天天气"}]
    kwargs = dict(model="toolrail", messages=messages, tools=_tools(weather_tools()),
                  tool_choice={"type": "function", "function": {"name": "get_weather"}}, parallel_tool_calls=False)
    call = client.chat.completions.create(**kwargs).choices[0].message.tool_calls[0]
    assert json.loads(call.function.arguments) == {"city": "Shanghai", "date": "tomorrow"}
    streamed = ""
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                streamed += (delta.function.arguments or "") if delta.function else ""
    assert json.loads(streamed) == {"city": "Shanghai", "date": "tomorrow"}


def test_response_format_json_schema(client):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9},
                                               "tag": {"type": "string", "enum": ["x", "y"]}},
              "required": ["n", "tag"], "additionalProperties": False}
    completion = client.chat.completions.create(
        model="toolrail", messages=[{"role": "user", "content": "a number and a tag"}],
        response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema, "strict": True}})
    assert completion.choices[0].finish_reason == "stop"
    assert validation_errors(schema, json.loads(completion.choices[0].message.content)) == []


def test_unsupported_schema_is_422_naming_the_feature(client):
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"m": {"type": "object", "patternProperties": {"^x": {"type": "integer"}}}}}}}
    with pytest.raises(openai.UnprocessableEntityError) as info:
        client.chat.completions.create(model="toolrail", messages=[{"role": "user", "content": "x"}], tools=[tool])
    error = info.value.body
    assert error["details"]["feature"] == "patternProperties"
    assert error["details"]["path"].endswith("/properties/m")


def test_required_with_no_tools_is_400(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="toolrail", messages=[{"role": "user", "content": "x"}], tools=[],
                                       tool_choice="required")
    assert "required" in info.value.message


def test_prompt_too_long_is_400(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="toolrail", messages=[{"role": "user", "content": "word " * 3000}],
                                       tools=_tools(marker_tools()))
    assert info.value.body["code"] == "context_length_exceeded" and info.value.body["param"] == "messages"


def test_a_generation_bound_is_a_200_with_finish_reason_length(client):
    kwargs = dict(model="toolrail", messages=[{"role": "user", "content": MARKER_TEXT}], tools=_tools(marker_tools()),
                  tool_choice="required", max_tokens=3)
    completion = client.chat.completions.create(**kwargs)  # the SDK raises on any error status
    choice = completion.choices[0]
    assert choice.finish_reason == "length"
    assert not choice.message.tool_calls  # three tokens close no call: none is sent half-written
    finish = None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for streamed in chunk.choices:
            finish = streamed.finish_reason or finish
    assert finish == "length"
