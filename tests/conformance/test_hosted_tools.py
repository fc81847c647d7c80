"""toolrail's own tools run server-side for a Responses request that says so (issue 34 item 2), driven by the
official clients: the Agents SDK's ``HostedMCPTool`` and openai-python's ``responses.create``.

The job API as deployed (authentication, the mounted Responses router) over a real worker pool on the module's own
Redis; the decider in the workers is the scripted double (``tests/executor/scripted_decider.py``), whose steps
travel in the user's message, so each run's calls are known in advance.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
import redis

from tests.harness.fixtures import workers_environment
from tests.harness.jobs import publishers
from tests.harness.processes import decider_worker
from tests.harness.serving import api_server
from tools.ledger import Ledger

openai = pytest.importorskip("openai")

LEDGER_PREFIX = "hosted:ledger"
KEY = "key-hosted"
TOOLRAIL = {"type": "mcp", "server_label": "toolrail", "server_url": "https://toolrail.invalid/mcp"}


@pytest.fixture(scope="module")
def api(db_url: str, worker_env: dict[str, str]) -> Iterator[str]:
    from executor.api.app import create_app
    from executor.runtime import Runtime
    from toolrail.settings import Settings

    env = {"TOOLRAIL_LEDGER_PREFIX": LEDGER_PREFIX, "TOOLRAIL_API_KEYS": f"{KEY}:hosted"}
    settings = Settings(decider="custom", api_keys=f"{KEY}:hosted", reconcile_interval_s=0, rate_limit_per_s=0)
    enqueue, rerun = publishers(db_url)
    with workers_environment(worker_env), \
            decider_worker(db_url, factory="tests.executor.scripted_decider:make", env=env, name="hosted"), \
            api_server(create_app(settings, Runtime.from_settings(settings, redis_url=db_url), mount_openai=True, ping_workers=lambda: 1, enqueue=enqueue,
                                  rerun=rerun)) as base:
        yield base


@pytest.fixture(scope="module")
def ledger(db_url: str) -> Ledger:
    book = Ledger(redis.Redis.from_url(db_url), prefix=LEDGER_PREFIX)
    book.seed()
    return book


def _script(*steps: dict) -> str:
    return "RUN " + json.dumps({"steps": list(steps)})


WEATHER = {"calls": [{"name": "get_weather", "arguments": {"city": "Paris", "date": "today"}}]}
TRANSFER = {"calls": [{"name": "slow_transfer", "arguments": {"from_account": "alice", "to": "bob", "amount": 2.5,
                                                              "currency": "CNY", "delay_s": 0.05}}]}


@pytest.mark.conformance("responses: toolrail's own tools run server-side (hosted mcp tool)", "OpenAI Agents SDK")
async def test_an_agent_runs_toolrails_own_tools_server_side(api: str) -> None:
    agents = pytest.importorskip("agents")
    from agents.items import MessageOutputItem, ToolCallItem

    agents.set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=f"{api}/v1", api_key=KEY, max_retries=0, timeout=120)
    tool = agents.HostedMCPTool(tool_config={**TOOLRAIL, "allowed_tools": ["get_weather"], "require_approval": "never"})
    agent = agents.Agent(name="forecaster", instructions="Answer with the weather.", tools=[tool],
                         model=agents.OpenAIResponsesModel(model="custom", openai_client=client))
    result = await agents.Runner.run(agent, _script(WEATHER, {"text": "it is {results}"}), max_turns=2)
    (call,) = [item.raw_item for item in result.new_items if isinstance(item, ToolCallItem)]
    assert call.type == "mcp_call" and call.server_label == "toolrail" and call.name == "get_weather"
    assert json.loads(call.arguments).items() >= {"city": "Paris", "date": "today"}.items() and call.error is None
    assert "Paris" in call.output  # the tool's own result, run by toolrail's workers
    assert isinstance(result.new_items[-1], MessageOutputItem) and "Paris" in result.final_output
    response_id = result.raw_responses[0].response_id
    job = httpx.get(f"{api}/v1/jobs/{response_id}", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).json()
    assert job["status"] == "succeeded" and [c["status"] for c in job["calls"]] == ["succeeded"]


@pytest.mark.conformance("responses: a hosted tool's call held for approval, then approved (mcp_approval_response)",
                         "openai-python")
def test_a_held_call_is_approved_by_mcp_approval_response_and_runs_once(api: str, ledger: Ledger) -> None:
    client = openai.OpenAI(base_url=f"{api}/v1", api_key=KEY, max_retries=0, timeout=120)
    tools = [{**TOOLRAIL, "allowed_tools": ["slow_transfer"], "require_approval": "always"}]
    first = client.responses.create(model="custom", input=_script(TRANSFER, {"text": "sent: {results}"}), tools=tools)
    (request,) = first.output
    assert first.status == "completed" and request.type == "mcp_approval_request" and request.name == "slow_transfer"
    assert [e for e in ledger.applications() if first.id in e["key"]] == []  # nothing ran before the person said so
    second = client.responses.create(model="custom", previous_response_id=first.id, tools=tools, input=[
        {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}])
    kinds = [item.type for item in second.output]
    assert second.status == "completed" and kinds == ["mcp_call", "message"], second.model_dump_json()[:2000]
    assert second.output[0].error is None and "sent:" in second.output[1].content[0].text
    assert len([e for e in ledger.applications() if e["key"].startswith(f"{first.id}:")]) == 1
    again = client.responses.retrieve(first.id)  # the first response read again: the run as it now stands
    assert [item.type for item in again.output] == ["mcp_call", "message"]
    continued = client.responses.retrieve(second.id)  # the continuation has an id of its own that reads back
    assert continued.id == second.id and [item.type for item in continued.output] == kinds
    # and a conversation goes on from it (the Agents SDK's previous_response_id = the last response's id)
    third = client.responses.create(model="custom", previous_response_id=second.id, tools=tools, input="thanks")
    assert third.status == "completed" and third.output[-1].type == "message", third.model_dump_json()[:2000]
    assert len([e for e in ledger.applications() if e["key"].startswith(f"{first.id}:")]) == 1  # never again


@pytest.mark.conformance("responses: require_approval always holds every tool's call, read-only ones too",
                         "openai-python")
def test_always_without_allowed_tools_holds_a_read_only_call(api: str) -> None:
    client = openai.OpenAI(base_url=f"{api}/v1", api_key=KEY, max_retries=0, timeout=120)
    held = client.responses.create(model="custom", input=_script(WEATHER, {"text": "done"}),
                                   tools=[{**TOOLRAIL, "require_approval": "always"}])
    assert [(item.type, item.name) for item in held.output] == [("mcp_approval_request", "get_weather")]


@pytest.mark.conformance("responses: a rejected hosted call never runs", "openai-python")
def test_a_rejected_call_never_runs(api: str, ledger: Ledger) -> None:
    client = openai.OpenAI(base_url=f"{api}/v1", api_key=KEY, max_retries=0, timeout=120)
    tools = [{**TOOLRAIL, "allowed_tools": ["slow_transfer"], "require_approval": "always"}]
    first = client.responses.create(model="custom", input=_script(TRANSFER, {"text": "done"}), tools=tools)
    second = client.responses.create(model="custom", previous_response_id=first.id, tools=tools, input=[
        {"type": "mcp_approval_response", "approval_request_id": first.output[0].id, "approve": False}])
    assert [e for e in ledger.applications() if e["key"].startswith(f"{first.id}:")] == []
    assert second.output and second.output[0].type == "mcp_call" and second.output[0].error


def test_the_standalone_endpoint_refuses_hosted_tools_naming_why() -> None:
    from decider.model import DEFAULT_MODEL_NAME
    from decider.openai_api import create_app

    with api_server(create_app(lambda: None)) as base:  # no model is asked: the refusal comes first
        answer = httpx.post(f"{base}/v1/responses", json={"model": DEFAULT_MODEL_NAME, "input": "hi",
                                                          "tools": [TOOLRAIL]}, timeout=10)
    error = answer.json()["error"]
    assert answer.status_code == 400 and error["param"] == "tools" and "toolrail serve" in error["message"]


@pytest.mark.conformance("responses: a hosted tool's call held for approval, approved through the run's interruptions",
                         "OpenAI Agents SDK")
async def test_an_agent_approves_a_held_call_through_its_interruptions(api: str, ledger: Ledger) -> None:
    agents = pytest.importorskip("agents")

    agents.set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=f"{api}/v1", api_key=KEY, max_retries=0, timeout=120)
    tool = agents.HostedMCPTool(tool_config={**TOOLRAIL, "allowed_tools": ["slow_transfer"],
                                             "require_approval": "always"})
    agent = agents.Agent(name="teller", instructions="Send the money.", tools=[tool],
                         model=agents.OpenAIResponsesModel(model="custom", openai_client=client))
    held = await agents.Runner.run(agent, _script(TRANSFER, {"text": "sent: {results}"}), max_turns=3)
    (interruption,) = held.interruptions
    assert interruption.raw_item.type == "mcp_approval_request" and interruption.raw_item.name == "slow_transfer"
    job_id = held.raw_responses[0].response_id
    assert [e for e in ledger.applications() if e["key"].startswith(f"{job_id}:")] == []
    state = held.to_state()
    state.approve(interruption)
    done = await agents.Runner.run(agent, state, max_turns=3)
    assert "sent:" in done.final_output
    assert len([e for e in ledger.applications() if e["key"].startswith(f"{job_id}:")]) == 1
    # the conversation goes on from the approved run's last response, server-side state: the run's calls are in it
    later = await agents.Runner.run(agent, "thanks", previous_response_id=done.last_response_id, max_turns=2)
    assert later.final_output and not later.interruptions
    assert len([e for e in ledger.applications() if e["key"].startswith(f"{job_id}:")]) == 1
