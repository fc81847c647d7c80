"""MCP to the letter of the spec (issue 34, item 3), with the official SDK's client against the real API's /mcp
(real workers, real Redis): an unknown tool is a JSON-RPC error, ``GET /mcp`` is 405, a plain-text result is text."""

from __future__ import annotations

import time

import anyio
import httpx
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

META = "toolrail.dev/"


def test_an_unknown_tool_is_the_json_rpc_error_invalid_params(api: str) -> None:
    async def main() -> None:
        async with Client(f"{api}/mcp", cache=None) as mcp:
            with pytest.raises(MCPError) as raised:
                await mcp.call_tool("no_such_tool", {})
            assert raised.value.code == -32602, raised.value
            assert "no_such_tool" in raised.value.message
            assert (await mcp.call_tool("get_weather", {"city": "Paris", "date": "today"})).is_error is False

    anyio.run(main)


def test_get_mcp_is_405_and_the_sdk_client_works_without_a_stream(api: str) -> None:
    started = time.monotonic()
    response = httpx.get(f"{api}/mcp", headers={"Accept": "text/event-stream", "MCP-Protocol-Version": "2025-06-18"},
                         timeout=5)
    assert response.status_code == 405 and response.headers["allow"] == "POST", response.text
    assert response.json()["error"]["type"] == "method_not_allowed"
    assert time.monotonic() - started < 3

    async def main() -> None:
        async with Client(f"{api}/mcp", cache=None) as mcp:
            assert "get_weather" in {tool.name for tool in (await mcp.list_tools()).tools}

    anyio.run(main)


def test_a_remote_tools_plain_text_passes_through_as_text(api: str, http_server: str) -> None:
    registered = httpx.post(f"{api}/v1/mcp-servers", json={"name": "plain", "url": http_server}, timeout=60)
    assert registered.status_code in (200, 201), registered.text

    async def main() -> None:
        async with Client(f"{api}/mcp", cache=None) as mcp:
            result = await mcp.call_tool("mcp__plain__shout", {"words": "hello"})
            assert result.is_error is False, result.content
            assert [(block.type, block.text) for block in result.content] == [("text", "HELLO!\nsaid twice")]
            assert result.structured_content is None
            job = httpx.get(f"{api}/v1/jobs/{result.meta[f'{META}job_id']}", timeout=10).json()
            assert job["calls"][0]["result"] == "HELLO!\nsaid twice"

    anyio.run(main)
