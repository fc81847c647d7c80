"""The job API end to end: real API, real Redis, real Celery workers, real sandboxed tools."""

from __future__ import annotations

import json

import httpx
import pytest
from tests.harness.jobs import wait_terminal

WEATHER_RAW = "好的：\n```json\n[{“name”：“get_weather”，“arguments”：{“city”：“沪”，“date”：“明天”，}}]\n```"


def submit(client: httpx.Client, body: dict, **headers: str) -> dict:
    response = client.post("/v1/jobs", json=body, headers=headers)
    assert response.status_code in (200, 202), response.text
    return response.json()


def test_raw_output_is_cleaned_validated_and_run(client: httpx.Client) -> None:
    created = submit(client, {"raw_output": WEATHER_RAW, "tools": ["get_weather"]}, **{"X-Request-ID": "req-weather-1"})
    assert created["request_id"] == "req-weather-1"
    job = wait_terminal(client, created["job_id"])
    assert job["status"] == "succeeded", job
    assert job["request_id"] == "req-weather-1"
    (call,) = job["calls"]
    assert call["arguments"] == {"city": "Shanghai", "date": "tomorrow", "unit": "celsius"}
    assert call["id"] == "call_req-weather-1_0" and call["index"] == 0
    assert call["result"]["city"] == "Shanghai" and call["status"] == "succeeded"
    assert any("alias '沪'" in note for note in call["repairs"])


def test_response_carries_request_id_header(client: httpx.Client) -> None:
    response = client.post("/v1/jobs", json={"raw_output": WEATHER_RAW, "tools": ["get_weather"]},
                           headers={"X-Request-ID": "hdr-check-7"})
    assert response.headers["X-Request-ID"] == "hdr-check-7"
    generated = client.get("/healthz").headers["X-Request-ID"]
    assert len(generated) == 32


def test_parallel_calls_keep_their_indices(client: httpx.Client) -> None:
    calls = [{"name": "get_weather", "arguments": {"city": "Beijing", "date": "today"}},
             {"name": "get_weather", "arguments": {"city": "Shanghai", "date": "today"}},
             {"name": "query_balance", "arguments": {"account": "alice"}}]
    job = wait_terminal(client, submit(client, {"tool_calls": calls})["job_id"])
    assert job["status"] == "succeeded", job
    assert [c["index"] for c in job["calls"]] == [0, 1, 2]
    assert [c["arguments"].get("city") or c["arguments"].get("account") for c in job["calls"]] == ["Beijing", "Shanghai", "alice"]
    assert job["calls"][2]["result"]["found"] is True


def test_invalid_output_without_decider_needs_review_with_errors(client: httpx.Client) -> None:
    job = wait_terminal(client, submit(client, {"raw_output": '{"name": "get_weather", "arguments": {"city": "北京", "date": "后天"}}',
                                                "tools": ["get_weather"]})["job_id"])
    assert job["status"] == "needs_review"
    assert job["calls"] == []
    (attempt,) = job["attempts"]
    assert attempt["source"] == "client"
    assert "后天" in attempt["raw_output"]
    assert attempt["errors"][0]["path"] == "/date" and "后天" in attempt["errors"][0]["message"]


def test_extra_fields_are_errors_not_silently_dropped(client: httpx.Client) -> None:
    response = client.post("/v1/jobs", json={"tool_calls": [{"name": "get_weather", "arguments": {
        "city": "Beijing", "date": "today", "humidity": "high"}}]})
    assert response.status_code == 422, response.text  # the client's own malformed call: refused at submit
    assert "humidity" in json.dumps(response.json()["error"]["details"]["errors"])


def test_unregistered_tool_in_output_never_runs(client: httpx.Client) -> None:
    job = wait_terminal(client, submit(client, {"raw_output": '[{"name": "rm_rf", "arguments": {}}]', "tools": ["get_weather"]})["job_id"])
    assert job["status"] == "needs_review" and job["calls"] == []


def test_unknown_tool_in_request_is_422_naming_it(client: httpx.Client) -> None:
    response = client.post("/v1/jobs", json={"raw_output": "{}", "tools": ["get_weather", "launch_missiles"]})
    assert response.status_code == 422
    body = response.json()["error"]
    assert body["type"] == "unknown_tool" and "launch_missiles" in body["message"]


def test_inline_function_calls_are_validated_and_returned(client: httpx.Client) -> None:
    tool = {"type": "function", "function": {"name": "book_table", "parameters": {
        "type": "object", "properties": {"people": {"type": "integer", "minimum": 1}}, "required": ["people"]}}}
    job = wait_terminal(client, submit(client, {"tools": [tool], "raw_output": '{"name": "book_table", "arguments": {"people": "4"}}'})["job_id"])
    assert job["status"] == "succeeded"
    assert job["calls"][0]["status"] == "validated" and job["calls"][0]["arguments"] == {"people": 4}


