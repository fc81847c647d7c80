"""The per-request parser: ids and indices bound to the request, streaming equals whole."""

from __future__ import annotations

import random

from decider.parser import ToolCallStreamParser, parse_output

TEXT = ('[{"name": "get_balance", "arguments": {"account": "A\\"1}", "n": [1, {"x": 2}]}}, '
        '{"name": "get_balance", "arguments": {"account": "B"}}, {"arguments": {"to": "C"}, "name": "transfer"}]')


def stream(text, request_id, sizes):
    parser = ToolCallStreamParser(request_id)
    deltas, pos = [], 0
    while pos < len(text):
        step = sizes()
        deltas += parser.feed(text[pos:pos + step])
        pos += step
    return parser, deltas


def test_whole_parse_ids_and_indices():
    out = parse_output(TEXT, request_id="req7")
    assert [(c.id, c.index, c.name) for c in out.tool_calls] == [
        ("call_req7_0", 0, "get_balance"), ("call_req7_1", 1, "get_balance"), ("call_req7_2", 2, "transfer")]
    assert out.tool_calls[0].arguments == {"account": 'A"1}', "n": [1, {"x": 2}]}
    assert out.problem is None


def test_streaming_deltas_reassemble_with_same_id_and_index_on_every_chunk():
    rng = random.Random(3)
    for _ in range(20):
        parser, deltas = stream(TEXT, "r", lambda: rng.randint(1, 7))
        assembled = {}
        for delta in deltas:
            entry = assembled.setdefault(delta.index, {"id": delta.id, "name": "", "arguments": ""})
            assert entry["id"] == delta.id == f"call_r_{delta.index}"
            entry["name"] += delta.name or ""
            entry["arguments"] += delta.arguments
        whole = parse_output(TEXT, request_id="r")
        assert [(c.id, c.name, c.raw_arguments) for c in whole.tool_calls] == [
            (e["id"], e["name"], e["arguments"]) for _, e in sorted(assembled.items())]
        assert parser.finish().tool_calls == whole.tool_calls


def test_first_delta_carries_name_and_type_later_ones_only_arguments():
    _, deltas = stream(TEXT, "r", lambda: 1)
    first = [d for d in deltas if d.index == 0]
    assert first[0].to_openai()["type"] == "function" and first[0].to_openai()["function"]["name"] == "get_balance"
    assert first[0].to_openai()["id"] == "call_r_0"
    # id, type and name in the first delta only: clients concatenate every string field they are sent
    assert all(set(d.to_openai()) == {"index", "function"} and set(d.to_openai()["function"]) == {"arguments"}
               for d in first[1:])


def test_parsers_are_per_request():
    a, b = ToolCallStreamParser("a"), ToolCallStreamParser("b")
    half = len(TEXT) // 2
    a.feed(TEXT[:half]); b.feed(TEXT[:half]); a.feed(TEXT[half:]); b.feed(TEXT[half:])
    assert {c.id for c in a.finish().tool_calls}.isdisjoint({c.id for c in b.finish().tool_calls})


def test_truncated_and_text_outputs():
    cut = parse_output('[{"name": "a", "arguments": {"x": "ab', request_id="t")
    assert cut.problem and cut.tool_calls[0].arguments is None and cut.tool_calls[0].raw_arguments == '{"x": "ab'
    assert parse_output('{"content": "hi"}', request_id="t").content == "hi"
    assert parse_output("plain words", request_id="t").content == "plain words"
    assert parse_output("[]", request_id="t").tool_calls == []


def test_reask_attempt_changes_ids():
    out = parse_output('[{"name": "a", "arguments": {}}]', request_id="q", attempt=2)
    assert out.tool_calls[0].id == "call_q_0_a2"
