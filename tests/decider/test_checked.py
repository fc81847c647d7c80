"""The one check-and-re-ask loop (``decide_checked``), as plain functions (no broker).

``ScriptedDecider`` is a test double of the decider protocol: it replays outputs written
in the test, so the bound of the loop can be checked exactly. The real decider runs the
same loop in tests/decider and end to end. Inputs are invented for these tests.
"""

from __future__ import annotations

import pytest

from decider.errors import BackendUnavailableError
from decider.protocol import DecideRequest, Decision
from decider.checked import decide_checked
from decider.errors import GenerationBoundError
from decider.prompt import FEEDBACK_NAME, reask_messages
from tools.registry import default_registry
from tools.spec import ToolSpec


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
    result = decide_checked(decider, request, max_reasks=2)
    assert result.status == "calls" and result.calls[0].arguments["city"] == "Beijing"
    assert [a.attempt for a in result.attempts] == [0, 1]
    second = decider.requests[1]
    assert second.attempt == 1
    assert "后天" in second.messages[-1]["content"] and "/date" in second.messages[-1]["content"]
    assert second.messages[-2] == {"role": "assistant", "content": BAD}
    assert len(request.messages) == 1  # the caller's list is never mutated


@pytest.mark.parametrize("max_reasks", [0, 1, 2, 3])
def test_reasks_are_bounded(max_reasks: int) -> None:
    decider = ScriptedDecider([BAD] * 10)
    result = decide_checked(decider, _request(), max_reasks=max_reasks)
    assert result.status == "needs_review" and result.error["type"] == "invalid_tool_calls"
    assert len(decider.requests) == max_reasks + 1
    assert len(result.attempts) == max_reasks + 1
    assert all(a.raw_output == BAD and a.errors for a in result.attempts)
    assert not result.calls and result.blocked


def test_a_clients_failing_output_goes_to_review_and_the_model_is_never_asked() -> None:
    decider = ScriptedDecider([GOOD])  # before: asked, its call replaced the client's (issue 32)
    result = decide_checked(decider, _request(), max_reasks=2, first_output=BAD)
    assert result.status == "needs_review" and [a.source for a in result.attempts] == ["client"]
    assert decider.requests == [] and not result.calls
    (sent,) = result.error["details"]["client_calls"]
    assert sent["arguments"] == {"city": "北京", "date": "后天"} and sent["errors"][0]["path"] == "/date"
    assert "never replaced" in result.error["message"]


def test_a_valid_client_output_never_asks_for_the_decider() -> None:
    asked = []
    result = decide_checked(lambda: asked.append(1), _request(), first_output=GOOD)
    assert result.status == "calls" and not asked


def test_transport_errors_are_not_fed_back_to_the_model() -> None:
    decider = ScriptedDecider([BackendUnavailableError("triton down")])
    with pytest.raises(BackendUnavailableError):
        decide_checked(decider, _request(), max_reasks=2)
    assert len(decider.requests) == 1


def test_required_tool_choice_rejects_a_text_answer() -> None:
    decider = ScriptedDecider(["I think it will rain.", GOOD])
    request = _request().model_copy(update={"tool_choice": "required"})
    result = decide_checked(decider, request, max_reasks=1)
    assert result.status == "calls" and len(result.attempts) == 2
    assert "required" in result.attempts[0].errors[0]["message"]


def test_reask_message_is_a_new_list() -> None:
    messages = [{"role": "user", "content": "hi"}]
    new = reask_messages(messages, output="x", errors=[{"path": "/a", "message": "bad"}])
    assert messages == [{"role": "user", "content": "hi"}] and len(new) == 3
    assert new[-1]["name"] == FEEDBACK_NAME and "/a: bad" in new[-1]["content"]


# ------------------------------------------------------------------ text answers and bare objects

def test_a_text_answer_is_a_text_answer_in_a_reask_too() -> None:
    decider = ScriptedDecider([BAD, '{"content": "Which city do you mean?"}'])
    result = decide_checked(decider, _request())
    assert result.status == "text" and result.content == "Which city do you mean?"
    assert not result.attempts[-1].errors


