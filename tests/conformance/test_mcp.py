"""MCP's official SDKs, Python (``mcp``) and TypeScript (``@modelcontextprotocol/sdk``, by node), against
toolrail's ``/mcp`` (streamable HTTP, with an API key) and ``toolrail mcp stdio`` (launched as a host's config
does): the same checks for each SDK and transport, asserting what the protocol says: the connection at the
client's newest protocol version (Python's 2026-07-28 by ``server/discover``, TypeScript's 2025-11-25 by the
``initialize`` handshake), the tool list, a call's structured result and an unknown tool's JSON-RPC error."""

from __future__ import annotations

import json

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import INVALID_PARAMS
from mcp_types.version import LATEST_PROTOCOL_VERSION

CHECKS = ["connect: the client's newest protocol version, the tools capability, serverInfo",
          "tools/list: every tool with an object inputSchema",
          "tools/call: structuredContent, and its JSON as the text block",
          "tools/call of an unknown tool: the JSON-RPC error -32602"]
TRANSPORTS = ["mcp http", "mcp stdio"]
ROWS = [(transport, check) for transport in TRANSPORTS for check in CHECKS]


def _client(transport: str, mcp_http: dict, mcp_stdio: dict) -> Client:
    if transport == "mcp stdio":
        return Client(StdioServerParameters(**mcp_stdio), cache=None)
    import httpx2  # the SDK's HTTP client library, which carries the API key

    http = httpx2.AsyncClient(headers=mcp_http["headers"], timeout=httpx2.Timeout(30, read=120))
    return Client(streamable_http_client(mcp_http["url"], http_client=http), cache=None)


async def _checks(mcp: Client) -> dict[str, str | None]:
    """Each check's failure (``None``: passed), on one connection."""
    failures: dict[str, str | None] = {}
    version, tools = mcp.protocol_version, mcp.server_capabilities.tools
    # auto mode probes server/discover (the 2026-07-28 era) before falling back to the initialize handshake
    failures[CHECKS[0]] = None if version == LATEST_PROTOCOL_VERSION and tools is not None and mcp.server_info \
        else f"version {version}, tools capability {tools}, serverInfo {mcp.server_info}"
    listed = (await mcp.list_tools()).tools  # parsed by the SDK's ListToolsResult
    names = {t.name for t in listed}
    failures[CHECKS[1]] = None if "get_weather" in names and all(t.input_schema["type"] == "object" for t in listed) \
        else f"tools {sorted(names)}"
    result = await mcp.call_tool("get_weather", {"city": "Paris", "date": "today"})
    text = result.content[0].text if result.content and result.content[0].type == "text" else None
    failures[CHECKS[2]] = None if not result.is_error and (result.structured_content or {}).get("city") == "Paris" \
        and text is not None and json.loads(text) == result.structured_content else result.model_dump_json()[:2000]
    try:
        unknown = await mcp.call_tool("no_such_tool", {})
        failures[CHECKS[3]] = f"a result, not the JSON-RPC error: {unknown.model_dump_json()[:500]}"
    except MCPError as error:
        failures[CHECKS[3]] = None if error.code == INVALID_PARAMS else f"code {error.code}: {error}"
    return failures


@pytest.fixture(scope="module")
def python_results(mcp_http: dict, mcp_stdio: dict) -> dict[tuple[str, str], str | None]:
    async def main() -> dict[tuple[str, str], str | None]:
        found = {}
        for transport in TRANSPORTS:
            async with _client(transport, mcp_http, mcp_stdio) as mcp:
                found.update({(transport, check): failure for check, failure in (await _checks(mcp)).items()})
        return found

    return anyio.run(main)


@pytest.fixture(scope="module")
def typescript_results(node_script, mcp_http: dict, mcp_stdio: dict) -> dict:  # noqa: ANN001 - node/'s runner
    return node_script("mcp.mjs", {"TOOLRAIL_MCP_HTTP": json.dumps(mcp_http), "TOOLRAIL_MCP_STDIO": json.dumps(mcp_stdio)})


@pytest.mark.parametrize(("transport", "check"), [
    pytest.param(t, c, marks=pytest.mark.conformance(f"{t}: {c}", "MCP Python SDK")) for t, c in ROWS])
def test_mcp_python_sdk(python_results, transport, check):
    assert python_results[transport, check] is None, python_results[transport, check]


@pytest.mark.parametrize(("transport", "check"), [
    pytest.param(t, c, marks=pytest.mark.conformance(f"{t}: {c}", "MCP TypeScript SDK")) for t, c in ROWS])
def test_mcp_typescript_sdk(typescript_results, transport, check):
    result = typescript_results[f"{transport}: {check}"]
    assert result["ok"], result["detail"]
