"""Waiting for a job without polling (issue 37, item 1): ``Prefer: wait=S`` on ``POST /v1/jobs`` and
``GET /v1/jobs/{id}?wait=S``, through the real API, Redis and Celery workers (sandboxed tools)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from executor.api.waiting import preferred_wait

WEATHER = {"name": "get_weather", "arguments": {"city": "Beijing", "date": "today"}}
SLOW_TRANSFER = {"name": "slow_transfer", "arguments": {"from_account": "alice", "to": "bob", "amount": 1.5, "delay_s": 1.0}}


def _echo(value: str, delay_s: float) -> dict:
    return {"tools": ["slow_echo"], "tool_calls": [{"name": "slow_echo", "arguments": {"value": value, "delay_s": delay_s}}]}


def test_prefer_wait_answers_200_with_the_finished_job(client: httpx.Client) -> None:
    started = time.monotonic()
    response = client.post("/v1/jobs", json={"tools": ["get_weather"], "tool_calls": [WEATHER]},
                           headers={"Prefer": "wait=20"})
    assert response.status_code == 200, response.text
    assert response.headers["Preference-Applied"] == "wait=20"
    job = response.json()
    assert job["status"] == "succeeded" and job["calls"][0]["result"]["city"] == "Beijing", job
    assert response.headers["Location"] == f"/v1/jobs/{job['job_id']}"
    assert time.monotonic() - started < 15
    assert client.get(f"/v1/jobs/{job['job_id']}").json() == job  # the record, as GET gives it


def test_a_job_settled_where_it_was_submitted_answers_its_stored_record(client: httpx.Client) -> None:
    inline = {"type": "function", "function": {"name": "echo_city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    response = client.post("/v1/jobs", json={"tools": [inline], "tool_calls": [{"name": "echo_city",
                                                                              "arguments": {"city": "Paris"}}]},
                           headers={"Prefer": "wait=5"})
    assert response.status_code == 200, response.text
    job = response.json()
    assert job["status"] == "succeeded" and job["calls"][0]["status"] == "validated", job
    assert client.get(f"/v1/jobs/{job['job_id']}").json() == job


def test_prefer_wait_past_its_time_is_202_and_a_long_poll_wakes_at_the_end(client: httpx.Client) -> None:
    started = time.monotonic()
    response = client.post("/v1/jobs", json=_echo("late", 2.0), headers={"Prefer": "respond-async, wait=0.3"})
    waited = time.monotonic() - started
    assert response.status_code == 202, response.text
    assert response.headers["Preference-Applied"] == "wait=0.3"
    assert set(response.json()) == {"job_id", "request_id", "status"}
    assert 0.25 <= waited < 1.8, waited
    job_id = response.json()["job_id"]
    job = client.get(f"/v1/jobs/{job_id}?wait=20").json()
    finished = time.monotonic()
    assert job["status"] == "succeeded", job
    # woken by the job's own end (its result's timestamp), not by a poll interval or the bound
    assert finished - job["calls"][0]["result"]["finished_at"] < 1.0
    assert finished - started < 10


def test_a_waiter_wakes_at_the_status_alone_and_a_job_without_that_stream_is_still_woken(client: httpx.Client,
                                                                                         runtime) -> None:
    store = runtime.store
    response = client.post("/v1/jobs", json=_echo("statuses", 1.0))
    job_id = response.json()["job_id"]
    # the status stream holds statuses alone (no call event), and the latest is what a waiter reads
    job = client.get(f"/v1/jobs/{job_id}?wait=20").json()
    assert job["status"] == "succeeded", job
    statuses = [fields[b"status"].decode() for _, fields in runtime.redis.xrange(store.statuses_key(job_id))]
    assert statuses[-1] == "succeeded" and set(statuses) <= {"queued", "running", "succeeded"}, statuses
    assert len(runtime.redis.xrange(store.events_key(job_id))) > len(statuses)  # the call's events are not there
    # a job stored before the status stream existed (an API of the version before) is woken through its events
    response = client.post("/v1/jobs", json=_echo("older", 1.0))
    job_id = response.json()["job_id"]
    runtime.redis.delete(store.statuses_key(job_id))
    started = time.monotonic()
    job = client.get(f"/v1/jobs/{job_id}?wait=20").json()
    assert job["status"] == "succeeded", job
    assert time.monotonic() - started < 10 and not runtime.redis.exists(store.statuses_key(job_id))  # none made


def test_without_a_preference_nothing_changes(client: httpx.Client) -> None:
    response = client.post("/v1/jobs", json={"tools": ["get_weather"], "tool_calls": [WEATHER]})
    assert response.status_code == 202 and "Preference-Applied" not in response.headers
    assert set(response.json()) == {"job_id", "request_id", "status"}
    # wait=0 (the default) answers at once, whatever the status
    assert client.get(f"/v1/jobs/{response.json()['job_id']}?wait=0").status_code == 200
    assert client.get(f"/v1/jobs/{response.json()['job_id']}?wait=-1").status_code == 422


def test_a_wait_wakes_at_approval_and_an_old_approval_wakes_no_later_waiter(client: httpx.Client, ledger) -> None:
    response = client.post("/v1/jobs", json={"tools": ["slow_transfer"], "tool_calls": [SLOW_TRANSFER],
                                             "require_approval": "side_effects"}, headers={"Prefer": "wait=20"})
    assert response.status_code == 200, response.text
    job = response.json()
    assert job["status"] == "awaiting_approval", job
    assert client.get(f"/v1/jobs/{job['job_id']}", params={"wait": 20}).json()["status"] == "awaiting_approval"
    approved = client.post(f"/v1/jobs/{job['job_id']}/calls/{job['calls'][0]['id']}/approve")
    assert approved.status_code == 200, approved.text
    # the call runs ~1 s; the stream still holds the earlier awaiting_approval, which must not answer this wait
    done = client.get(f"/v1/jobs/{job['job_id']}", params={"wait": 20}).json()
    assert done["status"] == "succeeded", done
    assert done["calls"][0]["approval"]["state"] == "approved"


def test_waiters_hold_no_thread(api: str) -> None:
    """60 long-polls at once, more than the API's thread pool (40): a plain request still answers at once."""

    async def scenario() -> tuple[float, list[str]]:
        async with httpx.AsyncClient(base_url=api, timeout=30, limits=httpx.Limits(max_connections=100)) as aclient:
            job_id = (await aclient.post("/v1/jobs", json=_echo("held", 2.5))).json()["job_id"]
            waits = [asyncio.create_task(aclient.get(f"/v1/jobs/{job_id}", params={"wait": 20})) for _ in range(60)]
            await asyncio.sleep(0.8)  # every waiter is in
            started = time.monotonic()
            assert (await aclient.get("/healthz")).status_code == 200
            healthz_s = time.monotonic() - started
            return healthz_s, [(await w).json()["status"] for w in waits]

    healthz_s, statuses = asyncio.run(scenario())
    assert healthz_s < 1.0, healthz_s
    assert statuses == ["succeeded"] * 60


