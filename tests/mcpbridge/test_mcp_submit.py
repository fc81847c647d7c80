"""MCP ``tools/call`` takes ``POST /v1/jobs``'s one path (``executor.runs.submit.submit``), through the real /mcp:
its job has a deadline (it had none), and a broker that refuses the job ends it ``failed`` (typed) as the API's
does (an MCP job used to stay ``queued``)."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import httpx
import pytest
from mcp import Client

META = "toolrail.dev/"


def _call(base: str, name: str, arguments: dict):  # noqa: ANN202 - the SDK's CallToolResult
    async def main():  # noqa: ANN202
        async with Client(f"{base}/mcp", cache=None) as mcp:
            return await mcp.call_tool(name, arguments)

    return anyio.run(main)


def test_an_mcp_call_job_has_a_deadline(api: str) -> None:
    from toolrail.settings import get_settings

    result = _call(api, "get_weather", {"city": "Beijing", "date": "today"})
    assert result.is_error is False, result.content[0].text
    job = httpx.get(f"{api}/v1/jobs/{result.meta[f'{META}job_id']}").json()
    assert job["status"] == "succeeded"
    assert job["deadline_at"] is not None
    assert 0 < job["deadline_at"] - job["created_at"] <= get_settings().run_deadline_s + 5, job


def _refusing_broker(job: object) -> None:
    raise ConnectionError("the broker is down (a double)")


@pytest.fixture(scope="module")
def refusing_api(runtime) -> Iterator[str]:  # noqa: ANN001 - the session runtime
    """An API whose queue refuses every job (a broker double that raises)."""
    from executor.api.app import create_app
    from tests.harness.serving import api_server
    from toolrail.settings import Settings

    settings = Settings()
    with api_server(create_app(settings, runtime, mount_openai=False, enqueue=_refusing_broker,
                               ping_workers=lambda: 1)) as base:
        yield base


def test_a_queueing_failure_ends_the_mcp_job_failed(refusing_api: str) -> None:
    result = _call(refusing_api, "get_weather", {"city": "Beijing", "date": "today"})
    assert result.is_error is True
    assert result.meta[f"{META}error"]["type"] == "enqueue_failed", result.meta
    job = httpx.get(f"{refusing_api}/v1/jobs/{result.meta[f'{META}job_id']}").json()
    assert job["status"] == "failed" and job["error"]["type"] == "enqueue_failed", job
    assert job["error"]["details"]["request_id"] == job["request_id"]
    # the job API's own submission: the same end, and a 503
    refused = httpx.post(f"{refusing_api}/v1/jobs", json={"tool_calls": [{"name": "get_weather", "arguments": {
        "city": "Beijing", "date": "today"}}], "tools": ["get_weather"]}, timeout=30)
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "1", refused.text
    assert refused.json()["error"]["type"] == "unavailable"  # the one handler: status and retryability on the class


def test_mcp_stdio_with_only_redis_url_flag_queues_there(worker, redis_url: str) -> None:  # noqa: ANN001 - the worker
    """``--redis-url`` (no ``REDIS_URL``): the job store and the Celery app it publishes with are that one Redis — a
    call ends ``succeeded`` (the app used to fall back to 127.0.0.1:6379, or now refuse, while the store used the flag)."""
    import os
    import sys

    from mcp.client.stdio import StdioServerParameters

    env = {"TOOLRAIL_TOOL_MODULES": "tests.executor.tools_for_tests", "TOOLRAIL_DECIDER": "none",
           "TOOLRAIL_DEMO_TOOLS": "all", "PYTHONPATH": os.getcwd(), "PATH": os.environ.get("PATH", "")}
    params = StdioServerParameters(command=sys.executable, args=["-m", "toolrail.cli", "mcp", "stdio", "--redis-url",
                                                                 redis_url], env=env, cwd=os.getcwd())

    async def main():  # noqa: ANN202
        async with Client(params, cache=None) as mcp:
            return await mcp.call_tool("get_weather", {"city": "Paris", "date": "today"})

    result = anyio.run(main)
    assert result.is_error is False, result.content[0].text
    assert result.structured_content["city"] == "Paris"
