"""Calls reported the moment their JSON closes: the parser, the check loop, the embedded decider.

``StreamingScriptedDecider`` is a test double of a decider (it replays outputs written in the
test through the real stream parser, chunk by chunk); the embedded decider over the tiny
random model is the real thing.
"""

from __future__ import annotations

import random
import threading

from decider.checked import decide_checked
from decider.parser import ToolCallStreamParser, parse_output
from decider.protocol import DecideRequest, Decision
from decider_fixtures import marker_tools, tiny_decider, tiny_engine  # noqa: F401
from tools.calls import call_id
from tools.registry import default_registry

TEXT = ('[{"name": "get_balance", "arguments": {"account": "A\\"1}", "n": [1, {"x": "}"}]}}, '
        '{"name": "get_balance", "arguments": {"account": "B"}}, {"arguments": {"to": "C"}, "name": "transfer"}]')


def test_each_call_is_reported_when_its_object_closes_and_equals_the_whole_parse() -> None:
    closes = [i for i in range(len(TEXT)) if TEXT[i:i + 4] == "}, {" or TEXT[i:] == "}]"]  # each call's own brace
    assert len(closes) == 3
    for seed in range(10):
        rng = random.Random(seed)
        reported: list[tuple[int, object]] = []
        parser = ToolCallStreamParser("rq", attempt=1, on_call=lambda call: reported.append((fed[0], call)))
        fed, pos = [0], 0
        while pos < len(TEXT):
            step = rng.randint(1, 9)
            fed[0] = min(len(TEXT), pos + step)
            parser.feed(TEXT[pos:pos + step])
            pos += step
        for (at, _), close in zip(reported, closes, strict=True):
            assert close < at <= close + 9  # reported with the chunk that held its closing brace, never earlier
        assert [c for _, c in reported] == parse_output(TEXT, request_id="rq", attempt=1).tool_calls
        assert reported[0][1].id == "call_rq_0_a1" and reported[0][1].arguments == {"account": 'A"1}', "n": [1, {"x": "}"}]}


def test_an_unclosed_call_is_never_reported() -> None:
    reported = []
    parser = ToolCallStreamParser("rq", on_call=reported.append)
    parser.feed('[{"name": "get_balance", "arguments": {"account": "A"}}, {"name": "get_balance", "arguments": {"acc')
    assert [c.index for c in reported] == [0]
    assert parser.finish().problem is not None


class StreamingScriptedDecider:
    """Test double: replays scripted outputs through the real stream parser, reporting closed calls as it goes."""

    def __init__(self, outputs: list[str]) -> None:
        self.outputs = list(outputs)

    def decide(self, request: DecideRequest, *, on_call=None) -> Decision:  # noqa: ANN001
        text = self.outputs.pop(0)
        parser = ToolCallStreamParser(request.request_id, attempt=request.attempt, on_call=on_call)
        for start in range(0, len(text), 5):
            parser.feed(text[start:start + 5])
        return Decision(request_id=request.request_id, raw_output=text, tool_calls=parser.finish().tool_calls)


def _request() -> DecideRequest:
    registry = default_registry()
    return DecideRequest(request_id="rq-early", messages=[{"role": "user", "content": "北京和上海明天天气"}],
                         tools=[registry.get("get_weather"), registry.get("transfer")])


def test_checked_loop_reports_only_calls_that_pass_alone_with_their_attempt() -> None:
    first = ('[{"name": "get_weather", "arguments": {"city": "北京", "date": "明天"}}, '
             '{"name": "get_weather", "arguments": {"city": "上海", "date": "大后天"}}]')
    second = ('[{"name": "get_weather", "arguments": {"city": "Beijing", "date": "tomorrow"}}, '
              '{"name": "get_weather", "arguments": {"city": "Shanghai", "date": "tomorrow"}}]')
    reported = []
    decision = decide_checked(StreamingScriptedDecider([first, second]), _request(),
                              on_call=lambda attempt, call: reported.append((attempt, call.index, call.name, call.arguments)))
    assert decision.status == "calls" and decision.attempt == 1
    # attempt 0: only the first call passed alone (the second one's date is invalid: it was re-asked)
    assert reported[0] == (0, 0, "get_weather", {"city": "Beijing", "date": "tomorrow", "unit": "celsius"})
    assert reported[1:] == [(1, c.index, c.name, c.arguments) for c in decision.calls]
    assert [call_id("rq-early", i, attempt=a) for a, i, _, _ in reported[1:]] == [c.id for c in decision.tool_calls]


def test_a_plain_decider_without_on_call_still_works() -> None:
    class Plain:
        def decide(self, request: DecideRequest) -> Decision:
            return Decision(request_id=request.request_id,
                            raw_output='[{"name": "get_weather", "arguments": {"city": "Beijing", "date": "tomorrow"}}]')

    reported = []
    decision = decide_checked(Plain(), _request(), on_call=lambda a, c: reported.append(c))
    assert decision.status == "calls" and reported == []


def test_embedded_decider_reports_the_decisions_calls_in_the_callers_thread(tiny_decider) -> None:  # noqa: F811
    for i in range(4):
        marker = f"M{i:06x}"
        seen: list[tuple[str, str, dict | None, int]] = []
        request = DecideRequest(request_id=f"early-{i}", messages=[{"role": "user", "content": f"balance of {marker}"}],
                                tools=marker_tools(), tool_choice="required", max_tokens=160)
        decision = tiny_decider.decide(request, on_call=lambda c: seen.append((c.id, c.name, c.arguments,
                                                                               threading.get_ident())))
        assert decision.tool_calls, decision.raw_output
        told = [(s[0], s[1], s[2]) for s in seen]
        # every call told early is the decision's (with the call count read after decoding, only the first is told)
        assert told and told == [(c.id, c.name, c.arguments) for c in decision.tool_calls][:len(told)]
        assert {s[3] for s in seen} == {threading.get_ident()}
