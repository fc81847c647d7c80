"""toolrail as an MCP server: the official SDK's client against the real API's /mcp (real workers, real Redis)."""

from __future__ import annotations

import anyio
import httpx
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from conftest import KEYS  # noqa: I001 - this directory's conftest

META = "toolrail.dev/"


def _client(url: str, key: str | None = None) -> Client:
    if key is None:
        return Client(url, cache=None)
    http = httpx2_client(key)
    return Client(streamable_http_client(url, http_client=http), cache=None)


def httpx2_client(key: str):
    import httpx2  # the SDK's HTTP client library

    return httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=httpx2.Timeout(30, read=60))


def test_list_and_call(api: str) -> None:
    async def main() -> None:
        async with _client(f"{api}/mcp") as mcp:
            listed = await mcp.list_tools()
            tools = {t.name: t for t in listed.tools}
            assert {"get_weather", "transfer", "progress_reporter"} <= set(tools)
            assert tools["get_weather"].input_schema["additionalProperties"] is False  # the strict schema
            assert tools["transfer"].annotations.destructive_hint is True

            # slow_echo (a test tool, 15 s limit): the first sandboxed call of a fresh worker is slow on this machine
            result = await mcp.call_tool("slow_echo", {"value": "hello"})
            assert result.is_error is False, result.content[0].text
            assert result.structured_content["value"] == "hello"
            job_id = result.meta[f"{META}job_id"]
            assert job_id.startswith("job_") and result.meta[f"{META}request_id"]
            job = httpx.get(f"{api}/v1/jobs/{job_id}").json()
            assert job["status"] == "succeeded" and job["request_id"] == result.meta[f"{META}request_id"]

    anyio.run(main)


def test_invalid_arguments_are_an_error_result(api: str) -> None:
    async def main() -> None:
        async with _client(f"{api}/mcp") as mcp:
            bad = await mcp.call_tool("get_weather", {"city": 42, "date": "someday", "color": "red"})
            assert bad.is_error is True
            text = bad.content[0].text
            # the check path's typed error, with the failing value and the validator, for the model to act on
            assert bad.meta[f"{META}error"]["type"] == "invalid_tool_calls" and "someday" in text and "enum" in text
            assert f"{META}job_id" in bad.meta
            unknown = await mcp.call_tool("no_such_tool", {})
            assert unknown.is_error is True and unknown.meta[f"{META}error"]["type"] == "unknown_tool"

    anyio.run(main)


def test_progress_notifications_flow_from_the_tool(api: str) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append((value, total, message))

    async def main() -> None:
        async with _client(f"{api}/mcp") as mcp:
            result = await mcp.call_tool("progress_reporter", {"steps": 3, "delay_s": 0.3}, progress_callback=progress)
            assert result.is_error is False, result.content[0].text

    anyio.run(main)
    assert seen, "no progress notification reached the MCP client"
    assert seen[-1][0] == 3 and seen[-1][1] == 3 and "step 3" in (seen[-1][2] or "")


def test_tenants_and_keys(keyed_api: str, http_server: str) -> None:
    # alpha registers an MCP server; only alpha sees (and may call) its tools through /mcp
    with httpx.Client(base_url=keyed_api, timeout=60, headers={"Authorization": f"Bearer {KEYS['alpha']}"}) as alpha:
        created = alpha.post("/v1/mcp-servers", json={"name": "calc", "url": http_server})
        assert created.status_code in (200, 201), created.text

    async def names(key: str) -> set[str]:
        async with _client(f"{keyed_api}/mcp", key) as mcp:
            return {t.name for t in (await mcp.list_tools()).tools}

    async def call(key: str):
        async with _client(f"{keyed_api}/mcp", key) as mcp:
            return await mcp.call_tool("mcp__calc__add", {"a": 2, "b": 3})

    assert "mcp__calc__add" in anyio.run(names, KEYS["alpha"])
    assert "mcp__calc__add" not in anyio.run(names, KEYS["beta"])
    assert anyio.run(call, KEYS["alpha"]).structured_content == {"sum": 5}
    denied = anyio.run(call, KEYS["beta"])
    assert denied.is_error and denied.meta[f"{META}error"]["type"] == "unknown_tool"
    # no key, a wrong key: 401 before any MCP handling
    for headers in ({}, {"Authorization": "Bearer nope"}):
        response = httpx.post(f"{keyed_api}/mcp", headers={**headers, "Accept": "application/json, text/event-stream"},
                              json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}})
        assert response.status_code == 401 and response.json()["error"]["type"] == "unauthorized"


@pytest.mark.parametrize("tenant", ["alpha"])
def test_job_api_sees_the_tenants_mcp_tools(keyed_api: str, http_server: str, tenant: str) -> None:
    with httpx.Client(base_url=keyed_api, timeout=60, headers={"Authorization": f"Bearer {KEYS[tenant]}"}) as c:
        c.post("/v1/mcp-servers", json={"name": "calc", "url": http_server}).raise_for_status()
        tools = {t["name"]: t for t in c.get("/v1/tools").json()["tools"]}
        assert tools["mcp__calc__add"]["source"] == "mcp:calc" and tools["mcp__calc__add"]["queue"] == "mcp.alpha.calc"
        assert "get_weather" in tools and "mcp__calc__get_weather" in tools  # prefixed: no collision
    with httpx.Client(base_url=keyed_api, timeout=60, headers={"Authorization": f"Bearer {KEYS['beta']}"}) as c:
        assert not any(t["name"].startswith("mcp__") for t in c.get("/v1/tools").json()["tools"])
        refused = c.post("/v1/jobs", json={"tool_calls": [{"name": "mcp__calc__add", "arguments": {"a": 1, "b": 2}}],
                                           "tools": ["mcp__calc__add"]})
        assert refused.status_code == 422 and refused.json()["error"]["type"] == "unknown_tool"


def test_rate_limit_and_loopback_rule(runtime) -> None:  # noqa: ANN001 - the session runtime
    from executor.api.app import create_app
    from executor.stack import serve_in_thread
    from toolrail.settings import Settings

    settings = Settings(api_keys="key-rl:rl", rate_limit_per_s=0.01, rate_limit_burst=2, mcp_refresh_interval_s=0)
    server, thread, base = serve_in_thread(create_app(settings, runtime, mount_openai=False, enqueue=lambda job: None,
                                                      ping_workers=lambda: 1))
    try:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        headers = {"Authorization": "Bearer key-rl", "Accept": "application/json, text/event-stream",
                   "MCP-Protocol-Version": "2025-11-25"}
        codes = [httpx.post(f"{base}/mcp", json=body, headers=headers, timeout=30).status_code for _ in range(3)]
        assert codes[-1] == 429 and 429 not in codes[:1], codes  # the tenant's bucket: burst 2, then refused
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    # without keys, a client that is not on loopback is refused before any MCP handling
    from mcpbridge.server import McpEndpoint, McpService, build_server

    endpoint = McpEndpoint(build_server(McpService(runtime, Settings(), lambda job: None)), tenants={})
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    anyio.run(endpoint, {"type": "http", "method": "POST", "path": "/mcp", "headers": [], "client": ("10.1.2.3", 5555)},
              receive, send)
    assert sent[0]["status"] == 403
