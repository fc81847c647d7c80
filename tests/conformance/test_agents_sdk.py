"""The OpenAI Agents SDK, unchanged, running an agent with one function tool against toolrail's Responses API."""

from __future__ import annotations

import pytest

agents = pytest.importorskip("agents")

pytestmark = pytest.mark.conformance("responses: an agent run with a function tool (two model turns)", "OpenAI Agents SDK")


@pytest.fixture
def model(base_url):  # per test: an async client belongs to one event loop
    import openai
    from agents import OpenAIResponsesModel, set_tracing_disabled

    set_tracing_disabled(True)  # traces would go to api.openai.com: nothing of the run depends on them
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
    return OpenAIResponsesModel(model="toolrail", openai_client=client)


async def test_an_agent_calls_its_tool_then_answers(model):
    from agents import Agent, ModelSettings, Runner, function_tool
    from agents.items import MessageOutputItem, ToolCallItem, ToolCallOutputItem

    ran: list[str] = []

    @function_tool
    def office_hours() -> str:
        """The office's opening hours."""
        ran.append("office_hours")
        return "9 to 5"

    agent = Agent(name="clerk", instructions="Answer with the office hours.", tools=[office_hours], model=model,
                  model_settings=ModelSettings(tool_choice="required", max_tokens=1024))
    result = await Runner.run(agent, "When is the office open?", max_turns=4)
    kinds = [type(item) for item in result.new_items]
    assert kinds[:2] == [ToolCallItem, ToolCallOutputItem] and kinds[-1] is MessageOutputItem
    assert ran == ["office_hours"] * kinds.count(ToolCallOutputItem) and ran
    assert isinstance(result.final_output, str)
    assert len(result.raw_responses) == kinds.count(ToolCallItem) + 1  # one model turn per call, then the answer
    assert all(r.response_id and r.response_id.startswith("resp_") for r in result.raw_responses)
    assert result.raw_responses[0].usage.input_tokens > 0


async def test_a_run_continues_by_previous_response_id(model, client):
    from agents import Agent, ModelSettings, Runner, function_tool

    @function_tool
    def office_hours() -> str:
        """The office's opening hours."""
        return "9 to 5"

    agent = Agent(name="clerk", instructions="Answer with the office hours.", tools=[office_hours], model=model,
                  model_settings=ModelSettings(tool_choice="required", max_tokens=1024))
    # each turn after the first sends only its new items and the previous turn's response id
    result = await Runner.run(agent, "When is the office open?", max_turns=4, auto_previous_response_id=True)
    assert len(result.raw_responses) >= 2 and isinstance(result.final_output, str)
    assert result.last_response_id == result.raw_responses[-1].response_id
    second = client.responses.retrieve(result.raw_responses[1].response_id)  # as toolrail stored it
    assert second.previous_response_id == result.raw_responses[0].response_id
