"""toolrail as an MCP server: the official SDK's client against the real API's /mcp (real workers, real Redis)."""

from __future__ import annotations

import time

import anyio
import httpx
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.harness.fixtures import mcp_environment
from tests.mcpbridge.mcp_servers import KEYS

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

    async def denied() -> int:  # another tenant's tool does not exist for beta: unknown (-32602)
        async with _client(f"{keyed_api}/mcp", KEYS["beta"]) as mcp:
            with pytest.raises(MCPError) as raised:
                await mcp.call_tool("mcp__calc__add", {"a": 2, "b": 3})
        return raised.value.code

    assert anyio.run(denied) == -32602
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
    from tests.harness.serving import api_server
    from toolrail.settings import Settings

    settings = Settings(api_keys="key-rl:rl", rate_limit_per_s=0.01, rate_limit_burst=2)
    with api_server(create_app(settings, runtime, mount_openai=False, enqueue=lambda job: None,
                               ping_workers=lambda: 1)) as base:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        headers = {"Authorization": "Bearer key-rl", "Accept": "application/json, text/event-stream",
                   "MCP-Protocol-Version": "2025-11-25"}
        codes = [httpx.post(f"{base}/mcp", json=body, headers=headers, timeout=30).status_code for _ in range(3)]
        assert codes[-1] == 429 and 429 not in codes[:1], codes  # the tenant's bucket: burst 2, then refused
    # without keys, a client that is not on loopback is refused before any MCP handling
    from executor.api.context import JobDesk
    from executor.api.middleware import LOOPBACK_NAMES
    from mcpbridge.server import McpEndpoint, McpService, build_server

    endpoint = McpEndpoint(build_server(McpService(JobDesk(runtime, lambda job: None, None), Settings())), tenants={},
                           loopback_names=tuple(LOOPBACK_NAMES))
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    anyio.run(endpoint, {"type": "http", "method": "POST", "path": "/mcp", "headers": [], "client": ("10.1.2.3", 5555)},
              receive, send)
    assert sent[0]["status"] == 403


def _no_queue(job: object) -> None:
    """A queue double: these tests list tools and check headers; nothing is queued."""


@pytest.fixture(scope="module")
def keyless_api(runtime):  # noqa: ANN001, ANN201 - the session runtime; yields the base URL
    """An API without keys (a one-user install: loopback only), over the session Redis, with a queue double."""
    from executor.api.app import create_app
    from tests.harness.serving import api_server
    from toolrail.settings import Settings

    with mcp_environment(allow_private_urls=True):
        app = create_app(Settings(), runtime, mount_openai=False, enqueue=_no_queue, ping_workers=lambda: 1)
    with api_server(app) as base:
        yield base


def _rpc(base: str, method: str, *, headers: dict | None = None) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {}}
    return httpx.post(f"{base}/mcp", json=body, timeout=30, headers={
        "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25", **(headers or {})})


def _result(response: httpx.Response) -> dict:
    import json

    data = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
    return json.loads(data[-1] if data else response.text)["result"]


def test_dns_rebinding_is_refused_without_keys(keyless_api: str, runtime) -> None:  # noqa: ANN001
    """A web page whose name rebinds to 127.0.0.1 reaches /mcp from loopback, but its Host and Origin name it: refused
    by the API (its check of every route) and, behind it, by /mcp itself (the SDK's DNS-rebinding protection, on)."""
    from contextlib import asynccontextmanager

    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from tests.harness.serving import api_server
    from executor.api.context import JobDesk
    from executor.api.middleware import LOOPBACK_NAMES
    from mcpbridge.server import McpEndpoint, McpService, build_server
    from toolrail.settings import Settings

    endpoint = McpEndpoint(build_server(McpService(JobDesk(runtime, _no_queue, None), Settings())), tenants={},
                           loopback_names=tuple(LOOPBACK_NAMES))

    @asynccontextmanager
    async def lifespan(app):  # noqa: ANN001, ANN202
        async with endpoint.running():
            yield

    bare = Starlette(routes=[Route("/mcp", endpoint=endpoint, methods=["GET", "POST", "DELETE"]),
                             Route("/healthz", endpoint=lambda request: PlainTextResponse("ok"))], lifespan=lifespan)
    with api_server(bare) as bare_url:
        for base, host_refusal in ((keyless_api, 403), (bare_url, 421)):
            port = base.rsplit(":", 1)[1]
            forged_host = _rpc(base, "tools/list", headers={"Host": f"evil.example:{port}"})
            assert forged_host.status_code == host_refusal, (base, forged_host.text)
            forged_origin = _rpc(base, "tools/list", headers={"Origin": "http://evil.example"})
            assert forged_origin.status_code == 403, (base, forged_origin.text)
            for host, origin in ((f"127.0.0.1:{port}", f"http://127.0.0.1:{port}"), (f"localhost:{port}", None)):
                fine = _rpc(base, "tools/list", headers={"Host": host, **({"Origin": origin} if origin else {})})
                assert fine.status_code == 200 and _result(fine)["tools"], fine.text


