"""Chat Completions through openai-python: create, stream, the ``chat.completions.stream()`` helper and ``parse``.

Each test is one deviation issue 34 found, asserted as the client and OpenAI's reference state the protocol.
"""

from __future__ import annotations

import json

import openai
import pydantic
import pytest

pytestmark = []

#: A tool whose call is streamed as decoded (no alias or grounded field: nothing is held back to be checked whole).
NOTE = {"type": "function", "function": {"name": "save_note", "description": "save a short note", "parameters": {
    "type": "object", "properties": {"title": {"type": "string", "maxLength": 24}, "pages": {"type": "integer"}},
    "required": ["title", "pages"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "Save a note titled groceries with 2 pages."}]


def chat(surface: str):
    return pytest.mark.conformance(f"chat: {surface}", "openai-python")


@chat("streamed tool calls (id, type, name in the first delta only)")
def test_streamed_call_sends_id_type_and_name_once(client):
    deltas = []
    for chunk in client.chat.completions.create(model="toolrail", messages=ASK, tools=[NOTE], tool_choice="required",
                                                parallel_tool_calls=False, max_tokens=60, stream=True):
        for choice in chunk.choices:
            deltas += choice.delta.tool_calls or []
    assert len(deltas) > 1, "the call should stream in pieces"
    first, rest = deltas[0], deltas[1:]
    assert first.id and first.type == "function" and first.function.name == "save_note"
    assert all(d.id is None and d.type is None and (d.function is None or d.function.name is None) for d in rest)


@chat("the stream helper (chat.completions.stream)")
def test_stream_helper_joins_one_call_with_its_own_id(client):
    with client.chat.completions.stream(model="toolrail", messages=ASK, tools=[NOTE], tool_choice="required",
                                        parallel_tool_calls=False, max_tokens=60) as stream:
        done = [e for e in stream if e.type == "tool_calls.function.arguments.done"]
        final = stream.get_final_completion()
    call = final.choices[0].message.tool_calls[0]
    assert call.id.startswith("call_") and call.id.count("call_") == 1, call.id  # not call_…_0call_…_0…
    assert call.function.name == "save_note"
    assert done and json.loads(done[0].arguments) == json.loads(call.function.arguments)


@chat("finish_reason length and usage when max_tokens cuts the answer")
def test_a_cut_text_answer_says_length_and_counts_usage(client):
    completion = client.chat.completions.create(model="toolrail", messages=[{"role": "user", "content": "Tell a story."}],
                                                max_tokens=5)
    choice = completion.choices[0]
    assert choice.finish_reason == "length"
    assert completion.usage.completion_tokens == 5 and completion.usage.prompt_tokens > 0
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + 5
    finish, usage = None, None
    for chunk in client.chat.completions.create(model="toolrail", messages=[{"role": "user", "content": "Tell a story."}],
                                                max_tokens=5, stream=True, stream_options={"include_usage": True}):
        finish = next((c.finish_reason for c in chunk.choices if c.finish_reason), finish)
        usage = chunk.usage or usage
    assert finish == "length" and usage is not None and usage.completion_tokens == 5


@chat("finish_reason length and usage when max_tokens cuts a tool call")
def test_a_cut_tool_call_says_length_and_counts_usage(client):
    completion = client.chat.completions.create(model="toolrail", messages=ASK, tools=[NOTE], tool_choice="required",
                                                max_tokens=4)
    assert completion.choices[0].finish_reason == "length"
    assert not completion.choices[0].message.tool_calls
    assert completion.usage.completion_tokens == 4 and completion.usage.prompt_tokens > 0


class Note(pydantic.BaseModel):
    title: str = pydantic.Field(max_length=8)
    pages: int = pydantic.Field(ge=1, le=9)


@chat("parse (structured output): a cut answer raises the length error")
def test_parse_raises_the_length_error_on_a_cut_answer(client):
    with pytest.raises(openai.LengthFinishReasonError):
        client.chat.completions.parse(model="toolrail", messages=ASK, response_format=Note, max_tokens=3)
    parsed = client.chat.completions.parse(model="toolrail", messages=ASK, response_format=Note, max_tokens=80)
    assert parsed.choices[0].finish_reason == "stop" and isinstance(parsed.choices[0].message.parsed, Note)


@chat("max_tokens up to the model's context (frameworks send 4096)")
def test_a_large_max_tokens_is_accepted_and_clamped(client):
    for field in ("max_tokens", "max_completion_tokens"):
        raw = client.chat.completions.with_raw_response.create(model="toolrail", messages=ASK, tools=[NOTE],
                                                               tool_choice="required", parallel_tool_calls=False,
                                                               **{field: 4096})
        assert raw.parse().choices[0].finish_reason == "tool_calls"
        clamp = json.loads(raw.http_response.text)["toolrail"]["max_tokens"]  # what was decoded under, said plainly
        assert clamp["requested"] == 4096 and 0 < clamp["applied"] < 4096
    with pytest.raises(openai.BadRequestError) as info:  # past any context: refused, naming the field
        client.chat.completions.create(model="toolrail", messages=ASK, max_tokens=10**7)
    assert info.value.param == "max_tokens" and info.value.type == "invalid_request_error"


@chat("an unknown model is a 404 model_not_found")
def test_an_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-17-imaginary", messages=ASK, max_tokens=4)
    assert info.value.code == "model_not_found" and info.value.param == "model"


@chat("a tool message answering no call is a 400 naming it")
def test_an_unanswered_tool_message_is_refused(client):
    messages = ASK + [{"role": "tool", "tool_call_id": "call_nobody_made", "content": "{}"}]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="toolrail", messages=messages, tools=[NOTE], max_tokens=8)
    assert info.value.param == "messages.[1].tool_call_id"
    error = info.value.body
    assert {"message", "type", "param", "code"} <= set(error) and error["type"] == "invalid_request_error"


@chat("tool_choice none offers no call and keeps the bound")
def test_tool_choice_none_answers_in_text_within_the_bound(client):
    completion = client.chat.completions.create(model="toolrail", messages=ASK, tools=[NOTE], tool_choice="none",
                                                max_tokens=6)
    choice = completion.choices[0]
    assert not choice.message.tool_calls and 0 < completion.usage.completion_tokens <= 6
    assert choice.finish_reason == ("length" if completion.usage.completion_tokens == 6 else "stop")
    for chunk in client.chat.completions.create(model="toolrail", messages=ASK, tools=[NOTE], tool_choice="none",
                                                max_tokens=6, stream=True):
        assert all(not c.delta.tool_calls for c in chunk.choices)


@chat("text streamed token by token when tools are offered")
def test_a_text_answer_with_tools_offered_streams_in_pieces(client):
    pieces, finish = [], None
    for chunk in client.chat.completions.create(model="toolrail", messages=[{"role": "user", "content": "Say hello."}],
                                                tools=[NOTE], tool_choice="auto", max_tokens=40, stream=True,
                                                extra_body={"max_reasks": 0}):
        for choice in chunk.choices:
            assert not choice.delta.tool_calls
            pieces += [choice.delta.content] if choice.delta.content else []
            finish = choice.finish_reason or finish
    assert finish in ("stop", "length")
    assert len(pieces) > 3, pieces  # not one chunk at the end
