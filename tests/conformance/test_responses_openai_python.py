"""The Responses API through openai-python: ``responses.create``, ``retrieve``, ``stream`` and ``parse``."""

from __future__ import annotations

import json

import openai
import pydantic
import pytest

NOTE = {"type": "function", "name": "save_note", "description": "save a short note", "strict": True, "parameters": {
    "type": "object", "properties": {"title": {"type": "string", "maxLength": 24}, "pages": {"type": "integer"}},
    "required": ["title", "pages"], "additionalProperties": False}}
ASK = "Save a note titled groceries with 2 pages."


def responses(surface: str):
    return pytest.mark.conformance(f"responses: {surface}", "openai-python")


@responses("create with a function tool, then the tool's output by previous_response_id")
def test_a_function_call_and_its_output_chain_by_id(client):
    first = client.responses.create(model="toolrail", input=ASK, tools=[NOTE], tool_choice="required",
                                    parallel_tool_calls=False, max_output_tokens=60)
    assert first.object == "response" and first.status == "completed" and first.id.startswith("resp_")
    (call,) = first.output
    assert call.type == "function_call" and call.name == "save_note" and call.call_id and call.status == "completed"
    assert set(json.loads(call.arguments)) == {"title", "pages"}
    assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0
    assert first.usage.total_tokens == first.usage.input_tokens + first.usage.output_tokens
    second = client.responses.create(model="toolrail", previous_response_id=first.id, tools=[NOTE], tool_choice="none",
                                     input=[{"type": "function_call_output", "call_id": call.call_id, "output": "saved"}],
                                     max_output_tokens=8)
    assert second.previous_response_id == first.id
    assert [item.type for item in second.output] == ["message"] and second.output[0].role == "assistant"
    assert second.output_text == second.output[0].content[0].text
    with pytest.raises(openai.BadRequestError):  # without the first turn, the same output answers no call
        client.responses.create(model="toolrail", tools=[NOTE], tool_choice="none", max_output_tokens=8,
                                input=[{"type": "function_call_output", "call_id": call.call_id, "output": "saved"}])
    assert client.responses.retrieve(first.id).output[0].call_id == call.call_id


@responses("input items: messages, function_call, function_call_output")
def test_the_whole_conversation_as_input_items(client):
    items = [{"role": "user", "content": [{"type": "input_text", "text": ASK}]},
             {"type": "function_call", "call_id": "call_a", "name": "save_note", "arguments": '{"title":"g","pages":2}'},
             {"type": "function_call_output", "call_id": "call_a", "output": "saved"}]
    response = client.responses.create(model="toolrail", input=items, instructions="Be brief.", tools=[NOTE],
                                       tool_choice="none", max_output_tokens=6)
    assert response.output[0].type == "message" and response.instructions == "Be brief."
    with pytest.raises(openai.BadRequestError) as info:  # an output answering no call
        client.responses.create(model="toolrail", input=items[:1] + items[2:], tools=[NOTE], max_output_tokens=6)
    assert info.value.param == "input"
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="toolrail", input=ASK, previous_response_id="resp_nobody", max_output_tokens=6)
    assert info.value.param == "previous_response_id"


@responses("max_output_tokens: status incomplete with incomplete_details")
def test_a_cut_response_is_incomplete(client):
    response = client.responses.create(model="toolrail", input="Tell a story.", max_output_tokens=5)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 5


class Note(pydantic.BaseModel):
    title: str = pydantic.Field(max_length=8)
    pages: int = pydantic.Field(ge=1, le=9)


@responses("text.format json_schema (responses.parse)")
def test_structured_output_parses(client):
    parsed = client.responses.parse(model="toolrail", input=ASK, text_format=Note, max_output_tokens=80)
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, Note)


@responses("streaming events: a function call")
def test_a_streamed_call_is_the_documented_event_sequence(client):
    with client.responses.stream(model="toolrail", input=ASK, tools=[NOTE], tool_choice="required",
                                 parallel_tool_calls=False, max_output_tokens=60) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] == "response.completed"
    assert kinds.index("response.function_call_arguments.done") < kinds.index("response.output_item.done")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    (call,) = final.output
    assert call.type == "function_call" and deltas == call.arguments
    assert events[2].item.call_id == call.call_id and events[2].item.name == "save_note"


@responses("streaming events: text")
def test_a_streamed_text_answer_is_the_documented_event_sequence(client):
    with client.responses.stream(model="toolrail", input="Say hello.", max_output_tokens=8) as stream:
        events = list(stream)
    final = events[-1].response  # response.incomplete when the bound cut it (the helper's final is completed only)
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete" if final.status == "incomplete" else "response.completed"]
    assert kinds.count("response.output_text.delta") > 1
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == final.output_text


@responses("an unknown model is a 404 model_not_found")
def test_an_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model="gpt-17-imaginary", input="hi", max_output_tokens=4)
    assert info.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_nobody")


@responses("the client's own function_call is answered as it is, never replaced")
def test_the_clients_own_call_is_kept(client):
    mine = {"type": "function_call", "call_id": "call_mine_1", "name": "save_note",
            "arguments": '{"title": "groceries", "pages": 2}'}
    response = client.responses.create(model="toolrail", input=[{"role": "user", "content": ASK}, mine], tools=[NOTE],
                                       max_output_tokens=40)
    (call,) = response.output
    assert (call.type, call.call_id, call.name) == ("function_call", "call_mine_1", "save_note")
    assert json.loads(call.arguments) == {"title": "groceries", "pages": 2}
    with client.responses.stream(model="toolrail", input=[{"role": "user", "content": ASK}, mine], tools=[NOTE],
                                 max_output_tokens=40) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.output[0].call_id == "call_mine_1"