def test_a_bare_arguments_object_with_one_tool_is_that_tools_call() -> None:
    result = decide_checked(None, _request(), first_output='{"city": "北京", "date": "tomorrow"}')
    assert result.status == "calls" and result.calls[0].name == "get_weather"
    assert len(result.attempts) == 1


def test_a_generation_bound_fails_fast_without_a_reask() -> None:
    decider = ScriptedDecider([GenerationBoundError("loop", "repeats", output="abcabc")])
    result = decide_checked(decider, _request(), max_reasks=2)
    assert result.status == "failed" and result.error["type"] == "generation_bound"
    assert len(decider.requests) == 1


# ------------------------------------------------------------------ declared grounding

PAY = ToolSpec(name="pay_invoice", side_effects=True, parameters={
    "type": "object", "additionalProperties": False, "required": ["invoice", "amount"],
    "properties": {"invoice": {"type": "string", "pattern": "^INV-[0-9]{4}$"},
                   "amount": {"type": "number"}, "memo": {"type": "string"}}})


def _pay(text: str) -> DecideRequest:
    return DecideRequest(request_id="rq-pay", messages=[{"role": "user", "content": text}], tools=[PAY])


def _call(invoice: str, amount: float, memo: str = "thanks") -> str:
    return '[{"name": "pay_invoice", "arguments": {"invoice": "%s", "amount": %s, "memo": "%s"}}]' % (invoice, amount, memo)


def test_grounded_values_stated_in_the_conversation_pass() -> None:
    decider = ScriptedDecider([_call("INV-4821", 310.5, "composed by the model")])
    result = decide_checked(decider, _pay("Please settle INV-4821, three hundred ten point five... I mean 310.5 dollars"))
    assert result.status == "calls" and result.calls[0].arguments["amount"] == 310.5


def test_an_unstated_amount_is_reasked_once_then_goes_to_review() -> None:
    decider = ScriptedDecider([_call("INV-4821", 999), _call("INV-4821", 999), _call("INV-4821", 999)])
    result = decide_checked(decider, _pay("settle invoice INV-4821 please"), max_reasks=2)
    assert result.status == "needs_review" and result.error["type"] == "ungrounded_values"
    assert len(decider.requests) == 2  # grounding is re-asked once, not max_reasks times
    assert "pay_invoice/amount" in result.error["message"]
    assert result.attempts[-1].findings[0]["path"] == "/amount"
    assert "999" in decider.requests[1].messages[-1]["content"]
    assert not result.calls


def test_the_model_may_answer_in_text_after_a_grounding_reask() -> None:
    decider = ScriptedDecider([_call("INV-0001", 20), '{"content": "Which invoice should I pay?"}'])
    result = decide_checked(decider, _pay("pay twenty for my invoice"))
    assert result.status == "text" and "/invoice" in result.attempts[0].findings[0]["path"]


def test_the_feedback_message_never_grounds_a_value() -> None:
    # the re-ask feedback quotes the bad value; it must not count as the user stating it
    decider = ScriptedDecider([_call("INV-7777", 5), _call("INV-7777", 5)])
    result = decide_checked(decider, _pay("pay 5 on my invoice"))
    assert result.status == "needs_review"


def test_a_side_effect_the_conversation_already_made_is_never_run_again():
    done = {"role": "assistant", "content": None, "tool_calls": [{"id": "c-1", "type": "function", "function": {
        "name": "pay_invoice", "arguments": '{"invoice": "INV-4821", "amount": 20, "memo": "thanks"}'}}]}
    messages = [{"role": "user", "content": "pay 20 on INV-4821"}, done,
                {"role": "tool", "tool_call_id": "c-1", "content": '{"paid": true}'}]
    request = DecideRequest(request_id="rq-again", messages=messages, tools=[PAY])
    again = ScriptedDecider([_call("INV-4821", 20), _call("INV-4821", 20)])
    result = decide_checked(again, request)
    # nobody asked for it again since it ran: re-asked once offering the answer only, then nothing new to run
    assert result.status == "needs_review" and result.error["type"] == "repeated_answered_calls"
    assert len(again.requests) == 2 and again.requests[1].tool_choice == "none" and not result.calls
    answered = decide_checked(ScriptedDecider([_call("INV-4821", 20), '{"content": "It is paid."}']), request)
    assert answered.status == "text"


