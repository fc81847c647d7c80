"""A client's own calls at ``POST /v1/jobs``: malformed ones are a 422 with JSON paths, and nothing is stored.

As the OpenAI API answers a malformed request. Model text (``raw_output``) that fails its check is the
client's output too: it goes to review with the client's calls and the findings, never to the platform's
model (issue 32).
No worker here: the API over the session Redis, its queueing captured.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from executor.api.app import create_app
from executor.runtime import Runtime
from toolrail.settings import get_settings

TRANSFER = {"from_account": "alice", "to": "bob", "amount": 5, "currency": "CNY"}


@pytest.fixture()
def api(redis_url: str, request: pytest.FixtureRequest) -> Iterator[tuple[TestClient, Runtime, list]]:
    decider = getattr(request, "param", "none")
    settings = get_settings().model_copy(update={"decider": decider})
    runtime = Runtime.from_settings(settings, redis_url=redis_url)
    queued: list[Any] = []
    app = create_app(settings, runtime, enqueue=queued.append, rerun=lambda job, call: queued.append(call),
                     ping_workers=lambda: 1, mount_openai=False)
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as client:
        yield client, runtime, queued


def _jobs(runtime: Runtime) -> int:
    return sum(1 for _ in runtime.redis.scan_iter("tr:job:*", count=1000))


@pytest.mark.parametrize("api", ["none", "embedded"], indirect=True)
def test_a_clients_invalid_call_is_422_with_the_json_path_and_nothing_is_stored(api) -> None:
    client, runtime, queued = api
    before = _jobs(runtime)
    # before: 202, then needs_review with "...; no decider is configured to re-ask" (also where one is)
    response = client.post("/v1/jobs", json={"tool_calls": [{"name": "transfer", "arguments": {**TRANSFER, "amount": "lots"}}],
                                             "tools": ["transfer"]})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_tool_calls"
    paths = [e["path"] for e in error["details"]["errors"]]
    assert paths == ["/tool_calls/0/arguments/amount"], error
    assert "/tool_calls/0/arguments/amount" in error["message"] and "lots" in error["message"]
    assert _jobs(runtime) == before and queued == []


def test_paths_follow_the_shape_of_each_call_and_an_unknown_name_points_at_it(api) -> None:
    client, _, _ = api
    response = client.post("/v1/jobs", json={"tool_calls": [
        {"name": "get_weather", "arguments": {"city": "Beijing", "date": "today", "humidity": "high"}},
        {"id": "c1", "type": "function", "function": {"name": "transfer", "arguments": '{"from_account": "alice"}'}},
        {"name": "launch_missiles", "arguments": {}}], "tools": ["get_weather", "transfer"]})
    assert response.status_code == 422, response.text
    errors = response.json()["error"]["details"]["errors"]
    by_path = {e["path"]: e for e in errors}
    assert "humidity" in by_path["/tool_calls/0/arguments"]["message"]
    assert any(p.startswith("/tool_calls/1/function/arguments") for p in by_path), errors
    assert by_path["/tool_calls/2/name"]["tool"] == "launch_missiles"


def test_a_call_the_cleaning_repairs_is_taken(api) -> None:
    client, _, queued = api
    response = client.post("/v1/jobs", json={"tool_calls": [
        {"name": "get_weather", "arguments": '{"city": "Beijing", "date": "today",}'}], "tools": ["get_weather"]})
    assert response.status_code == 202, response.text  # a trailing comma is cleaned, not refused
    assert queued, "the repaired call was queued"


def test_required_call_with_no_calls_is_422(api) -> None:
    client, _, _ = api
    response = client.post("/v1/jobs", json={"tool_calls": [], "tools": ["get_weather"], "tool_choice": "required"})
    assert response.status_code == 422 and response.json()["error"]["details"]["errors"][0]["path"] == "/tool_calls"


@pytest.mark.parametrize("api", ["embedded", "none"], indirect=True)
def test_raw_output_that_fails_its_check_goes_to_review_and_never_to_the_model(api) -> None:
    client, runtime, queued = api
    for body in ({"messages": [{"role": "user", "content": "北京明天天气怎么样"}]}, {}):  # with a conversation and without
        response = client.post("/v1/jobs", json={**body, "tools": ["get_weather"],
                                                 "raw_output": '{"name": "get_weather", "arguments": {"city": "北京", "date": "后天"}}'})
        assert response.status_code == 202, response.text
        assert response.json()["status"] == "needs_review"  # decided in the API: no decide task to re-ask a model
        job = client.get(f"/v1/jobs/{response.json()['job_id']}").json()
        assert [a["source"] for a in job["attempts"]] == ["client"]
        assert "never replaced by the platform's model" in job["error"]["message"], job["error"]
        (sent,) = job["error"]["details"]["client_calls"]
        assert sent["arguments"] == {"city": "北京", "date": "后天"} and sent["errors"][0]["path"] == "/date"
    assert queued == []
