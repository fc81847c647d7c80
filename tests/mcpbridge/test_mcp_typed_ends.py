"""Typed ends of MCP calls (issue 35, item 4), through the session's real API, workers and an SDK-written server.

- a call over its tenant's MCP concurrency limit ends within seconds with ``mcp_tenant_limit`` (its limit, tenant and
  server in ``details``). Before: ~30 s of task retries, then an untyped ``internal_error (ConcurrencyLimitedError)``;
- approving a call (with edited arguments or without) after its MCP server was deleted is a 409
  ``tool_unavailable`` and nothing is recorded. Before: a 500.
"""

from __future__ import annotations

import time

import httpx

from tests.harness.jobs import wait_terminal


def _register(client: httpx.Client, name: str, url: str) -> None:
    response = client.post("/v1/mcp-servers", json={"name": name, "url": url})
    assert response.status_code in (200, 201), response.text


def test_a_call_over_its_tenants_limit_ends_typed_within_seconds(client: httpx.Client, http_server: str, runtime) -> None:  # noqa: ANN001
    from mcpbridge.client import tenant_slots
    from mcpbridge.settings import mcp_settings

    _register(client, "busy", http_server)
    slots = tenant_slots(runtime)  # the limit the workers apply (the session's settings)
    slots.reset("default")
    held = []
    while (slot := slots.try_acquire("default", lease_s=120)) is not None:  # the tenant's other calls, hanging
        held.append(slot)
    try:
        assert len(held) == mcp_settings().max_concurrent_per_tenant
        started = time.monotonic()
        created = client.post("/v1/jobs", json={"tools": ["mcp__busy__add"],
                                                "tool_calls": [{"name": "mcp__busy__add", "arguments": {"a": 1, "b": 2}}]})
        assert created.status_code == 202, created.text
        job = wait_terminal(client, created.json()["job_id"], timeout_s=60)
        took = time.monotonic() - started
    finally:
        for slot in held:
            slots.release(slot)
    (call,) = job["calls"]
    assert call["status"] == "failed" and call["error"]["type"] == "mcp_tenant_limit", call
    details = call["error"]["details"]
    assert details["limit"] == len(held) and details["tenant"] == "default" and details["server"] == "busy", details
    assert took < 15, f"the call ended {took:.1f} s after its submission"


def test_approving_a_call_of_a_deleted_server_is_a_typed_409(client: httpx.Client, http_server: str) -> None:
    _register(client, "fleeting", http_server)
    created = client.post("/v1/jobs", json={"tools": ["mcp__fleeting__add"], "require_approval": ["mcp__fleeting__add"],
                                            "tool_calls": [{"name": "mcp__fleeting__add", "arguments": {"a": 1, "b": 2}}]})
    assert created.status_code == 202, created.text
    job_id = created.json()["job_id"]
    deadline = time.monotonic() + 30
    while (job := client.get(f"/v1/jobs/{job_id}").json())["status"] != "awaiting_approval":
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
    call_id = job["calls"][0]["id"]
    assert client.delete("/v1/mcp-servers/fleeting").status_code in (200, 204)
    for body in ({"arguments": {"a": 5, "b": 6}}, None):
        answer = client.post(f"/v1/jobs/{job_id}/calls/{call_id}/approve", json=body)
        assert answer.status_code == 409, answer.text
        error = answer.json()["error"]
        assert error["type"] == "tool_unavailable" and error["details"]["tool"] == "mcp__fleeting__add", error
    assert client.get(f"/v1/jobs/{job_id}").json()["calls"][0]["approval"]["state"] == "pending"  # nothing recorded
    rejected = client.post(f"/v1/jobs/{job_id}/calls/{call_id}/reject", json={"reason": "its server is gone"})
    assert rejected.status_code == 200, rejected.text
    assert wait_terminal(client, job_id)["status"] in {"succeeded", "failed"}