def test_every_listed_tool_matches_the_specifications_tool_schema(keyless_api: str, http_server: str) -> None:
    """Every entry of /mcp's tools/list, local and MCP-provided, against the Tool of the published specification
    (the SDK's models generated from schema/2025-11-25.json) and the SDK's own ``mcp.types.Tool``."""
    from mcp import types as sdk_types
    from mcp_types._v2025_11_25 import Tool as SpecTool

    created = httpx.post(f"{keyless_api}/v1/mcp-servers", json={"name": "spec", "url": http_server}, timeout=60)
    assert created.status_code in (200, 201), created.text
    tools = _result(_rpc(keyless_api, "tools/list"))["tools"]
    assert any(t["name"].startswith("mcp__spec__") for t in tools) and any(t["name"] == "get_weather" for t in tools)
    for tool in tools:
        SpecTool.model_validate(tool, strict=False)
        sdk_types.Tool.model_validate(tool)
        assert tool["inputSchema"]["type"] == "object"
        assert all(isinstance(v, (dict, bool)) for v in tool["inputSchema"].get("properties", {}).values()), tool["name"]
        if "outputSchema" in tool:
            assert tool["outputSchema"]["type"] == "object", tool["name"]


def _running_call(redis_client, found: list[tuple[str, str]]):  # noqa: ANN001, ANN202 - the session Redis
    """A progress callback that records (JSON-RPC id, job id) of the tenant's call in flight, once it runs."""

    async def progress(value: float, total: float | None, message: str | None) -> None:
        for key in [] if found else redis_client.scan_iter(match="tr:mcp:rpc:default:*"):
            found.extend((key.decode().rsplit(":", 1)[1], m.decode()) for m in redis_client.smembers(key))

    return progress


def test_a_client_giving_up_cancels_the_job(api: str, redis_client) -> None:  # noqa: ANN001 - the session Redis
    """The SDK client stops waiting for a call: the job ends ``cancelled`` instead of running to the end."""
    found: list[tuple[str, str]] = []

    async def main() -> None:
        async with _client(f"{api}/mcp") as mcp:
            async with anyio.create_task_group() as group:
                group.start_soon(lambda: mcp.call_tool("progress_reporter", {"steps": 60, "delay_s": 0.5},
                                                       progress_callback=_running_call(redis_client, found)))
                with anyio.fail_after(30):
                    while not found:
                        await anyio.sleep(0.1)
                group.cancel_scope.cancel()

    anyio.run(main)
    assert len(found) == 1
    assert _status_when_cancelled(api, found[0][1])["status"] == "cancelled"


def test_notifications_cancelled_cancels_the_job(api: str, redis_client) -> None:  # noqa: ANN001 - the session Redis
    """A ``notifications/cancelled`` naming the call's id, on a POST of its own (the endpoint is stateless): the job
    is cancelled and the waiting call answers with the cancellation."""
    found: list[tuple[str, str]] = []
    outcome: list = []

    async def main() -> None:
        async with _client(f"{api}/mcp") as mcp:
            async with anyio.create_task_group() as group:

                async def call() -> None:
                    outcome.append(await mcp.call_tool("progress_reporter", {"steps": 60, "delay_s": 0.5},
                                                       progress_callback=_running_call(redis_client, found)))

                group.start_soon(call)
                with anyio.fail_after(30):
                    while not found:
                        await anyio.sleep(0.1)
                rpc_id = int(found[0][0]) if found[0][0].isdigit() else found[0][0]
                notice = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": rpc_id}}
                sent = await anyio.to_thread.run_sync(lambda: httpx.post(f"{api}/mcp", json=notice, timeout=30, headers={
                    "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}))
                assert sent.status_code == 202, sent.text

    anyio.run(main)
    job = _status_when_cancelled(api, found[0][1])
    assert job["status"] == "cancelled" and "notifications/cancelled" in job["error"]["message"]
    assert outcome[0].is_error and outcome[0].meta[f"{META}error"]["type"] == "cancelled"


def _status_when_cancelled(api: str, job_id: str) -> dict:
    deadline = time.monotonic() + 20
    job: dict = {}
    while time.monotonic() < deadline:
        job = httpx.get(f"{api}/v1/jobs/{job_id}").json()
        if job["status"] == "cancelled":
            break
        time.sleep(0.2)
    return job
