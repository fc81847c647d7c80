"""``toolrail tools add-mcp`` against the real API, and ``toolrail mcp stdio`` driven by the SDK's stdio client."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import redis
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.mcpbridge.mcp_servers import stdio_command

TOOLRAIL = [sys.executable, "-m", "toolrail.cli"]


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TOOLRAIL_API_KEY"}
    return subprocess.run([*TOOLRAIL, *args], capture_output=True, text=True, timeout=120, env=env)


def test_add_mcp_over_the_api(api: str, http_server: str) -> None:
    done = _run("tools", "add-mcp", "clicalc", "--url", http_server, "--api", api, "--side-effects", "add")
    assert done.returncode == 0, done.stderr
    assert "registered clicalc" in done.stdout and "mcp__clicalc__add" in done.stdout and "side-effects" in done.stdout
    local = _run("tools", "add-mcp", "clilocal", "--api", api, "--timeout", "20", "--read-path", str(Path(stdio_command("good")[1]).parent),
                 "--command", *stdio_command("good"))
    assert local.returncode == 0, local.stderr
    assert "mcp__clilocal__crash" in local.stdout
    listed = _run("tools", "list-mcp", "--api", api)
    assert listed.returncode == 0 and "clicalc" in listed.stdout and "clilocal" in listed.stdout
    refused = _run("tools", "add-mcp", "Bad!", "--url", http_server, "--api", api)
    assert refused.returncode == 1 and refused.stderr.startswith("toolrail tools add-mcp: validation_error")
    assert len(refused.stderr.strip().splitlines()) == 1
    gone = _run("tools", "remove-mcp", "clicalc", "--api", api)
    assert gone.returncode == 0 and _run("tools", "remove-mcp", "clicalc", "--api", api).returncode == 1


def test_mcp_stdio_serves_the_registry(worker, redis_url: str) -> None:  # noqa: ANN001 - the worker fixture
    """The host's config names Redis only (docs/mcp.md): the tools are the ones the workers load (demo tools and
    tests.executor.tools_for_tests), not what this process's own environment would enable (none)."""
    env = {"REDIS_URL": redis_url, "PYTHONPATH": os.getcwd()}
    params = StdioServerParameters(command=sys.executable, args=["-m", "toolrail.cli", "mcp", "stdio"], env=env,
                                   cwd=os.getcwd())

    async def main() -> None:
        async with Client(params, cache=None) as mcp:
            names = {t.name for t in (await mcp.list_tools()).tools}
            assert {"get_weather", "slow_echo", "transfer"} <= names
            bad = await mcp.call_tool("get_weather", {"city": "Paris", "date": "yesterday"})
            assert bad.is_error and bad.meta["toolrail.dev/error"]["type"] == "invalid_tool_calls"
            assert bad.meta["toolrail.dev/job_id"].startswith("job_")

    anyio.run(main)


def test_mcp_stdio_without_a_redis_url_is_one_line() -> None:
    """No REDIS_URL and no --redis-url: one line on stderr and exit 1, never a guessed 127.0.0.1:6379."""
    env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "TOOLRAIL_REDIS_URL"}}
    done = subprocess.run([*TOOLRAIL, "mcp", "stdio"], capture_output=True, text=True, timeout=120, env=env,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 1 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "REDIS_URL" in lines[0] and "6379" not in lines[0], done.stderr


def test_mcp_stdio_refuses_to_start_naming_the_tools_it_cannot_load() -> None:
    from executor.store.worker_tools import publish
    from tests.harness.databases import own_database

    url = own_database(f"{__name__}:stdio-refusal")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TOOLRAIL_")}, "REDIS_URL": url}
    nobody = subprocess.run([*TOOLRAIL, "mcp", "stdio"], capture_output=True, text=True, timeout=120, env=env,
                            stdin=subprocess.DEVNULL)
    assert nobody.returncode == 1 and nobody.stdout == "" and "no worker has published" in nobody.stderr, nobody.stderr
    publish(redis.Redis.from_url(url), "elsewhere@host", demo_tools=["get_weather"], modules=["acme_tools_not_here"],
            tools=["get_weather", "acme_lookup"])
    done = subprocess.run([*TOOLRAIL, "mcp", "stdio"], capture_output=True, text=True, timeout=120, env=env,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 1 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert "acme_lookup" in line and "acme_tools_not_here" in line and "elsewhere@host" in line, line
    assert "get_weather" not in line.split("which")[0]  # the tool it can load is not named missing
