"""The validate → clean → re-ask loop, as plain functions (no broker).

``ScriptedDecider`` is a test double of the decider protocol: it replays outputs written
in the test, so the bound of the loop can be checked exactly. The real decider runs the
same loop in tests/decider and end to end.
"""

from __future__ import annotations

import pytest

from decider.errors import BackendUnavailableError
from decider.protocol import DecideRequest, Decision
from executor.pipeline import ReasksExhausted, check_output, decide_with_reasks, reask_messages
from tools.registry import default_registry


class ScriptedDecider:
    def __init__(self, outputs: list[str | Exception]) -> None:
        self.outputs = list(outputs)
        self.requests: list[DecideRequest] = []

    def decide(self, request: DecideRequest) -> Decision:
        self.requests.append(request)
        item = self.outputs.pop(0)
        if isinstance(item, Exception):
            raise item
        return Decision(request_id=request.request_id, raw_output=item)


BAD = '[{"name": "get_weather", "arguments": {"city": "北京", "date": "后天"}}]'
GOOD = '[{"name": "get_weather", "arguments": {"city": "北京", "date": "tomorrow"}}]'


def _request() -> DecideRequest:
    return DecideRequest(request_id="rq-1", messages=[{"role": "user", "content": "北京后天天气"}],
                         tools=[default_registry().get("get_weather")])


def test_reask_fixes_and_carries_the_errors() -> None:
    decider = ScriptedDecider([BAD, GOOD])
    request = _request()
    check, attempts = decide_with_reasks(decider, request, max_reasks=2)
    assert check.ok and check.calls[0].arguments["city"] == "Beijing"
    assert [a.attempt for a in attempts] == [0, 1]
    second = decider.requests[1]
    assert second.attempt == 1
    assert "后天" in second.messages[-1]["content"] and "/date" in second.messages[-1]["content"]
    assert second.messages[-2] == {"role": "assistant", "content": BAD}
    assert len(request.messages) == 1  # the caller's list is never mutated


@pytest.mark.parametrize("max_reasks", [0, 1, 2, 3])
def test_reasks_are_bounded(max_reasks: int) -> None:
    decider = ScriptedDecider([BAD] * 10)
    with pytest.raises(ReasksExhausted) as info:
        decide_with_reasks(decider, _request(), max_reasks=max_reasks)
    assert len(decider.requests) == max_reasks + 1
    assert len(info.value.attempts) == max_reasks + 1
    assert all(a.raw_output == BAD and a.errors for a in info.value.attempts)


def test_client_output_counts_as_the_first_attempt() -> None:
    specs = {"get_weather": default_registry().get("get_weather")}
    first = ("client", BAD, check_output(BAD, specs))
    decider = ScriptedDecider([BAD, GOOD])
    check, attempts = decide_with_reasks(decider, _request(), max_reasks=2, first=first)
    assert check.ok and [a.source for a in attempts] == ["client", "decider", "decider"]


def test_transport_errors_are_not_fed_back_to_the_model() -> None:
    decider = ScriptedDecider([BackendUnavailableError("triton down")])
    with pytest.raises(BackendUnavailableError):
        decide_with_reasks(decider, _request(), max_reasks=2)
    assert len(decider.requests) == 1


def test_required_tool_choice_rejects_a_text_answer() -> None:
    decider = ScriptedDecider(["I think it will rain.", GOOD])
    request = _request().model_copy(update={"tool_choice": "required"})
    check, attempts = decide_with_reasks(decider, request, max_reasks=1)
    assert check.ok and len(attempts) == 2 and "required" in attempts[0].errors[0]["message"]


def test_reask_message_is_a_new_list() -> None:
    messages = [{"role": "user", "content": "hi"}]
    new = reask_messages(messages, "x", [{"path": "/a", "message": "bad"}])
    assert messages == [{"role": "user", "content": "hi"}] and len(new) == 3
