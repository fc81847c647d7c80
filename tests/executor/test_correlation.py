"""One request id from the API to the last log line: response, record, Celery headers, tool process, logs."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import httpx
from tests.harness.jobs import wait_terminal


def test_request_id_reaches_the_tool_process(client: httpx.Client) -> None:
    response = client.post("/v1/jobs", headers={"X-Request-ID": "corr-tool-1"}, json={
        "tools": ["inspect_sandbox"], "tool_calls": [{"name": "inspect_sandbox", "arguments": {}}]})
    job = wait_terminal(client, response.json()["job_id"])
    assert job["status"] == "succeeded", job
    seen = job["calls"][0]["result"]
    assert seen["request_id_env"] == "corr-tool-1" and seen["request_id_ctx"] == "corr-tool-1"


def test_sandbox_cannot_read_worker_secret(client: httpx.Client) -> None:
    response = client.post("/v1/jobs", json={"tools": ["inspect_sandbox"], "tool_calls": [
        {"name": "inspect_sandbox", "arguments": {"variable": "TOOLRAIL_TEST_SECRET"}}]})
    job = wait_terminal(client, response.json()["job_id"])
    seen = job["calls"][0]["result"]
    assert seen["value"] is None, "the worker's secret leaked into the tool process"
    assert "REDIS_URL" not in seen["env_keys"] and "TOOLRAIL_TEST_SECRET" not in seen["env_keys"]


def test_request_id_in_celery_headers(redis_client, redis_url: str) -> None:
    from executor.worker.tasks import decide
    from toolrail.context import CELERY_REQUEST_ID_HEADER, request_scope

    queue = "inspect.headers"  # no worker consumes it: the message stays for us to read
    redis_client.delete(queue)
    with request_scope("corr-header-1"):
        decide.apply_async(args=["job_none"], queue=queue)
    raw = redis_client.lpop(queue)
    message = json.loads(raw)
    assert message["headers"][CELERY_REQUEST_ID_HEADER] == "corr-header-1"
    assert message["headers"].get("correlation_id") != "corr-header-1"  # Celery's own id is left alone
    assert json.loads(base64.b64decode(message["body"]))[0] == ["job_none"]


def test_every_log_line_of_a_job_carries_its_request_id(client: httpx.Client, worker_log: Path, capfd) -> None:
    response = client.post("/v1/jobs", headers={"X-Request-ID": "corr-logs-1"}, json={
        "tools": ["get_weather", "query_balance"],
        "tool_calls": [{"name": "get_weather", "arguments": {"city": "京", "date": "today"}},
                       {"name": "query_balance", "arguments": {"account": "bob"}}]})
    job_id = response.json()["job_id"]
    assert wait_terminal(client, job_id)["status"] == "succeeded"
    time.sleep(0.5)
    worker_lines = [json.loads(line) for line in worker_log.read_text().splitlines() if line.startswith("{")]
    job_lines = [line for line in worker_lines if line.get("job_id") == job_id]
    events = {line["event"] for line in job_lines}
    assert {"call.start", "call.end", "job.finished"} <= events, events  # client calls: dispatched by the API
    assert all(line.get("request_id") == "corr-logs-1" for line in job_lines), [l for l in job_lines if l.get("request_id") != "corr-logs-1"]
    ends = [line for line in job_lines if line["event"] == "call.end"]  # the tool process's own records, said there
    assert len(ends) == 2 and all(line["tool_request_id"] == "corr-logs-1" and line["tool_pid"] for line in ends), ends
    api_lines = [json.loads(line) for line in capfd.readouterr().err.splitlines() if line.startswith("{")]
    api_job_lines = [line for line in api_lines if line.get("job_id") == job_id or line.get("event") == "http.request"
                     and line.get("request_id") == "corr-logs-1"]
    assert api_job_lines and all(line["request_id"] == "corr-logs-1" for line in api_job_lines)
    assert {"job.created", "http.request"} <= {line["event"] for line in api_job_lines}
    created = next(line for line in api_job_lines if line["event"] == "job.created")
    assert created["dispatched"] == 2 and created["status"] == "running", created