def _after_result(spec: ToolSpec | None = None) -> DecideRequest:
    arguments = '{"city": "Beijing", "date": "tomorrow", "unit": "celsius"}'
    return DecideRequest(request_id="rq-run", tools=[spec or default_registry().get("get_weather")], messages=[
        {"role": "user", "content": "weather in Beijing tomorrow?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": '{"temperature": 23}'}])


def test_a_read_only_call_already_answered_is_reasked_offering_the_answer_only() -> None:
    repeat = '[{"name": "get_weather", "arguments": {"city": "Beijing", "date": "tomorrow"}}]'
    decider = ScriptedDecider([repeat, "It will be 23 degrees."])
    result = decide_checked(decider, _after_result(), max_reasks=2)
    assert result.status == "text" and result.content == "It will be 23 degrees."
    assert result.attempts[0].errors[0]["validator"] == "repeated_call"
    assert "call_a" in result.attempts[0].errors[0]["message"]
    assert decider.requests[0].tool_choice == "auto" and decider.requests[1].tool_choice == "none"
    assert result.attempts[1].platform["reask_tool_choice"] == "none"  # what the platform did is on the record
    assert decider.requests[1].messages == decider.requests[0].messages  # no feedback for a small model to parrot


def test_a_different_call_after_a_result_is_the_models_to_make() -> None:
    other = '[{"name": "get_weather", "arguments": {"city": "Beijing", "date": "today"}}]'
    result = decide_checked(ScriptedDecider([other]), _after_result(), max_reasks=2)
    assert result.status == "calls" and result.calls[0].arguments["date"] == "today"


def test_a_repeatable_tool_may_be_called_again() -> None:
    spec = default_registry().get("get_weather").model_copy(update={"repeatable": True})
    repeat = '[{"name": "get_weather", "arguments": {"city": "Beijing", "date": "tomorrow"}}]'
    result = decide_checked(ScriptedDecider([repeat]), _after_result(spec), max_reasks=2)
    assert result.status == "calls" and len(result.attempts) == 1


# ------------------------------------------------------------------ bounds and calls written as text

def test_a_bound_keeps_the_calls_that_closed_before_it_checked() -> None:
    cut = GOOD[:-1] + ', {"name": "get_weather", "arguments": {"city": "北'
    decider = ScriptedDecider([GenerationBoundError("max_tokens", "cut", output=cut, tokens=40)])
    result = decide_checked(decider, _request(), max_reasks=2)
    assert result.status == "failed" and result.error["type"] == "generation_bound"
    assert [(c.name, c.arguments["city"], c.arguments["date"]) for c in result.calls] == [
        ("get_weather", "Beijing", "tomorrow")]
    assert len(decider.requests) == 1


def test_a_bound_keeps_no_call_that_fails_its_check() -> None:
    decider = ScriptedDecider([GenerationBoundError("max_tokens", "cut", output=BAD[:-1] + ", {")])
    result = decide_checked(decider, _request(), max_reasks=2)
    assert result.status == "failed" and result.calls == []


