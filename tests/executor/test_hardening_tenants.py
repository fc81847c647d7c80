"""Tenant isolation: one tenant's key never reaches another tenant's jobs, events or idempotency keys.

The API runs in-process (Starlette's TestClient) over the session's real Redis, with jobs
queued to the session's real Celery workers.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from executor.api.app import create_app
from executor.job_client import wait_for_job
from executor.store.records import TERMINAL_JOB
from toolrail.settings import Settings

KEYS = {"alpha": "key-alpha-0001", "beta": "key-beta-0002"}
BODY = {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Beijing", "date": "today"}}]}


@pytest.fixture(scope="module")
def app_client(runtime, worker) -> Iterator[TestClient]:
    settings = Settings(api_keys=",".join(f"{k}:{t}" for t, k in KEYS.items()))
    with TestClient(create_app(settings, runtime, mount_openai=False), raise_server_exceptions=False) as client:
        yield client


def auth(tenant: str, style: str = "bearer") -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}"} if style == "bearer" else {"X-API-Key": KEYS[tenant]}


def finished(client: TestClient, job_id: str, tenant: str) -> dict:
    job = wait_for_job(client, job_id, timeout_s=30, headers=auth(tenant))
    assert job["status"] in TERMINAL_JOB, f"{job_id} not terminal"
    return job


@pytest.fixture(scope="module")
def alpha_job(app_client: TestClient) -> dict:
    created = app_client.post("/v1/jobs", json=BODY, headers={**auth("alpha"), "Idempotency-Key": "shared-key-1"})
    assert created.status_code == 202, created.text
    return finished(app_client, created.json()["job_id"], "alpha")


def test_no_key_or_a_wrong_key_is_401(app_client: TestClient) -> None:
    for headers in ({}, {"Authorization": "Bearer nope"}, {"X-API-Key": "nope"}, {"Authorization": KEYS["alpha"]}):
        response = app_client.get("/v1/jobs", headers=headers)
        assert response.status_code == 401, headers
        assert response.json()["error"]["type"] == "unauthorized"


def test_owner_reads_its_job_with_either_header(app_client: TestClient, alpha_job: dict) -> None:
    assert alpha_job["status"] == "succeeded" and alpha_job["tenant"] == "alpha"
    for style in ("bearer", "x-api-key"):
        assert app_client.get(f"/v1/jobs/{alpha_job['job_id']}", headers=auth("alpha", style)).status_code == 200


def test_other_tenant_cannot_read_list_or_stream(app_client: TestClient, alpha_job: dict) -> None:
    job_id = alpha_job["job_id"]
    read = app_client.get(f"/v1/jobs/{job_id}", headers=auth("beta"))
    assert read.status_code == 404 and read.json()["error"]["type"] == "not_found"
    # the 404 is the same as for a job that never existed: nothing tells B that A's job exists
    ghost = app_client.get("/v1/jobs/job_00000000000000000000000000000000", headers=auth("beta"))
    assert ghost.status_code == 404 and read.json()["error"]["message"].replace(job_id, "X") == \
        ghost.json()["error"]["message"].replace("job_00000000000000000000000000000000", "X")
    assert job_id not in app_client.get("/v1/jobs", headers=auth("beta")).json()["jobs"]
    assert job_id in app_client.get("/v1/jobs", headers=auth("alpha")).json()["jobs"]
    events = app_client.get(f"/v1/jobs/{job_id}/events", headers=auth("beta"), params={"timeout_s": 1})
    assert events.status_code == 404 and "data:" not in events.text
    with_resume = app_client.get(f"/v1/jobs/{job_id}/events", headers={**auth("beta"), "Last-Event-ID": "0-0"})
    assert with_resume.status_code == 404


def test_other_tenant_cannot_cancel_or_mutate(app_client: TestClient, alpha_job: dict) -> None:
    cancel = app_client.post(f"/v1/jobs/{alpha_job['job_id']}/cancel", headers=auth("beta"))
    assert cancel.status_code == 404 and cancel.json()["error"]["type"] == "not_found"
    # no other mutating verb exists on a job; A's job is unchanged
    for method in ("DELETE", "PUT", "PATCH", "POST"):
        response = app_client.request(method, f"/v1/jobs/{alpha_job['job_id']}", headers=auth("beta"), json={})
        assert response.status_code in (404, 405), (method, response.status_code)
    again = app_client.get(f"/v1/jobs/{alpha_job['job_id']}", headers=auth("alpha")).json()
    assert again["status"] == alpha_job["status"] and again["calls"] == alpha_job["calls"]


def test_idempotency_keys_are_per_tenant(app_client: TestClient, alpha_job: dict) -> None:
    # same key, same body: B gets a job of its own, never A's job or A's results
    same = app_client.post("/v1/jobs", json=BODY, headers={**auth("beta"), "Idempotency-Key": "shared-key-1"})
    assert same.status_code == 202, same.text
    assert same.json()["job_id"] != alpha_job["job_id"]
    beta_job = finished(app_client, same.json()["job_id"], "beta")
    assert beta_job["tenant"] == "beta" and beta_job["request_id"] != alpha_job["request_id"]
    # A's key with another body: B gets 202 (its own job), not the 409 that would reveal A's use of the key
    private = app_client.post("/v1/jobs", json=BODY, headers={**auth("alpha"), "Idempotency-Key": "alpha-private"})
    probe = app_client.post("/v1/jobs", json={**BODY, "max_reasks": 1},
                            headers={**auth("beta"), "Idempotency-Key": "alpha-private"})
    assert private.status_code == 202 and probe.status_code == 202, probe.text
    assert probe.json()["job_id"] != private.json()["job_id"]
    # within one tenant the key still works: same body replays A's job, other body is a 409
    replay = app_client.post("/v1/jobs", json=BODY, headers={**auth("alpha"), "Idempotency-Key": "shared-key-1"})
    assert replay.status_code == 200 and replay.json()["job_id"] == alpha_job["job_id"]
    conflict = app_client.post("/v1/jobs", json={**BODY, "max_reasks": 1},
                               headers={**auth("alpha"), "Idempotency-Key": "shared-key-1"})
    assert conflict.status_code == 409 and conflict.json()["error"]["type"] == "idempotency_conflict"
