"""The client's output is the client's (issue 32, item 1): a call the client brought is never replaced by the model's.

Red team: ``POST /v1/jobs`` with the client's ``refund(order_id="A-17", amount_cents=500)`` and the user's "refund
order A-17 by 5 dollars". The check finds 500 not stated; before, the platform re-asked its own model (here a double
that copies the literal 5, as the 135M model did: tests/executor/literal_decider.py) and **ran its 5**. Now the
client's call runs, waits for a person, or goes to ``needs_review`` with the client's calls and the findings — and
the model is never asked. One test per entry point: the job API (``tool_calls``, ``raw_output``, a conversation that
ends in the client's own assistant turn), ``/v1/chat/completions`` and MCP ``tools/call``. Real Redis, a real Celery
worker pool, the real API and the real ledger.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

import anyio
import httpx
import pytest
import redis
from fastapi.testclient import TestClient

from tests.harness.fixtures import TEST_TOOL_MODULES
from tests.harness.jobs import publishers
from tests.harness.processes import decider_worker
from tests.executor.literal_decider import DECISIONS_KEY

from executor.job_client import wait_for_job
from tools.ledger import Ledger

LEDGER_PREFIX = "clientcalls:ledger"
MODULES = f"{TEST_TOOL_MODULES},tests.executor.literal_decider"
ASKED = "refund order A-17 by 5 dollars"
CLIENT_CALL = {"name": "refund", "arguments": {"order_id": "A-17", "amount_cents": 500}}
#: Where a client's unsupported value may stop: review, or (where grounding sends unclear support to a person) approval.
HELD = {"needs_review", "awaiting_approval"}


@pytest.fixture(scope="module")
def ledger(db_url: str) -> Ledger:
    book = Ledger(redis.Redis.from_url(db_url), prefix=LEDGER_PREFIX)
    book.seed({"shop": {"USD": 1_000_000}, "alice": {"USD": 0}})
    return book


@pytest.fixture(scope="module")
def api(db_url: str, ledger: Ledger) -> Iterator[str]:
    from executor.api.app import create_app
    from executor.runtime import Runtime
    from tests.harness.serving import api_server
    from toolrail.settings import Settings
    from tools.registry import load_registry

    env = {"TOOLRAIL_TOOL_MODULES": MODULES, "TOOLRAIL_LEDGER_PREFIX": LEDGER_PREFIX}
    settings = Settings(decider="custom", rate_limit_per_s=0, reconcile_interval_s=0)
    runtime = Runtime.from_settings(settings, redis_url=db_url)
    runtime = dataclasses.replace(runtime, registry=load_registry(modules=MODULES.split(",")))
    enqueue, rerun = publishers(db_url)
    with decider_worker(db_url, factory="tests.executor.literal_decider:make", env=env, queues=("tool.refund",), name="clientcalls"), \
            api_server(create_app(settings, runtime, enqueue=enqueue, rerun=rerun, ping_workers=lambda: 1,
                                  mount_openai=False)) as base:
        yield base


@pytest.fixture()
def client(api: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api, timeout=30) as c:
        yield c


def _decisions(db_url: str) -> int:
    return int(redis.Redis.from_url(db_url).get(DECISIONS_KEY) or 0)


def _moved(ledger: Ledger, job_id: str) -> list[int]:
    return [entry["cents"] for entry in ledger.applications() if entry["key"].startswith(f"{job_id}:")]


def _submit(client: httpx.Client, body: dict) -> dict:
    response = client.post("/v1/jobs", json={"tools": ["refund"], **body})
    assert response.status_code == 202, response.text
    return wait_for_job(client, response.json()["job_id"], timeout_s=60, until=HELD)


def _assert_held_as_sent(job: dict, ledger: Ledger) -> None:
    """Nothing ran; the job holds the client's call as sent, with the findings, and only the client's attempt."""
    assert job["status"] in HELD, json.dumps(job)[:2000]
    assert [a["source"] for a in job["attempts"]] == ["client"], job["attempts"]
    assert _moved(ledger, job["job_id"]) == []
    if job["status"] == "needs_review":
        error = job["error"]
        assert [c["arguments"] for c in error["details"]["client_calls"]] == [CLIENT_CALL["arguments"]], error
        assert error["details"]["errors"] and "never replaced" in error["message"], error
    else:
        (call,) = job["calls"]
        assert call["arguments"] == CLIENT_CALL["arguments"] and call["status"] == "awaiting_approval"


@pytest.mark.parametrize("brought", ["tool_calls", "raw_output", "assistant_turn"])
def test_the_job_api_never_runs_the_models_call_in_place_of_the_clients(client: httpx.Client, ledger: Ledger,
                                                                       db_url: str, brought: str) -> None:
    # before: tool_calls / raw_output → re-asked, the model's refund(amount_cents=5) ran (the ledger held 5 cents);
    # an assistant turn → the model decided afresh and its 5 ran
    asked = _decisions(db_url)
    user = {"role": "user", "content": ASKED}
    body = {"tool_calls": {"tool_calls": [CLIENT_CALL], "messages": [user]},
            "raw_output": {"raw_output": json.dumps(CLIENT_CALL), "messages": [user]},
            "assistant_turn": {"messages": [user, {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_client_1", "type": "function", "function": {
                    "name": "refund", "arguments": json.dumps(CLIENT_CALL["arguments"])}}]}]}}[brought]
    job = _submit(client, body)
    _assert_held_as_sent(job, ledger)
    assert _decisions(db_url) == asked, "the platform's model was asked to replace the client's call"
    final = client.get(f"/v1/jobs/{job['job_id']}").json()
    assert all(c["arguments"] == CLIENT_CALL["arguments"] for c in final["calls"])


def test_a_clients_supported_call_runs_as_sent_and_a_reviewer_can_run_a_held_one(client: httpx.Client,
                                                                                 ledger: Ledger, db_url: str) -> None:
    asked = _decisions(db_url)
    ran = _submit(client, {"tool_calls": [CLIENT_CALL], "messages": [
        {"role": "user", "content": "refund 500 on order A-17"}]})
    assert ran["status"] == "succeeded", json.dumps(ran)[:2000]
    assert _moved(ledger, ran["job_id"]) == [500]
    held = _submit(client, {"tool_calls": [CLIENT_CALL], "messages": [{"role": "user", "content": ASKED}]})
    if held["status"] == "needs_review":  # the person runs the client's call as it was sent
        reviewed = client.post(f"/v1/jobs/{held['job_id']}/review", json={"calls": [CLIENT_CALL]})
        assert reviewed.status_code == 200, reviewed.text
    else:
        (call,) = held["calls"]
        assert client.post(f"/v1/jobs/{held['job_id']}/calls/{call['id']}/approve").status_code == 200
    done = wait_for_job(client, held["job_id"], timeout_s=60)
    assert done["status"] == "succeeded" and _moved(ledger, held["job_id"]) == [500], json.dumps(done)[:2000]
    assert _decisions(db_url) == asked


def test_chat_completions_answers_the_clients_own_calls_without_asking_the_model() -> None:
    from decider.openai_api import create_app
    from tools.registry import load_registry

    def no_model():  # noqa: ANN202 - the endpoint's decider factory: asking it at all is the failure
        raise AssertionError("the platform's model was asked about the client's own calls")

    refund = load_registry(modules=MODULES.split(",")).get("refund").to_openai()
    turn = {"role": "assistant", "content": None, "tool_calls": [{"id": "call_client_1", "type": "function", "function": {
        "name": "refund", "arguments": json.dumps(CLIENT_CALL["arguments"])}}]}
    app = TestClient(create_app(no_model), raise_server_exceptions=False)
    # before: the model was asked (here: a 500 from the factory); a model would have written its own call
    held = app.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": ASKED}, turn], "tools": [refund]})
    assert held.status_code == 200, held.text
    body = held.json()
    assert body["choices"][0]["message"].get("tool_calls") in (None, [])  # an unsupported value is never sent on
    assert body["toolrail"]["status"] == "needs_review" and body["toolrail"]["findings"], body["toolrail"]
    assert [a["source"] for a in body["toolrail"]["attempts"]] == ["client"]
    assert body["toolrail"]["blocked_calls"][0]["name"] == "refund"

    stated = app.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "refund 500 on order A-17"},
                                                                 turn], "tools": [refund]})
    assert stated.status_code == 200, stated.text
    message = stated.json()["choices"][0]
    assert message["finish_reason"] == "tool_calls"
    (call,) = message["message"]["tool_calls"]
    assert call["id"] == "call_client_1" and json.loads(call["function"]["arguments"]) == CLIENT_CALL["arguments"]

    streamed = app.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "refund 500 on order A-17"},
                                                                   turn], "tools": [refund], "stream": True})
    chunks = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
    assert deltas[0]["tool_calls"][0]["id"] == "call_client_1" and streamed.text.rstrip().endswith("data: [DONE]")


def test_an_mcp_call_runs_as_the_client_sent_it(api: str, ledger: Ledger, db_url: str) -> None:
    from mcp import Client

    asked = _decisions(db_url)

    async def main() -> tuple[object, object]:
        async with Client(f"{api}/mcp", cache=None) as mcp:
            ran = await mcp.call_tool("refund", {"order_id": "A-18", "amount_cents": 700})
            bad = await mcp.call_tool("refund", {"order_id": "A-18", "amount_cents": "seven hundred"})
            return ran, bad

    ran, bad = anyio.run(main)
    assert ran.is_error is False, ran.content[0].text
    job_id = ran.meta["toolrail.dev/job_id"]
    assert _moved(ledger, job_id) == [700]
    bad_job = bad.meta["toolrail.dev/job_id"]
    assert bad.is_error is True and _moved(ledger, bad_job) == []
    record = httpx.get(f"{api}/v1/jobs/{bad_job}").json()
    assert [a["source"] for a in record["attempts"]] == ["client"], record
    assert _decisions(db_url) == asked