@pytest.fixture()
def one_waiter_api(runtime, worker) -> Iterator[str]:
    from executor.api.app import create_app
    from tests.harness.serving import api_server
    from toolrail.settings import get_settings

    settings = get_settings().model_copy(update={"wait_max_per_tenant": 1})
    with api_server(create_app(settings, runtime, mount_openai=False)) as base:
        yield base


def test_waiters_are_bounded_per_tenant(one_waiter_api: str) -> None:
    with httpx.Client(base_url=one_waiter_api, timeout=30) as client:
        job_id = client.post("/v1/jobs", json=_echo("bound", 1.5)).json()["job_id"]
        holder = threading.Thread(target=client.get, args=(f"/v1/jobs/{job_id}",), kwargs={"params": {"wait": 20}})
        holder.start()
        time.sleep(0.3)
        try:
            refused = httpx.get(f"{one_waiter_api}/v1/jobs/{job_id}", params={"wait": 5}, timeout=10)
            assert refused.status_code == 429 and refused.json()["error"]["type"] == "too_many_waiters"
            # a submit is never refused for it: the preference is just not applied
            quick = httpx.post(f"{one_waiter_api}/v1/jobs", json=_echo("x", 0.5), headers={"Prefer": "wait=5"},
                               timeout=10)
            assert quick.status_code == 202 and "Preference-Applied" not in quick.headers
        finally:
            holder.join()


@pytest.mark.parametrize(("header", "seconds"), [("wait=5", 5.0), ("respond-async, wait=2.5", 2.5),
                                                  ('wait="7"', 7.0), ("WAIT = 3; x=y", 3.0), ("handling=lenient", None),
                                                  ("wait=soon", None), ("", None), (None, None)])
def test_the_wait_preference_is_read_as_rfc_7240_writes_it(header: str | None, seconds: float | None) -> None:
    assert preferred_wait(header) == seconds