@pytest.mark.parametrize(("kwargs", "status", "type_"), [
    ({"content": b"not json", "headers": {"content-type": "application/json"}}, 422, "validation_error"),
    ({"content": b'{"raw_output": "x"}', "headers": {"content-type": "text/plain"}}, 415, "unsupported_media_type"),
    ({"content": b'{"raw_output": "' + b"x" * 1_100_000 + b'"}', "headers": {"content-type": "application/json"}}, 413, "body_too_large"),
    ({"content": b"[" * 5000 + b"]" * 5000, "headers": {"content-type": "application/json"}}, 400, "too_deep"),
    ({"json": {"raw_output": "x" * 100_001}}, 422, "validation_error"),
    ({"json": {"messages": [{"role": "wizard", "content": "hi"}]}}, 422, "validation_error"),
    ({"json": {"raw_output": "{}", "surprise": 1}}, 422, "validation_error"),
    ({"json": {}}, 422, "validation_error"),
    ({"json": {"raw_output": "{}", "max_reasks": 99}}, 422, "validation_error"),
    ({"json": {"tool_choice": "required", "tools": [], "messages": [{"role": "user", "content": "hi"}]}}, 400, "invalid_request"),
])
def test_bad_input_is_a_typed_4xx(client: httpx.Client, kwargs: dict, status: int, type_: str) -> None:
    response = client.post("/v1/jobs", **kwargs)
    assert response.status_code == status, response.text[:300]
    error = response.json()["error"]
    assert error["type"] == type_ and error["message"]
    assert "Traceback" not in response.text


def test_unknown_job_is_404(client: httpx.Client) -> None:
    response = client.get("/v1/jobs/job_does_not_exist")
    assert response.status_code == 404 and response.json()["error"]["type"] == "not_found"
    assert client.get("/v1/jobs/../../etc").status_code == 404


def test_idempotency_key_same_body_same_job_other_body_409(client: httpx.Client) -> None:
    body = {"raw_output": WEATHER_RAW, "tools": ["get_weather"]}
    first = client.post("/v1/jobs", json=body, headers={"Idempotency-Key": "idem-abc"})
    again = client.post("/v1/jobs", json=body, headers={"Idempotency-Key": "idem-abc"})
    assert first.status_code == 202 and again.status_code == 200
    assert first.json()["job_id"] == again.json()["job_id"]
    other = client.post("/v1/jobs", json={**body, "max_reasks": 1}, headers={"Idempotency-Key": "idem-abc"})
    assert other.status_code == 409 and other.json()["error"]["type"] == "idempotency_conflict"


def test_events_stream_every_state_change(client: httpx.Client) -> None:
    job_id = submit(client, {"raw_output": WEATHER_RAW, "tools": ["get_weather"]})["job_id"]
    statuses, calls = [], []
    with client.stream("GET", f"/v1/jobs/{job_id}/events", params={"timeout_s": 30}) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        for line in stream.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                (statuses if event["type"] == "status" else calls).append(event.get("status"))
    assert statuses[0] == "queued" and statuses[-1] == "succeeded"
    assert "running" in statuses and calls[-1] == "succeeded"


def test_tools_listing_has_strict_schemas(client: httpx.Client) -> None:
    tools = {t["name"]: t for t in client.get("/v1/tools").json()["tools"]}
    assert {"get_weather", "query_balance", "transfer"} <= set(tools)
    weather = tools["get_weather"]["parameters"]
    assert weather["additionalProperties"] is False
    assert weather["properties"]["date"]["enum"] == ["today", "tomorrow"]
    assert tools["transfer"]["side_effects"] is True and tools["transfer"]["queue"] == "tool.transfer"


def test_ready_and_metrics(client: httpx.Client) -> None:
    ready = client.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json()["checks"]["redis"] == "ok" and ready.json()["checks"]["workers"] >= 1
    metrics = client.get("/metrics").text
    assert "toolrail_queue_depth" in metrics and "toolrail_http_request_duration_seconds" in metrics


def test_job_api_serves_the_openai_endpoint(runtime) -> None:
    """The OpenAI-compatible route is mounted next to the job API (the model loads on first use)."""
    from executor.api.app import create_app
    from toolrail.settings import Settings

    app = create_app(Settings(decider="embedded"), runtime, enqueue=lambda job: None, ping_workers=lambda: 0)
    paths = set(app.openapi()["paths"])
    assert {"/v1/chat/completions", "/v1/responses", "/v1/responses/{response_id}", "/v1/jobs"} <= paths
    from fastapi.testclient import TestClient

    response = TestClient(app, base_url="http://127.0.0.1").post("/v1/chat/completions", json={"messages": []})
    assert 400 <= response.status_code < 500 and response.json()["error"]["type"]


def test_cancel_stops_pending_calls_and_is_final(client: httpx.Client) -> None:
    created = submit(client, {"tools": ["stress"], "tool_calls": [{"name": "stress", "arguments": {"mode": "sleep", "amount": 1.5}},
                                                                  {"name": "stress", "arguments": {"mode": "ok"}}]})
    cancelled = client.post(f"/v1/jobs/{created['job_id']}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    job = wait_terminal(client, created["job_id"])
    assert job["status"] == "cancelled" and job["error"]["type"] == "cancelled"
    again = client.post(f"/v1/jobs/{created['job_id']}/cancel")
    assert again.status_code == 409 and again.json()["error"]["type"] == "already_terminal"
    assert client.post("/v1/jobs/job_unknown/cancel").status_code == 404