@pytest.mark.parametrize("written", [
    'get_weather(city="Beijing", date="tomorrow")',
    '[{"name": "get_weather", "arguments": {"city": "Beijing", "date": "tomorrow"}}]',
])
def test_a_call_written_as_text_is_reasked_once_with_calls_required(written: str) -> None:
    import json

    decider = ScriptedDecider([json.dumps({"content": written}), GOOD])
    result = decide_checked(decider, _request(), max_reasks=2)
    assert result.status == "calls" and result.calls[0].name == "get_weather"
    assert [e["validator"] for e in result.attempts[0].errors] == ["call_as_text"]
    assert decider.requests[0].tool_choice == "auto" and decider.requests[1].tool_choice == "required"
    assert result.attempts[1].platform["reask_tool_choice"] == "required"


def test_a_call_written_as_text_again_goes_to_review() -> None:
    text = '{"content": "get_weather(city=\\"Beijing\\")"}'
    decider = ScriptedDecider([text, text, text])
    result = decide_checked(decider, _request(), max_reasks=2)
    assert result.status == "needs_review" and result.error["type"] == "call_as_text"
    assert len(decider.requests) == 2


def test_a_text_answer_that_names_a_tool_is_an_answer() -> None:
    decider = ScriptedDecider(['{"content": "I can look that up with get_weather if you tell me the city."}'])
    result = decide_checked(decider, _request(), max_reasks=2)
    assert result.status == "text" and not result.attempts[0].errors


def test_a_call_written_as_text_when_calls_were_forbidden_ends_the_decision() -> None:
    """The model repeats an answered call; asked to answer in text it writes the same call as text: requiring calls
    next would only ask for the repeat again, so the decision ends (no third attempt) as one that only repeated
    answered calls — a run ends on its results there (``executor.runs.policy.ends_on_results``)."""
    import json

    repeat = '[{"name": "get_weather", "arguments": {"city": "Beijing", "date": "tomorrow"}}]'
    decider = ScriptedDecider([repeat, json.dumps({"content": repeat}), repeat])
    result = decide_checked(decider, _after_result(), max_reasks=2)
    assert result.status == "needs_review" and result.error["type"] == "repeated_answered_calls"
    assert [r.tool_choice for r in decider.requests] == ["auto", "none"]


def _transfer_after_result(*, user_again: str | None = None) -> DecideRequest:
    spec = ToolSpec.from_openai({"type": "function", "function": {"name": "send", "parameters": {
        "type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]}}})
    spec = spec.model_copy(update={"side_effects": True})
    messages = [{"role": "user", "content": "send it to bob"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "send", "arguments": '{"to": "bob"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": '{"sent": true}'}]
    if user_again:
        messages.append({"role": "user", "content": user_again})
    return DecideRequest(request_id="rq-se", messages=messages, tools=[spec])


def test_a_side_effect_that_already_ran_unasked_for_again_is_reasked_for_the_answer() -> None:
    # before (issue 32): repeated_side_effect, re-asked, then review; nobody asked for it again since it ran
    decider = ScriptedDecider(['[{"name": "send", "arguments": {"to": "bob"}}]', '{"content": "Sent to bob."}'])
    result = decide_checked(decider, _transfer_after_result(), max_reasks=2)
    assert result.status == "text" and result.content == "Sent to bob."
    assert result.attempts[0].errors[0]["validator"] == "repeated_call"
    assert decider.requests[1].tool_choice == "none"  # offered the answer only


def test_a_side_effect_the_user_asks_for_again_still_needs_a_person() -> None:
    repeat = '[{"name": "send", "arguments": {"to": "bob"}}]'
    result = decide_checked(ScriptedDecider([repeat, repeat]), _transfer_after_result(user_again="send it again"))
    assert result.status == "needs_review" and result.error["type"] == "repeated_side_effect"


def test_only_repeating_answered_calls_is_its_own_review_type() -> None:
    # the answer-only re-ask answered with the call written as text: nothing new to run (a run ends on its results)
    decider = ScriptedDecider(['[{"name": "send", "arguments": {"to": "bob"}}]', '{"content": "send(to=\\"bob\\")"}'])
    result = decide_checked(decider, _transfer_after_result(), max_reasks=2)
    assert result.status == "needs_review" and result.error["type"] == "repeated_answered_calls", result.error
