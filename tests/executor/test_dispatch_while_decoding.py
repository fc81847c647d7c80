"""Dispatch while decoding: a read-only call runs while the model still writes the next one.

Real Redis (a database of its own), a real Celery worker pool, the real API; the decider is the
streaming scripted double of tests/executor/streaming_decider.py (calls go through the real
stream parser and the real check path; the double only decides what text comes, and how slowly).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.harness.jobs import publishers
from tests.harness.processes import decider_worker


PAUSE_S = 1.5
#: Job ids the API queued a decide task for.
DECIDE_TASKS: list[str] = []


@pytest.fixture(scope="module")
def stream_worker(db_url: str) -> Iterator[object]:
    with decider_worker(db_url, factory="tests.executor.streaming_decider:make", name="early") as proc:
        yield proc


@pytest.fixture(scope="module")
def client(db_url: str, stream_worker) -> Iterator[httpx.Client]:
    from executor.api.app import create_app
    from executor.runtime import Runtime
    from tests.harness.serving import api_server
    from toolrail.settings import Settings

    settings = Settings(decider="custom", reconcile_interval_s=0)
    publish_decide, rerun = publishers(db_url)

    def enqueue(job) -> None:  # noqa: ANN001
        DECIDE_TASKS.append(job.job_id)
        publish_decide(job)

    app = create_app(settings, Runtime.from_settings(settings, redis_url=db_url), mount_openai=False, ping_workers=lambda: 1,
                     enqueue=enqueue, rerun=rerun)
    with api_server(app) as base:
        with httpx.Client(base_url=base, timeout=30) as http:
            yield http


def _calls(*cities: str) -> str:
    return json.dumps([{"name": "get_weather", "arguments": {"city": c, "date": "tomorrow"}} for c in cities])


def _run(client: httpx.Client, attempts: list[dict]) -> dict:
    script = {"steps": [{"attempts": attempts}, {"text": "done"}]}
    body = {"messages": [{"role": "user", "content": "Weather tomorrow in Beijing and Shanghai? STREAM"},
                         {"role": "user", "content": "STREAM " + json.dumps(script)}],
            "tools": ["get_weather"], "max_steps": 2}
    response = client.post("/v1/jobs", json=body)
    assert response.status_code == 202, response.text
    job_id = response.json()["job_id"]
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in {"succeeded", "failed", "needs_review", "cancelled", "expired"}:
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not end: {job}")


def test_read_only_calls_run_while_the_decision_is_still_decoding(client: httpx.Client) -> None:
    job = _run(client, [{"output": _calls("Beijing", "Shanghai"), "pause_s": PAUSE_S}])
    assert job["status"] == "succeeded", job
    step = job["steps"][0]
    ended = step["decision_ended_at"]
    first, second = step["calls"]
    assert [c["arguments"]["city"] for c in (first, second)] == ["Beijing", "Shanghai"]
    assert all(c["status"] == "succeeded" for c in (first, second))
    # the first call was queued as soon as its JSON closed, two pauses before the decision ended, and ran meanwhile
    assert ended - first["dispatched_at"] >= PAUSE_S
    assert first["started_at"] < ended
    assert [(e["id"], e["kept"]) for e in step["early_dispatch"]] == [(first["id"], True), (second["id"], True)]
    assert step["early_dispatch"][0]["dispatched_before_end_s"] >= PAUSE_S
    assert job["discarded_calls"] == []
    assert job["steps"][1]["content"] == "done"  # the results went back to the model: the run went on


def test_an_early_call_the_decision_drops_is_recorded_not_lost(client: httpx.Client) -> None:
    # attempt 0: Beijing is valid (queued early), the second call is not: re-asked; attempt 1's calls run
    bad = json.dumps([{"name": "get_weather", "arguments": {"city": "Beijing", "date": "tomorrow"}},
                      {"name": "get_weather", "arguments": {"city": "Shanghai", "date": "next year"}}])
    job = _run(client, [{"output": bad, "pause_s": PAUSE_S}, {"output": _calls("Beijing", "Shanghai"), "pause_s": 0.2}])
    assert job["status"] == "succeeded", job
    step = job["steps"][0]
    kept = [c["id"] for c in step["calls"]]
    assert all(cid.endswith("_a1") for cid in kept) and len(kept) == 2
    (dropped,) = job["discarded_calls"]
    assert not dropped["id"].endswith("_a1") and dropped["arguments"]["city"] == "Beijing"
    assert dropped["status"] in {"succeeded", "pending"}  # it ran during the re-ask, or was left unrun
    journal = {e["id"]: e["kept"] for e in step["early_dispatch"]}
    assert journal[dropped["id"]] is False and all(journal.get(cid) for cid in kept)
    assert all(c["id"] != dropped["id"] for c in job["calls"])  # no step counts it; the model never saw its result


def test_client_calls_never_go_through_the_decide_task(client: httpx.Client) -> None:
    good = client.post("/v1/jobs", json={"tools": ["get_weather"], "tool_calls": [
        {"name": "get_weather", "arguments": {"city": "Paris", "date": "today"}}]}).json()
    inline = client.post("/v1/jobs", json={"tools": [{"type": "function", "function": {"name": "echo_city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
        "tool_calls": [{"name": "echo_city", "arguments": {"city": "Paris"}}]}).json()
    assert inline["status"] == "succeeded"  # validate-only: decided and ended in the API
    bad = client.post("/v1/jobs", json={"tools": ["get_weather"], "max_steps": 2, "messages": [
        {"role": "user", "content": "Weather tomorrow in Beijing?"}],
        # the client's model output fails its check: the client's, so it waits for a person (the decider is not asked)
        "raw_output": json.dumps([{"name": "get_weather", "arguments": {"city": "Beijing", "date": "someday"}}])}).json()
    assert bad["status"] == "needs_review"  # decided in the API, as the valid ones are
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        jobs = [client.get(f"/v1/jobs/{j['job_id']}").json() for j in (good, bad)]
        if all(j["status"] in {"succeeded", "failed", "needs_review"} for j in jobs):
            break
        time.sleep(0.2)
    assert [j["status"] for j in jobs] == ["succeeded", "needs_review"], jobs
    events = [s for _, s in _statuses(client, good["job_id"])]
    assert events[:3] == ["queued", "validating", "running"] and events[-1] == "succeeded"
    assert not {good["job_id"], inline["job_id"], bad["job_id"]} & set(DECIDE_TASKS)
    assert [a["source"] for a in jobs[1]["steps"][0]["attempts"]] == ["client"]


def _statuses(client: httpx.Client, job_id: str) -> list[tuple[str, str]]:
    out = []
    with client.stream("GET", f"/v1/jobs/{job_id}/events", params={"timeout_s": 5}) as stream:
        for line in stream.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                if event["type"] == "status":
                    out.append((event["type"], event["status"]))
    return out
