"""MCP servers as tool providers: toolrail calling small SDK-written servers over streamable HTTP and stdio.

Real traffic both ways: the API registers a server (fetches and checks its tools/list), jobs name its
tools, the real workers call it through ``mcpbridge.client`` (queue ``mcp.<tenant>.<server>``).
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.harness.jobs import wait_terminal
from tests.mcpbridge.mcp_servers import stdio_server
from mcpbridge.errors import McpToolRejectedError
from mcpbridge.spec import check_listed_tool
from tools.registry import Registry
from tools.spec import ToolSpec

HERE_GARBAGE = [__import__("sys").executable, str(__import__("pathlib").Path(__file__).parent / "garbage_server.py")]


def _register(client: httpx.Client, **body) -> dict:
    response = client.post("/v1/mcp-servers", json=body)
    assert response.status_code in (200, 201), response.text
    return response.json()


def _submit(client: httpx.Client, tool: str, arguments: dict) -> str:
    response = client.post("/v1/jobs", json={"tools": [tool], "tool_calls": [{"name": tool, "arguments": arguments}]})
    assert response.status_code == 202, response.text
    return response.json()["job_id"]


def _call(client: httpx.Client, job_id: str) -> dict:
    job = wait_terminal(client, job_id, timeout_s=90)
    first = job["calls"][0] if job["calls"] else {"status": None, "error": None}
    return {**first, "job_status": job["status"], "job_error": job.get("error")}


def test_http_server_tools_run_as_tool_calls(client: httpx.Client, http_server: str) -> None:
    server = _register(client, name="web", url=http_server, timeout_s=4, idle_timeout_s=1.5)
    names = {t["remote_name"] for t in server["tools"]}
    assert {"add", "slow", "pay", "get_weather"} <= names and server["queue"] == "mcp.default.web"
    pay = next(t for t in server["tools"] if t["remote_name"] == "pay")
    assert pay["side_effects"] is True  # destructiveHint
    assert all(t["description"].startswith("[MCP server 'web', untrusted]") for t in server["tools"])
    listed = {t["name"]: t for t in client.get("/v1/tools").json()["tools"]}
    assert listed["mcp__web__add"]["source"] == "mcp:web" and listed["mcp__web__add"]["output_schema"]
    assert "get_weather" in listed and listed["get_weather"].get("source") is None  # the local tool is untouched

    invalid = client.post("/v1/jobs", json={"tools": ["mcp__web__add"],
                                            "tool_calls": [{"name": "mcp__web__add", "arguments": {"a": 2, "c": 3}}]})
    assert invalid.status_code == 422 and invalid.json()["error"]["type"] == "invalid_tool_calls"  # never sent
    jobs = {
        "ok": _submit(client, "mcp__web__add", {"a": 2, "b": 3}),
        "progress": _submit(client, "mcp__web__slow", {"seconds": 2.5, "progress": True}),
        "idle": _submit(client, "mcp__web__slow", {"seconds": 3}),
        "hard": _submit(client, "mcp__web__slow", {"seconds": 6, "progress": True}),
        "hang": _submit(client, "mcp__web__hang", {}),
        "bad_output": _submit(client, "mcp__web__bad_output", {}),
        "fail": _submit(client, "mcp__web__fail", {"why": "closed"}),
        "pay": _submit(client, "mcp__web__pay", {"amount": 7}),
    }
    calls = {key: _call(client, job_id) for key, job_id in jobs.items()}

    assert calls["ok"]["status"] == "succeeded" and calls["ok"]["result"] == {"sum": 5}
    assert calls["progress"]["status"] == "succeeded", calls["progress"]  # progress reset the 1.5 s idle timer
    assert calls["progress"]["result"]["steps"] >= 10
    for key, limit in (("idle", "idle"), ("hang", "idle"), ("hard", "hard")):
        error = calls[key]["error"]
        assert error["type"] == "tool_timeout" and error["details"]["limit"] == limit, (key, error)
        assert error["details"]["server"] == "web"
    assert calls["bad_output"]["error"]["type"] == "tool_output_invalid"
    assert calls["bad_output"]["error"]["details"]["tool"] == "bad_output"
    fail = calls["fail"]["error"]
    assert fail["type"] == "tool_error" and fail["details"]["tool_error"]["type"] == "mcp_tool_error"
    assert "closed" in fail["details"]["tool_error"]["message"]
    paid = calls["pay"]
    assert paid["status"] == "succeeded" and paid["result"]["paid"] == 7
    assert paid["result"]["meta"]["toolrail.dev/idempotency_key"] == f"{jobs['pay']}:{paid['id']}"
    assert "toolrail.dev/idempotency_key" not in (calls["ok"]["result"].get("meta") or {})


def test_list_changed_refreshes_the_tools(client: httpx.Client) -> None:
    from tests.mcpbridge.mcp_servers import serve_http

    url, stop = serve_http("good")
    try:
        _register(client, name="changing", url=url)
        names = lambda: {t["name"] for t in client.get("/v1/tools").json()["tools"]}  # noqa: E731
        assert "mcp__changing__extra" not in names()
        assert _call(client, _submit(client, "mcp__changing__change", {}))["status"] == "succeeded"
        assert "mcp__changing__extra" in names()  # refreshed by the worker on notifications/tools/list_changed
        assert _call(client, _submit(client, "mcp__changing__extra", {}))["result"] == {"ok": True}
    finally:
        stop()


def test_a_server_that_is_down_opens_its_breaker(client: httpx.Client) -> None:
    from tests.mcpbridge.mcp_servers import serve_http

    url, stop = serve_http("good")
    _register(client, name="flaky", url=url)
    stop()
    errors = [_call(client, _submit(client, "mcp__flaky__add", {"a": 1, "b": 1}))["error"]["type"] for _ in range(5)]
    assert errors == ["mcp_unavailable"] * 5
    started = time.monotonic()
    for tool in ("mcp__flaky__add", "mcp__flaky__pay"):  # the breaker is the server's: all its tools fail fast
        call = _call(client, _submit(client, tool, {"a": 1, "b": 1} if tool.endswith("add") else {"amount": 1}))
        assert call["error"]["type"] == "circuit_open", call
    assert time.monotonic() - started < 20


def test_bad_listings_are_refused_with_the_path(client: httpx.Client) -> None:
    from tests.mcpbridge.mcp_servers import serve_http

    # over stdio the 10 MB description arrives and is cut; the $ref loop and the bad name are refused
    server = _register(client, name="shady", **stdio_server("bad"))
    kept = {t["remote_name"]: t for t in server["tools"]}
    assert set(kept) == {"huge", "fine"}
    huge = kept["huge"]["description"]
    assert huge.startswith("[MCP server 'shady', untrusted]") and len(huge) < 1200 and "[…cut:" in huge
    assert "IGNORE PREVIOUS" not in huge
    refused = {r["details"].get("tool"): r for r in server["refused"]}
    assert refused["loop"]["type"] == "mcp_tool_rejected"
    assert refused["loop"]["details"]["path"].startswith("/tools/0/inputSchema")
    assert refused["bad name!"]["details"]["reason"] == "invalid_name"
    # over streamable HTTP too (a listing may be up to 16 MiB; a call's result keeps the SDK's 1 MiB)
    url, stop = serve_http("bad")
    try:
        web = _register(client, name="shadyweb", url=url)
    finally:
        stop()
    assert {t["remote_name"] for t in web["tools"]} == {"huge", "fine"} and len(web["refused"]) == 2
    # a server that cannot be reached is refused at registration; url and command together are a 422
    down = client.post("/v1/mcp-servers", json={"name": "nowhere", "url": "http://127.0.0.1:9/mcp?token=s3cret"})
    assert down.status_code == 422 and down.json()["error"]["type"] == "mcp_server_unavailable"
    assert "http://127.0.0.1:9" in down.text and "s3cret" not in down.text  # the origin only: no path, no query
    both = client.post("/v1/mcp-servers", json={"name": "both", "url": url, "command": ["x"]})
    assert both.status_code == 422


def test_prefixed_name_that_collides_with_a_local_tool_is_refused() -> None:
    local = Registry([ToolSpec(name="mcp__srv__lookup", parameters={"type": "object", "properties": {}})])
    with pytest.raises(McpToolRejectedError) as caught:
        check_listed_tool("srv", 3, {"name": "lookup", "inputSchema": {"type": "object"}}, registry=local,
                          side_effects=set(), approval=set())
    assert caught.value.details["reason"] == "name_collision" and caught.value.details["path"] == "/tools/3/name"


def test_stdio_servers_run_confined(client: httpx.Client) -> None:
    server = _register(client, name="local", **stdio_server("good"), timeout_s=20, idle_timeout_s=8)
    assert "mcp__local__add" in {t["name"] for t in server["tools"]}
    garbage = _register(client, name="garbage", command=HERE_GARBAGE, read_paths=[str(Path(HERE_GARBAGE[1]).parent)],
                        timeout_s=20, idle_timeout_s=8)
    jobs = {"ok": _submit(client, "mcp__local__add", {"a": 20, "b": 22}),
            "inspect": _submit(client, "mcp__local__inspect", {}),
            "crash": _submit(client, "mcp__local__crash", {}),
            "garbage": _submit(client, "mcp__garbage__talk", {})}
    assert garbage["tools"][0]["name"] == "mcp__garbage__talk"
    calls = {key: _call(client, job_id) for key, job_id in jobs.items()}
    assert calls["ok"]["result"] == {"sum": 42}
    seen = calls["inspect"]["result"]
    # allow-listed (LC_CTYPE: Python's own C-locale coercion in the server process, PEP 538)
    assert set(seen["env"]) <= {"PATH", "LANG", "LC_ALL", "TZ", "HOME", "TMPDIR", "LC_CTYPE"}, seen["env"]
    assert seen["cwd"] == seen["home"] and "/mcp-local-" in seen["cwd"]  # a scratch dir of its own
    assert seen["network"] == "Permission denied", seen  # the seccomp filter refuses socket(2); no interfaces anyway
    assert seen["rlimit_as"] == 1024 * 1024 * 1024
    assert calls["crash"]["error"]["type"] == "mcp_server_exited"
    assert calls["crash"]["error"]["details"]["server"] == "local"
    error = calls["garbage"]["error"]
    assert error["type"] == "mcp_protocol_error" and "not JSON-RPC" in error["message"], error
    assert calls["garbage"]["duration_s"] < 8  # failed at the bad line, not at the idle timeout


def test_operator_flags_side_effects_and_approval(client: httpx.Client, http_server: str) -> None:
    server = _register(client, name="guarded", url=http_server, side_effects=["add"], requires_approval=["pay"],
                       read_only=["slow", "add"])
    tools = {t["remote_name"]: t for t in server["tools"]}
    assert tools["add"]["side_effects"] is True and tools["pay"]["requires_approval"] is True
    # unannotated tools may change things (MCP's defaults) unless the operator vouches they only read
    assert tools["slow"]["side_effects"] is False and tools["hang"]["side_effects"] is True
    assert server["read_only"] == ["slow"]  # side_effects wins over read_only
    added = _call(client, _submit(client, "mcp__guarded__add", {"a": 1, "b": 2}))
    assert added["result"] == {"sum": 3}
    job_id = _submit(client, "mcp__guarded__pay", {"amount": 5})
    deadline = time.monotonic() + 30
    while (job := client.get(f"/v1/jobs/{job_id}").json())["status"] != "awaiting_approval":
        assert time.monotonic() < deadline and job["status"] not in {"succeeded", "failed"}, job
        time.sleep(0.2)
    assert job["calls"][0]["status"] == "awaiting_approval"  # nothing was sent to the server
    approved = client.post(f"/v1/jobs/{job_id}/calls/{job['calls'][0]['id']}/approve")
    assert approved.status_code == 200, approved.text
    paid = _call(client, job_id)
    assert paid["status"] == "succeeded" and paid["result"]["meta"]["toolrail.dev/idempotency_key"].startswith(job_id)


class _Runtime:
    """A runtime double for ``mcpbridge.client.run_call`` in this process: the session Redis and settings only."""

    def __init__(self, redis_client, settings) -> None:  # noqa: ANN001
        self.redis, self.settings = redis_client, settings


def _spec(tenant: str, url: str):  # noqa: ANN202 - an McpToolSpec
    from mcpbridge.spec import McpToolSpec

    record = {"name": "fair", "url": url, "timeout_s": 10.0, "idle_timeout_s": 10.0, "queue": f"mcp.{tenant}.fair"}
    tool = {"name": "mcp__fair__add", "remote_name": "add", "description": "add", "side_effects": False,
            "requires_approval": False, "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                                                          "b": {"type": "integer"}}}}
    return McpToolSpec.from_record(tenant, record, tool)


def test_a_tenants_calls_past_its_limit_hold_no_worker(redis_client, http_server: str,  # noqa: ANN001
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """With alpha's one slot taken (its hanging call elsewhere), alpha's next call goes back to its queue within about
    a second, without connecting; beta's call of the same server runs meanwhile; once the slot frees, alpha's runs."""
    from executor.errors import RetryableError
    from executor.calls.concurrency import ConcurrencyLimitedError
    from executor.sandbox.boundary import CallRun
    from mcpbridge.client import run_call, tenant_slot, tenant_slots
    from tests.harness.fixtures import mcp_environment
    from toolrail.settings import Settings

    from toolrail import netguard

    connections: list[str] = []
    resolve = netguard.resolve_host
    monkeypatch.setattr(netguard, "resolve_host", lambda host, port: connections.append(host) or resolve(host, port))
    with mcp_environment(max_concurrent_per_tenant=1, allow_private_urls=True):
        rt = _Runtime(redis_client, Settings())
        call = CallRun(request_id="r1", job_id="job_fair", call_id="c1", idempotency_key="job_fair:c1",
                       arguments={"a": 2, "b": 3})
        def admitted(tenant: str):  # noqa: ANN202 - as the run loop runs it: the tenant's slot first (Runtime.admission)
            spec = _spec(tenant, http_server)
            with tenant_slot(rt, spec):
                return run_call(rt, spec, call)

        slots = tenant_slots(rt)
        for tenant in ("alpha", "beta"):
            slots.reset(tenant)
        held = slots.try_acquire("alpha", lease_s=60)
        try:
            started = time.monotonic()
            with pytest.raises(ConcurrencyLimitedError) as caught:
                admitted("alpha")
            assert time.monotonic() - started < 5 and isinstance(caught.value, RetryableError)
            assert caught.value.details["limit"] == 1 and caught.value.details["retry_in_s"] is not None
            assert connections == []  # nothing was sent: the call held no connection and no worker
            assert admitted("beta").result == {"sum": 5}
        finally:
            slots.release(held)
        assert admitted("alpha").result == {"sum": 5}
        assert slots.state("alpha")["in_flight"] == 0
